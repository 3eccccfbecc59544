"""The loss scaler's state machine, found by running its rule and drawn with matplotlib.

No arrow is typed in.  ``scaler_state_machine(rule)`` starts where a new scaler starts and
runs ``ScaleRule.next`` (the function ``LossScaler`` itself calls) on an overflow and on a
clean step from every situation it reaches, breadth first.  A situation is what the rule
reads: (scale, growth tracker, overflow seen, last step overflowed).  Each distinct
(state, event, next state) it sees becomes one arrow, with the shortest run of steps that
produces it, so a test can replay it on a real ``LossScaler``.

Two shortcuts keep the search short:

* a run of "held" steps jumps to its last one: the tracker only counts, and the outcome of
  an overflow does not depend on it (this changes nothing the search finds);
* after Chainer's warmup the scale moves by growth_factor^(1/N) per clean step, so the
  scales within reach are dense: there they are told apart only to within one such step
  (two scales that close could differ by one landing exactly on a bound; every arrow found
  is still real, and the tests compare the arrows with a real scaler's transitions).

``draw_scaler_states(scaler)`` draws the result; the labels are computed from the rule's
settings (factors, interval, floor, ceiling, the scale's dtype).

The rules of Megatron-LM, DeepSpeed and fairseq (a ``HysteresisScaler``) are searched the same way
by ``hysteresis_states.py``, over situations that hold the library's own counters; their drawing has
the state "tolerated" between "steady" and "backed_off", and its labels name those counters.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from tinyamp.amp.loss_scale import EVENTS, STATES, ScaleRule
from tinyamp.amp.scaler import LossScaler
from tinyamp.inspect import hysteresis_states as hs

Situation = tuple[float, int, bool, bool]  # scale, growth tracker, overflow seen, last step found an inf/NaN
Path = tuple[tuple[bool, int], ...]  # (found_inf, that many steps in a row), from a fresh scaler


@dataclass(frozen=True)
class Transition:
    """One arrow, ``state --event--> next_state``; ``path``: steps from the start whose last one makes it."""

    state: str
    event: str
    next_state: str
    path: Path


@dataclass(frozen=True)
class StateMachine:
    """What the search found: the start state, every transition, and whether the search ran to its end."""

    rule: Any  # a ScaleRule, or a hysteresis rule (MegatronRule, DeepSpeedRule, FairseqRule)
    start: str
    transitions: tuple[Transition, ...]
    situations: int  # situations whose two next steps were run
    complete: bool  # False if the search stopped at its limit (the arrows found are still all real)

    @property
    def states(self) -> list[str]:
        """The states the scaler can be in, the start first."""
        found = [self.start] + [s for t in self.transitions for s in (t.state, t.next_state)]
        return list(dict.fromkeys(found))


def as_rule(scaler_or_rule: LossScaler | ScaleRule | str | None) -> Any:
    """The rule of a LossScaler (a HysteresisScaler's too), a rule itself, a preset's rule by name, or (None)
    the default scaler's."""
    if scaler_or_rule is None:
        return LossScaler().rule
    if isinstance(scaler_or_rule, str):
        scaler_or_rule = LossScaler.preset(scaler_or_rule)
    if isinstance(scaler_or_rule, LossScaler):
        return scaler_or_rule.rule
    if isinstance(scaler_or_rule, ScaleRule) or hs.is_hysteresis_rule(scaler_or_rule):
        return scaler_or_rule
    raise TypeError(f"expected a LossScaler, a ScaleRule or a preset name; got {type(scaler_or_rule).__name__}")


def scaler_state_machine(
    scaler_or_rule: LossScaler | ScaleRule | str | None = None, limit: int = 100_000
) -> StateMachine:
    """Every (state, event, next state) the rule produces from a fresh scaler, found by running it.

    Breadth first over situations (scale, tracker, overflow seen, last found_inf), from
    ``(init_scale, 0, False, False)``, taking one overflowed and one clean step from each;
    at most `limit` situations (the default reaches the end for every preset).  For a hysteresis
    rule the situations hold the library's counters instead (``hysteresis_states.py``), and a step
    that raises LossScaleFloorError is the transition ``STATE --floor_error--> stopped``.
    """
    rule = as_rule(scaler_or_rule)
    if hs.is_hysteresis_rule(rule):
        start_state, found_h, parents, expanded, complete = hs.search(rule, limit)
        order_h = sorted(found_h, key=lambda t: (hs.STATE_ORDER.index(t[0]), hs.EVENT_ORDER.index(t[1]),
                                                 hs.STATE_ORDER.index(t[2])))  # fmt: skip
        found_t = tuple(Transition(*triple, _path(parents, *found_h[triple])) for triple in order_h)
        return StateMachine(rule, start_state, found_t, expanded, complete)
    start: Situation = (rule.init_scale, 0, False, False)
    # parent[key] = (key of the situation before, found_inf, steps): a path to every situation
    parent: dict[Any, tuple[Any, bool, int] | None] = {_key(rule, start): None}
    found: dict[tuple[str, str, str], tuple[Any, bool, int]] = {}
    queue, expanded = deque([start]), 0
    while queue and expanded < limit:
        here, expanded = queue.popleft(), expanded + 1
        key = _key(rule, here)
        for found_inf in (True, False):
            triple, there = _step(rule, here, found_inf)
            found.setdefault(triple, (key, found_inf, 1))
            steps = 1
            held_for = rule.growth_interval - 1 - there[1]
            if triple[1] == "held" and _tracker_counts(rule, there[2]) and held_for > 0:
                # more held steps follow, each the same transition; jump to the last one
                found.setdefault((triple[2], "held", triple[2]), (key, False, 2))
                there, steps = (there[0], rule.growth_interval - 1, there[2], False), 1 + held_for
            if _key(rule, there) not in parent:
                parent[_key(rule, there)] = (key, found_inf, steps)
                queue.append(there)
    order = sorted(found, key=lambda t: (STATES.index(t[0]), EVENTS.index(t[1]), STATES.index(t[2])))
    transitions = tuple(Transition(*triple, _path(parent, *found[triple])) for triple in order)
    return StateMachine(rule, rule.state(rule.init_scale, False, False), transitions, expanded, not queue)


def _tracker_counts(rule: ScaleRule, overflow_seen: bool) -> bool:
    """Whether the tracker decides anything: only the "interval" rule after any warmup counts towards a growth."""
    return rule.mode == "dynamic" and rule.growth_rule == "interval" and not rule.in_warmup(overflow_seen)


def _step(rule: ScaleRule, here: Situation, found_inf: bool) -> tuple[tuple[str, str, str], Situation]:
    scale, tracker, seen, last = here
    new_scale, new_tracker, new_seen, event = rule.next(scale, tracker, seen, found_inf)
    triple = (rule.state(scale, last, seen), event, rule.state(new_scale, found_inf, new_seen))
    return triple, (new_scale, new_tracker, new_seen, found_inf)


def _key(rule: ScaleRule, s: Situation) -> tuple[Any, ...]:
    """What tells two situations apart for the search (see the module docstring's shortcuts)."""
    scale, tracker, seen, last = s
    if rule.mode == "dynamic" and rule.growth_rule == "per_step" and not rule.in_warmup(seen) and scale > 0:
        scale = round(math.log(scale) / math.log(rule.growth_multiplier(seen)))  # one clean step's growth
    return scale, tracker if _tracker_counts(rule, seen) else 0, seen, last


def _path(parent: dict[Any, Any], key: Any, found_inf: bool, steps: int) -> Path:
    runs: list[tuple[bool, int]] = [(found_inf, steps)]
    while parent[key] is not None:
        key, found_inf, steps = parent[key]
        runs.append((found_inf, steps))
    merged: list[tuple[bool, int]] = []
    for flag, n in reversed(runs):  # oldest first, neighbouring runs of the same outcome joined
        if merged and merged[-1][0] == flag:
            merged[-1] = (flag, merged[-1][1] + n)
        else:
            merged.append((flag, n))
    return tuple(merged)


# ---- the drawing -------------------------------------------------------------------------------------
# Where each state sits (inches on the drawing): higher scales higher up, overflows to the right;
# Chainer's warmup ends in backed_off or at_floor, its neighbours.
POSITIONS = {
    "warmup": (10.3, 0.8),
    "at_ceiling": (6.2, 5.2),
    "steady": (3.9, 3.0),
    "backed_off": (8.5, 3.0),
    "at_floor": (6.2, 0.8),
    "static": (2.8, 1.2),  # alone on a smaller drawing
    "off": (2.8, 1.2),
}
# The side of its box where a state's self-loop goes, for loops of clean and of overflowed steps.
LOOP_SIDES = {
    "warmup": {"clean": "bottom"},
    "at_ceiling": {"clean": "right", "overflow": "left"},
    "steady": {"clean": "left", "overflow": "bottom"},
    "backed_off": {"overflow": "right", "clean": "bottom"},
    "at_floor": {"clean": "left", "overflow": "bottom"},
    "static": {"any": "right"},
    "off": {"any": "right"},
}
NODE_COLORS = {"warmup": "#e8f0fb", "steady": "#e6f4e6", "backed_off": "#fdeedd", "at_floor": "#fbe3e3",
               "at_ceiling": "#efe6f7", "static": "#eeeeee", "off": "#eeeeee"}  # fmt: skip
STEP_COLORS = {"overflow": "#d62728", "clean": "#2a8a2a", "any": "#555555"}
STEP_NAMES = {"overflow": "after an overflowed step (it is skipped)", "clean": "after a clean step",
              "any": "after any step"}  # fmt: skip
WIDTH, HEIGHT = 1.9, 0.8  # a state's box, inches
CANVAS = {"dynamic": (11.6, 7.0), "static": (7.2, 3.4), "off": (7.2, 3.4)}  # inches; so are the drawing's units


def draw_scaler_states(scaler_or_rule: LossScaler | ScaleRule | str | None = None, title: str | None = None) -> Any:
    """The scaler's states and the events between them, as a matplotlib Figure.

    `scaler_or_rule` is a LossScaler, its ScaleRule, a preset name ("pytorch", "jmp", ...)
    or None (a default ``LossScaler()``).  Every arrow is a transition ``scaler_state_machine``
    found by running the rule: red after an overflowed step, green after a clean one.  Each
    label line is "event: what happens to the scale", written from the rule's settings.
    Artists carry gids a test can read: "state:NAME" on a state, "A->B:KIND" on an arrow and its label.
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    machine = scaler_state_machine(scaler_or_rule)
    rule = machine.rule
    if hs.is_hysteresis_rule(rule):
        return _draw_hysteresis_states(machine, title)
    width, height = CANVAS[rule.mode]
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, width)
    ax.set_ylim(-0.7, height - 0.7)
    ax.set_aspect("equal")
    ax.set_axis_off()
    boxes = {}
    for state in machine.states:
        about = _state_text(rule, state) + (f"\nstart: scale {_num(rule.init_scale)}" if state == machine.start else "")
        boxes[state] = _draw_state(ax, state, about, state == machine.start)
    arrows: dict[tuple[str, str, str], list[str]] = {}
    for t in machine.transitions:
        kind = _step_kind(rule, t.event)
        arrows.setdefault((t.state, t.next_state, kind), []).append(f"{t.event}: {_event_text(rule, t)}")
    pairs = {(a, b) for (a, b, _) in arrows}
    for (a, b, kind), lines in arrows.items():
        gid, color = f"{a}->{b}:{kind}", STEP_COLORS[kind]
        if a == b:
            _draw_loop(ax, a, LOOP_SIDES[a].get(kind, "top"), lines, color, gid)
            continue
        # an arrow with one back (or one of the other kind) bends further, so that the two stay apart
        crowded = (b, a) in pairs or sum((x, y) == (a, b) for (x, y, _) in arrows) > 1
        bend = (0.22 if crowded else 0.06) + (0.45 if kind == "clean" and (a, b, "overflow") in arrows else 0.0)
        _draw_arrow(ax, boxes[a], boxes[b], a, b, bend, lines, color, gid)
    kinds = list(dict.fromkeys(kind for (_, _, kind) in arrows))
    handles = [Line2D([], [], color=STEP_COLORS[k], lw=1.6, label=STEP_NAMES[k]) for k in kinds]
    ax.legend(handles=handles, loc="lower left", fontsize=8, frameon=False)
    mode = {"dynamic": "dynamic scaling", "static": "a static scale", "off": "scaling off"}[rule.mode]
    heading = title or f"The loss scaler's states ({mode})"
    fig.text(0.5, 1 - 0.1 / height, heading, ha="center", va="top", fontsize=12)
    fig.text(0.5, 1 - 0.38 / height, _settings(rule), ha="center", va="top", fontsize=8.5, color="#444444")
    n = len(machine.transitions)
    note = "" if machine.complete else " (the search stopped at its limit: there may be more)"
    found = f"{n} transition{'s' * (n != 1)}, found by running ScaleRule.next from the start over "
    found += f"{machine.situations:,} situations{note}"
    fig.text(0.99, 0.01, found, ha="right", va="bottom", fontsize=7, color="#666666")
    return fig


def _num(x: float) -> str:
    """A scale or factor as written: 2^16 for a power of two from 1024 up, else %g."""
    if x >= 1024 and math.log2(x).is_integer():
        return f"2^{int(math.log2(x))}"
    return f"{x:g}"


def _event_text(rule: ScaleRule, t: Transition) -> str:
    """What the event does to the scale, in this rule's numbers."""
    g, b, n = _num(rule.growth_factor), _num(rule.backoff_factor), rule.growth_interval
    if t.event == "held":
        if rule.mode != "dynamic":
            return f"the scale stays {_num(rule.init_scale)}" + (" (no scaling)" if rule.mode == "off" else "")
        return f"clean step{'' if n == 2 else 's'} {'1' if n == 2 else f'1-{n - 1}'} of {n}: scale kept"
    if t.event == "backed_off":
        return f"x{b}"
    if t.event == "hit_floor":
        return f"x{b}, clamped to the floor {_num(rule.min_scale or 0.0)}"
    if t.state == "warmup" or (rule.growth_rule == "interval" and n == 1):
        grow = f"x{g}"
    elif rule.growth_rule == "per_step":
        grow = f"x{g}^(1/{n})"
    else:
        grow = f"clean step {n} of {n}: x{g}"
    if t.event == "grew":
        return grow
    if rule.max_scale is not None:
        return f"{grow}, clamped to the ceiling {_num(rule.max_scale)}"
    return f"{grow} would be inf in {rule.scale_dtype}: kept"


def _state_text(rule: ScaleRule, state: str) -> str:
    """One line on what the state means, in this rule's numbers."""
    if state == "at_ceiling":
        if rule.max_scale is not None:
            return f"scale = ceiling {_num(rule.max_scale)}"
        return f"x{_num(rule.growth_factor)} would be inf in {rule.scale_dtype}"
    return {
        "warmup": "no overflow yet",
        "steady": "clean steps, counting" if rule.growth_rule == "interval" else "clean steps",
        "backed_off": "the last step overflowed",
        "at_floor": f"scale = floor {_num(rule.min_scale or 0.0)}",
        "static": f"scale fixed at {_num(rule.init_scale)}",
        "off": "scale 1: no scaling",
    }[state]


def _step_kind(rule: ScaleRule, event: str) -> str:
    """Which steps make this event: overflowed ones, clean ones, or (static and off modes: "held") any."""
    if event in ("backed_off", "hit_floor"):
        return "overflow"
    return "clean" if rule.mode == "dynamic" else "any"


def _settings(rule: ScaleRule) -> str:
    """The rule's settings in one line."""
    if rule.mode != "dynamic":
        return f"scale {_num(rule.init_scale)} always; an overflowed step is still skipped"
    parts = [f"starts at {_num(rule.init_scale)}", f"x{_num(rule.backoff_factor)} on overflow"]
    g, n = _num(rule.growth_factor), rule.growth_interval
    if rule.warmup:
        parts.append(f"x{g} per clean step until the first overflow")
    if rule.growth_rule == "per_step":
        parts.append(f"{'then ' if rule.warmup else ''}x{g}^(1/{n}) per clean step")
    else:
        parts.append(f"{'then ' if rule.warmup else ''}x{g} after {n} clean steps in a row")
    floor = "none" if rule.min_scale is None else _num(rule.min_scale)
    ceiling = "none" if rule.max_scale is None else _num(rule.max_scale)
    parts.append(f"floor {floor}, ceiling {ceiling}; the scale is a {rule.scale_dtype}")
    return "; ".join(parts)


def _draw_state(ax: Any, state: str, about: str, is_start: bool, where: dict[str, tuple[float, float]] = POSITIONS,
                size: tuple[float, float] = (WIDTH, HEIGHT)) -> Any:  # fmt: skip
    from matplotlib.patches import FancyBboxPatch

    (x, y), (w, h) = where[state], size
    box = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04,rounding_size=0.15",
                         facecolor=NODE_COLORS[state], edgecolor="#222222", lw=2.2 if is_start else 1.0,
                         gid=f"state:{state}")  # fmt: skip
    ax.add_patch(box)
    ax.text(x, y + h / 2 - 0.23, state, ha="center", va="center", fontsize=11, fontweight="bold",
            gid=f"state:{state}")  # fmt: skip
    ax.text(x, y + h / 2 - 0.44, about, ha="center", va="top", fontsize=7.5, color="#333333", gid=f"state:{state}")
    return box


def _draw_arrow(ax: Any, box_a: Any, box_b: Any, a: str, b: str, bend: float, lines: list[str], color: str,
                gid: str, where: dict[str, tuple[float, float]] = POSITIONS, shift: tuple[float, float] = (0, 0),
                ) -> None:  # fmt: skip
    from matplotlib.patches import FancyArrowPatch

    (xa, ya), (xb, yb) = where[a], where[b]
    arrow = FancyArrowPatch((xa, ya), (xb, yb), patchA=box_a, patchB=box_b, connectionstyle=f"arc3,rad={bend}",
                            arrowstyle="-|>", mutation_scale=14, color=color, lw=1.4, gid=gid)  # fmt: skip
    ax.add_patch(arrow)
    # arc3's control point is the midpoint + bend * (dy, -dx); the curve passes halfway to it
    mx, my = (xa + xb) / 2 + 0.5 * bend * (yb - ya) + shift[0], (ya + yb) / 2 - 0.5 * bend * (xb - xa) + shift[1]
    ax.text(mx, my, "\n".join(lines), ha="center", va="center", fontsize=7.5, color=color, gid=gid,
            bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.9))  # fmt: skip


def _draw_loop(
    ax: Any,
    state: str,
    side: str,
    lines: list[str],
    color: str,
    gid: str,
    where: dict[str, tuple[float, float]] = POSITIONS,
    size: tuple[float, float] = (WIDTH, HEIGHT),
) -> None:
    from matplotlib.patches import FancyArrowPatch

    x, y = where[state]
    w, h, gap, out = size[0] / 2 + 0.04, size[1] / 2 + 0.04, 0.2, 0.5
    # two points on one side of the box, ordered so that arc3 bulges away from it; the label beyond the bulge
    a, b, at, align = {
        "top": ((x + gap, y + h), (x - gap, y + h), (x, y + h + out), dict(ha="center", va="bottom")),
        "bottom": ((x - gap, y - h), (x + gap, y - h), (x, y - h - out), dict(ha="center", va="top")),
        "left": ((x - w, y + gap), (x - w, y - gap), (x - w - out, y), dict(ha="right", va="center")),
        "right": ((x + w, y - gap), (x + w, y + gap), (x + w + out, y), dict(ha="left", va="center")),
    }[side]
    ax.add_patch(FancyArrowPatch(a, b, connectionstyle="arc3,rad=2.0", arrowstyle="-|>", mutation_scale=12,
                                 color=color, lw=1.4, gid=gid))  # fmt: skip
    ax.text(*at, "\n".join(lines), fontsize=7.5, color=color, gid=gid, **align)


# ---- a hysteresis rule's drawing: "tolerated" between steady and backed_off, the run's end below ----------
H_POSITIONS = {
    "at_ceiling": (8.0, 9.7),
    "tolerated": (8.0, 6.4),
    "steady": (2.9, 4.0),
    "backed_off": (13.1, 4.0),
    "at_floor": (8.0, 0.9),
    "stopped": (13.1, 0.9),
}
H_LOOP_SIDES = {
    "at_ceiling": {"clean": "right", "overflow": "left"},
    "steady": {"clean": "top"},
    "backed_off": {"overflow": "top"},
    "at_floor": {"clean": "left", "overflow": "bottom"},
    "tolerated": {"overflow": "left"},  # fairseq with a tolerance: an overflow tolerated after another
}
H_SIZE, H_CANVAS = (2.5, 0.95), (16.0, 11.6)
H_OVERFLOW_EVENTS = ("tolerated", "backed_off", "hit_floor", hs.FLOOR_ERROR)
NODE_COLORS.update(tolerated="#fdf6d8", stopped="#dddddd")
# where an arrow's label moves from the middle of its curve, so that no two labels meet (inches)
H_LABEL_SHIFT: dict[tuple[str, str, str], tuple[float, float]] = {
    ("steady", "backed_off", "overflow"): (0.0, -0.25),
    ("at_floor", "tolerated", "overflow"): (0.3, -1.6),
    ("tolerated", "at_floor", "clean"): (0.9, -1.75),
    ("steady", "at_ceiling", "clean"): (-0.8, 0.6),
    ("at_ceiling", "tolerated", "overflow"): (-0.9, 0.0),
    ("tolerated", "at_ceiling", "clean"): (0.9, 0.0),
    ("tolerated", "at_ceiling", "overflow"): (0.2, -0.5),  # a backoff from inf is inf again: the scale stays there
}


def _draw_hysteresis_states(machine: StateMachine, title: str | None) -> Any:
    """draw_scaler_states for a hysteresis rule: the library's counters in every label."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    rule, (width, height) = machine.rule, H_CANVAS
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, width)
    ax.set_ylim(-0.7, height - 0.7)
    ax.set_aspect("equal")
    ax.set_axis_off()
    boxes = {}
    for state in machine.states:
        start = f"\nstart: scale {hs.num(rule.round(rule.init_scale))}" if state == machine.start else ""
        boxes[state] = _draw_state(ax, state, hs.state_text(rule, state) + start, state == machine.start,
                                   H_POSITIONS, H_SIZE)  # fmt: skip
    arrows: dict[tuple[str, str, str], list[str]] = {}
    for t in machine.transitions:
        kind = "overflow" if t.event in H_OVERFLOW_EVENTS else "clean"
        arrows.setdefault((t.state, t.next_state, kind), []).append(f"{t.event}: {hs.event_text(rule, t.event)}")
    pairs = {(a, b) for (a, b, _) in arrows}
    for (a, b, kind), lines in arrows.items():
        gid, color = f"{a}->{b}:{kind}", STEP_COLORS[kind]
        if a == b:
            _draw_loop(ax, a, H_LOOP_SIDES[a].get(kind, "top"), lines, color, gid, H_POSITIONS, H_SIZE)
            continue
        crowded = (b, a) in pairs or sum((x, y) == (a, b) for (x, y, _) in arrows) > 1
        bend = (0.22 if crowded else 0.06) + (0.45 if kind == "clean" and (a, b, "overflow") in arrows else 0.0)
        _draw_arrow(
            ax, boxes[a], boxes[b], a, b, bend, lines, color, gid, H_POSITIONS, H_LABEL_SHIFT.get((a, b, kind), (0, 0))
        )
    kinds = list(dict.fromkeys(kind for (_, _, kind) in arrows))
    handles = [Line2D([], [], color=STEP_COLORS[k], lw=1.6, label=STEP_NAMES[k]) for k in kinds]
    ax.legend(handles=handles, loc="lower left", fontsize=8, frameon=False)
    from tinyamp.amp.hysteresis_rules import CLASS

    heading = title or f"The {rule.library} loss scaler's states ({CLASS[rule.library]}, with hysteresis)"
    fig.text(0.5, 1 - 0.1 / height, heading, ha="center", va="top", fontsize=12)
    lines = f"{hs.settings_text(rule)}\n{hs.restored_text(rule)}"
    fig.text(0.5, 1 - 0.38 / height, lines, ha="center", va="top", fontsize=8.5, color="#444444")
    n = len(machine.transitions)
    note = "" if machine.complete else " (the search stopped at its limit: there may be more)"
    found = f"{n} transition{'s' * (n != 1)}, found by running the {rule.library} rule's next() from the start over "
    found += f"{machine.situations:,} situations{note}"
    fig.text(0.99, 0.01, found, ha="right", va="bottom", fontsize=7, color="#666666")
    return fig
