"""pytest plugin (and import hook for the CLI runner) for the strict CuPy stand-in.

The stand-in cannot run CUDA kernels, so the engine room's kernel-based GPU implementations
(cuBLAS products, unscaling and sums of squares, the whole scaler step with fused updates,
the fused ReLU, GELU and softmax)
are taken back from ``tinyamp.kernels``, and the reference code runs on the stand-in's
arrays instead, which refuse every host/device mix that CuPy refuses.  Tests that call a
kernel directly, or the GPU code with NumPy stand-ins for the kernels, are deselected.
"""

from __future__ import annotations

from typing import Any

import cupy  # the stand-in: tests/engine_room/strict_cupy is first on PYTHONPATH

from tinyamp import kernels
from tinyamp.engine import cuda

_KERNEL_BASED = ("product", "multiply_and_sum_squares_", "sum_of_squares", "scaled_step", "relu", "relu_backward",
                 "gelu", "gelu_backward", "softmax", "softmax_backward", "layer_norm", "layer_norm_backward",
                 "sum_rows", "cross_entropy", "cross_entropy_backward")  # fmt: skip
for _name in _KERNEL_BASED:
    kernels.unregister(_name, cuda.IMPLEMENTATIONS[_name])

NEEDS_FUSED_KERNELS = (
    "test_an_overflow_skipped_on_the_gpu_changes_nothing_and_rolls_back_the_counters",
    "test_one_fused_update_is_bit_identical_to_numpy",
    "test_fused_updates_keep_float32_subnormals_as_numpy_does",
    "test_sums_of_squares_in_many_blocks_agree",
    "test_fused_relu_",
    "test_fused_gelu_",
    "test_fused_softmax_",
    "test_fused_layer_norm_",
    "test_fused_cross_entropy_",
    "test_sum_rows_as_",
)


# CPU tests that route NumPy arrays through the GPU code with NumPy stand-ins for the kernels: they
# need the GPU implementations registered, and they run in the main suite anyway.
KERNELS_ON_NUMPY = ("kernels_on_numpy", "cublas_on_numpy")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    keep = [
        item for item in items
        if not item.name.startswith(NEEDS_FUSED_KERNELS)
        and not set(KERNELS_ON_NUMPY) & set(getattr(item, "fixturenames", ()))
    ]  # fmt: skip
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"STRICT-CUPY VIOLATIONS: {len(cupy.VIOLATIONS)}")
    for message in dict.fromkeys(v.split("\n")[0] for v in cupy.VIOLATIONS):
        terminalreporter.write_line("  " + message)
