"""The pictures of tinyamp.inspect: each one drawn from the code's own data, and checked against it.

* the loss scaler's state machine: its arrows are exactly the transitions a real LossScaler
  makes when driven through many overflow/clean sequences, and each arrow's path replays;
* one mixed-precision step: every "dtype: bytes" on the picture is the nbytes of the arrays
  themselves, measured here independently in the same step;
* the graph of a loss: one box per op and per leaf, one arrow per input, every cast autocast
  made, and a DOT export with one line per edge.

Every figure is rendered by Agg with warnings as errors; all its text lies inside it, none on other text.
"""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.docs

pytest.importorskip("matplotlib")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

import tinyamp as ta  # noqa: E402
from tinyamp import autograd, optim  # noqa: E402
from tinyamp.amp import CLASSIC_PRESETS, LossScaler, MasterWeights, autocast  # noqa: E402
from tinyamp.amp.hysteresis import HysteresisScaler, LossScaleFloorError  # noqa: E402
from tinyamp.amp.hysteresis_rules import HYSTERESIS_EVENTS  # noqa: E402
from tinyamp.amp.hysteresis_rules import STATES as HYSTERESIS_STATES  # noqa: E402
from tinyamp.amp.loss_scale import EVENTS, STATES  # noqa: E402
from tinyamp.inspect import (  # noqa: E402
    draw_graph,
    draw_mixed_precision_step,
    draw_scaler_states,
    draw_step_record,
    record_step,
    scaler_state_machine,
    to_dot,
)
from tinyamp.inspect.draw_graph import dtype_colors  # noqa: E402


# ---- what every picture keeps -------------------------------------------------------------------------
def drawn(draw: Callable[[], Figure]) -> Figure:
    """The figure `draw()` returns, rendered by Agg with every warning raised as an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = draw()
        FigureCanvasAgg(fig)
        fig.canvas.draw()
    return fig


def texts(fig: Figure) -> list[Text]:
    found = fig.findobj(lambda a: isinstance(a, Text) and a.get_visible() and a.get_text().strip() != "")
    return [t for t in found if isinstance(t, Text)]


def check_text(fig: Figure) -> None:
    """Every piece of text lies inside the figure, and none on top of another."""
    box = fig.bbox
    extents = [(t, t.get_window_extent()) for t in texts(fig)]
    for t, e in extents:
        inside = e.x0 >= box.x0 - 1 and e.y0 >= box.y0 - 1 and e.x1 <= box.x1 + 1 and e.y1 <= box.y1 + 1
        assert inside, f"{t.get_text()!r} at {e} is cut off by the figure {box}"
    for i, (a, ea) in enumerate(extents):
        for b, eb in extents[i + 1 :]:
            assert not ea.overlaps(eb), f"{a.get_text()!r} is drawn on top of {b.get_text()!r}"


def gid_texts(fig: Figure, prefix: str) -> dict[str, list[str]]:
    """gid -> the texts carrying it, for the gids that start with `prefix`."""
    out: dict[str, list[str]] = {}
    for t in texts(fig):
        if t.get_gid() is not None and t.get_gid().startswith(prefix):
            out.setdefault(t.get_gid(), []).append(t.get_text())
    return out


# ---- 1. the loss scaler's state machine ----------------------------------------------------------------
# Small growth intervals and starts near the bounds, so that random sequences reach every state.
RULES: dict[str, Callable[[], LossScaler]] = {
    "pytorch": lambda: LossScaler.preset("pytorch", growth_interval=3, init_scale=2.0**120),
    "apex": lambda: LossScaler.preset("apex", growth_interval=3),
    "keras": lambda: LossScaler.preset("keras", growth_interval=2, init_scale=2.0**122),
    "jmp": lambda: LossScaler.preset("jmp", growth_interval=3, init_scale=2.0**6),
    "chainer": lambda: LossScaler.preset("chainer", growth_interval=3),
    "float64, no bounds": lambda: LossScaler(init_scale=2.0**1016, growth_interval=2),
    "start below the floor": lambda: LossScaler(
        init_scale=0.25, min_scale=1.0, max_scale=2.0**8, start_below_floor=True, growth_interval=3
    ),
    "warmup, interval rule": lambda: LossScaler(
        warmup=True, init_scale=2.0, min_scale=1.0, max_scale=2.0**6, growth_interval=3
    ),
    "static": lambda: LossScaler(mode="static", init_scale=2.0**10),
    "off": lambda: LossScaler(mode="off"),
}


def simulated_transitions(make: Callable[[], LossScaler], sequences: int = 40, seed: int = 0) -> set[tuple[str, ...]]:
    """(state, event, next state) of every update of real scalers driven by random runs of outcomes.

    Runs of clean steps and of overflows of varied lengths (up to a few hundred), so that the
    floor and the ceiling are reached as well as the everyday transitions.
    """
    rng = random.Random(seed)
    seen = set()
    for _ in range(sequences):
        scaler = make()
        for _ in range(rng.randint(2, 12)):
            flag = rng.random() < 0.5
            lengths = [1, 1, 2, 3, 30] if flag else [1, 2, 3, 5, 60, 300]
            for _ in range(rng.choice(lengths)):
                before = scaler.state
                event = scaler.update(flag)
                seen.add((before, event.event, event.state))
    return seen


def drawn_transitions(fig: Figure, events: tuple[str, ...] = EVENTS) -> set[tuple[str, ...]]:
    """(state, event, next state) read off the arrows' labels: gid "A->B:kind", each event's text opening a line
    "event: ..." (a hysteresis rule's texts go on over more lines)."""
    found = set()
    for gid, labels in gid_texts(fig, "").items():
        match = re.fullmatch(r"(\w+)->(\w+):(overflow|clean|any)", gid)
        if match is None:
            continue
        for line in "\n".join(labels).splitlines():
            event = line.split(":")[0]
            if event in events:
                found.add((match[1], event, match[2]))
            else:
                assert events != EVENTS and found, f"arrow {gid} has the label line {line!r}"
    return found


@pytest.mark.parametrize("rule", RULES)
def test_the_arrows_are_exactly_the_transitions_a_real_scaler_makes(rule: str) -> None:
    fig = drawn(lambda: draw_scaler_states(RULES[rule]()))
    check_text(fig)
    simulated = simulated_transitions(RULES[rule])
    assert drawn_transitions(fig) == simulated
    arrows = {a.get_gid() for a in fig.findobj(FancyArrowPatch)}
    assert arrows == {gid for gid in gid_texts(fig, "") if "->" in gid}  # each arrow has its label, and no more
    states = {gid.removeprefix("state:") for gid in gid_texts(fig, "state:")}
    assert states == {s for t in simulated for s in (t[0], t[2])} | {RULES[rule]().state}
    assert states <= set(STATES)


@pytest.mark.parametrize("rule", RULES)
def test_every_transition_comes_with_a_path_that_replays_on_a_real_scaler(rule: str) -> None:
    machine = scaler_state_machine(RULES[rule]())
    assert machine.complete
    for t in machine.transitions:
        scaler = LossScaler(**asdict(machine.rule))
        for flag, steps in t.path:
            for _ in range(steps):
                before = scaler.state
                record = scaler.update(flag)
        assert (before, record.event, record.state) == (t.state, t.event, t.next_state), t


@pytest.mark.parametrize("preset", [*CLASSIC_PRESETS, None])  # the hysteresis rules: below
def test_the_published_rules_draw_with_their_own_numbers(preset: str | None) -> None:
    scaler = LossScaler() if preset is None else LossScaler.preset(preset)
    machine = scaler_state_machine(scaler)
    assert machine.complete  # the default limit reaches the end for every preset
    fig = drawn(lambda: draw_scaler_states(scaler))
    check_text(fig)
    drawn_set = drawn_transitions(fig)
    assert drawn_set == {(t.state, t.event, t.next_state) for t in machine.transitions}
    labels = "\n".join(line for gid, ts in gid_texts(fig, "").items() if "->" in gid for line in ts)
    rule = scaler.rule
    if rule.growth_rule == "interval":
        n = rule.growth_interval
        assert f"grew: clean step {n} of {n}: x2" in labels
    assert "backed_off: x0.5" in labels
    assert ("at_floor" in {s for t in drawn_set for s in t}) == (rule.min_scale is not None)
    start = {2.0**16: "2^16", 2.0**15: "2^15", 1.0: "1"}[rule.init_scale]
    assert f"start: scale {start}" in "\n".join(gid_texts(fig, f"state:{scaler.state}")[f"state:{scaler.state}"])


# ---- the hysteresis rules: the same search over the library's counters, "tolerated" between steady and backed_off
# Small windows and starts near the bounds again; floors that end the run and floors that do not.
H_RULES: dict[str, Callable[[], LossScaler]] = {
    "megatron": lambda: LossScaler.preset(
        "megatron", initial_scale=2.0**124, growth_interval=3, min_scale=2.0**118, hysteresis=3
    ),
    "deepspeed, raises at the floor": lambda: LossScaler.preset(
        "deepspeed", init_scale=2.0**1019, scale_window=2, min_scale=2.0**1013, delayed_shift=2
    ),
    "deepspeed, consecutive_hysteresis": lambda: LossScaler.preset(
        "deepspeed",
        init_scale=2.0**1019,
        scale_window=2,
        min_scale=2.0**1013,
        delayed_shift=3,
        consecutive_hysteresis=True,
        raise_error_at_min_scale=False,
    ),  # fmt: skip
    "fairseq": lambda: LossScaler.preset("fairseq", init_scale=2.0**1020, scale_window=3, min_loss_scale=2.0**1013),
    "fairseq, tolerance and threshold": lambda: LossScaler.preset(
        "fairseq", init_scale=2.0**1020, scale_window=6, tolerance=0.25, threshold=2.0**1013, min_loss_scale=0.0
    ),
}


def simulated_hysteresis_transitions(make: Callable[[], LossScaler], sequences: int = 300) -> set[tuple[str, ...]]:
    """(state, event, next state) of real HysteresisScalers driven by random outcomes, each run with its own
    chance of an overflow (rare to frequent, so that tolerated overflows, both bounds and the floor's error are
    met); a LossScaleFloorError ends its run (floor_error -> stopped)."""
    rng, seen = random.Random(0), set()
    for _ in range(sequences):
        scaler, p = make(), rng.choice([0.05, 0.15, 0.3, 0.5, 0.7])
        try:
            for _ in range(200):
                flag = rng.random() < p
                before = scaler.state
                event = scaler.update(flag)
                seen.add((before, event.event, event.state))
        except LossScaleFloorError:
            seen.add((before, "floor_error", "stopped"))
    return seen


@pytest.mark.parametrize("rule", H_RULES)
def test_a_hysteresis_rules_arrows_are_exactly_the_transitions_a_real_scaler_makes(rule: str) -> None:
    fig = drawn(lambda: draw_scaler_states(H_RULES[rule]()))
    check_text(fig)
    simulated = simulated_hysteresis_transitions(H_RULES[rule])
    assert drawn_transitions(fig, (*HYSTERESIS_EVENTS, "floor_error")) == simulated
    assert {a.get_gid() for a in fig.findobj(FancyArrowPatch)} == {gid for gid in gid_texts(fig, "") if "->" in gid}
    states = {gid.removeprefix("state:") for gid in gid_texts(fig, "state:")}
    assert states == {s for t in simulated for s in (t[0], t[2])} <= {*HYSTERESIS_STATES, "stopped"}


@pytest.mark.parametrize("rule", H_RULES)
def test_a_hysteresis_rules_transitions_replay_on_a_real_scaler(rule: str) -> None:
    machine = scaler_state_machine(H_RULES[rule]())
    assert machine.complete == ("tolerance" not in rule)  # a tolerance > 0: the search has no end (see below)
    assert ("tolerated" in machine.states) == (rule != "fairseq")  # fairseq's tolerance 0 tolerates no overflow
    for t in machine.transitions:
        scaler = HysteresisScaler(machine.rule.library, **machine.rule.settings)
        *before_last, (flag, steps) = [(f, 1) for f, n in t.path for _ in range(n)]
        for f, _ in before_last:
            scaler.update(f)
        before = scaler.state
        if t.event == "floor_error":
            with pytest.raises(LossScaleFloorError):
                scaler.update(flag)
            assert t.next_state == "stopped"
            continue
        record = scaler.update(flag)
        assert (before, record.event, record.state) == (t.state, t.event, t.next_state), t


@pytest.mark.parametrize("preset, settings", [("megatron", {}), ("deepspeed", {}),
                                              ("deepspeed", {"consecutive_hysteresis": True}), ("fairseq", {}),
                                              ("fairseq", {"tolerance": 0.25, "threshold": 1.0})])  # fmt: skip
def test_the_hysteresis_rules_draw_with_their_counters_and_what_restores_them(preset: str, settings: dict) -> None:
    scaler = LossScaler.preset(preset, **settings)
    machine = scaler_state_machine(scaler)
    fig = drawn(lambda: draw_scaler_states(scaler))
    check_text(fig)
    assert drawn_transitions(fig, (*HYSTERESIS_EVENTS, "floor_error")) == {
        (t.state, t.event, t.next_state) for t in machine.transitions
    }
    words = "\n".join(t.get_text() for t in texts(fig))
    arrows = {(t.state, t.event, t.next_state) for t in machine.transitions}
    counter = {"megatron": "hysteresis_tracker", "deepspeed": "cur_hysteresis", "fairseq": "overflows_since_rescale"}
    assert counter[preset] in words and f"start: scale 2^{int(np.log2(scaler.scale))}" in words
    if preset == "megatron":  # a clean step keeps the tracker down: from steady an overflow may back off at once
        assert (
            machine.complete
            and {("steady", "tolerated", "tolerated"), ("steady", "backed_off", "backed_off")} <= arrows
        )
        assert "restored only when the scale grows" in words and "hysteresis_tracker = 2 (only here)" in words
    if preset == "deepspeed" and not settings:
        assert machine.complete and ("steady", "backed_off", "backed_off") in arrows
        assert ("at_floor", "floor_error", "stopped") in arrows and "restored only when the scale grows" in words
    if preset == "deepspeed" and settings:  # every clean step restores it: from steady an overflow is tolerated
        assert machine.complete and ("steady", "tolerated", "tolerated") in arrows
        assert not any(a == "steady" and e == "backed_off" for a, e, _ in arrows)
        assert "restored at every clean step" in words
    if preset == "fairseq" and not settings:  # tolerance 0: no overflow is tolerated, and the floor ends the run
        assert machine.complete and "tolerated" not in machine.states and "stopped" in machine.states
    if preset == "fairseq" and settings:  # overflows spread out enough are tolerated for ever: no end to the search
        assert "tolerated" in machine.states and not machine.complete and "search stopped at its limit" in words


def test_static_and_off_scalers_have_one_state_and_one_loop() -> None:
    for mode in ("static", "off"):
        machine = scaler_state_machine(LossScaler(mode=mode))
        assert [(t.state, t.event, t.next_state) for t in machine.transitions] == [(mode, "held", mode)]
        fig = drawn(lambda mode=mode: draw_scaler_states(LossScaler(mode=mode)))
        assert [a.get_gid() for a in fig.findobj(FancyArrowPatch)] == [f"{mode}->{mode}:any"]


def test_a_rule_without_an_end_says_the_search_stopped() -> None:
    # x3 and x0.25 between a floor and a ceiling: the scales within reach are dense, the search cannot end
    scaler = LossScaler(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.25, min_scale=1.0, max_scale=1e6)
    machine = scaler_state_machine(scaler, limit=2000)
    assert not machine.complete and machine.situations == 2000
    assert set(machine.states) == {"steady", "backed_off", "at_floor", "at_ceiling"}


# ---- 2. one mixed-precision step ------------------------------------------------------------------------
def measured(fig: Figure, stage: str) -> dict[str, int]:
    """The "dtype: N B" lines of one box of the step picture."""
    (lines,) = [t for gid, t in gid_texts(fig, f"stage:{stage}").items()]
    return {m[1]: int(m[2].replace(",", "")) for m in re.finditer(r"(\w+): ([\d,]+) B", "\n".join(lines))}


def nbytes(arrays: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in arrays:
        out[a.dtype.name] = out.get(a.dtype.name, 0) + a.nbytes
    return out


def box_fill(fig: Figure, stage: str) -> str:
    (box,) = [p for p in fig.findobj(FancyBboxPatch) if p.get_gid() == f"stage:{stage}"]
    return to_hex(box.get_facecolor())


def fp16_step(init_scale: float = 2.0**10) -> tuple[Any, ...]:
    """An FP16 MLP with FP32 masters (SGD with momentum), a scaler, a batch, and a loss under autocast."""
    ta.manual_seed(0)
    model = ta.nn.MLP([12, 16, 5]).half()
    opt = MasterWeights(optim.SGD(model.named_parameters(), lr=0.5, momentum=0.9))
    rng = np.random.default_rng(0)
    x = ta.tensor(rng.standard_normal((7, 12)).astype(np.float32))
    y = ta.tensor(rng.integers(0, 5, 7))
    return model, opt, LossScaler(init_scale=init_scale), x, y


def test_every_byte_count_on_the_step_picture_is_measured_from_the_arrays() -> None:
    model, opt, scaler, x, y = fp16_step()
    params = model.parameters()
    weights_before = nbytes(p.data for p in params)
    values_before = [p.data.copy() for p in params]
    seen: dict[str, Any] = {}

    def loss_fn() -> ta.Tensor:
        with autocast():
            loss = ta.cross_entropy(model(x), y)
        # what the graph keeps for backward, walked here by hand: each array once, leaves' own arrays left out
        leaves = {id(p.data) for p in params} | {id(x.data), id(y.data)}
        kept = {id(a): a for fn in autograd.walk(loss) for a in fn.saved or () if id(a) not in leaves}
        seen.update(loss=loss, saved=nbytes(kept.values()))
        return loss

    fig = drawn(lambda: draw_mixed_precision_step(model, loss_fn, opt, scaler))
    check_text(fig)
    assert measured(fig, "weights") == weights_before == {"float16": 2 * sum(p.size for p in params)}
    assert measured(fig, "forward") == seen["saved"] and "float16" in seen["saved"]
    assert measured(fig, "loss") == {"float32": 4} == nbytes([seen["loss"].data])
    assert measured(fig, "scaled") == {"float32": 4}
    assert measured(fig, "backward") == nbytes(p.grad for p in params) == weights_before  # FP16 gradients
    masters = opt.master_params
    assert measured(fig, "unscale") == nbytes(m.grad for m in masters) == {"float32": 2 * weights_before["float16"]}
    momentum = nbytes(s["momentum_buffer"] for s in opt.optimizer.state)
    assert measured(fig, "update") == {"float32": nbytes(m.data for m in masters)["float32"]}  # masters, then state
    update_text = "\n".join(gid_texts(fig, "stage:update")["stage:update"])
    assert f"optimizer state, float32: {momentum['float32']:,} B" in update_text
    assert measured(fig, "round") == nbytes(p.data for p in params)
    changed = sum(int((b != p.data).sum()) for b, p in zip(values_before, params))
    total = sum(p.size for p in params)
    round_text = "\n".join(gid_texts(fig, "stage:round")["stage:round"])
    assert f"{changed:,} of {total:,} values changed" in round_text and changed > 0
    assert "loss x 2^10" in "\n".join(gid_texts(fig, "stage:scaled")["stage:scaled"])
    # FP16 and FP32 in their colours, the same as the graph picture's
    for stage, dtype in [("weights", "float16"), ("backward", "float16"), ("loss", "float32"),
                         ("unscale", "float32"), ("update", "float32"), ("round", "float16")]:  # fmt: skip
        assert box_fill(fig, stage) == dtype_colors(dtype)[0], stage


def test_an_overflowed_step_is_drawn_as_skipped_with_nothing_changed() -> None:
    model, opt, scaler, x, y = fp16_step(init_scale=2.0**40)  # FP16 gradients overflow to inf
    before = [p.data.copy() for p in model.parameters()]

    def loss_fn() -> ta.Tensor:
        with autocast():
            return ta.cross_entropy(model(x), y)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the overflow is the point
        record = record_step(model, loss_fn, opt, scaler)
    fig = drawn(lambda: draw_step_record(record))
    check_text(fig)
    assert all(np.array_equal(b, p.data) for b, p in zip(before, model.parameters()))
    all_text = "\n".join(t.get_text() for t in texts(fig))
    assert "step skipped" in all_text and "(skipped)" in all_text
    assert f"0 of {sum(p.size for p in model.parameters()):,} values changed" in all_text
    assert "2^40 -> 2^39 (backed_off)" in all_text


def test_a_box_of_several_dtypes_says_so_with_a_bar_of_their_shares() -> None:
    """The forward's box holds FP16 and FP32 (and the labels' int64): filled as the majority, its bar split by
    bytes; a box of one dtype has no bar, and the figure says what a mixed box's fill means."""
    model, opt, scaler, x, y = fp16_step()

    def loss_fn() -> ta.Tensor:
        with autocast():
            return ta.cross_entropy(model(x), y)

    fig = drawn(lambda: draw_mixed_precision_step(model, loss_fn, opt, scaler))
    check_text(fig)
    forward = measured(fig, "forward")
    assert len(forward) > 1 and box_fill(fig, "forward") == dtype_colors(max(forward, key=forward.get))[0]
    bars = {p.get_gid(): p for p in fig.findobj(Rectangle) if (p.get_gid() or "").startswith("share:")}
    assert set(bars) == {f"share:forward:{d}" for d in forward}  # only the mixed box has a bar
    widths = {gid.rsplit(":", 1)[1]: bar.get_width() for gid, bar in bars.items()}
    total = sum(forward.values())
    assert all(np.isclose(widths[d] / sum(widths.values()), forward[d] / total) for d in forward)
    assert all(to_hex(bars[f"share:forward:{d}"].get_facecolor()) == dtype_colors(d)[1] for d in forward)
    assert any("filled in the colour of the one with most bytes" in t.get_text() for t in texts(fig))


def test_without_master_weights_the_picture_says_there_is_nothing_to_round() -> None:
    ta.manual_seed(0)
    model = ta.nn.MLP([6, 4])
    x, y = ta.tensor(np.ones((3, 6), np.float32)), ta.tensor(np.array([0, 1, 2]))
    opt = optim.SGD(model.parameters(), lr=0.1)
    fig = drawn(
        lambda: draw_mixed_precision_step(model, lambda: ta.cross_entropy(model(x), y), opt, LossScaler(mode="off"))
    )
    assert measured(fig, "update") == {"float32": 4 * (6 * 4 + 4)}
    assert "no master copy: nothing to round" in "\n".join(gid_texts(fig, "stage:round")["stage:round"])
    assert box_fill(fig, "weights") == dtype_colors("float32")[0]


# ---- 3. the graph of a loss -----------------------------------------------------------------------------
def walked(loss: ta.Tensor) -> tuple[set[int], set[int], int]:
    """Ops, leaf tensors and edges of the graph of `loss`, walked here with a stack (not by draw_graph)."""
    ops, leaves, edges = set(), set(), 0
    stack = [loss.creator]
    while stack:
        fn = stack.pop()
        if id(fn) in ops:
            continue
        ops.add(id(fn))
        for t in fn.inputs:
            edges += 1
            if t.is_leaf:
                leaves.add(id(t))
            else:
                stack.append(t.creator)
    return ops, leaves, edges


def mlp_loss(dtype: str = "float16") -> tuple[Any, ta.Tensor, autocast]:
    ta.manual_seed(0)
    model = ta.nn.MLP([8, 16, 16, 4])
    x = ta.tensor(np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32))
    with autocast(dtype, log_casts=True) as ac:
        loss = ta.cross_entropy(model(x), ta.tensor(np.array([0, 1, 2, 3, 0])))
    return model, loss, ac


def node_labels(fig: Figure) -> dict[str, str]:
    return {gid: "\n".join(ts) for gid, ts in gid_texts(fig, "node:").items()}


def check_graph_picture(fig: Figure, loss: ta.Tensor, ac: autocast) -> None:
    ops, leaves, edges = walked(loss)
    boxes = [p for p in fig.findobj(FancyBboxPatch) if (p.get_gid() or "").startswith("node:")]
    arrows = [p for p in fig.findobj(FancyArrowPatch) if (p.get_gid() or "").startswith("edge:")]
    assert len(boxes) == len(ops) + len(leaves) == len(node_labels(fig))
    assert len(arrows) == edges
    labels = list(node_labels(fig).values())
    # every cast autocast made (a cached one reuses its first copy) is a box: a Cast op, or a copy of a leaf
    made = [r for r in ac.cast_log if not r.cached]
    casts = [text for text in labels if text.startswith(("Cast (autocast)", "autocast copy"))]
    assert len(casts) == len(made)
    for r in made:
        shape_and_dtype = f"{r.shape}\n{r.from_dtype} -> {r.to_dtype}"
        assert any(shape_and_dtype in c or (c.startswith("autocast copy") and f"{r.shape}\n{r.to_dtype}" in c)
                   for c in casts), r  # fmt: skip
    for box in boxes:  # each box in the colour of the dtype it shows (a cast: the dtype it makes)
        dtype = node_labels(fig)[box.get_gid()].splitlines()[-1].split(" -> ")[-1]
        assert to_hex(box.get_facecolor()) == dtype_colors(dtype)[0]
    check_text(fig)


def test_the_graph_has_a_box_per_op_and_leaf_an_arrow_per_input_and_every_autocast_cast() -> None:
    model, loss, ac = mlp_loss()
    fig = drawn(lambda: draw_graph(loss, model))
    check_graph_picture(fig, loss, ac)
    labels = node_labels(fig).values()
    for name, p in model.named_parameters():
        assert f"{name}\n{p.shape}\n{p.dtype.name}" in labels
    assert "CrossEntropy\n()\nfloat32" in labels  # the loss, kept in FP32 by the policy
    assert sum(text.startswith("Linear") and text.endswith("float16") for text in labels) == 3


def test_a_transformer_block_of_about_fifty_nodes_stays_readable() -> None:
    ta.manual_seed(0)
    block = ta.nn.TransformerBlock(8, 2)
    x = ta.tensor(np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32))
    with autocast(log_casts=True) as ac:
        loss = block(x).sum()
    fig = drawn(lambda: draw_graph(loss, block))
    check_graph_picture(fig, loss, ac)
    ops, leaves, _ = walked(loss)
    assert len(ops) + len(leaves) >= 50
    boxes = [p.get_window_extent() for p in fig.findobj(FancyBboxPatch)]
    for i, a in enumerate(boxes):  # no box on top of another
        assert not any(a.overlaps(b) for b in boxes[i + 1 :])


def test_bfloat16_has_its_own_colour() -> None:
    pytest.importorskip("ml_dtypes")
    model, loss, ac = mlp_loss("bfloat16")
    fig = drawn(lambda: draw_graph(loss, model))
    check_graph_picture(fig, loss, ac)
    assert any(t.endswith("float32 -> bfloat16") for t in node_labels(fig).values())


def test_the_dot_export_has_one_statement_per_node_and_one_line_per_edge() -> None:
    model, loss, _ = mlp_loss()
    dot = to_dot(loss, model)
    ops, leaves, edges = walked(loss)
    lines = dot.splitlines()
    assert lines[0] == "digraph loss {" and lines[-1] == "}"
    assert dot.count("{") == dot.count("}") == 1  # no brace inside a label
    edge = re.compile(r'  (op|leaf)\d+ -> op\d+ \[label="[^"]*", color="#\w+"\];')
    edge_lines = [line for line in lines if edge.fullmatch(line)]
    assert len(edge_lines) == sum(" -> " in line.split("[")[0] for line in lines) == edges
    declared = {m[1] for line in lines if (m := re.fullmatch(r"  ((?:op|leaf)\d+) \[label=.*\];", line))}
    assert len(declared) == len(ops) + len(leaves)
    used = {name.strip() for line in edge_lines for name in line.split(" [")[0].split(" -> ")}
    assert used <= declared
    for line in lines:  # every quote in a label escaped: quotes come in pairs
        assert line.replace('\\"', "").count('"') % 2 == 0, line


def test_a_graph_freed_by_backward_cannot_be_drawn() -> None:
    model, loss, _ = mlp_loss()
    loss.backward()
    with pytest.raises(ValueError, match="draw the graph before backward"):
        draw_graph(loss, model)
