"""One mixed-precision training step as a dataflow picture, measured from a real step.

After Figure 1 of Micikevicius et al. (2018): 16-bit weights -> forward (16-bit
activations) -> loss (FP32) -> loss x S -> backward (16-bit gradients) -> unscale by 1/S
and check for inf/NaN (FP32) -> the optimizer updates the FP32 masters -> the masters are
rounded back into the 16-bit weights.  ``record_step`` runs that step once, with your
model, loss, optimizer and scaler, and measures each stage from the arrays themselves:
their dtypes and their bytes (``nbytes``).  ``draw_step_record`` draws what it measured;
``draw_mixed_precision_step`` does both.  Nothing on the picture is typed in: with FP32
weights it shows FP32 weights, without a MasterWeights it shows no master copy.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tinyamp import backend
from tinyamp.inspect.draw_graph import dtype_colors
from tinyamp.inspect.saved import saved_tensors
from tinyamp.tensor import Tensor

Bytes = dict[str, int]  # dtype name -> bytes


def bytes_by_dtype(arrays: Iterable[Any]) -> Bytes:
    """Bytes of the arrays by dtype name, each array once (None skipped)."""
    out: Bytes = {}
    seen: set[int] = set()
    for a in arrays:
        if a is None or id(a) in seen or not backend.is_array(a):
            continue
        seen.add(id(a))
        out[a.dtype.name] = out.get(a.dtype.name, 0) + int(a.nbytes)
    return out


@dataclass(frozen=True)
class StepRecord:
    """What one step held at each stage, measured: bytes by dtype, and what the step decided."""

    weights: Bytes  # the model's parameters, before the step (what the forward reads)
    saved: Bytes  # arrays the graph kept for backward, other than leaves (activations, cast copies)
    loss: Bytes
    scale: float
    scaled_loss: Bytes
    gradients: Bytes  # the model parameters' .grad after backward
    unscaled: Bytes  # the .grad of what the optimizer updates, after unscaling (a MasterWeights' FP32 masters)
    nonfinite: tuple[str, ...]  # parameters whose gradient held an inf or NaN: the step is skipped
    updated: Bytes  # what the optimizer updates: the masters, or the model's own parameters
    optimizer_state: Bytes
    has_masters: bool  # False: the optimizer updated the model's parameters directly, nothing to round
    rounded: Bytes  # the model's parameters after the step
    changed: int  # elements of the model's parameters the step changed
    elements: int  # elements of the model's parameters
    scale_after: float  # the loss scale for the next step
    event: str  # what the scaler's rule did ("held", "grew", "backed_off", ...)


def record_step(model: Any, loss_fn: Callable[[], Tensor], optimizer: Any, scaler: Any) -> StepRecord:
    """Run one training step and measure every stage of it.

    `loss_fn()` runs the forward pass on `model` and returns the loss (wrap it in autocast
    if that is the recipe).  The step is the usual one: ``optimizer.zero_grad()``,
    ``scaler.scale_loss(loss).backward()``, ``scaler.unscale_(optimizer)``,
    ``scaler.step(optimizer)``; the gradients are left in place for you to read.
    """
    params = model.parameters()
    before = [p.data.copy() for p in params]
    weights = bytes_by_dtype(p.data for p in params)
    optimizer.zero_grad()
    loss = loss_fn()
    saved = {}
    for row in saved_tensors(loss).rows:  # each array once; leaves (weights, the batch) are held anyway
        if row.shared_with is None and row.kind != "leaf":
            saved[row.dtype] = saved.get(row.dtype, 0) + row.nbytes
    scale = scaler.scale
    scaled = scaler.scale_loss(loss)
    scaled.backward()
    gradients = bytes_by_dtype(p.grad for p in params)
    flags = scaler.unscale_(optimizer)
    updated_params = optimizer.params  # a MasterWeights' masters, or the model's parameters
    unscaled = bytes_by_dtype(p.grad for p in updated_params)
    report = scaler.step(optimizer)
    inner = getattr(optimizer, "optimizer", optimizer)  # the optimizer inside a MasterWeights
    own = {id(p) for p in params}
    changed = sum(int((b != p.data).sum()) for b, p in zip(before, params))
    return StepRecord(
        weights=weights, saved=saved, loss=bytes_by_dtype([loss.data]), scale=scale,
        scaled_loss=bytes_by_dtype([scaled.data]), gradients=gradients, unscaled=unscaled,
        nonfinite=tuple(name for name, bad in flags.items() if bad),
        updated=bytes_by_dtype(p.data for p in updated_params),
        optimizer_state=bytes_by_dtype(v for s in inner.state for v in s.values()),
        has_masters=any(id(p) not in own for p in updated_params), rounded=bytes_by_dtype(p.data for p in params),
        changed=changed, elements=sum(p.size for p in params), scale_after=report.scale_after, event=report.event,
    )  # fmt: skip


def draw_mixed_precision_step(model: Any, loss_fn: Callable[[], Tensor], optimizer: Any, scaler: Any) -> Any:
    """Run one real training step (``record_step``) and draw it (``draw_step_record``): a matplotlib Figure."""
    return draw_step_record(record_step(model, loss_fn, optimizer, scaler))


def _lines(by_dtype: Bytes) -> list[str]:
    return [f"{dtype}: {n:,} B" for dtype, n in by_dtype.items()] or ["(nothing)"]


def _main_dtype(by_dtype: Bytes) -> str:
    """The dtype holding the most bytes: the box's fill (a box of several dtypes also draws a bar of their shares)."""
    return max(by_dtype, key=by_dtype.get) if by_dtype else ""


def _scale_text(s: float) -> str:
    """The loss scale as written: 2^16 for a power of two, else %g."""
    return f"2^{int(math.log2(s))}" if s >= 2 and math.log2(s).is_integer() else f"{s:g}"


def _stages(r: StepRecord) -> list[tuple[str, str, list[str], Bytes]]:
    """(gid, title, lines, bytes that colour the box) for the eight stages, in the order of the step."""
    skipped = bool(r.nonfinite)
    check = ["all finite: the step is taken"]
    if skipped:  # the names, shortened to the box's width
        many = f"{len(r.nonfinite)} gradient{'s' * (len(r.nonfinite) != 1)}"
        check = [f"inf/NaN in {many}: step skipped", textwrap.shorten(", ".join(r.nonfinite), 40, placeholder=" ...")]
    update_what = "the master copies" if r.has_masters else "the weights"  # their dtype: on the lines below
    state = [f"optimizer state, {line}" for line in _lines(r.optimizer_state)] if r.optimizer_state else []
    if r.has_masters:
        rounded = [*_lines(r.rounded), f"{r.changed:,} of {r.elements:,} values changed"]
    else:
        rounded = ["no master copy: nothing to round", f"{r.changed:,} of {r.elements:,} values changed"]
    return [
        ("weights", "weights (the forward reads)", [*_lines(r.weights), f"{r.elements:,} values"], r.weights),
        ("forward", "forward: saved for backward", _lines(r.saved), r.saved),
        ("loss", "loss", _lines(r.loss), r.loss),
        ("scaled", f"scaled loss: loss x {_scale_text(r.scale)}", _lines(r.scaled_loss), r.scaled_loss),
        ("backward", "backward: weight gradients", _lines(r.gradients), r.gradients),
        ("unscale", f"unscale (x 1/{_scale_text(r.scale)}) and check", [*_lines(r.unscaled), *check], r.unscaled),
        ("update", f"update {update_what}" + (" (skipped)" if skipped else ""), _lines(r.updated) + state, r.updated),
        ("round", "round into the weights" if r.has_masters else "the weights after the step", rounded, r.rounded),
    ]


BOX_W, BOX_H = 2.7, 1.35  # inches
SHARE_H = 0.14  # the height of a mixed box's bar of dtype shares, inches
SLOTS = [(0, 1), (1, 1), (2, 1), (3, 1), (3, 0), (2, 0), (1, 0), (0, 0)]  # (column, row): a loop, clockwise


def draw_step_record(record: StepRecord, title: str | None = None) -> Any:
    """Draw a StepRecord: eight boxes in a loop, each filled in the colour of the dtype that holds most of its bytes.

    Each box lists "dtype: bytes" for every dtype it measured.  A box that holds several dtypes
    says so: along its bottom a bar split by each dtype's share of the bytes, in their line colours
    (gid "share:NAME:DTYPE"), and the figure's second line says what the fill means.  Other
    artists carry the gid "stage:NAME" (weights, forward, loss, scaled, backward, unscale,
    update, round).
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

    fig = Figure(figsize=(12.4, 4.9), dpi=100)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, 12.4)
    ax.set_ylim(0, 4.9)
    ax.set_axis_off()
    corners = [(0.35 + c * (BOX_W + 0.35), 0.3 + r * (BOX_H + 0.75)) for c, r in SLOTS]
    stages = _stages(record)
    for (gid, heading, lines, colour_by), (x, y) in zip(stages, corners):
        fill, edge = dtype_colors(_main_dtype(colour_by))
        ax.add_patch(FancyBboxPatch((x, y), BOX_W, BOX_H, boxstyle="round,pad=0,rounding_size=0.12", facecolor=fill,
                                    edgecolor=edge, lw=1.4, gid=f"stage:{gid}"))  # fmt: skip
        ax.text(x + 0.12, y + BOX_H - 0.12, heading, ha="left", va="top", fontsize=8.5, fontweight="bold",
                gid=f"stage:{gid}")  # fmt: skip
        ax.text(x + 0.12, y + BOX_H - 0.42, "\n".join(lines), ha="left", va="top", fontsize=8, linespacing=1.3,
                gid=f"stage:{gid}")  # fmt: skip
        if len(colour_by) > 1:  # a mixed box: its fill is the majority's, the bar shows every share
            left, total = x + 0.12, sum(colour_by.values())
            for dtype, n in colour_by.items():
                width = (BOX_W - 0.24) * n / total
                strong = dtype_colors(dtype)[1]  # the line colour: the fill colour would vanish on the box's fill
                ax.add_patch(Rectangle((left, y + 0.1), width, SHARE_H, facecolor=strong, edgecolor="white", lw=0.5,
                                       gid=f"share:{gid}:{dtype}"))  # fmt: skip
                left += width
    for i, (x, y) in enumerate(corners):
        nx, ny = corners[(i + 1) % len(corners)]
        if ny == y:  # along a row: from the side of one box to the side of the next
            start = (x + BOX_W, y + BOX_H / 2) if nx > x else (x, y + BOX_H / 2)
            end = (nx, ny + BOX_H / 2) if nx > x else (nx + BOX_W, ny + BOX_H / 2)
        else:  # down the right end, up the left end
            start, end = (x + BOX_W / 2, y if ny < y else y + BOX_H), (nx + BOX_W / 2, ny + BOX_H if ny < y else ny)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, color="#333333", lw=1.3))
    mixed = [b for *_, b in stages if len(b) > 1]
    shown = list(dict.fromkeys([_main_dtype(b) for *_, b in stages if b] + [d for b in mixed for d in b]))
    handles = [Patch(facecolor=dtype_colors(d)[0], edgecolor=dtype_colors(d)[1], label=d) for d in shown]
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8, frameon=False)
    heading = title or "One mixed-precision training step, measured: dtypes and bytes at each stage"
    fig.text(0.02, 0.975, heading, ha="left", va="top", fontsize=11)
    outcome = "skipped" if record.nonfinite else "taken"
    scales = f"{_scale_text(record.scale)} -> {_scale_text(record.scale_after)} ({record.event})"
    said = f"the step was {outcome}; the loss scale went {scales}"
    if mixed:
        said += "; a box of several dtypes is filled in the colour of the one with most bytes, its bar shows each share"
    fig.text(0.02, 0.915, said, ha="left", va="top", fontsize=8.5, color="#444444")
    return fig
