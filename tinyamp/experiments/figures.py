"""Figures from results.json: loss curves, the loss scale, measured failures, the gradients, FP8 tensors.

matplotlib is optional (``pip install "tinyamp[plots]"``); it is imported only here, only
when a figure is drawn, through its object API (``matplotlib.figure.Figure``: no pyplot,
no window, no global state).  Every function takes one task of the ``results.json``
document, so a figure can be redrawn from a saved file.

Each ``draw_*`` function returns the Figure (or None when the task has nothing for it to
show), so that a test can read its artists; ``write_figures`` saves them.  The rules they
keep, because a student takes a figure at its word:

* every axes shows data, and a legend names only what is drawn;
* a curve hidden under another (within a line width at every step) says so in its label;
* text that explains a shape (a flat loss scale, updates lost as the learning rate reaches
  0) is computed from the data it explains.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

# The FP16 bands on a log2 axis: at or below 2^-25 (half the smallest subnormal, 2^-24)
# a value rounds to 0 (2^-25 itself is a tie, to even: 0); up to 2^-14 it is subnormal
# (fewer significant bits; values between 2^-25 and 2^-24 round up to 2^-24); below
# 65520 it rounds to a normal value (65504 is the largest; 65520 is the tie between 65504
# and 2^16, which rounds to even, to inf); from 65520 on it overflows to inf.
FP16_BANDS = (
    ("underflow to 0 (2^-25 and below)", -80.0, -25.0, "#d62728"),
    ("subnormal (2^-25 to 2^-14)", -25.0, -14.0, "#ff7f0e"),
    ("normal (2^-14 to 65504)", -14.0, math.log2(65520.0), "#2ca02c"),
    ("overflow to inf (65520 and above)", math.log2(65520.0), 40.0, "#d62728"),
)

COLORS = {"fp32": "#000000", "fp16": "#d62728", "fp16-scaled": "#e377c2", "fp16-master": "#ff7f0e",
          "mixed": "#1f77b4", "bf16": "#8c564b", "bf16-mixed": "#9467bd", "fp8": "#2ca02c", "fp8-current": "#17becf",
          "mxfp8": "#bcbd22"}  # fmt: skip
LINE_WIDTH = 1.4  # points
HIDDEN_DASHES = (0, (4.0, 3.0))  # a curve drawn over another is dashed, so the one beneath shows through
TINY_LR = 0.01  # "the learning rate has reached ~0": below 1% of its peak
FEW_POINTS = 20  # a series with fewer points gets markers: a lone measurement is a dot, not an invisible line
KIND_COLORS = {"input": "Blues", "weight": "Greens", "grad_output": "Reds"}  # an FP8 run: a colormap per kind of tensor


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


def _values(series: list[Any]) -> np.ndarray:
    """A results.json series as floats (null, written for NaN and for "not measured", becomes NaN)."""
    return np.array([math.nan if v is None else v for v in series], dtype=np.float64)


def _steps(result: dict[str, Any], n: int) -> np.ndarray:
    """The step numbers of a per-step series of length `n`, from its ``first_step`` (0 unless a run resumed
    from a checkpoint without a history; results.json files older than that field end at ``steps``)."""
    first = result["first_step"] if "first_step" in result else int(result.get("steps", n)) - n
    return first + np.arange(n)


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """A trailing moving average over the finite values of each window (the raw minibatch loss is noisy).

    A step whose loss is NaN (a skipped, overflowed step) drops out of its windows instead of
    turning every later average into NaN; a window with no finite value is NaN.
    """
    v = np.asarray(values, dtype=np.float64)
    if window <= 1 or len(v) < window:
        return v
    finite = np.isfinite(v)
    total = np.cumsum(np.insert(np.where(finite, v, 0.0), 0, 0.0))
    count = np.cumsum(np.insert(finite, 0, False).astype(np.int64))
    starts = np.maximum(np.arange(1, len(v) + 1) - window, 0)  # the window ending at step i starts here
    ends = np.arange(1, len(v) + 1)
    n = count[ends] - count[starts]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (total[ends] - total[starts]) / np.maximum(n, 1), math.nan)


def _scale_text(scale: float) -> str:
    """A loss scale as written: 65536 while %g writes it exactly, 2^24 for a larger power of two."""
    if f"{scale:g}" == f"{scale:.17g}" or not scale > 0 or not math.log2(scale).is_integer():
        return f"{scale:g}"
    return f"2^{int(math.log2(scale))}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _hidden_under(fig: Any, ax: Any, lines: list[Any]) -> dict[int, tuple[int, bool]]:
    """Which curves lie on an earlier one: {index: (index of the earlier curve, exactly equal?)}.

    A curve is hidden when, at every step where either has a value, both have one and the
    drawn strokes are less than a line width apart (in pixels, after the layout is done).
    Among several earlier curves, an exact copy is named first, then the first one it lies on.
    """
    fig.draw_without_rendering()  # the layout fixes the axes' height, and so how far apart two values are drawn
    found: dict[int, tuple[int, bool]] = {}
    for j, b in enumerate(lines):
        xb, yb = np.asarray(b.get_xdata(), dtype=np.float64), np.asarray(b.get_ydata(), dtype=np.float64)
        width = b.get_linewidth() * fig.dpi / 72
        candidates = []
        for i, a in enumerate(lines[:j]):
            xa, ya = np.asarray(a.get_xdata(), dtype=np.float64), np.asarray(a.get_ydata(), dtype=np.float64)
            if (
                xa.shape != xb.shape
                or not np.array_equal(xa, xb)
                or not np.array_equal(np.isfinite(ya), np.isfinite(yb))
            ):
                continue
            both = np.isfinite(ya) & np.isfinite(yb)
            if not both.any():
                continue
            if np.array_equal(ya[both], yb[both]):
                candidates.append((0, i, True))
                continue
            pa = ax.transData.transform(np.column_stack([xa[both], ya[both]]))[:, 1]
            pb = ax.transData.transform(np.column_stack([xb[both], yb[both]]))[:, 1]
            if np.max(np.abs(pa - pb)) <= width:
                candidates.append((1, i, False))
        if candidates:
            _, i, exact = min(candidates)
            found[j] = (i, exact)
    return found


def _say_hidden(fig: Any, ax: Any, lines: list[Any], names: list[str], gap: Any, sep: str = " ") -> None:
    """Relabel (and dash) each curve hidden under an earlier one; `gap(i, j)` says how far apart they are.

    `sep` goes between the name and the note ("\n" for a narrow legend beside the axes).
    """
    for j, (i, exact) in _hidden_under(fig, ax, lines).items():
        if exact:
            lines[j].set_label(f"{names[j]}{sep}(identical to {names[i]})")
        else:
            lines[j].set_label(f"{names[j]}{sep}(on top of {names[i]}: {gap(i, j)})")
        lines[j].set_linestyle(HIDDEN_DASHES)


def draw_loss_curves(task: dict[str, Any], title: str) -> Any:
    """The training loss of every regime against the step (smoothed; log scale when it falls by decades)."""
    fig = _figure()
    ax = fig.add_subplot()
    names, lines, smoothed = [], [], []
    for name, r in task["regimes"].items():
        loss = _values(r["series"]["loss"])
        smooth = _smooth(loss, max(1, len(loss) // 60))
        if not np.isfinite(smooth).any():
            continue  # a loss that was never finite has nothing to draw
        (line,) = ax.plot(_steps(r, len(loss)), smooth, label=name, color=COLORS.get(name), lw=LINE_WIDTH)
        names.append(name)
        lines.append(line)
        smoothed.append(smooth)
    ax.set_xlabel("step")
    ax.set_ylabel("minibatch loss (moving average)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if not lines:
        return None
    spread = np.concatenate([s[np.isfinite(s)] for s in smoothed])
    if spread.min() > 0 and spread.max() / spread.min() > 20:
        ax.set_yscale("log")  # a loss falling by decades; a narrower range reads better on a linear axis

    def gap(i: int, j: int) -> str:
        a, b = smoothed[i], smoothed[j]
        both = np.isfinite(a) & np.isfinite(b) & (a != 0)
        return f"at most {100 * np.max(np.abs(b[both] - a[both]) / np.abs(a[both])):.2g}% apart"

    _say_hidden(fig, ax, lines, names, gap)
    _annotate_failures(ax, task["regimes"], dict(zip(names, lines)))
    resumed = sorted({s for r in task["regimes"].values() for s in r.get("resumed_at") or []})
    for i, step in enumerate(resumed):  # where a stopped run went on from its checkpoint
        ax.axvline(step, color="0.5", lw=0.8, ls=":", label="resumed from a checkpoint" if i == 0 else None)
    ax.legend(fontsize="small")
    return fig


def _annotate_failures(ax: Any, regimes: dict[str, Any], lines: dict[str, Any]) -> None:
    """Write beside the end of each failed curve how far it ended from FP32 and what the run measured."""
    from tinyamp.experiments.diagnosis import diagnose

    for name, verdict in diagnose(regimes).items():
        if not verdict.failed or name not in lines:
            continue
        x, y = lines[name].get_xdata()[-1], lines[name].get_ydata()[-1]
        lost = regimes[name].get("lost_update_fraction")
        why = f"{100 * lost:.0f}% of its updates lost" if lost is not None else "; ".join(verdict.causes[:1])
        side = "above" if verdict.points > 0 else "below"
        ax.annotate(f"{name} FAILED: {verdict.loss_ratio:.1f}x FP32's final loss, test accuracy\n"
                    f"{abs(verdict.points):.1f} points {side} FP32's: {why}", xy=(x, y), xytext=(-4, -12),
                    textcoords="offset points", ha="right", va="top", fontsize="small",
                    color=lines[name].get_color())  # fmt: skip


def draw_loss_scale(task: dict[str, Any], title: str) -> Any:
    """The loss scale of every regime that scales, its skipped (overflowed) steps marked.

    When no regime scales its loss, the scale they all ran at (1) is drawn, with any step
    skipped because its gradients were not finite (a LossScaler in mode "off" still skips them).
    """
    fig = _figure()
    ax = fig.add_subplot()
    shown = {n: r for n, r in task["regimes"].items() if r["scaler"] != "off"}
    scaling = bool(shown)
    if not scaling:
        shown = dict(task["regimes"])
    names, lines, constant, scales = [], [], [], []
    low, high = math.inf, 0.0
    skip_label = "skipped step (gradients not finite)"
    for name, r in shown.items():
        scale = _values(r["series"]["scale"])
        steps = _steps(r, len(scale))
        skipped = steps[np.flatnonzero(r["series"]["skipped"])]
        unchanged = bool(np.all(scale == scale[0]))
        scaler = f"{r['scaler']} scaler" if r["scaler"] != "off" else "no loss scaling"
        first, last = _scale_text(scale[0]), _scale_text(scale[-1])
        course = f"{first} throughout" if unchanged else f"{first} at first, {last} at the last step"
        skips = _plural(skipped.size, "skipped step") if skipped.size else "no step skipped"
        label = f"{name} ({scaler}): {course}, {skips}"
        (line,) = ax.step(steps, scale, where="post", label=label, color=COLORS.get(name), lw=LINE_WIDTH)
        if skipped.size:  # the scale *before* the step: the one that overflowed
            ax.plot(skipped, scale[skipped - steps[0]], "x", color="#d62728", ms=8, mew=2, label=skip_label)
            skip_label = "_nolegend_"  # one legend entry for the markers of every regime
        names.append(name)
        lines.append(line)
        constant.append(unchanged)
        scales.append(scale)
        low, high = min(low, scale.min()), max(high, scale.max())
    steps_run = max(len(r["series"]["scale"]) for r in shown.values())
    if not scaling:
        title = f"{title}: no regime scaled its loss" + (f" (S = {_scale_text(low)})" if low == high else "")
    elif all(constant):
        title = f"{title}: never changed in {_plural(steps_run, 'step')}"
    ax.set_yscale("log", base=2)
    ax.set_ylim(low / 2, high * 2)  # a flat line is a scale that never overflowed: show room around it
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale S (the loss is multiplied by S)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)

    def gap(i: int, j: int) -> str:
        return f"at most a factor {np.nanmax(np.maximum(scales[i], scales[j]) / np.minimum(scales[i], scales[j])):.3g}"

    _say_hidden(fig, ax, lines, names, gap)
    ax.legend(fontsize="small")
    return fig


def _lost_percent(measured: dict[str, list[Any]]) -> np.ndarray:
    """Per measured step: lost updates as a % of the elements the optimizer changed (NaN where none was)."""
    return np.array([100 * n / c if c else math.nan for c, n in zip(measured["changed"], measured["lost"])])


def _tiny_lr_from(lr: np.ndarray) -> int | None:
    """The index from which the learning rate stays below TINY_LR of its peak to the end, or None."""
    if lr.size == 0 or not lr.max() > 0:
        return None
    tiny = lr < TINY_LR * lr.max()
    if not tiny[-1]:
        return None
    return int(np.flatnonzero(~tiny)[-1] + 1) if (~tiny).any() else 0


def _explain_the_lr(ax: Any, task: dict[str, Any], lost: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Draw the learning rate on the lost-updates panel, and shade where it has fallen to ~0.

    An update is lr times a gradient-sized step, and a 16-bit weight keeps it only when it is
    above half an ulp of the weight: as a schedule takes the lr to 0, every update is lost,
    whatever the precision of the gradients.  Drawn only when the lr changed over the run.
    """
    with_lr = [r for r in task["regimes"].values() if r["series"].get("lr")]
    if not with_lr:
        return
    lr = _values(with_lr[0]["series"]["lr"])  # one task, one schedule: every regime ran the same lr
    steps = _steps(with_lr[0], lr.size)
    if not np.isfinite(lr).all() or lr.max() == lr.min():
        return
    peak = lr.max()
    ax.plot(steps, 100 * lr / peak, color="#7f7f7f", lw=1.0, ls=":",
            label=f"learning rate, % of its peak ({peak:g})")  # fmt: skip
    tiny = _tiny_lr_from(lr)
    if tiny is None:
        return
    start = int(steps[tiny])
    inside = [p[s >= start] for s, p in lost.values()]
    inside = np.concatenate(inside) if inside else np.zeros(0)
    share = ""
    if np.isfinite(inside).any():
        low, high = f"{np.nanmin(inside):.0f}%", f"{np.nanmax(inside):.0f}%"
        share = f";\nlost there: {low}" if low == high else f";\nlost there: {low} to {high}"
    ax.axvspan(start, steps[-1] + 1, color="#7f7f7f", alpha=0.15, lw=0,
               label=f"lr below {100 * TINY_LR:g}% of its peak from step {start}\n"
                     f"(down to {lr[-1]:.1g}), the updates with it{share}")  # fmt: skip


def draw_measurements(task: dict[str, Any], title: str) -> Any:
    """The share of gradient values 16 bits flush to 0 and of updates they lose, over the steps.

    One panel for each measurement some regime has: FP32 weights lose no update in 16 bits,
    so an FP32 run alone gets one panel, the share of *its* gradients FP16 would flush to 0
    (the runner measures it for FP32 too).  None when nothing at all was measured.
    """
    regimes = task["regimes"]

    def measured(r: dict[str, Any], key: str) -> np.ndarray:
        return 100 * _values(r["measured"].get(key, []))

    flushed = {n: r for n, r in regimes.items() if r["underflow_fraction"] is not None}
    as_if_fp16 = not flushed  # no 16-bit regime: show what FP16 would do to the FP32 gradients
    if as_if_fp16:
        flushed = dict(regimes)
    flushed = {n: r for n, r in flushed.items() if np.isfinite(measured(r, "underflow_fraction")).any()}
    lost = {
        n: (np.asarray(r["measured"]["step"]), _lost_percent(r["measured"]))
        for n, r in regimes.items()
        if any(r["measured"]["changed"])
    }
    if not flushed and not lost:
        return None
    fig = _figure(9.0, 5.6 if flushed and lost else 3.6)
    panels = list(np.atleast_1d(fig.subplots(int(bool(flushed)) + int(bool(lost)), 1, sharex=True)))
    if not lost:
        fp32 = all(r["lost_update_fraction"] is None for r in regimes.values())
        title = f"{title}\n(no lost updates to measure: {'the weights are FP32' if fp32 else 'no weight changed'})"
    panels[0].set_title(title)
    panels[-1].set_xlabel("step")
    for ax in panels:  # limits and text first: whether two curves are drawn apart depends on the layout
        ax.grid(True, alpha=0.3)
        ax.set_ylim(-3, 103)
    if flushed:
        ax = panels[0]
        names, lines = [], []
        for name, r in flushed.items():
            y = measured(r, "underflow_fraction")
            label = f"{name} (its gradients, rounded to FP16{_at_scale(r)})" if as_if_fp16 else name
            (line,) = ax.plot(r["measured"]["step"], y, label=label, color=COLORS.get(name), lw=1.2,
                              marker="." if len(y) < FEW_POINTS else None)  # fmt: skip
            names.append(name)
            lines.append(line)
        ax.set_ylabel(
            "gradient values FP16\nwould flush to 0 (%)" if as_if_fp16 else "gradient values\nflushed to 0 (%)"
        )
        lines_y = {n: measured(r, "underflow_fraction") for n, r in flushed.items()}
        _say_hidden(fig, ax, lines, names, lambda i, j: _points_apart(lines_y[names[i]], lines_y[names[j]]), "\n")
    if lost:
        ax = panels[-1]
        names, lines = [], []
        for name, (steps, y) in lost.items():
            (line,) = ax.plot(steps, y, label=name, color=COLORS.get(name), lw=1.2,
                              marker="." if len(y) < FEW_POINTS else None)  # fmt: skip
            names.append(name)
            lines.append(line)
        ax.set_ylabel("updates lost\nin 16 bits (%)")
        _say_hidden(fig, ax, lines, names, lambda i, j: _points_apart(lost[names[i]][1], lost[names[j]][1]), "\n")
        _explain_the_lr(ax, task, lost)
    for ax in panels:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def _at_scale(result: dict[str, Any]) -> str:
    """The words " at S = 1" when the run kept one loss scale throughout (the underflow was measured at it)."""
    scale = _values(result["series"]["scale"])
    return f" at S = {_scale_text(scale[0])}" if scale.size and np.all(scale == scale[0]) else ""


def _points_apart(a: np.ndarray, b: np.ndarray) -> str:
    """How far apart two percentage curves are at most, in percentage points."""
    both = np.isfinite(a) & np.isfinite(b)
    return f"at most {np.max(np.abs(a[both] - b[both])):.2g} points apart"


def _percent_of(counts: np.ndarray, mask: np.ndarray) -> float:
    """The share of the counted values in the bins `mask` selects, in % (0 when nothing was counted)."""
    total = counts.sum()
    return float(100 * counts[mask].sum() / total) if total else 0.0


def draw_gradient_histogram(task: dict[str, Any], title: str, regime: str | None = None) -> Any:
    """Histogram of log2|gradient| at the last step, before and after loss scaling, over the FP16 bands.

    In the manner of Figure 3 of Micikevicius et al. (2018): the gradients are those an FP32
    backward computes for the regime's final weights; the shaded bands say what FP16 does to
    a value of that magnitude.  A regime without loss scaling (S = 1) gets one panel: scaled
    and unscaled are the same values.
    """
    regimes = task["regimes"]
    if regime is None:
        regime = next((n for n, r in regimes.items() if r["scaler"] != "off"), next(iter(regimes)))
    h = regimes[regime]["histogram"]
    bins = np.asarray(h["log2_bins"], dtype=np.float64)
    scale = float(h["scale"])
    shown = [("unscaled", "true gradients" + (" (S = 1: no loss scaling)" if scale == 1 else " (scale 1)"))]
    if scale != 1:
        shown.append(("scaled", f"multiplied by the loss scale S = {scale:g}"))
    fig = _figure(7.5, 5.6 if len(shown) == 2 else 3.8)
    panels = list(np.atleast_1d(fig.subplots(len(shown), 1, sharex=True)))
    occupied = np.flatnonzero(np.asarray(h["unscaled"]) + np.asarray(h["scaled"]))
    if occupied.size:  # the bins in use, and at least up to 2^22: the overflow band stays in view
        lo, hi = bins[occupied[0]] - 2, max(bins[occupied[-1]] + 3, 22)
    else:
        lo, hi = bins[0] - 1, bins[-1] + 2
    bands = []
    for ax, (key, label) in zip(panels, shown):
        counts = np.asarray(h[key], dtype=np.float64)
        total = counts.sum()
        for name, a, b, color in FP16_BANDS:
            if b > lo and a < hi:  # only the bands in view, so that the legend names only what is seen
                span = ax.axvspan(max(a, lo), min(b, hi), color=color, alpha=0.12, lw=0, label=name)
                if ax is panels[0]:
                    bands.append(span)
        share = 100 * counts / total if total else counts
        ax.bar(bins + 0.5, share, width=1.0, color="#444444", edgecolor="white", lw=0.3)
        under, sub, over = (_percent_of(counts, m) for m in (bins < -25, (bins >= -25) & (bins < -14), bins >= 16))
        said = f"{under:.1f}% underflow to 0, {sub:.1f}% subnormal"
        if over > 0:  # 2^16 and above: past 65504, inf
            said += f", {over:.1f}% overflow to inf"
        ax.set_title(f"{label}: {said} in FP16", fontsize="medium")
        ax.set_ylabel("% of nonzero values")
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_xlim(lo, hi)
    panels[-1].set_xlabel("log2 |gradient|")
    fig.suptitle(f"{title}: {regime}, last step")
    # The band names under the axes, not on the bands: a narrow band cannot hold its name.
    fig.legend(handles=bands, loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    return fig


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


def _log_scale_if_positive(ax: Any, base: int) -> None:
    """A log y axis where the panel has a positive value to show; a linear one where it has none (a short run
    in which no value saturated or flushed: a log axis of nothing but gaps makes matplotlib raise)."""
    ys = [np.asarray(line.get_ydata(), dtype=np.float64) for line in ax.get_lines()]
    if any((np.isfinite(y) & (y > 0)).any() for y in ys):
        ax.set_yscale("log", base=base)


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
    ax_amax.set_ylabel("amax (largest |value|) per step")
    ax_share.set_ylabel("% of the values: saturated (solid),\nflushed to zero (dotted)")
    for ax, base in ((ax_scale, 2), (ax_amax, 10), (ax_share, 10)):
        _log_scale_if_positive(ax, base)
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


def write_figures(document: dict[str, Any], folder: Path) -> list[Path]:
    """Every figure for every task of a results.json document, as PNG files in `folder`.

    A figure with nothing to show (no regime measured anything) is not written, so the
    list returned names only files that exist.
    """
    paths = []
    for name, task in document["tasks"].items():
        what = {"mlp": "digits MLP", "transformer": "char transformer", "wordlm": "word-level model"}.get(name, name)
        for kind, fig in (
            ("loss", draw_loss_curves(task, f"{what}: training loss")),
            ("loss_scale", draw_loss_scale(task, f"{what}: loss scale")),
            ("measured", draw_measurements(task, f"{what}: what 16 bits lose")),
            ("gradients", draw_gradient_histogram(task, f"{what} gradients")),
        ):
            if fig is not None:
                path = folder / f"{name}_{kind}.png"
                fig.savefig(path)
                paths.append(path)
        for regime, result in task["regimes"].items():  # each FP8 regime: its tensors' scales and counts
            fig = draw_fp8_tensors(result, f"{what}, {regime}")
            if fig is not None:
                path = folder / f"{name}_{regime}_tensors.png"
                fig.savefig(path)
                paths.append(path)
    return paths
