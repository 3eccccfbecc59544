"""HysteresisScaler: a LossScaler that follows Megatron-LM's, DeepSpeed's or fairseq's rule (``hysteresis_rules.py``).

Built by ``LossScaler.preset("megatron" | "deepspeed" | "fairseq", **settings)``.  Its history
records (``HysteresisEvent``) and its ``state_dict`` carry the library's own counters, so that
a restored scaler continues bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from tinyamp.amp import presets
from tinyamp.amp.hysteresis_rules import (
    HYSTERESIS_EVENTS,
    RULES,
    STATES,
    HysteresisEvent,
    LossScaleFloorError,
    make_rule,
)
from tinyamp.amp.loss_scale import ScaleEvent
from tinyamp.amp.scaler import LossScaler
from tinyamp.amp.scaler_checks import ScalerStateError

__all__ = ["HysteresisScaler", "HysteresisEvent", "LossScaleFloorError"]

FORMAT = "tinyamp.amp.HysteresisScaler"
VERSION = 1


class HysteresisScaler(LossScaler):
    """A LossScaler whose rule is Megatron-LM's, DeepSpeed's or fairseq's (``LossScaler.preset`` builds one).

    Everything else (the phases, the skip, the reports, ``history``) is LossScaler's.  The library's
    counters are ``counters`` (its own names); ``growth_tracker`` is the clean steps since the last
    overflow (Megatron: since the last growth too), ``hysteresis`` the counter in ``HysteresisEvent``.
    """

    def __init__(self, library: str, **settings: Any) -> None:
        """`library` is "megatron", "deepspeed" or "fairseq"; `settings` are its own, by its own names."""
        if library not in RULES:
            raise ValueError(f"unknown hysteresis rule {library!r}; the rules are {', '.join(RULES)}")
        self.rule = make_rule(library, settings)  # type: ignore[assignment]
        self._scale = self.rule.round(self.rule.init_scale)
        self._counters = self.rule.start()
        self._tracker, self._step_count, self._overflow_seen = 0, 0, False
        self._state = self.rule.state(self._scale, "held")
        self._history: list[ScaleEvent] = []
        self._phase, self._step_just_updated, self._unscaled_optimizer = "ready", False, None
        self._grad_norm = math.nan
        self.last_report = None

    def _transition(self, found_inf: bool) -> ScaleEvent:
        rule = self.rule
        try:
            scale, counters, event = rule.next(self._scale, self._counters, found_inf)
        except LossScaleFloorError:
            self._phase, self._unscaled_optimizer = "ready", None  # the step was skipped; nothing changed
            raise
        state = rule.state(scale, event)
        record = HysteresisEvent(
            self._step_count, self._scale, scale, found_inf, event, rule.clean_steps(counters), state,
            rule.hysteresis(counters), tuple(counters.items()),
        )  # fmt: skip
        self._scale, self._counters, self._state = scale, counters, state
        self._tracker, self._overflow_seen = record.growth_tracker, self._overflow_seen or found_inf
        self._history.append(record)
        self._step_count += 1
        return record

    @property
    def library(self) -> str:
        """"megatron", "deepspeed" or "fairseq"."""
        return self.rule.library

    @property
    def counters(self) -> dict[str, int]:
        """The library's own counters (a copy), e.g. Megatron's growth_tracker and hysteresis_tracker."""
        return dict(self._counters)

    @property
    def hysteresis(self) -> int:
        """Megatron's hysteresis_tracker, DeepSpeed's cur_hysteresis, fairseq's overflows_since_rescale."""
        return self.rule.hysteresis(self._counters)

    @property
    def config(self) -> dict[str, Any]:
        """``HysteresisScaler(**scaler.config)`` rebuilds it: the library and its settings."""
        return {"library": self.rule.library, **self.rule.settings}

    def __repr__(self) -> str:
        return (
            f"HysteresisScaler({self.rule.library}, scale={self._scale!r}, state={self._state!r}, "
            f"{', '.join(f'{k}={v}' for k, v in self._counters.items())}, step={self._step_count}, "
            f"phase={self._phase!r})"
        )

    def history_columns(self) -> dict[str, list[Any]]:
        """The history as columns; the library's counters each get their own column."""
        names = [f.name for f in fields(HysteresisEvent) if f.name != "counters"]
        columns = {n: [getattr(e, n) for e in self._history] for n in names}
        for key in self._counters:  # Megatron's growth_tracker is the growth_tracker column already
            columns.setdefault(key, [dict(e.counters)[key] for e in self._history])  # type: ignore[attr-defined]
        return columns

    def state_dict(self) -> dict[str, Any]:
        """Everything the future of this scaler depends on, as plain Python values (saved between steps)."""
        self._check_between_steps("state_dict()", "save the scaler between steps, after scaler.step(optimizer)")
        return {"format": FORMAT, "version": VERSION, "config": self.config, "scale": self._scale,
                "counters": dict(self._counters), "step_count": self._step_count, "state": self._state,
                "history": self.history_columns()}  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` of a scaler with the same config; checked first, so a bad one changes nothing."""
        self._check_between_steps("load_state_dict()", "load between steps")
        scale, counters, steps, state, history = _validated(self, state_dict)
        self._scale, self._counters, self._step_count, self._state, self._history = (
            scale, counters, steps, state, history
        )  # fmt: skip
        self._tracker = self.rule.clean_steps(counters)
        self._overflow_seen = any(e.found_inf for e in history)
        self._step_just_updated, self.last_report = False, None

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any]) -> HysteresisScaler:
        """A new scaler with the saved config and state."""
        config = state_dict.get("config") if isinstance(state_dict, dict) else None
        if not isinstance(config, dict):
            raise ScalerStateError("this is not a HysteresisScaler state_dict: it has no 'config' dict")
        try:
            scaler = cls(**config)
        except (TypeError, ValueError) as exc:
            raise ScalerStateError(f"the saved config is not valid: {exc}") from exc
        scaler.load_state_dict(state_dict)
        return scaler


def _validated(scaler: HysteresisScaler, d: Any) -> tuple[float, dict[str, int], int, str, list[ScaleEvent]]:
    def fail(why: str) -> ScalerStateError:
        return ScalerStateError(f"cannot load this HysteresisScaler state_dict: {why}")

    rule = scaler.rule
    keys = {"format", "version", "config", "scale", "counters", "step_count", "state", "history"}
    if not isinstance(d, dict) or set(d) != keys or d["format"] != FORMAT or d["version"] != VERSION:
        raise fail(f"expected a dict with the keys {sorted(keys)}, format {FORMAT!r}, version {VERSION}")
    if d["config"] != scaler.config:
        raise fail(f"it was saved by a scaler configured as {d['config']!r}; this one is {scaler.config!r}")
    scale, counters, steps = d["scale"], d["counters"], d["step_count"]
    if not isinstance(scale, float) or not scale > 0 or rule.round(scale) != scale:  # inf: grown past the top
        raise fail(f"scale={scale!r} is not a float > 0 (or inf, as the library's grows) in {rule.scale_dtype}")
    start = rule.start()
    if not isinstance(counters, dict) or set(counters) != set(start) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in counters.values()
    ) or not rule.valid(counters):  # fmt: skip
        raise fail(f"counters={counters!r} are not {rule.library}'s ({', '.join(start)}) within their ranges")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise fail(f"step_count={steps!r} is not an int >= 0")
    columns = d["history"]
    own = [f.name for f in fields(HysteresisEvent) if f.name != "counters"]
    names = own + [k for k in start if k not in own]
    if not isinstance(columns, dict) or set(columns) != set(names):
        raise fail(f"'history' must be a dict with the columns {names}")
    if any(not isinstance(v, list) or len(v) != steps for v in columns.values()):
        raise fail(f"each history column must be a list of step_count={steps} entries")
    history = []
    for i in range(steps):
        row = {n: columns[n][i] for n in names}
        if row["step"] != i or row["event"] not in HYSTERESIS_EVENTS or row["state"] not in STATES:
            raise fail(f"history row {i} is not a record of step {i}: {row!r}")
        row["counters"] = tuple((k, row[k] if k in own else row.pop(k)) for k in start)
        history.append(HysteresisEvent(**row))
    last = (history[-1].scale_after, dict(history[-1].counters), history[-1].state) if history else None
    if last is not None and last != (scale, counters, d["state"]):
        raise fail(f"the last history record {last!r} disagrees with scale, counters and state")
    if last is None and (scale, counters) != (rule.round(rule.init_scale), start):
        raise fail("the history is empty, but the scale or the counters are not the initial ones")
    state = rule.state(scale, history[-1].event if history else "held")
    if d["state"] != state:
        raise fail(f"state={d['state']!r}, but the scale and the history give state {state!r}")
    return scale, dict(counters), steps, state, history


presets.HYSTERESIS_SCALER[:] = [HysteresisScaler]
