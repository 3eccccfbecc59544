"""A run's history in its checkpoint, so that a resumed run reports the whole run, not its last part.

The runner records, per step, the loss, the loss scale, whether the step was skipped and the
learning rate (``series``), and at the measured steps the lost updates and the underflow
(``measured``).  `tinyamp train` saves them in the checkpoint's ``extra`` as NumPy arrays (8
bytes a step each, read within load_checkpoint's budget for extra arrays), and a resumed run
starts from them: its table, results.json and figures cover every step from the first, and
``resumed_at`` lists the steps where it was resumed.  Like everything in a checkpoint, the
history is checked before it is used (one sentence naming the file).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

SERIES = {"loss": np.float64, "scale": np.float64, "skipped": np.bool_, "lr": np.float64}
MEASURED = {
    "step": np.int64,
    "changed": np.float64,  # counts, with NaN for "not counted" (None in results.json)
    "lost": np.float64,
    "underflow_fraction": np.float64,
    "underflow_norm_fraction": np.float64,
}
_COUNTS = ("changed", "lost")


def new(start: int = 0) -> dict[str, Any]:
    """An empty history for a run that starts at step `start` (one resumed from a checkpoint without a history)."""
    return {
        "first_step": start,
        "resumed_at": [start] if start else [],
        "series": {k: [] for k in SERIES},
        "measured": {k: [] for k in MEASURED},
    }


def to_extra(history: dict[str, Any], upto: int) -> dict[str, Any]:
    """The history of the steps before `upto`, as a checkpoint saved at step `upto` stores it: numbers and arrays."""
    first = history["first_step"]
    kept = sum(1 for s in history["measured"]["step"] if s < upto)

    def column(values: list[Any], dtype: Any) -> np.ndarray:
        return np.array([math.nan if v is None else v for v in values], dtype=dtype)

    return {
        "first_step": int(first),
        "resumed_at": [int(s) for s in history["resumed_at"] if s < upto],
        "series": {k: column(history["series"][k][: upto - first], t) for k, t in SERIES.items()},
        "measured": {k: column(history["measured"][k][:kept], t) for k, t in MEASURED.items()},
    }


def from_extra(saved: Any, start: int, path: str) -> dict[str, Any]:
    """The history a checkpoint saved at step `start` holds, checked, as lists the runner appends to.

    Raises ValueError (one sentence naming `path`) for anything `to_extra` never writes.
    """

    def bad(what: str) -> ValueError:
        return ValueError(f"{path}: the checkpoint's history {what}; the file was edited or damaged")

    if not isinstance(saved, dict) or set(saved) != {"first_step", "resumed_at", "series", "measured"}:
        raise bad("is not the table of series tinyamp writes")
    first = saved["first_step"]
    if type(first) is not int or not 0 <= first <= start:
        raise bad(f"starts at step {first!r}, not a step from 0 to {start}")
    resumed = saved["resumed_at"]
    if not (isinstance(resumed, list) and all(type(s) is int and first < s < start for s in resumed)):
        raise bad(f"says it was resumed at {resumed!r}, not steps between {first} and {start}")
    columns = {}
    for part, kinds, length in (("series", SERIES, start - first), ("measured", MEASURED, None)):
        table = saved[part]
        if not isinstance(table, dict) or set(table) != set(kinds):
            raise bad(f"has no {part} of {', '.join(kinds)}")
        for key, dtype in kinds.items():
            values = table[key]
            if not (isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype == dtype):
                raise bad(f"stores {part} {key} as something other than a list of {np.dtype(dtype).name}")
            length = len(values) if length is None else length
            if len(values) != length:
                raise bad(f"holds {len(values)} values of {part} {key}, not {length}")
            columns[part, key] = values
    steps = columns["measured", "step"]
    if len(steps) and (steps.min() < first or steps.max() >= start or (np.diff(steps) <= 0).any()):
        raise bad(f"lists measured steps outside {first}..{start - 1} or out of order")

    def as_list(part: str, key: str) -> list[Any]:
        values = columns[part, key].tolist()
        if key in _COUNTS:
            return [None if math.isnan(v) else int(v) for v in values]
        return values

    return {
        "first_step": first,
        "resumed_at": [*resumed, start] if start > first else list(resumed),
        "series": {k: as_list("series", k) for k in SERIES},
        "measured": {k: as_list("measured", k) for k in MEASURED},
    }
