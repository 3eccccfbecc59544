"""Results of gpu_check.py: one Section per part of the check, a Markdown table, a JSON file.

A section records numbers as it measures them, so what it measured before failing is
still reported; its status is "ok", "FAILED" or "skipped".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Row:
    """One line of the final table."""

    section: str
    metric: str
    value: str
    target: str = ""
    met: str = ""


@dataclass
class Section:
    """What one section measured: raw numbers (for the JSON) and table rows (for people)."""

    name: str
    status: str = "pending"
    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    error: str | None = None
    log: list[str] = field(default_factory=list)

    def record(self, key: str, value: Any, label: str | None = None, shown: str | None = None,
               target: str = "", met: bool | None = None) -> None:  # fmt: skip
        """Keep `value` under `key`; with a `label`, also add a table row showing `shown` (default str(value))."""
        self.metrics[key] = value
        if label is not None:
            self.rows.append(Row(self.name, label, str(value) if shown is None else shown, target,
                                 "" if met is None else ("yes" if met else "NO")))  # fmt: skip

    def say(self, line: str) -> None:
        """Print a progress line and keep it in the log."""
        print(f"  [{self.name}] {line}", flush=True)
        self.log.append(line)


def ms(seconds: float) -> str:
    """Seconds as milliseconds for the table."""
    return f"{1e3 * seconds:.3f} ms" if seconds < 0.01 else f"{1e3 * seconds:.2f} ms"


def mib(n_bytes: float) -> str:
    """Bytes as MiB (or GiB) for the table."""
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.2f} MiB"


def times(ratio: float) -> str:
    """A ratio, as '3.21x'."""
    return f"{ratio:.3g}x"


def markdown_table(sections: list[Section], dry_run: bool = False) -> str:
    """Every section's rows, and the status of those that did not succeed, as one Markdown table.

    In a dry run the targets are GPU targets, so the met? column says so instead of judging.
    """
    lines = ["| section | metric | value | target | met? |", "|---|---|---:|---|---|"]
    for s in sections:
        rows = list(s.rows)
        if s.status != "ok":
            why = (s.error or "").strip().splitlines()[-1:] or [""]
            rows.append(Row(s.name, "status", s.status, "", why[0][:100]))
        for r in rows:
            met = "n/a (dry run)" if dry_run and r.met in ("yes", "NO") else r.met
            lines.append(f"| {r.section} | {r.metric} | {r.value} | {r.target} | {met} |")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    """JSON-safe: NaN and inf become None, tuples lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def write_json(path: Path, meta: dict[str, Any], sections: list[Section]) -> None:
    """Every number of the run, by section, with the table rows and any error."""
    doc = {
        "meta": meta,
        "sections": {
            s.name: {
                "status": s.status, "seconds": s.seconds, "metrics": s.metrics, "error": s.error,
                "rows": [vars(r) for r in s.rows], "log": s.log,
            }
            for s in sections
        },
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_plain(doc), indent=2, default=str))
