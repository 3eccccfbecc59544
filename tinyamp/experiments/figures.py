"""Figures from results.json: loss curves, the loss scale, measured failures, the gradient histogram.

matplotlib is optional (``pip install "tinyamp[plots]"``); it is imported only here, only
when a figure is drawn, through its object API (``matplotlib.figure.Figure``: no pyplot,
no window, no global state).  Every function takes the ``results.json`` document, so a
figure can be redrawn from a saved file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

# The FP16 bands on a log2 axis: at or below 2^-25 (half the smallest subnormal, 2^-24)
# a value rounds to 0; up to 2^-14 it is subnormal (fewer significant bits; values between
# 2^-25 and 2^-24 round up to 2^-24); up to 65504 (just under 2^16) it is normal; above,
# it overflows to inf.
FP16_BANDS = (
    ("underflow: 0 in FP16", -80.0, -25.0, "#d62728"),
    ("subnormal", -25.0, -14.0, "#ff7f0e"),
    ("normal", -14.0, math.log2(65504.0), "#2ca02c"),
    ("overflow: inf", math.log2(65504.0), 40.0, "#d62728"),
)

COLORS = {"fp32": "#000000", "fp16": "#d62728", "fp16-master": "#ff7f0e", "mixed": "#1f77b4", "bf16-mixed": "#9467bd"}


def matplotlib_available() -> bool:
    """True when matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float = 7.0, height: float = 4.2) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _smooth(values: list[float], window: int) -> np.ndarray:
    """A trailing moving average (the raw minibatch loss is noisy)."""
    v = np.asarray(values, dtype=np.float64)
    if window <= 1 or len(v) < window:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    head = c[1:window] / np.arange(1, window)
    return np.concatenate([head, (c[window:] - c[:-window]) / window])


def loss_curves(task: dict[str, Any], path: Path, title: str) -> Path:
    """The training loss of every regime against the step (smoothed; log scale)."""
    fig = _figure()
    ax = fig.add_subplot()
    spread = []
    for name, r in task["regimes"].items():
        loss = [math.nan if v is None else v for v in r["series"]["loss"]]
        smooth = _smooth(loss, max(1, len(loss) // 60))
        ax.plot(np.arange(len(loss)), smooth, label=name, color=COLORS.get(name), lw=1.4)
        spread += [np.nanmin(smooth), np.nanmax(smooth)]
    if spread and min(spread) > 0 and max(spread) / min(spread) > 20:
        ax.set_yscale("log")  # a loss falling by decades; a narrower range reads better on a linear axis
    ax.set_xlabel("step")
    ax.set_ylabel("minibatch loss (moving average)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(path)
    return path


def loss_scale(task: dict[str, Any], path: Path, title: str) -> Path:
    """The loss scale of every regime that scales, with its skipped (overflowed) steps marked."""
    fig = _figure()
    ax = fig.add_subplot()
    scaled = {n: r for n, r in task["regimes"].items() if r["scaler"] != "off"}
    low, high = math.inf, 0.0
    for name, r in scaled.items():
        scale = np.asarray(r["series"]["scale"], dtype=np.float64)
        steps = np.arange(len(scale))
        skipped = np.flatnonzero(r["series"]["skipped"])
        label = f"{name} ({r['scaler']}): {skipped.size} skipped step{'s' * (skipped.size != 1)}"
        ax.step(steps, scale, where="post", label=label, color=COLORS.get(name), lw=1.4)
        if skipped.size:  # the scale *before* the step: the one that overflowed
            ax.plot(skipped, scale[skipped], "x", color="#d62728", ms=8, mew=2)
        low, high = min(low, scale.min()), max(high, scale.max())
    if not scaled:
        ax.text(0.5, 0.5, "no regime used loss scaling", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.set_yscale("log", base=2)
        ax.set_ylim(low / 2, high * 2)  # a flat line is a scale that never overflowed: show room around it
        ax.plot([], [], "x", color="#d62728", ms=8, mew=2, label="skipped step (gradients not finite)")
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale S (the loss is multiplied by S)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    fig.savefig(path)
    return path


def measurements(task: dict[str, Any], path: Path, title: str) -> Path:
    """Two panels over the steps: the share of gradient values lost to underflow, and of updates lost."""
    fig = _figure(7.0, 5.6)
    top, bottom = fig.subplots(2, 1, sharex=True)
    for name, r in task["regimes"].items():
        if r["underflow_fraction"] is None:
            continue  # FP32: nothing is rounded to 16 bits
        m = r["measured"]
        top.plot(m["step"], [100 * (math.nan if v is None else v) for v in m["underflow_fraction"]],
                 label=name, color=COLORS.get(name), lw=1.2)  # fmt: skip
        lost = [100 * n / c if c else math.nan for c, n in zip(m["changed"], m["lost"])]
        bottom.plot(m["step"], lost, label=name, color=COLORS.get(name), lw=1.2)
    top.set_ylabel("gradient values\nflushed to 0 (%)")
    bottom.set_ylabel("updates lost\nin 16 bits (%)")
    bottom.set_xlabel("step")
    top.set_title(title)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(-3, 103)
    top.legend(fontsize="small")
    fig.savefig(path)
    return path


def gradient_histogram(task: dict[str, Any], path: Path, title: str, regime: str | None = None) -> Path:
    """Histogram of log2|gradient| at the last step, before and after loss scaling, over the FP16 bands.

    In the manner of Figure 3 of Micikevicius et al. (2018): the gradients are those an FP32
    backward computes for the regime's final weights; the shaded bands say what FP16 does to
    a value of that magnitude.
    """
    regimes = task["regimes"]
    if regime is None:
        regime = next((n for n, r in regimes.items() if r["scaler"] != "off"), next(iter(regimes)))
    h = regimes[regime]["histogram"]
    bins = np.asarray(h["log2_bins"], dtype=np.float64)
    scale = float(h["scale"])
    fig = _figure(7.5, 5.6)
    panels = fig.subplots(2, 1, sharex=True)
    shown = [("unscaled", "true gradients (scale 1)"), ("scaled", f"multiplied by the loss scale S = {scale:g}")]
    lo, hi = bins[0] - 1, bins[-1] + 2
    for ax, (key, label) in zip(panels, shown):
        counts = np.asarray(h[key], dtype=np.float64)
        total = counts.sum()
        for _name, a, b, color in FP16_BANDS:
            ax.axvspan(max(a, lo), min(b, hi), color=color, alpha=0.12, lw=0)
        share = total and 100 * counts / total
        ax.bar(bins + 0.5, share, width=1.0, color="#444444", edgecolor="white", lw=0.3)
        under = 100 * counts[bins < -25].sum() / total if total else 0.0
        sub = 100 * counts[(bins >= -25) & (bins < -14)].sum() / total if total else 0.0
        ax.set_title(f"{label}: {under:.1f}% underflow to 0, {sub:.1f}% subnormal in FP16", fontsize="medium")
        ax.set_ylabel("% of nonzero values")
        ax.grid(True, axis="y", alpha=0.3)
    occupied = np.flatnonzero(np.asarray(h["unscaled"]) + np.asarray(h["scaled"]))
    if occupied.size:
        panels[1].set_xlim(bins[occupied[0]] - 2, max(bins[occupied[-1]] + 3, 22))
    left, right = panels[1].get_xlim()
    for name, a, b, color in FP16_BANDS:
        if b > left and a < right:  # label each band that is in view, at its left edge
            panels[0].text(max(a, left) + 0.3, panels[0].get_ylim()[1] * 0.9, name, color=color, fontsize="small")
    panels[1].set_xlabel("log2 |gradient|")
    fig.suptitle(f"{title}: {regime}, last step")
    fig.savefig(path)
    return path


def write_figures(document: dict[str, Any], folder: Path) -> list[Path]:
    """Every figure for every task of a results.json document, as PNG files in `folder`."""
    paths = []
    for name, task in document["tasks"].items():
        what = "digits MLP" if name == "mlp" else "char transformer"
        paths.append(loss_curves(task, folder / f"{name}_loss.png", f"{what}: training loss"))
        paths.append(loss_scale(task, folder / f"{name}_loss_scale.png", f"{what}: loss scale"))
        paths.append(measurements(task, folder / f"{name}_measured.png", f"{what}: what 16 bits lose"))
        paths.append(gradient_histogram(task, folder / f"{name}_gradients.png", f"{what} gradients"))
    return paths
