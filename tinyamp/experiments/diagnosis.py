"""Read a comparison of regimes: which runs failed, what each one measured, and the repair.

A run *failed* when it ends with a training loss at least twice FP32's or a test accuracy
at least 5 points below; it *matches* FP32 within 1 point of FP32's test accuracy.  The
causes are what the run measured (``tinyamp.experiments.measure``), never guessed:

* lost updates: the share of the weight changes that rounded away in the 16-bit weights;
* underflow: the share of the true gradient values that are 0 in FP16 at the run's loss scale;
* overflow: the steps skipped for an inf or NaN gradient, and where the first one came from.

Each failing regime's repair is the regime one mechanism away (``REPAIRS``), run beside it,
so the table shows the repair as a run and not as a promise.  Works on ``results.json``'s
regime entries (``RegimeResult.to_json()``), so a tool can diagnose a saved run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tinyamp.experiments.regimes import REGIMES

FAILED_LOSS_RATIO = 2.0  # a final training loss at least twice FP32's ...
FAILED_POINTS = 5.0  # ... or a test accuracy at least 5 points below FP32's: the run failed
MATCH_POINTS = 1.0  # within 1 point of FP32's test accuracy: the run matches FP32

# regime -> (the regime that adds one repair to it, that repair)
REPAIRS: dict[str, tuple[str, str]] = {
    "fp16": ("fp16-master", "FP32 master weights"),
    "fp16-scaled": ("mixed", "FP32 master weights"),
    "fp16-master": ("mixed", "loss scaling"),
    "bf16": ("bf16-mixed", "FP32 master weights"),
}


@dataclass(frozen=True)
class Verdict:
    """One regime against FP32: how far it ended, whether it failed, what it measured, its repair."""

    regime: str
    loss_ratio: float  # its final training loss / FP32's
    points: float  # its test accuracy minus FP32's, in percentage points
    causes: tuple[str, ...]  # what it measured: lost updates, underflow, overflow
    repair: str | None  # the repair and how its run ended, when the repaired regime ran too

    @property
    def failed(self) -> bool:
        return self.loss_ratio >= FAILED_LOSS_RATIO or self.points <= -FAILED_POINTS

    @property
    def matches(self) -> bool:
        return abs(self.points) <= MATCH_POINTS

    def lines(self) -> list[str]:
        """The verdict for under the demo's table: the outcome, then why, then the repair's run."""
        state = "FAILED" if self.failed else "matches FP32" if self.matches else "apart from FP32"
        side = "above" if self.points > 0 else "below"
        out = [f"{self.regime:<12} {state}: training loss {self.loss_ratio:.2f}x FP32's, test accuracy "
               f"{abs(self.points):.2f} points {side}"]  # fmt: skip
        if self.causes:
            out.append(f"{'':<12} measured: {'; '.join(self.causes)}")
        if self.repair:
            out.append(f"{'':<12} {self.repair}")
        return out


def causes(name: str, result: dict[str, Any]) -> tuple[str, ...]:
    """What the run of regime `name` measured, in words: lost updates, underflow, overflows (the first one's op)."""
    out = []
    lost = result.get("lost_update_fraction")
    if lost is not None:
        spec = REGIMES.get(name)
        kept = " (its FP32 masters kept them)" if spec is not None and spec.master_weights else ""
        out.append(f"{100 * lost:.0f}% of its updates too small to move a 16-bit weight{kept}")
    underflow = result.get("underflow_fraction")
    if underflow is not None:
        out.append(f"{100 * underflow:.1f}% of its gradient values 0 at the end")
    overflow = overflows(result)
    if overflow:
        out.append(overflow)
    return tuple(out)


def overflows(result: dict[str, Any]) -> str | None:
    """The steps a run skipped for an inf or NaN gradient, and the op where the first one appeared; None if none."""
    skipped = result.get("skipped_steps", 0)
    if not skipped:
        return None
    first = result.get("first_overflow") or {}
    where = f", the first at step {first['step']} (scale {first['scale']:g}): {first['where']}" if first else ""
    return f"{skipped} step{'s' * (skipped != 1)} skipped for an overflow{where}"


def diagnose(regimes: dict[str, dict[str, Any]]) -> dict[str, Verdict]:
    """A Verdict for every regime but ``fp32`` of a classifier's comparison (results.json's ``regimes``).

    Needs the ``fp32`` row and metrics with ``train_loss`` and ``accuracy``; {} otherwise.
    """
    fp32 = regimes.get("fp32")
    if fp32 is None or "accuracy" not in fp32["metrics"]:
        return {}

    def against(r: dict[str, Any]) -> tuple[float, float]:
        m = r["metrics"]
        return m["train_loss"] / fp32["metrics"]["train_loss"], 100 * (m["accuracy"] - fp32["metrics"]["accuracy"])

    verdicts = {}
    for name, r in regimes.items():
        if name == "fp32":
            continue
        ratio, points = against(r)
        repair = None
        if name in REPAIRS and REPAIRS[name][0] in regimes:
            fixed, how = REPAIRS[name]
            fixed_ratio, fixed_points = against(regimes[fixed])
            side = "above" if fixed_points > 0 else "below"
            repair = f"add {how}: {fixed} ends {fixed_ratio:.2f}x, {abs(fixed_points):.2f} points {side}"
        verdicts[name] = Verdict(name, ratio, points, causes(name, r), repair)
    return verdicts
