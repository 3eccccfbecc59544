"""The state machine of a hysteresis rule (Megatron-LM's, DeepSpeed's, fairseq's), found by running it.

As for the classic rules (``draw_scaler.py``), no arrow is typed in: the search starts where a new
``HysteresisScaler`` starts and runs the rule's own ``next`` (the function the scaler calls) on an
overflow and on a clean step from every situation it reaches, breadth first.  A situation is the
scale, the library's counters and the state.  Two situations are told apart only by what the
rule's next decisions read:

* Megatron: ``growth_tracker``, and ``hysteresis_tracker`` down to 1 (at 1, 0, -1, ... the next
  overflow backs off, and only a growth restores it);
* DeepSpeed: ``cur_hysteresis``, and the clean steps since the last overflow as 0 or their
  place in the ``scale_window`` (a clean step grows when that count is > 0 and a multiple of it);
* fairseq: the steps since the last overflow modulo ``scale_window``; with ``tolerance > 0`` also
  ``overflows_since_rescale`` and the steps since the last rescale, whose ratio decides a backoff.
  These two can grow without bound (overflows spread out enough are tolerated for ever), so that
  search may stop at its limit; every arrow it found is still real.

A run of clean steps that hold the scale jumps to its last one, as in the classic search (the
overflow's outcome does not depend on how far the count has got).  fairseq with ``tolerance > 0``
does not jump: there its ratio changes with every clean step.

A step that raises ``LossScaleFloorError`` (DeepSpeed's ``raise_error_at_min_scale``, fairseq's
``min_loss_scale``) ends the run: it is drawn as the event ``floor_error`` into the state ``stopped``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from tinyamp.amp.hysteresis_rules import HYSTERESIS_EVENTS, RULES, STATES, LossScaleFloorError

FLOOR_ERROR, STOPPED = "floor_error", "stopped"  # the event and the state of a run ended by LossScaleFloorError
EVENT_ORDER = (*HYSTERESIS_EVENTS, FLOOR_ERROR)
STATE_ORDER = (*STATES, STOPPED)
# The counter that lets an overflow pass, by its library's own name
COUNTER = {"megatron": "hysteresis_tracker", "deepspeed": "cur_hysteresis", "fairseq": "overflows_since_rescale"}

Situation = tuple[float, tuple[tuple[str, int], ...], str]  # scale, the library's counters, the state


def is_hysteresis_rule(rule: Any) -> bool:
    """Whether `rule` is one of hysteresis_rules.py's (the rule of a HysteresisScaler)."""
    return isinstance(rule, tuple(RULES.values()))


def search(rule: Any, limit: int) -> tuple[str, dict[tuple[str, str, str], tuple[Any, bool, int]], dict, int, bool]:
    """Breadth first from a fresh scaler: (start state, triple -> its last step, parents, situations, complete).

    ``found[triple] = (key of the situation before, found_inf, steps)``; ``parent`` maps each
    situation's key to the same for the step that first reached it (None for the start).
    """
    scale = rule.round(rule.init_scale)
    start: Situation = (scale, tuple(rule.start().items()), rule.state(scale, "held"))
    parent: dict[Any, tuple[Any, bool, int] | None] = {key(rule, start): None}
    found: dict[tuple[str, str, str], tuple[Any, bool, int]] = {}
    queue, expanded = deque([start]), 0
    while queue and expanded < limit:
        here, expanded = queue.popleft(), expanded + 1
        here_key, (scale, counters, state) = key(rule, here), here
        for found_inf in (True, False):
            try:
                new_scale, new_counters, event = rule.next(scale, dict(counters), found_inf)
            except LossScaleFloorError:
                found.setdefault((state, FLOOR_ERROR, STOPPED), (here_key, found_inf, 1))
                continue
            there: Situation = (new_scale, tuple(new_counters.items()), rule.state(new_scale, event))
            found.setdefault((state, event, there[2]), (here_key, found_inf, 1))
            steps, extra = 1, held_after(rule, new_counters) if event == "held" else 0
            if extra > 0:  # more held steps follow, each steady -> steady; jump to the last of them
                held = rule.state(new_scale, "held")
                found.setdefault((there[2], "held", held), (here_key, False, 2))
                there, steps = (new_scale, tuple(advanced(rule, new_counters, extra).items()), held), 1 + extra
            if key(rule, there) not in parent:
                parent[key(rule, there)] = (here_key, found_inf, steps)
                queue.append(there)
    start_state = start[2]
    return start_state, found, parent, expanded, not queue


def key(rule: Any, situation: Situation) -> tuple[Any, ...]:
    """What tells two situations apart for the search (see the module docstring)."""
    scale, counters, state = situation
    c, s = dict(counters), rule.settings
    if rule.library == "megatron":
        return scale, c["growth_tracker"], max(c["hysteresis_tracker"], 1), state
    if rule.library == "deepspeed":
        clean = c["cur_iter"] - c["last_overflow_iter"] - 1
        return scale, 0 if clean == 0 else (clean - 1) % s["scale_window"] + 1, c["cur_hysteresis"], state
    since = (c["iter"] - c["last_overflow_iter"]) % s["scale_window"]
    if s["tolerance"] == 0:  # every overflow backs off: the ratio decides nothing
        return scale, since, state
    return scale, since, c["overflows_since_rescale"], c["iter"] - c["last_rescale_iter"], state


def held_after(rule: Any, c: dict[str, int]) -> int:
    """How many more clean steps after this held one would hold the scale too (0: the next one may not)."""
    s = rule.settings
    if rule.library == "megatron":
        return s["growth_interval"] - 1 - c["growth_tracker"]
    if rule.library == "deepspeed":  # the next clean step grows when its count is a multiple of scale_window
        return -(c["cur_iter"] - c["last_overflow_iter"] - 1) % s["scale_window"]
    if s["tolerance"] == 0:
        return -(c["iter"] - c["last_overflow_iter"]) % s["scale_window"]
    return 0


def advanced(rule: Any, c: dict[str, int], steps: int) -> dict[str, int]:
    """The counters after `steps` more held clean steps."""
    c = dict(c)
    counting = {"megatron": "growth_tracker", "deepspeed": "cur_iter", "fairseq": "iter"}[rule.library]
    c[counting] += steps
    return c


# ---- the words on the drawing ---------------------------------------------------------------------------
def num(x: float) -> str:
    """A scale or factor as written: 2^16 for a power of two from 1024 up, else %g."""
    if x >= 1024 and math.log2(x).is_integer():
        return f"2^{int(math.log2(x))}"
    return f"{x:g}"


def event_text(rule: Any, event: str) -> str:
    """What the event does, in the library's counters and this rule's numbers."""
    s, lib = rule.settings, rule.library
    if lib == "megatron":
        h, n, floor = s["hysteresis"], s["growth_interval"], num(rule.floor())
        back, grow = f"x{num(s['backoff_factor'])}", f"x{num(s['growth_factor'])}"
        return {
            "tolerated": "hysteresis_tracker - 1 > 0:\nscale kept, growth_tracker = 0",
            "backed_off": f"hysteresis_tracker\n- 1 <= 0: {back}",
            "hit_floor": f"hysteresis_tracker - 1 <= 0:\n{back}, clamped to min_scale {floor}",
            "held": f"clean step {'1' if n == 2 else f'1-{n - 1}'} of {n}:\nkept (hysteresis_tracker too)",
            "grew": f"clean step {n} of {n}: {grow};\nhysteresis_tracker = {h} (only here)",
        }[event]
    if lib == "deepspeed":
        d, w, floor = s["delayed_shift"], s["scale_window"], num(s["min_scale"])
        restore = "" if s["consecutive_hysteresis"] else " (only here)"
        kept = f"cur_hysteresis = {d}" if s["consecutive_hysteresis"] else "cur_hysteresis kept"
        return {
            "tolerated": "cur_hysteresis > 1: kept;\ncur_hysteresis - 1",
            "backed_off": "cur_hysteresis\n== 1: /2" if d > 1 else "delayed_shift\n== 1: /2",
            "hit_floor": f"cur_hysteresis == 1: /2,\nclamped to min_scale {floor}",
            "held": f"clean step: kept;\n{kept}",
            "grew": f"clean step {w + 1} since an overflow,\nthen every {w}: x2;\ncur_hysteresis = {d}{restore}",
            FLOOR_ERROR: f"at min_scale {floor}, cur_hysteresis == 1:\nLossScaleFloorError",
        }[event]
    w, tol, factor = s["scale_window"], s["tolerance"], num(s["scale_factor"])
    ratio = "overflows_since_rescale / steps\nsince the last rescale"
    return {
        "tolerated": f"{ratio} < {tol:g}: kept",
        "backed_off": f"{ratio} >= {tol:g}:\n/{factor}; overflows_since_rescale = 0",
        "hit_floor": f"that ratio >= {tol:g}: /{factor},\nraised to threshold {num(s['threshold'] or 0.0)}",
        "held": f"clean step 1-{w - 1} since\nthe overflow: kept" if w > 2 else "clean step: kept",
        "grew": f"every {w} clean steps:\nx{factor} (overflows_since_rescale kept)",
        FLOOR_ERROR: f"new scale <= min_loss_scale {s['min_loss_scale']:g}:\nLossScaleFloorError",
    }[event]


def state_text(rule: Any, state: str) -> str:
    """One line on what the state means, in this rule's numbers."""
    fairseq = rule.library == "fairseq"
    return {
        "tolerated": f"overflow skipped, scale kept;\n{COUNTER[rule.library]} {'up' if fairseq else 'down'} by 1",
        "steady": "clean steps, counting",
        "backed_off": "the last overflow backed off",
        "at_floor": f"scale = {rule.floor_name} {num(rule.floor() or 0.0)}",
        "at_ceiling": f"x{num(rule.grown(1.0))} would be inf in {rule.scale_dtype}",
        STOPPED: "LossScaleFloorError:\nthe run ends, nothing changed",
    }[state]


def settings_text(rule: Any) -> str:
    """The rule's settings in one line, by the library's own names."""
    return ", ".join(f"{k}={num(v) if isinstance(v, float) else v}" for k, v in rule.settings.items())


def restored_text(rule: Any) -> str:
    """When the counter that tolerates overflows is restored: the line that sets these rules apart."""
    s = rule.settings
    if rule.library == "megatron":
        return (f"hysteresis_tracker starts at hysteresis={s['hysteresis']}, goes down at every overflow and is "
                "restored only when the scale grows: overflows need not be consecutive")  # fmt: skip
    if rule.library == "deepspeed":
        when = "at every clean step (consecutive_hysteresis=True: only consecutive overflows count)" if s[
            "consecutive_hysteresis"] else "only when the scale grows (consecutive_hysteresis=False)"  # fmt: skip
        return f"cur_hysteresis starts at delayed_shift={s['delayed_shift']} and is restored {when}"
    return (f"overflows_since_rescale counts the overflows since the last backoff; an overflow backs off when they "
            f"are >= tolerance={s['tolerance']:g} of the steps since the last rescale (growth or backoff)")  # fmt: skip
