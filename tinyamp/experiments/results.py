"""What a run produces: one RegimeResult per regime, the demo table, and results.json.

Every number printed in the table is a field of :class:`RegimeResult`, and
``results.json`` holds all of them plus the per-step series (loss, loss scale, skipped
flags, and the measured lost-update and underflow fractions), so a figure or a test
can be made from the file alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tinyamp.units import format_bytes

SCHEMA = "tinyamp-results/1"

UNDERFLOW_NOTE = (
    "underflow@end: of the nonzero gradient values (activations and weights) an FP32 backward computes for the "
    "same weights and batch, the share that is 0 in the regime's 16-bit format after multiplying by its loss "
    "scale (|g|*S <= 2^-25 in FP16); mean over the last 10% of the steps"
)
LOST_NOTE = (
    "lost upd.: of the elements the optimizer changed, the share whose 16-bit weight did not move "
    "(fp16(w + update) == w); with FP32 masters the update was kept there, so the share is what *would* have "
    "been lost; pooled over the whole run (every measured step)"
)


@dataclass
class RegimeResult:
    """The outcome of training one task in one regime."""

    regime: str
    task: str
    scaler: str
    steps: int
    metrics: dict[str, float]  # train_loss, test_loss, accuracy (mlp); val_loss (transformer)
    skipped_steps: int
    final_scale: float
    underflow_fraction: float | None  # None for FP32 (its gradients are FP32)
    underflow_norm_fraction: float | None  # the share of the gradients' squared norm those values carried
    lost_update_fraction: float | None  # None for FP32
    saved_bytes: int  # every array the first step's graph kept for backward, each counted once
    saved_bytes_by_kind: dict[str, int]
    ms_per_step: float  # the median over the timed steps
    seconds: float
    series: dict[str, list[Any]] = field(default_factory=dict)  # per step: loss, scale, skipped, lr
    measured: dict[str, list[Any]] = field(default_factory=dict)  # at measured steps: step, lost, underflow
    histogram: dict[str, Any] = field(default_factory=dict)  # log2|g| counts at the end, unscaled and scaled
    memory: dict[str, Any] = field(default_factory=dict)  # with --memory: bytes held by role, peak of a step
    ms_per_step_spread: list[float] = field(default_factory=list)  # 10th and 90th percentiles of the timed steps
    stopped: str | None = None  # why the run ended before its last step (the loss scale underflowed to 0)
    first_step: int = 0  # the step of series[0]: 0, or where a run resumed from a checkpoint without a history
    resumed_at: list[int] = field(default_factory=list)  # the steps where the run was resumed
    fp8: dict[str, Any] = field(default_factory=dict)  # FP8 regimes: every cast tensor's scales and counts per step
    first_overflow: dict[str, Any] = field(default_factory=dict)  # the first skipped step: step, scale, op

    def to_json(self) -> dict[str, Any]:
        """A dict with only JSON values (NaN becomes None)."""
        return _clean(asdict(self))


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _percent(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def format_table(results: Sequence[RegimeResult]) -> str:
    """The comparison table, one row per regime, with footnotes defining the measured columns."""
    if not results:
        return "(no results)"
    classifier = "accuracy" in results[0].metrics
    loss_key = "train_loss" if classifier else "val_loss"
    header = [
        "regime",
        "train loss" if classifier else "val loss",
        *(["test acc"] if classifier else []),
        "skipped",
        "final scale",
        "underflow@end",
        "lost upd.",
        "saved",
        "ms/step",
    ]
    rows = []
    for r in results:
        rows.append(
            [
                r.regime,
                f"{r.metrics[loss_key]:.4f}",
                *([f"{100 * r.metrics['accuracy']:.2f}%"] if classifier else []),
                str(r.skipped_steps),
                "-" if r.scaler == "off" else f"{r.final_scale:g}",
                _percent(r.underflow_fraction),
                _percent(r.lost_update_fraction),
                format_bytes(r.saved_bytes, kib_decimals=0),
                f"{r.ms_per_step:.2f}" if math.isfinite(r.ms_per_step) else "-",  # every step was measured
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths)))
    lines = [line, "-" * len(line)]
    for row in rows:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def footnotes() -> str:
    """The definitions of the measured columns, for under the table."""
    return "\n".join(
        [
            f"* {UNDERFLOW_NOTE}.",
            f"* {LOST_NOTE}.",
            "* saved: bytes of the arrays the first step's graph keeps for backward (tinyamp.inspect.saved_tensors).",
            "* ms/step: the median time of a training step (measurement steps excluded; - when every step was "
            "measured; results.json has the 10th and 90th percentiles). On a CPU, FP16 is emulated through FP32 "
            "and the casts cost time; FP16's speed-up needs a GPU (--device cuda: Tensor Cores, and half the bytes "
            "to move). benchmarks/ times the steps side by side.",
        ]
    )


def results_document(tasks: dict[str, tuple[Any, Sequence[RegimeResult]]], config: dict[str, Any]) -> dict[str, Any]:
    """The content of results.json.

    ``{"schema", "config", "notes", "tasks": {task name: {"config": the task's settings,
    "regimes": {regime name: RegimeResult.to_json()}}}}``; `tasks` maps a task's name to
    the task object (its dataclass fields are its settings) and its results.
    """
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "config": _clean(config),
        "notes": {"underflow_fraction": UNDERFLOW_NOTE, "lost_update_fraction": LOST_NOTE},
        "tasks": {},
    }
    for name, (task, results) in tasks.items():
        settings = {k: v for k, v in vars(task).items() if k not in ("data", "dataset")}
        out["tasks"][name] = {"config": _clean(settings), "regimes": {r.regime: r.to_json() for r in results}}
    return out


def write_json(document: dict[str, Any], folder: Path, name: str = "results.json") -> Path:
    """Write `document` as indented JSON (no NaN: strict JSON readers accept it)."""
    path = folder / name
    path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path
