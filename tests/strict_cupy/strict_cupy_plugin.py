"""pytest plugin (and import hook for the CLI runner) for the strict CuPy stand-in.

The stand-in cannot run CUDA kernels, so tinyamp's three GPU-only fast paths (cuBLAS
products, fused master updates, fused unscaling) are switched to the generic array code
they replace; everything else runs on the stand-in's arrays, which refuse every host/device
mix that CuPy refuses.  Tests that assert a fast path ran are deselected.
"""

from __future__ import annotations

from typing import Any

import cupy  # the stand-in: tests/strict_cupy is first on PYTHONPATH

from tinyamp.amp import unscale_cuda
from tinyamp.ops import cublas_gemm
from tinyamp.optim import fused_cuda

cublas_gemm.applies = lambda *args, **kwargs: False
fused_cuda.applies = lambda *args, **kwargs: False
unscale_cuda.applies = lambda *args, **kwargs: False

NEEDS_FUSED_KERNELS = ("test_an_overflow_skipped_on_the_gpu_changes_nothing_and_rolls_back_the_counters",)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    keep = [item for item in items if not item.name.startswith(NEEDS_FUSED_KERNELS)]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"STRICT-CUPY VIOLATIONS: {len(cupy.VIOLATIONS)}")
    for message in dict.fromkeys(v.split("\n")[0] for v in cupy.VIOLATIONS):
        terminalreporter.write_line("  " + message)
