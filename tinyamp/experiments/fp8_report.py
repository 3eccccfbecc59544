"""An FP8 run's record, read aloud: what its casts saturated and flushed, and which met an inf or a NaN.

``results.json`` holds, for an FP8 regime, ``fp8["tensors"][name]["series"]``: per step the
amax of the tensor, the scale it was cast with (MXFP8: the smallest and largest block scale),
and how many values saturated, flushed to zero or were not finite.  ``totals`` and
``sentence`` read the whole run; ``nonfinite_lines`` names each cast that met an inf or a
NaN; ``by_role`` adds them up per role of the tensor in a Linear layer (weights, activations,
gradients).  ``figures.draw_fp8_tensors`` draws the series.
"""

from __future__ import annotations

from typing import Any

SHOWN_NONFINITE = 5  # casts named one by one; the rest are counted

# A cast tensor's name is "<layer>.<kind>", "<layer>.<kind>.T" for MXFP8's second blocking (along the other axis).
ROLES = {"weight": "weights", "input": "activations", "grad_output": "gradients"}


def role_of(name: str) -> str:
    """The role of the cast tensor `name` ("blocks.0.mlp.0.weight.T"): "weights", "activations" or "gradients"."""
    parts = name.split(".")
    kind = parts[-2] if parts[-1] == "T" else parts[-1]
    if kind not in ROLES:
        raise ValueError(f"{name!r} is not a cast tensor's name: it ends in none of {', '.join(ROLES)} (or .T)")
    return ROLES[kind]


def by_role(fp8: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Over the whole run, per role: the values cast, and how many saturated, flushed to zero or were not finite."""
    out = {role: {"values": 0, "saturated": 0, "flushed": 0, "nonfinite": 0} for role in ROLES.values()}
    for name, t in fp8["tensors"].items():
        total = out[role_of(name)]
        total["values"] += t["values"] * len(t["series"]["amax"])  # values per cast, one cast a step
        for key in ("saturated", "flushed", "nonfinite"):
            total[key] += sum(t["series"][key])
    return out


def _percent(part: int, whole: int) -> str:
    if not whole:
        return "-"
    share = 100 * part / whole
    return "0%" if part == 0 else f"{share:.2g}%"


def sentence(fp8: dict[str, Any]) -> str:
    """One sentence on a run's casts: the shares saturated and flushed to zero, forward and backward."""
    parts = []
    for pass_, what in (("forward", "E4M3 (activations and weights)"), ("backward", "E5M2 (gradients)")):
        t = fp8["totals"][pass_]
        parts.append(f"of the {t['values']:,} values cast to {what}, {_percent(t['saturated'], t['values'])} "
                     f"saturated and {_percent(t['flushed'], t['values'])} flushed to zero")  # fmt: skip
    bad = sum(fp8["totals"][p]["nonfinite"] for p in ("forward", "backward"))
    tail = "no value was inf or NaN" if not bad else f"{bad:,} values were inf or NaN, cast to NaN (listed below)"
    return f"{fp8['recipe']}: {'; '.join(parts)}; {tail}."


def nonfinite_lines(result: Any) -> list[str]:
    """A line for each cast that met an inf or a NaN (the first few), with what became of its step."""
    fp8, series = result.fp8, result.series
    lines = []
    for e in fp8["nonfinite"][:SHOWN_NONFINITE]:
        i = e["step"] - result.first_step
        skipped = 0 <= i < len(series["skipped"]) and series["skipped"][i]
        fate = "the step was skipped (its gradients were not finite)" if skipped else "the step was NOT skipped"
        n, name = e["values"], e["tensor"]
        values = f"{n:,} values of {name} were" if n != 1 else f"1 value of {name} was"
        lines.append(f"{fp8['recipe']}: step {e['step']}: {values} inf or NaN before the cast: cast to NaN, not "
                     f"saturated, the scale held; {fate}")  # fmt: skip
    more = len(fp8["nonfinite"]) - SHOWN_NONFINITE
    if more > 0:
        lines.append(f"{fp8['recipe']}: and {more} more casts with values that were inf or NaN (results.json, "
                     "fp8.nonfinite, lists them all)")  # fmt: skip
    return lines
