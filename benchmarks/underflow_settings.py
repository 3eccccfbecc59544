"""Does FP16 without loss scaling cost the digits MLP anything?  Several common settings, measured.

    python benchmarks/underflow_settings.py            # about 3 minutes on 2 CPU cores
    python benchmarks/underflow_settings.py --quick    # every setting at 2% of its steps (a smoke run)
    python benchmarks/underflow_settings.py --seed 2 --only Adam   # another seed, the Adam settings

For each setting, the digits MLP trains from the same seed on the same batches in three
regimes: ``fp32``, ``fp16-master`` (FP16 weights and activations, FP32 master weights, no loss
scaling) and ``mixed`` (the same, with the dynamic loss scale).  The two 16-bit regimes
differ in one mechanism only, so the columns say what loss scaling buys:

* underflow: the share of the true (FP32) gradient values that are 0 in FP16 at the
  regime's loss scale, mean over the last 10% of the steps (the demo table's underflow@end);
* of |g|^2: the share of the gradients' squared norm those values carry;
* train loss and test accuracy at the end.

tinyamp/experiments/README.md ("How to read it") quotes this table.  Its point: many gradient values underflow, yet
they are the smallest ones (an example the model already fits has a tiny error, divided by
the batch size), so the updates do not change.  Loss scaling is needed where the *bulk* of
a gradient lies below FP16's range, as in the paper's detector and language models.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinyamp.engine.fast.allocator import keep_freed_memory  # noqa: E402
from tinyamp.experiments.runner import run_regime  # noqa: E402
from tinyamp.experiments.tasks import DigitsMLP  # noqa: E402

REGIMES = ("fp32", "fp16-master", "mixed")


@dataclass
class Setting:
    """A named change to DigitsMLP's defaults, those of `tinyamp train` (`task` overrides them)."""

    name: str
    steps: int
    task: dict[str, Any] = field(default_factory=dict)


SETTINGS = (
    Setting("tinyamp train's defaults: SGD 0.05, momentum 0.9, cosine, batch 128", 1500),
    Setting("4x longer: 6000 steps", 6000),
    Setting("constant learning rate, 3000 steps", 3000, {"schedule": "constant"}),
    Setting("SGD + weight decay 5e-4", 1500, {"weight_decay": 5e-4}),
    Setting("Adam 0.001, batch 512", 1500, {"optimizer": "adam", "lr": 1e-3, "batch_size": 512}),
    Setting("8 hidden layers, Adam 0.001", 1500, {"optimizer": "adam", "lr": 1e-3, "hidden": (256,) * 8}),
)


def run_setting(setting: Setting, fraction: float = 1.0, seed: int = 0) -> list[dict[str, Any]]:
    """The three regimes of `setting` from `seed`, at `fraction` of its steps: one row each.

    Measured every 10 steps, as the demo does, so the first setting repeats `tinyamp train`'s numbers.
    """
    steps = max(2, round(setting.steps * fraction))
    rows = []
    for regime in REGIMES:
        task = DigitsMLP(**setting.task, seed=seed)
        result, _ = run_regime(task, regime, steps, measure_every=10)
        rows.append(
            {
                "setting": setting.name,
                "steps": steps,
                "seed": seed,
                "regime": regime,
                "train_loss": result.metrics["train_loss"],
                "accuracy": result.metrics["accuracy"],
                "underflow": result.underflow_fraction,
                "underflow_norm": result.underflow_norm_fraction,
            }
        )
    return rows


def _share(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def format_rows(rows: list[dict[str, Any]]) -> str:
    """One block per setting, then how fp16-master compares with mixed."""
    lines = []
    for name in dict.fromkeys(r["setting"] for r in rows):
        block = {r["regime"]: r for r in rows if r["setting"] == name}
        lines.append(f"{name} ({block['fp32']['steps']} steps, seed {block['fp32']['seed']})")
        lines.append(f"  {'regime':12s} {'train loss':>10s} {'test acc':>9s} {'underflow':>10s} {'of |g|^2':>9s}")
        for regime, r in block.items():
            norm = "-" if r["underflow_norm"] is None else f"{r['underflow_norm']:.0e}"
            lines.append(
                f"  {regime:12s} {r['train_loss']:10.6f} {_share(r['accuracy'], 2):>9s} "
                f"{_share(r['underflow']):>10s} {norm:>9s}"
            )
        plain, mixed, fp32 = block["fp16-master"], block["mixed"], block["fp32"]
        lines.append(
            f"  fp16-master / mixed training loss {plain['train_loss'] / mixed['train_loss']:.3f} "
            f"(mixed / fp32 {mixed['train_loss'] / fp32['train_loss']:.3f}), "
            f"test accuracy {100 * (plain['accuracy'] - mixed['accuracy']):+.2f} points"
        )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2%% of the steps: checks that it runs")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and batches (default 0)")
    parser.add_argument("--only", default="", help="run the settings whose name contains this text")
    args = parser.parse_args(argv)
    chosen = [s for s in SETTINGS if args.only.lower() in s.name.lower()]
    if not chosen:
        names = "; ".join(s.name for s in SETTINGS)
        parser.error(f"no setting's name contains {args.only!r}; the settings are: {names}")
    keep_freed_memory()
    began = time.perf_counter()
    rows = []
    for setting in chosen:
        rows += run_setting(setting, 0.02 if args.quick else 1.0, args.seed)
    print(format_rows(rows))
    print(f"took {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
