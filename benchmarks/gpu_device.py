"""The device-specific parts of gpu_check.py, kept small: clocks, array module, spin kernel, TF32 GEMM.

Everything else in the GPU check runs the same code on both devices: on "cuda" the
clock is a pair of CUDA events, on "cpu" (the dry run) it is ``time.perf_counter``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from tinyamp import backend


class CpuClock:
    """Host wall time: a mark is a ``perf_counter`` reading."""

    def mark(self) -> Any:
        """A point in time, now."""
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds from `start` to `end`."""
        return end - start

    def sync(self) -> None:
        """Wait until the device is idle (the CPU always is)."""


class CupyClock:
    """GPU time: a mark is a CUDA event recorded on CuPy's current stream."""

    def __init__(self) -> None:
        self.cupy = backend.array_module("cuda")

    def mark(self) -> Any:
        """Record an event; the GPU timestamps it when it reaches it."""
        event = self.cupy.cuda.Event()
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        """GPU seconds between two recorded events (waits for `end`)."""
        end.synchronize()
        return self.cupy.cuda.get_elapsed_time(start, end) / 1e3

    def sync(self) -> None:
        """Wait for every kernel launched so far."""
        self.cupy.cuda.Device().synchronize()


class TorchClock:
    """GPU time for PyTorch work: a mark is a ``torch.cuda.Event`` on PyTorch's current stream."""

    def __init__(self, torch: ModuleType) -> None:
        self.torch = torch

    def mark(self) -> Any:
        """Record an event; the GPU timestamps it when it reaches it."""
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        """GPU seconds between two recorded events (waits for `end`)."""
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def sync(self) -> None:
        """Wait for every kernel PyTorch launched so far."""
        self.torch.cuda.synchronize()


@dataclass(frozen=True)
class Timing:
    """Median seconds per call (device clock), the fastest sample, samples taken, median host seconds per call."""

    median_s: float
    min_s: float
    samples: int
    host_s: float


def measure(
    clock: Any, fn: Callable[[], Any], warmup: int = 3, reps: int = 10, inner: int = 1, budget_s: float = 15.0
) -> Timing:
    """Time `fn`: `warmup` calls, then up to `reps` samples of `inner` back-to-back calls each.

    Sampling stops early once the samples have taken `budget_s` of host time (at least 3
    samples are always taken), so a step far slower than expected cannot eat the run.
    """
    for _ in range(warmup):
        fn()
    clock.sync()
    device_s: list[float] = []
    host_s: list[float] = []
    for _ in range(reps):
        h0 = time.perf_counter()
        start = clock.mark()
        for _ in range(inner):
            fn()
        end = clock.mark()
        device_s.append(clock.seconds(start, end) / inner)
        host_s.append((time.perf_counter() - h0) / inner)
        if len(device_s) >= 3 and sum(host_s) * inner > budget_s:
            break
    return Timing(statistics.median(device_s), min(device_s), len(device_s), statistics.median(host_s))


@dataclass
class Device:
    """One device of the check: its name, array module and clock."""

    name: str
    xp: ModuleType
    clock: Any

    @property
    def asynchronous(self) -> bool:
        """True when work is queued and runs later (a GPU), False when it runs as it is called."""
        return self.name == "cuda"

    def put(self, host_array: np.ndarray) -> Any:
        """`host_array` on this device."""
        return backend.to_device(host_array, self.name)

    def free(self) -> None:
        """Drop unreachable arrays and give cached GPU blocks back (between measurements)."""
        gc.collect()
        if self.name == "cuda":
            self.clock.sync()
            self.xp.get_default_memory_pool().free_all_blocks()


def make_device(dry_run: bool) -> Device:
    """The CPU (NumPy, perf_counter) for a dry run, else the GPU (CuPy, CUDA events)."""
    if dry_run:
        return Device("cpu", np, CpuClock())
    return Device("cuda", backend.array_module("cuda"), CupyClock())


def tf32_matmul(dev: Device, a: Any, b: Any, out: Any) -> Any:
    """out = a @ b for float32 C-contiguous (m, k) @ (k, n), on TF32 Tensor Cores (cuBLAS FAST_TF32).

    Row-major C = A B is column-major C^T = B^T A^T: B goes first and m, n swap.  On the
    CPU (dry run) there is no TF32: a float32 product stands in.
    """
    if dev.name != "cuda":
        np.matmul(a, b, out=out)
        return out
    cupy = dev.xp
    cublas, runtime = backend.cublas(), cupy.cuda.runtime  # tinyamp's own accessor
    (m, k), n = a.shape, b.shape[1]
    alpha, beta = np.array(1.0, np.float32), np.array(0.0, np.float32)
    cublas.gemmEx(
        cupy.cuda.device.get_cublas_handle(), cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k,
        alpha.ctypes.data, b.data.ptr, runtime.CUDA_R_32F, n, a.data.ptr, runtime.CUDA_R_32F, k,
        beta.ctypes.data, out.data.ptr, runtime.CUDA_R_32F, n,
        cublas.CUBLAS_COMPUTE_32F_FAST_TF32, cublas.CUBLAS_GEMM_DEFAULT,
    )  # fmt: skip
    return out


def relative_error(x: Any, reference: Any) -> float:
    """||x - reference||_F / ||reference||_F, computed in float32 on the arrays' device."""
    xp = backend.get_array_module(reference)
    ref = reference.astype(xp.float32)
    return float(xp.linalg.norm(x.astype(xp.float32) - ref) / xp.linalg.norm(ref))
