"""FP8 training against FP16 mixed, BF16 and FP32: the char transformer's validation loss, the digits MLP's accuracy.

    python benchmarks/fp8_training.py [--steps 1500] [--mlp-steps 1500] [--out benchmarks/results/fp8_training.json]
    python benchmarks/fp8_training.py --seed 1 --mlp-steps 0     # the transformer alone, on another seed

Each task trains from the same seed on the same batches in fp32, mixed (FP16 with FP32 masters
and dynamic loss scaling), bf16-mixed and the three FP8 recipes of ``tinyamp.fp8.training``
(fp8: delayed per-tensor scaling; fp8-current; mxfp8), as ``tinyamp train --precision ...``
does, each for the same number of steps.  Printed per regime: the score, its gap to mixed and
to FP32 (for the transformer also its ratio to mixed's: issue 40's goal is within 2%), the
skipped steps, and over the whole run the shares of the values each role cast to FP8
(weights and activations to E4M3, gradients to E5M2) that saturated or flushed to zero, and
the time of a step (FP8 is emulated on NumPy: slower than FP32 here, by design).  The
transformer's run takes several minutes on two cores; it is a measurement, kept out of CI
(tests/test_fp8_training.py asserts the MLP's accuracy; tutorial 10 reads this file's JSON).
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
from tinyamp.experiments.fp8_report import by_role  # noqa: E402
from tinyamp.experiments.runner import run_regime  # noqa: E402
from tinyamp.experiments.tasks import CharTransformer, DigitsMLP  # noqa: E402

REGIMES = ("fp32", "mixed", "bf16-mixed", "fp8", "fp8-current", "mxfp8")
ROLES = ("weights", "activations", "gradients")


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
            for role, t in by_role(result.fp8).items():
                for key in ("saturated", "flushed", "nonfinite"):
                    row[f"{role}_{key}"] = share(t[key], t["values"])
        rows.append(row)
        print(f"  {regime:<12} {score} {row[score]:.4f}  ({row['seconds']:.0f} s)", file=sys.stderr, flush=True)
    reference = {r["regime"]: r[score] for r in rows}
    for r in rows:
        r["minus_mixed"] = r[score] - reference["mixed"]
        r["minus_fp32"] = r[score] - reference["fp32"]
        r["over_mixed"] = r[score] / reference["mixed"]
    return rows


def percent(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{100 * value:>{width - 1}.3g}%"


def table(rows: list[dict], score: str, scale: float, unit: str) -> str:
    head = (f"{'regime':<12}{score:>10}{'- mixed':>9}{'- fp32':>9}{'/ mixed':>9}{'skip':>5}"
            + "".join(f"{f'{role[0].upper()} {k}':>11}" for role in ROLES for k in ("sat.", "flush"))
            + f"{'ms/step':>8}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = "".join(percent(r.get(f"{role}_{k}"), 11) for role in ROLES for k in ("saturated", "flushed"))
        lines.append(f"{r['regime']:<12}{scale * r[score]:>10.4f}{scale * r['minus_mixed']:>+9.4f}"
                     f"{scale * r['minus_fp32']:>+9.4f}{r['over_mixed']:>9.4f}{r['skipped']:>5}{cells}"
                     f"{r['ms_per_step']:>8.1f}")  # fmt: skip
    lines.append(f"({score} and its gaps in {unit}; W, A, G: the shares of the weights' and activations' values "
                 "cast to E4M3, and of the gradients' to E5M2, that saturated or flushed to zero over the run)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="transformer steps (default 1500, tinyamp train's)")
    parser.add_argument("--mlp-steps", type=int, default=1500, help="digits MLP steps (default 1500, the demo's)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the weights and the batches (default 0)")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON")
    args = parser.parse_args()
    keep_freed_memory()
    with one_blas_thread():
        mlp, transformer = [], []
        if args.mlp_steps > 0:  # --mlp-steps 0: the transformer alone (another seed, say)
            print(f"digits MLP, {args.mlp_steps} steps:", file=sys.stderr)
            mlp = run(DigitsMLP(seed=args.seed), args.mlp_steps, "accuracy")
        if args.steps > 0:
            print(f"char transformer, {args.steps} steps:", file=sys.stderr)
            transformer = run(CharTransformer(seed=args.seed), args.steps, "val_loss")
    if mlp:
        print(f"Digits MLP 64-256-256-10, {args.mlp_steps} steps of SGD, seed {args.seed}: test accuracy")
        print(table(mlp, "accuracy", 100.0, "points"))
    if transformer:
        print(f"\nChar transformer (2 layers, dim 64, context 32), {args.steps} steps of Adam, seed {args.seed}: "
              "validation loss")
        print(table(transformer, "val_loss", 1.0, "nats"))
    if args.out is not None:
        document = {"machine": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
                    "seed": args.seed, "mlp_steps": args.mlp_steps, "transformer_steps": args.steps,
                    "mlp": mlp, "transformer": transformer}  # fmt: skip
        args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
