"""One BLAS thread for every training entry point, so that a run's bits do not depend on the machine.

OpenBLAS splits a product's work differently with another thread count, and the float32
sums round differently: the same run gave other weights with 2 threads than with 1
(tests/test_cli.py checks that the command's do not).  `tinyamp train`, `tinyamp demo` and
``python -m tinyamp.distributed`` all train inside ``one_blas_thread()``, so a run stopped
under one of them and resumed under another continues bit for bit, whatever
OPENBLAS_NUM_THREADS says.  The products here are small (the largest, in the transformer,
is 1024x64 by 64x256); benchmarks/demo_time.py measures what one thread costs them.
"""

from __future__ import annotations

import contextlib
from typing import Any


def one_blas_thread() -> Any:
    """A context manager that runs BLAS on one thread (threadpoolctl), whatever the machine has."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # a dependency; without it the run is the same, its bits may depend on the cores
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")
