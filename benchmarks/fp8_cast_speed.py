"""FP8 and FP4 casts of 2^22 float32 values, one thread: tinyamp against ml_dtypes, PyTorch and torchao.

    OPENBLAS_NUM_THREADS=1 python benchmarks/fp8_cast_speed.py [--out results/fp8_cast_speed.txt]

**Element casts.**  The saturating cast to E4M3 and E5M2: tinyamp as training runs it
(``tinyamp.fp8.seam.encode``: the engine room's compiled loop, with numba), the chapter's
reference (``tinyamp.fp8.formats.encode``, whole-array NumPy passes), ml_dtypes' ``astype``
after ``np.clip`` (the same bits, tests/test_fp8_formats.py), and, where PyTorch is importable,
``x.clamp(-max, max).to(torch.float8_...)``; decoding (a 256-entry table) against ml_dtypes'
widening.  **Quantizing.**  Per-tensor current scaling of the 2^22 values to E4M3 (``TensorScaling.quantize``,
its counts of saturated, flushed and non-finite values included; torchao's
``hp_tensor_to_float8_dynamic`` on them as a 2048 x 2048 tensor), and on that 2048 x 2048 tensor
MXFP8 E4M3 and MXFP4 (E2M1 in blocks of 32 under E8M0 scales, the OCP floor rule; torchao's
``to_mx`` with FLOOR) and NVFP4 (E2M1 in blocks of 16 under E4M3 scales and an FP32 tensor scale;
torchao's ``nvfp4_quantize`` with ``per_tensor_amax_to_scale``).  The torchao rows appear only
where torchao is importable (it is no dependency of tinyamp; ``pip install torch torchao`` in
another environment), and the script says so when it is not.

Medians of interleaved rounds (timing.py) in milliseconds, with tinyamp's time (as training runs
it) over each contender's, all measured in this one run.  numba compiles each loop at its
first call (or loads it from its on-disk cache): those warm-up calls are not timed.  One thread:
the script sets OPENBLAS_NUM_THREADS, OMP_NUM_THREADS and MKL_NUM_THREADS to 1 unless they are set,
and PyTorch's threads to 1; tinyamp's loops run on one thread in any case.
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # before NumPy (and PyTorch) start their thread pools

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # timing.py
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the working tree's tinyamp, installed or not

from timing import interleaved_medians  # noqa: E402

from tinyamp.engine.fast import casts  # noqa: E402
from tinyamp.fp8 import blocks, formats, scaling, seam  # noqa: E402
from tinyamp.fp8.formats import FORMATS, decode  # noqa: E402

N = 1 << 22
OURS = "tinyamp"  # as training runs it: through tinyamp.kernels, the engine room's loops where they apply
CHAPTER = "tinyamp chapter (NumPy)"


def peers() -> tuple[object | None, object | None, str]:
    """(torch, torchao's modules or None, a note on what is missing)."""
    try:
        import torch
    except ImportError:
        return None, None, "PyTorch is not importable here: no torch or torchao rows (pip install torch torchao)"
    torch.set_num_threads(1)
    try:
        from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
        from torchao.float8.float8_training_tensor import LinearMMConfig
        from torchao.prototype.mx_formats import mx_tensor, nvfp4_tensor
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
    except ImportError:
        return torch, None, "torchao is not importable here: no torchao rows (pip install torchao)"
    ao = {"dynamic": hp_tensor_to_float8_dynamic, "config": LinearMMConfig(), "mx": mx_tensor, "nvfp4": nvfp4_tensor,
          "floor": ScaleCalculationMode.FLOOR}  # fmt: skip
    return torch, ao, ""


def cases(n: int) -> tuple[dict[str, dict[str, Callable[[], object]]], str]:
    """Each case's contenders (name: a call that does the work once), and the note on missing peers."""
    import ml_dtypes

    x = (np.random.default_rng(0).standard_normal(n) * 100).astype(np.float32)  # some beyond 448: saturated
    grid = x.reshape(-1, 2048) if n % 2048 == 0 else x.reshape(1, -1)
    torch, ao, note = peers()
    out: dict[str, dict[str, Callable[[], object]]] = {}
    for name, dtype in (("E4M3", ml_dtypes.float8_e4m3fn), ("E5M2", ml_dtypes.float8_e5m2)):
        top, bits = np.float32(FORMATS[name].max), formats.encode(x, name)
        case = {OURS: lambda n=name: seam.encode(x, n), CHAPTER: lambda n=name: formats.encode(x, n),
                "ml_dtypes": lambda t=top, d=dtype: np.clip(x, -t, t).astype(d)}  # fmt: skip
        if torch is not None:
            tx, tdtype = torch.from_numpy(x), getattr(torch, {"E4M3": "float8_e4m3fn", "E5M2": "float8_e5m2"}[name])
            case["torch"] = lambda tx=tx, t=float(top), d=tdtype: tx.clamp(-t, t).to(d)
        out[f"float32 -> {name}, saturating"] = case
        out[f"{name} -> float32"] = {OURS: lambda b=bits, n=name: decode(b, n),
                                     "ml_dtypes": lambda b=bits, d=dtype: b.view(d).astype(np.float32)}  # fmt: skip
    recipe = scaling.ScalingRecipe(recipe="current")
    out["per-tensor current scaling, E4M3"] = {
        OURS: lambda: seam.TensorScaling("x", "E4M3", recipe).quantize(x),
        CHAPTER: lambda: scaling.TensorScaling("x", "E4M3", recipe).quantize(x),
    }
    for scheme in ("mxfp8_e4m3", "mxfp4", "nvfp4"):
        out[f"{scheme}, 2048 x 2048"] = {OURS: lambda s=scheme: seam.quantize_blocks(grid, s),
                                         CHAPTER: lambda s=scheme: blocks.quantize(grid, s)}  # fmt: skip
    if ao is not None:
        tg = torch.from_numpy(np.ascontiguousarray(grid))
        current = out["per-tensor current scaling, E4M3"]
        current["torchao"] = lambda: ao["dynamic"](tg, torch.float8_e4m3fn, ao["config"])
        out["mxfp8_e4m3, 2048 x 2048"]["torchao"] = lambda: ao["mx"].to_mx(tg, torch.float8_e4m3fn, 32, ao["floor"])
        out["mxfp4, 2048 x 2048"]["torchao"] = lambda: ao["mx"].to_mx(tg, torch.float4_e2m1fn_x2, 32, ao["floor"])
        out["nvfp4, 2048 x 2048"]["torchao"] = lambda: ao["nvfp4"].nvfp4_quantize(
            tg, 16, ao["nvfp4"].per_tensor_amax_to_scale(tg.abs().max()))  # fmt: skip
    return out, note


def measure(n: int = N, rounds: int = 7) -> tuple[dict[str, dict[str, float]], str]:
    """Milliseconds per call of each contender of each case, and the note on missing peers; ImportError
    without ml_dtypes."""
    table, note = cases(n)
    return {case: {k: 1e3 * v for k, v in interleaved_medians(fns, rounds=rounds).items()}
            for case, fns in table.items()}, note  # fmt: skip


def report(results: dict[str, dict[str, float]], note: str, n: int = N) -> str:
    loops = "numba's compiled loops" if casts.active_kernels() == "numba" else "no numba: the chapter's NumPy passes"
    lines = [f"FP8/FP4 casts of 2^{n.bit_length() - 1} float32 values, one thread; median ms, and {OURS}'s time",
             f"over each contender's ({OURS} as training runs it: through tinyamp.kernels; here {loops})",
             f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}", ""]  # fmt: skip
    if note:
        lines += [note, ""]
    lines.append(f"{'case':<36}{'contender':<26}{'ms':>9}{OURS + ' / it':>14}")
    for case, ms in results.items():
        for contender, t in ms.items():
            lines.append(f"{case:<36}{contender:<26}{t:>9.2f}{ms[OURS] / t:>14.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    try:
        results, note = measure()
    except ImportError:
        print("ml_dtypes is not installed (pip install ml_dtypes): nothing to compare with")
        return 0
    text = report(results, note)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
