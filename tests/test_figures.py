"""The figures of `--out DIR`: each one drawn from a real short run, and checked through its objects.

A figure a student can trust has: no empty axes; a legend entry only for something drawn;
every piece of text inside the figure and none on top of another; no matplotlib warning;
and text that says what the data show (curves hidden under others, a flat loss scale, the
learning rate reaching 0 at the end of a cosine schedule).  The checks read the Figure's
artists after an Agg draw, never the pixels.
"""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.cli

pytest.importorskip("matplotlib")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import Collection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from tinyamp.amp import LossScaler  # noqa: E402
from tinyamp.experiments import figures  # noqa: E402
from tinyamp.experiments.regimes import REGIMES, build  # noqa: E402
from tinyamp.experiments.results import results_document  # noqa: E402
from tinyamp.experiments.runner import run_regime  # noqa: E402
from tinyamp.experiments.tasks import DigitsMLP  # noqa: E402

STEPS = 30  # long enough for every series to have a few measured points; each run takes about a second
HIDDEN = (64, 64)  # a smaller MLP than the demo's: the same story, faster


def task_document(task: DigitsMLP, results: list[Any]) -> dict[str, Any]:
    """The "mlp" task of a results.json document, as write_figures receives it."""
    return results_document({"mlp": (task, results)}, {"command": "test"})["tasks"]["mlp"]


@pytest.fixture(scope="module")
def fp32_run() -> dict[str, Any]:
    """`tinyamp train --precision fp32`: one regime with nothing 16-bit about it."""
    task = DigitsMLP(hidden=HIDDEN)
    return task_document(task, [run_regime(task, "fp32", STEPS, measure_every=5)[0]])


@pytest.fixture(scope="module")
def demo_run() -> dict[str, Any]:
    """The demo's four FP16 regimes side by side, with a cosine learning rate."""
    task = DigitsMLP(hidden=HIDDEN)
    regimes = ["fp32", "fp16", "fp16-master", "mixed"]
    return task_document(task, [run_regime(task, r, STEPS, measure_every=5)[0] for r in regimes])


@pytest.fixture(scope="module")
def constant_lr_run() -> dict[str, Any]:
    """FP16 weights with a constant learning rate: lost updates that nothing about the lr explains."""
    task = DigitsMLP(hidden=HIDDEN, schedule="constant")
    return task_document(task, [run_regime(task, r, STEPS, measure_every=5)[0] for r in ("fp16", "mixed")])


@pytest.fixture(scope="module")
def skipping_run() -> dict[str, Any]:
    """Mixed precision whose loss scale starts too high (2^24): it overflows, backs off, and grows again."""
    task = DigitsMLP(hidden=HIDDEN)
    setup = build(REGIMES["mixed"], task.make_model(), task.make_optimizer, "pytorch")
    setup.scaler = LossScaler(init_scale=2.0**24, growth_interval=8)
    result = run_regime(task, "mixed", STEPS, measure_every=5, setup=setup)[0]
    assert result.skipped_steps > 0  # the premise of the run: without a skipped step there is nothing to mark
    return task_document(task, [result])


def drawn(fig: Figure, draw: Callable[[], Figure | None] | None = None) -> Figure:
    """`fig` (or what `draw()` returns) rendered by Agg, failing on any warning on the way."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "No artists with labels found to put in legend"
        if draw is not None:
            made = draw()
            assert made is not None
            fig = made
        FigureCanvasAgg(fig)
        fig.canvas.draw()
    return fig


def has_data(artist: Any) -> bool:
    """True for an artist that shows data: a line with a finite point, a bar or band, a marker set."""
    if not artist.get_visible():
        return False
    if isinstance(artist, Line2D):
        y = np.asarray(artist.get_ydata(), dtype=np.float64)
        return bool(np.isfinite(y).any())
    if isinstance(artist, Patch):
        return artist.get_path().vertices.size > 0 and artist.get_window_extent().width > 0
    if isinstance(artist, Collection):
        return len(artist.get_offsets()) > 0 or len(artist.get_paths()) > 0
    return False


def data_artists(ax: Any) -> list[Any]:
    return [a for a in (*ax.lines, *ax.patches, *ax.collections) if has_data(a)]


def texts(fig: Figure) -> list[Text]:
    """Every piece of text a reader sees: titles, labels, tick labels, legends, notes."""
    found = fig.findobj(lambda a: isinstance(a, Text) and a.get_visible() and a.get_text().strip() != "")
    return [t for t in found if isinstance(t, Text)]


def ticks_out_of_view(fig: Figure) -> set[Text]:
    """Tick labels matplotlib keeps for ticks beyond the axis limits: not drawn, and left where they were."""
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            slack = 1e-9 * max(1.0, abs(high - low))
            for tick in (*axis.get_major_ticks(), *axis.get_minor_ticks()):
                if not low - slack <= tick.get_loc() <= high + slack:
                    hidden |= {tick.label1, tick.label2}
    return hidden


def legend_entries(fig: Figure) -> Iterator[tuple[Any, str]]:
    """(legend, label) for every entry of every legend, the figure's and the axes'."""
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes)]
    for legend in legends:
        if legend is not None:
            for text in legend.get_texts():
                yield legend, text.get_text()


def check_trustworthy(fig: Figure) -> None:
    """The rules every figure keeps, whatever its data."""
    for ax in fig.axes:
        assert data_artists(ax), f"axes {ax.get_title()!r} / {ax.get_ylabel()!r} shows no data"
    artists = [a for ax in fig.axes for a in data_artists(ax)]
    for _legend, label in legend_entries(fig):
        assert any(a.get_label() == label for a in artists), f"legend entry {label!r} names nothing drawn"
    box = fig.bbox
    shown = [t for t in texts(fig) if t not in ticks_out_of_view(fig)]
    extents = [(t, t.get_window_extent()) for t in shown]
    for t, e in extents:
        inside = e.x0 >= box.x0 - 1 and e.y0 >= box.y0 - 1 and e.x1 <= box.x1 + 1 and e.y1 <= box.y1 + 1
        assert inside, f"{t.get_text()!r} at {e} is cut off by the figure {box}"
    for (a, ea), (b, eb) in itertools.combinations(extents, 2):
        assert not ea.overlaps(eb), f"{a.get_text()!r} is drawn on top of {b.get_text()!r}"


DRAWERS: dict[str, Callable[[dict[str, Any]], Figure | None]] = {
    "loss": lambda task: figures.draw_loss_curves(task, "digits MLP: training loss"),
    "loss_scale": lambda task: figures.draw_loss_scale(task, "digits MLP: loss scale"),
    "measured": lambda task: figures.draw_measurements(task, "digits MLP: what 16 bits lose"),
    "gradients": lambda task: figures.draw_gradient_histogram(task, "digits MLP gradients"),
}
RUNS = ["fp32_run", "demo_run", "constant_lr_run", "skipping_run"]


@pytest.mark.parametrize("kind", list(DRAWERS))
@pytest.mark.parametrize("run", RUNS)
def test_every_figure_has_data_honest_legends_and_text_inside(
    run: str, kind: str, request: pytest.FixtureRequest
) -> None:
    task = request.getfixturevalue(run)
    check_trustworthy(drawn(Figure(), lambda: DRAWERS[kind](task)))


def test_fp32_alone_draws_what_fp32_has_in_the_measured_figure(fp32_run: dict[str, Any]) -> None:
    fig = drawn(Figure(), lambda: figures.draw_measurements(fp32_run, "digits MLP: what 16 bits lose"))
    ax = fig.axes[0]
    (line,) = [a for a in ax.lines if has_data(a)]
    measured = fp32_run["regimes"]["fp32"]["measured"]
    expected = [100 * v for v in measured["underflow_fraction"]]
    assert np.allclose(line.get_ydata(), expected)  # the share FP16 would flush, from FP32's own gradients
    assert "fp32" in line.get_label()
    assert len(fig.axes) == 1  # FP32 weights lose no update: no panel for it


def test_write_figures_writes_the_four_figures_of_an_fp32_run(fp32_run: dict[str, Any], tmp_path: Path) -> None:
    document = {"tasks": {"mlp": fp32_run}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = figures.write_figures(document, tmp_path)
    names = ["mlp_loss.png", "mlp_loss_scale.png", "mlp_measured.png", "mlp_gradients.png"]
    assert [p.name for p in paths] == names
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_histogram_band_labels_are_inside_and_apart(demo_run: dict[str, Any]) -> None:
    fig = drawn(Figure(), lambda: figures.draw_gradient_histogram(demo_run, "digits MLP gradients", "mixed"))
    names = [band[0] for band in figures.FP16_BANDS]
    labels = [t for t in texts(fig) if any(t.get_text().startswith(n) for n in names)]
    left, right = fig.axes[0].get_xlim()
    in_view = [n for n, a, b, _ in figures.FP16_BANDS if b > left and a < right]
    assert sorted({n for n in names for t in labels if t.get_text().startswith(n)}) == sorted(in_view)
    assert "overflow to inf (65520 and above)" in [t.get_text() for t in labels]  # the band the old figure cut off
    for t in labels:
        assert fig.bbox.contains(*t.get_window_extent().p0) and fig.bbox.contains(*t.get_window_extent().p1)
    for a, b in itertools.combinations(labels, 2):
        assert not a.get_window_extent().overlaps(b.get_window_extent()), (a.get_text(), b.get_text())


def curves(ax: Any) -> dict[str, Line2D]:
    """The regime curves of an axes, by regime name (the label's first word)."""
    return {line.get_label().split()[0]: line for line in ax.lines if line.get_label().split()[0] in REGIMES}


def pixel_gap(ax: Any, a: Line2D, b: Line2D) -> float:
    """The largest vertical distance between two drawn curves, in pixels (where both have data)."""
    ya, yb = (ax.transData.transform(np.column_stack([ln.get_xdata(), ln.get_ydata()]))[:, 1] for ln in (a, b))
    both = np.isfinite(ya) & np.isfinite(yb)
    return float(np.max(np.abs(ya[both] - yb[both])))


@pytest.mark.parametrize(("kind", "panel"), [("loss", 0), ("measured", 0), ("measured", 1)])
def test_curves_on_top_of_each_other_are_said_to_be(demo_run: dict[str, Any], kind: str, panel: int) -> None:
    fig = drawn(Figure(), lambda: DRAWERS[kind](demo_run))
    ax = fig.axes[panel]
    lines = curves(ax)
    assert len(lines) >= 3
    said = 0
    for (_, a), (_, b) in itertools.combinations(lines.items(), 2):
        if pixel_gap(ax, a, b) <= b.get_linewidth() * fig.dpi / 72:  # the strokes overlap at every step
            assert "on top of" in b.get_label() or "identical to" in b.get_label(), b.get_label()
            said += 1
    assert said > 0, "in 30 steps the 16-bit regimes draw FP32's curves"  # the premise: a case to label
    for name, line in lines.items():
        for other in lines:
            if other != name and f"on top of {other}" in line.get_label():  # the claim must be true of the figure
                assert pixel_gap(ax, lines[other], line) <= line.get_linewidth() * fig.dpi / 72


def test_identical_series_are_called_identical(demo_run: dict[str, Any]) -> None:
    task = copy.deepcopy(demo_run)
    task["regimes"]["mixed"]["series"] = copy.deepcopy(task["regimes"]["fp16"]["series"])
    fig = drawn(Figure(), lambda: figures.draw_loss_curves(task, "digits MLP: training loss"))
    label = curves(fig.axes[0])["mixed"].get_label()
    assert "identical to fp16" in label, label


def lr_notes(fig: Figure) -> list[str]:
    """Text and legend entries of a figure that speak of the learning rate."""
    said = [t.get_text() for t in texts(fig)]
    return [s for s in said if "learning rate" in s or "lr " in s]


def test_lost_updates_at_the_end_of_a_cosine_schedule_are_put_down_to_the_learning_rate(
    demo_run: dict[str, Any],
) -> None:
    fig = drawn(Figure(), lambda: figures.draw_measurements(demo_run, "digits MLP: what 16 bits lose"))
    lr = np.asarray(demo_run["regimes"]["mixed"]["series"]["lr"])
    first_tiny = int(np.flatnonzero(lr < 0.01 * lr.max())[0])
    notes = lr_notes(fig)
    assert any(f"step {first_tiny}" in s for s in notes), notes  # where the lr falls below 1% of its peak
    lost_axes = fig.axes[1]
    shaded = [p for p in lost_axes.patches if "lr" in p.get_label()]
    assert len(shaded) == 1
    left = lost_axes.transData.inverted().transform(shaded[0].get_verts().min(axis=0))[0]  # Polygon or Rectangle
    assert left == pytest.approx(first_tiny)


def test_a_constant_learning_rate_gets_no_such_note(constant_lr_run: dict[str, Any]) -> None:
    fig = drawn(Figure(), lambda: figures.draw_measurements(constant_lr_run, "digits MLP: what 16 bits lose"))
    assert len(fig.axes) == 2  # the lost updates are drawn ...
    assert not [s for s in lr_notes(fig) if "peak" in s]  # ... and not blamed on an lr that never fell


def test_a_loss_scale_that_never_changed_says_so_and_promises_no_skipped_steps(demo_run: dict[str, Any]) -> None:
    fig = drawn(Figure(), lambda: figures.draw_loss_scale(demo_run, "digits MLP: loss scale"))
    (ax,) = fig.axes
    entries = [label for _, label in legend_entries(fig)]
    assert not [e for e in entries if "skipped step" in e and "no skipped" not in e], entries
    scale = demo_run["regimes"]["mixed"]["series"]["scale"]
    assert len(set(scale)) == 1  # the premise: 30 steps at 2^16 without an overflow
    said = " ".join([ax.get_title(), *entries])
    assert "never changed" in said and f"{scale[0]:g}" in said, said


def test_skipped_steps_are_marked_where_they_happened(skipping_run: dict[str, Any]) -> None:
    fig = drawn(Figure(), lambda: figures.draw_loss_scale(skipping_run, "digits MLP: loss scale"))
    (ax,) = fig.axes
    series = skipping_run["regimes"]["mixed"]["series"]
    skipped = np.flatnonzero(series["skipped"])
    (marks,) = [line for line in ax.lines if line.get_label().startswith("skipped step")]
    assert np.array_equal(marks.get_xdata(), skipped)
    assert np.array_equal(marks.get_ydata(), np.asarray(series["scale"])[skipped])
    assert "never changed" not in ax.get_title()
    assert f"{len(skipped)} skipped step" in " ".join(label for _, label in legend_entries(fig))


def test_nothing_measured_draws_no_measured_figure(fp32_run: dict[str, Any]) -> None:
    task = copy.deepcopy(fp32_run)
    for r in task["regimes"].values():
        r["measured"] = {k: [] for k in r["measured"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert figures.draw_measurements(task, "nothing") is None


def test_a_diverged_loss_still_draws_its_finite_part(demo_run: dict[str, Any]) -> None:
    task = copy.deepcopy(demo_run)
    loss = task["regimes"]["fp16"]["series"]["loss"]
    loss[STEPS // 2 :] = [None] * (STEPS - STEPS // 2)  # NaN in results.json is written as null
    fig = drawn(Figure(), lambda: figures.draw_loss_curves(task, "digits MLP: training loss"))
    check_trustworthy(fig)
    y = np.asarray(curves(fig.axes[0])["fp16"].get_ydata(), dtype=np.float64)
    assert np.isfinite(y[: STEPS // 2]).all() and not np.isfinite(y[STEPS // 2 :]).any()
    assert not math.isnan(fig.axes[0].get_ylim()[0])


def test_a_resumed_run_is_drawn_at_its_own_steps() -> None:
    task = DigitsMLP(hidden=HIDDEN)
    _, setup = run_regime(task, "mixed", STEPS // 2, measure_every=5)
    resumed = run_regime(task, "mixed", STEPS, measure_every=5, setup=setup, start=STEPS // 2)[0]
    doc = task_document(task, [resumed])
    assert resumed.measured["step"][0] == STEPS // 2  # the premise: the measured steps count from the start
    loss = drawn(Figure(), lambda: figures.draw_loss_curves(doc, "resumed"))
    assert np.array_equal(curves(loss.axes[0])["mixed"].get_xdata(), np.arange(STEPS // 2, STEPS))
    measured = drawn(Figure(), lambda: figures.draw_measurements(doc, "resumed"))
    (lr,) = [line for line in measured.axes[1].lines if line.get_label().startswith("learning rate")]
    assert lr.get_xdata()[0] == STEPS // 2 and lr.get_xdata()[-1] == STEPS - 1  # beside the lost updates it explains


def test_an_fp8_run_in_which_no_value_saturated_or_flushed_is_drawn_on_a_linear_share_axis() -> None:
    """A log axis with nothing positive to show made matplotlib raise, and `tinyamp train` with it (4 mxfp8 steps)."""
    task = DigitsMLP(hidden=HIDDEN)
    regime = task_document(task, [run_regime(task, "mxfp8", 4, measure_every=2)[0]])["regimes"]["mxfp8"]
    for t in regime["fp8"]["tensors"].values():
        t["series"]["saturated"] = [0] * len(t["series"]["saturated"])
        t["series"]["flushed"] = [0] * len(t["series"]["flushed"])
    for p in regime["fp8"]["totals"].values():
        p["saturated"] = p["flushed"] = 0
    fig = figures.draw_fp8_tensors(regime, "mxfp8")
    FigureCanvasAgg(fig).draw()  # the draw that raised
    ax_scale, ax_amax, ax_share = fig.axes
    assert (ax_scale.get_yscale(), ax_amax.get_yscale(), ax_share.get_yscale()) == ("log", "log", "linear")
    assert ax_share.get_title() == "no value saturated or flushed to zero in the whole run"
