"""An FP8 run's record, read aloud and drawn: what its casts saturated and flushed, and each tensor's scale.

``results.json`` holds, for an FP8 regime, ``fp8["tensors"][name]["series"]``: per step the
amax of the tensor, the scale it was cast with (MXFP8: the smallest and largest block scale),
and how many values saturated, flushed to zero or were not finite.  ``totals`` and
``sentence`` read the whole run; ``nonfinite_lines`` names each cast that met an inf or a
NaN; ``draw_fp8_tensors`` draws the series (matplotlib, as ``figures.py`` does).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp.experiments.figures import LINE_WIDTH, _figure, _smooth, _steps, _values

KIND_COLORS = {"input": "Blues", "weight": "Greens", "grad_output": "Reds"}  # a colormap per kind of tensor
SHOWN_NONFINITE = 5  # casts named one by one; the rest are counted


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


def _kind(name: str) -> str:
    """The kind of a tensor, "input", "weight" or "grad_output", from its name ("blocks.0.mlp.0.grad_output.T")."""
    return next(k for k in KIND_COLORS if f".{k}" in f".{name}")


def _colors(names: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    out = {}
    for kind, cmap in KIND_COLORS.items():
        mine = [n for n in names if _kind(n) == kind]
        for i, n in enumerate(mine):
            out[n] = colormaps[cmap](0.45 + 0.5 * i / max(1, len(mine) - 1))
    return out


def draw_fp8_tensors(result: dict[str, Any], title: str) -> Any:
    """Three panels over the steps, a line per cast tensor: its scale, its amax, and the shares of its
    values saturated (solid) and flushed to zero (dotted), each a moving average; None without FP8."""
    fp8 = result.get("fp8") or {}
    tensors = fp8.get("tensors") or {}
    if not tensors:
        return None
    fig = _figure(9.0, 9.0)
    ax_scale, ax_amax, ax_share = fig.subplots(3, 1, sharex=True)
    colors = _colors(list(tensors))
    for name, t in tensors.items():
        s = t["series"]
        steps = _steps(result, len(s["amax"]))
        if "scale" in s:
            ax_scale.step(steps, _values(s["scale"]), where="post", color=colors[name], lw=LINE_WIDTH, label=name)
        else:  # MXFP8: the band from the smallest to the largest block scale
            low, high = _values(s["scale_low"]), _values(s["scale_high"])
            ax_scale.fill_between(steps, low, high, step="post", color=colors[name], alpha=0.25, lw=0)
            ax_scale.step(steps, low, where="post", color=colors[name], lw=LINE_WIDTH, label=name)
        amax = _values(s["amax"])
        ax_amax.plot(steps, np.where(np.isfinite(amax), amax, np.nan), color=colors[name], lw=LINE_WIDTH)
        bad = np.flatnonzero(np.asarray(s["nonfinite"]) > 0)
        if bad.size:
            top = np.nanmax(amax[np.isfinite(amax)]) if np.isfinite(amax).any() else 1.0
            ax_amax.plot(steps[bad], np.full(bad.size, top), "x", color="#d62728", ms=8, mew=2)
        window = max(1, len(steps) // 60)
        for key, style in (("saturated", "-"), ("flushed", ":")):
            share = _smooth(100 * np.asarray(s[key], dtype=np.float64) / max(1, t["values"]), window)
            ax_share.plot(steps, np.where(share > 0, share, np.nan), style, color=colors[name], lw=LINE_WIDTH)
    per_tensor = "scale (x is multiplied by it before the cast)"
    ax_scale.set_ylabel(per_tensor if "scale" in next(iter(tensors.values()))["series"] else
                        "block scales, smallest (line) to largest")  # fmt: skip
    ax_scale.set_yscale("log", base=2)
    ax_amax.set_ylabel("amax (largest |value|) per step")
    ax_amax.set_yscale("log", base=10)
    ax_share.set_ylabel("% of the values: saturated (solid),\nflushed to zero (dotted)")
    ax_share.set_yscale("log", base=10)
    ax_share.set_xlabel("step")
    totals = fp8["totals"]
    never = [k for k in ("saturated", "flushed") if not totals["forward"][k] + totals["backward"][k]]
    if never:
        ax_share.set_title(f"no value {' or '.join('flushed to zero' if k == 'flushed' else k for k in never)} "
                           "in the whole run", fontsize="small")  # fmt: skip
    if any(totals[p]["nonfinite"] for p in totals):
        ax_amax.set_title("x: a step whose cast met an inf or a NaN (cast to NaN, the step skipped)", fontsize="small")
    for ax in (ax_scale, ax_amax, ax_share):
        ax.grid(True, which="both", alpha=0.3)
    ax_scale.set_title(f"{title}: {fp8['summary']}", fontsize="medium")
    ax_scale.legend(fontsize="xx-small", ncol=3 if len(tensors) > 12 else 1, loc="center left",
                    bbox_to_anchor=(1.01, 0.5))  # fmt: skip
    return fig
