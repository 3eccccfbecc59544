"""FP8 training against BF16 and FP32: the char transformer's validation loss, and the digits MLP's accuracy.

    python benchmarks/fp8_training.py [--steps 1500] [--mlp-steps 1500] [--out benchmarks/results/fp8_training.json]

Each task trains from the same seed on the same batches in fp32, bf16-mixed and the three FP8
recipes of ``tinyamp.fp8.training`` (fp8: delayed per-tensor scaling; fp8-current; mxfp8),
as ``tinyamp train --precision ...`` does.  Printed per regime: the score, its gap to BF16
and to FP32, the skipped steps, the shares of the values cast to E4M3 and E5M2 that saturated
or flushed to zero, and the time of a step (FP8 is emulated on NumPy: slower than FP32 here,
by design).  The transformer's run takes several minutes on two cores; it is a measurement,
kept out of CI (tests/test_fp8_training.py asserts the MLP's accuracy).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the working tree's tinyamp, installed or not

from tinyamp.engine.fast.allocator import keep_freed_memory  # noqa: E402
from tinyamp.experiments.blas_threads import one_blas_thread  # noqa: E402
from tinyamp.experiments.runner import run_regime  # noqa: E402
from tinyamp.experiments.tasks import CharTransformer, DigitsMLP  # noqa: E402

REGIMES = ("fp32", "bf16-mixed", "fp8", "fp8-current", "mxfp8")


def share(part: int, whole: int) -> float:
    return part / whole if whole else float("nan")


def run(task, steps: int, score: str) -> list[dict]:
    rows = []
    for regime in REGIMES:
        began = time.perf_counter()
        with np.errstate(all="ignore"):
            result, _ = run_regime(task, regime, steps, measure_every=10**9)
        row = {"regime": regime, score: result.metrics[score], "skipped": result.skipped_steps,
               "ms_per_step": result.ms_per_step, "seconds": time.perf_counter() - began}  # fmt: skip
        if result.fp8:
            for pass_, t in result.fp8["totals"].items():
                for key in ("saturated", "flushed", "nonfinite"):
                    row[f"{pass_}_{key}"] = share(t[key], t["values"])
        rows.append(row)
        print(f"  {regime:<12} {score} {row[score]:.4f}  ({row['seconds']:.0f} s)", file=sys.stderr, flush=True)
    reference = {r["regime"]: r[score] for r in rows}
    for r in rows:
        r["minus_bf16"] = r[score] - reference["bf16-mixed"]
        r["minus_fp32"] = r[score] - reference["fp32"]
    return rows


def percent(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{100 * value:>{width - 1}.3g}%"


def table(rows: list[dict], score: str, scale: float, unit: str) -> str:
    head = (f"{'regime':<12}{score:>11}{'- bf16':>10}{'- fp32':>10}{'skipped':>9}{'E4M3 sat.':>11}"
            f"{'E4M3 flush':>12}{'E5M2 sat.':>11}{'E5M2 flush':>12}{'ms/step':>9}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        fp8 = [r.get(f"{p}_{k}") for p in ("forward", "backward") for k in ("saturated", "flushed")]
        cells = "".join(percent(v, width) for v, width in zip(fp8, (11, 12, 11, 12)))
        lines.append(f"{r['regime']:<12}{scale * r[score]:>11.4f}{scale * r['minus_bf16']:>+10.4f}"
                     f"{scale * r['minus_fp32']:>+10.4f}{r['skipped']:>9}{cells}{r['ms_per_step']:>9.1f}")  # fmt: skip
    lines.append(f"({score} and its gaps in {unit})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="transformer steps (default 1500, tinyamp train's)")
    parser.add_argument("--mlp-steps", type=int, default=1500, help="digits MLP steps (default 1500, the demo's)")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON")
    args = parser.parse_args()
    keep_freed_memory()
    with one_blas_thread():
        print(f"digits MLP, {args.mlp_steps} steps:", file=sys.stderr)
        mlp = run(DigitsMLP(), args.mlp_steps, "accuracy")
        print(f"char transformer, {args.steps} steps:", file=sys.stderr)
        transformer = run(CharTransformer(), args.steps, "val_loss")
    print(f"Digits MLP 64-256-256-10, {args.mlp_steps} steps of SGD, seed 0: test accuracy")
    print(table(mlp, "accuracy", 100.0, "points"))
    print(f"\nChar transformer (2 layers, dim 64, context 32), {args.steps} steps of Adam, seed 0: validation loss")
    print(table(transformer, "val_loss", 1.0, "nats"))
    if args.out is not None:
        document = {"machine": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
                    "mlp_steps": args.mlp_steps, "transformer_steps": args.steps,
                    "mlp": mlp, "transformer": transformer}  # fmt: skip
        args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
