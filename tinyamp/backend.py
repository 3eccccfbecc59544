"""The array backends: NumPy on the CPU, CuPy on an NVIDIA GPU.

This is the one module that imports CuPy, and it does so lazily: ``import tinyamp``
never touches CuPy, so the package works (and every CPU test runs) on machines where
CuPy is absent or where no GPU exists.  A tensor's device is decided by the type of
its array: a ``numpy.ndarray`` lives on ``"cpu"``, a ``cupy.ndarray`` on ``"cuda"``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

DEVICES = ("cpu", "cuda")

_cupy: ModuleType | None = None  # set by _import_cupy() once CuPy has been asked for


class DeviceError(RuntimeError):
    """A device that does not exist here, or tensors on two devices in one op."""


class OutOfRangeError(ValueError, IndexError):
    """An integer label or index outside [0, size): a ValueError for cross-entropy's labels and an
    IndexError for an embedding's rows (both, as NumPy's AxisError is both)."""


class EngineRoomSettingError(ValueError):
    """TINYAMP_ENGINE_ROOM holds something other than on or off."""


ENGINE_ROOM_SETTINGS = ("on", "off")


def engine_room_setting(environ: Any = None) -> str:
    """TINYAMP_ENGINE_ROOM, checked: "on" (the default) or "off" (the reference kernels alone).

    Anything else raises EngineRoomSettingError naming the value: a misspelt "of" would
    otherwise run the engine room while the user believes it is off.
    """
    import os

    raw = (os.environ if environ is None else environ).get("TINYAMP_ENGINE_ROOM", "on")
    value = raw.strip().lower()
    if value not in ENGINE_ROOM_SETTINGS:
        raise EngineRoomSettingError(
            f"TINYAMP_ENGINE_ROOM={raw!r} is neither on nor off: unset it, or set it to on (the default: the faster "
            "kernels where they apply) or off (the reference kernels of tinyamp/kernels.py alone)"
        )
    return value


def refuse_engine_room_setting(exc: EngineRoomSettingError) -> None:
    """For `tinyamp` and ``python -m tinyamp...``: say `exc` in one sentence and exit with status 2.

    ``import tinyamp`` reads the setting, and the command imports tinyamp before its own
    code runs, so this is called from the import when the process is the command (the
    ``tinyamp`` script, or ``python -m`` while it locates the module); a program that
    imports tinyamp gets the exception instead.
    """
    import os

    from tinyamp._startup import running_as_command

    if running_as_command():
        rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        if rank == "0":  # under mpiexec every rank exits 2; the first says why
            print(f"tinyamp: error: {exc}", file=sys.stderr)
        raise SystemExit(2)


def _import_cupy() -> ModuleType:
    """Import CuPy and check that a GPU is visible, or explain why not."""
    global _cupy
    if _cupy is not None:
        return _cupy
    try:
        import cupy
    except ImportError as exc:
        raise DeviceError(
            "device='cuda' needs CuPy, which is not installed here. Install it with "
            "pip install 'tinyamp[cuda12]' (or [cuda13]), or use device='cpu'."
        ) from exc
    # `import cupy` succeeds without a GPU; the first allocation would then raise
    # a CUDARuntimeError deep inside CuPy.  Ask up front instead.
    if not cupy.is_available():
        raise DeviceError(
            "device='cuda' was requested but CuPy sees no CUDA GPU on this machine "
            "(cupy.is_available() is False). Use device='cpu'."
        )
    missing = missing_cuda_compiler(cupy)
    if missing is not None:
        raise DeviceError(missing)
    _cupy = cupy
    return cupy


def missing_cuda_compiler(cupy: ModuleType) -> str | None:
    """Why CuPy cannot compile kernels (None when it can): a wheel installed without the CUDA libraries.

    CuPy compiles every kernel, ``a + b`` included, with NVRTC when it first runs.  The
    plain ``cupy-cuda12x`` wheel assumes a CUDA Toolkit on the machine; without one,
    ``import cupy`` and ``cupy.is_available()`` still succeed and the first operation fails.
    """
    nvrtc = getattr(cupy.cuda, "nvrtc", None)
    if nvrtc is None:  # a layout without it: nothing to ask, the first kernel will tell
        return None
    try:
        nvrtc.getVersion()  # loads libnvrtc
    except (ImportError, RuntimeError) as exc:  # cuda-pathfinder's DynamicLibNotFoundError is a RuntimeError
        why = str(exc).strip()
        return (
            f"CuPy sees a GPU but cannot load NVRTC, the CUDA compiler it builds every kernel with ({why}). "
            "Install CuPy with the CUDA libraries: pip install 'tinyamp[cuda12]' (or [cuda13]), which installs "
            "cupy-cuda12x[ctk]; or use device='cpu'."
        )
    return None


def cublas() -> ModuleType:
    """CuPy's thin cuBLAS wrapper (GemmEx and friends), for the Tensor Core products."""
    cupy = _import_cupy()
    try:  # CuPy loads libcublas on first use: a missing library is an ImportError here, not at `import cupy`
        module = getattr(cupy.cuda, "cublas", None)
        if module is None or not hasattr(module, "gemmStridedBatchedEx"):  # some layouts keep it in cupy_backends
            import importlib

            module = importlib.import_module("cupy_backends.cuda.libs.cublas")
    except ImportError as exc:
        raise DeviceError(
            f"CuPy sees a GPU but cannot load cuBLAS ({exc}). Install the CUDA libraries with CuPy, e.g. "
            "pip install 'cupy-cuda13x[ctk]' (or cupy-cuda12x[ctk]), or use device='cpu'."
        ) from exc
    return module


def cuda_is_available() -> bool:
    """True when CuPy is installed and a CUDA GPU can be used."""
    try:
        _import_cupy()
    except DeviceError:
        return False
    return True


def check_device(device: str) -> str:
    """Return `device` normalized ("cpu" or "cuda"), or raise a clear error."""
    if not isinstance(device, str):
        raise DeviceError(f"device must be a string, one of {DEVICES}; got {device!r}")
    name = device.lower()
    if name == "gpu" or name.startswith("cuda"):
        name = "cuda"
    if name not in DEVICES:
        raise DeviceError(f"unknown device {device!r}: tinyamp knows {', '.join(DEVICES)}")
    return name


def array_module(device: str) -> ModuleType:
    """The array library (numpy or cupy) that holds arrays for `device`."""
    if check_device(device) == "cpu":
        return np
    return _import_cupy()


def _cupy_if_imported() -> ModuleType | None:
    """CuPy, if anyone imported it: a user may hand tinyamp a CuPy array before tinyamp
    itself has needed CuPy, and that array must still be recognized as living on the GPU."""
    return _cupy if _cupy is not None else sys.modules.get("cupy")


def get_array_module(array: Any) -> ModuleType:
    """numpy or cupy, whichever owns `array` (the DeZero idiom: one code path, two libraries)."""
    if isinstance(array, np.ndarray):
        return np
    cupy = _cupy_if_imported()
    return cupy if cupy is not None and isinstance(array, cupy.ndarray) else np


def device_of(array: Any) -> str:
    """The device ("cpu" or "cuda") where `array` lives."""
    return "cpu" if get_array_module(array) is np else "cuda"


def is_array(obj: Any) -> bool:
    """True for a NumPy or CuPy ndarray."""
    if isinstance(obj, np.ndarray):
        return True
    cupy = _cupy_if_imported()
    return cupy is not None and isinstance(obj, cupy.ndarray)


def to_device(array: Any, device: str) -> Any:
    """Copy `array` to `device` (a no-op when it is already there)."""
    device = check_device(device)
    if device_of(array) == device:
        return array
    if device == "cpu":
        settle_checks("at the first read from the GPU after the call")  # the host waits here anyway
        return array.get()
    return _import_cupy().asarray(array)


def host_floats(values: list[Any]) -> list[float]:
    """0-d arrays (on any devices) or numbers as Python floats, one device-to-host copy per device.

    Each copy makes the host wait for the GPU, so a training step gathers what it must
    read (overflow flags, gradient norms, counts) and reads it once; the flags of deferred
    checks (below) ride along, and one that failed raises its error here."""
    checks = take_pending_checks()
    values = [*values, *(check.flag for check in checks)]
    by_module: dict[int, list[int]] = {}
    for i, v in enumerate(values):
        by_module.setdefault(id(get_array_module(v)), []).append(i)
    host = [0.0] * len(values)
    for indices in by_module.values():
        xp = get_array_module(values[indices[0]])
        stacked = xp.stack([xp.asarray(values[i], dtype=np.float64) for i in indices])
        for i, v in zip(indices, to_device(stacked, "cpu").tolist()):
            host[i] = v
    raise_failed_checks(checks, host[len(host) - len(checks) :], "at the first read from the GPU after the call")
    return host[: len(host) - len(checks)]


# ---- checks the GPU answers later ------------------------------------------------------------------------
# A range check of labels or indices needs two numbers on the host (the smallest and largest
# value); on a GPU that read makes the host wait for every kernel launched before it, once per
# call.  The engine room keeps such a check on the device instead (engine/cuda/range_check.py) and
# it is answered at the next read the program makes anyway: a step's read of its overflow
# check takes the checks' flags along, and a check that failed raises its error there, before
# any weight changes.  On the CPU nothing is deferred: the check raises at the call.
def out_of_range_message(what: str, size: int, low: int, high: int) -> str:
    """The sentence of an OutOfRangeError: the range, and the smallest and largest value found."""
    return f"{what} must lie in [0, {size}); got values from {low} to {high}"


def check_in_range(values: Any, size: int, what: str) -> Any:
    """`values` (integers, not empty) once checked to lie in [0, size); else an OutOfRangeError naming them.

    The reference of the kernel "check_in_range": the smallest and largest value reach the host
    in one read.  On a GPU the engine room defers the check instead (defer_check) and returns a
    copy of `values` clipped into [0, size), so that no kernel reads outside a table before the
    error is raised, at the next read (before a step changes a weight).
    """
    xp = get_array_module(values)
    low, high = (int(v) for v in to_device(xp.stack([values.min(), values.max()]), "cpu"))
    if low < 0 or high >= size:
        raise OutOfRangeError(out_of_range_message(what, size, low, high))
    return values


@dataclass
class DeferredCheck:
    """Integers that must lie in [0, size), checked on the device: `bounds` holds their (min, max), and
    `flag` is a 0-d float64 array, 0 when they lie in range and inf when not (a non-finite value, so that
    it can sit among a step's sums of squares and make the step skip)."""

    what: str
    size: int
    bounds: Any
    flag: Any

    def error(self, read_at: str) -> OutOfRangeError:
        low, high = (int(v) for v in to_device(self.bounds, "cpu").tolist())
        message = out_of_range_message(self.what, self.size, low, high)
        return OutOfRangeError(f"{message} (checked on the GPU without making the host wait; reported {read_at})")


_pending_checks: list[DeferredCheck] = []
MAX_PENDING_CHECKS = 256  # forward passes that read nothing (an evaluation loop) hold at most this many


def defer_check(check: DeferredCheck) -> None:
    """Keep `check` until the next read from the GPU (or until MAX_PENDING_CHECKS are kept)."""
    _pending_checks.append(check)
    if len(_pending_checks) >= MAX_PENDING_CHECKS:
        settle_checks(f"after {MAX_PENDING_CHECKS} checks with no read between them")


def take_pending_checks() -> list[DeferredCheck]:
    """The checks not answered yet, handed to a caller that reads their flags with its own read."""
    taken = list(_pending_checks)
    _pending_checks.clear()
    return taken


def raise_failed_checks(checks: list[DeferredCheck], flags: list[float], read_at: str) -> None:
    """Raise the error of the first of `checks` whose flag, read to the host, is not finite."""
    for check, flag in zip(checks, flags):
        if not math.isfinite(flag):
            raise check.error(read_at)


def settle_checks(read_at: str) -> None:
    """Answer every check not answered yet, with one read of their flags; raise the first that failed."""
    checks = take_pending_checks()
    if checks:
        xp = get_array_module(checks[0].flag)
        raise_failed_checks(checks, to_device(xp.stack([c.flag for c in checks]), "cpu").tolist(), read_at)
