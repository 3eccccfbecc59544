"""What a LossScaler checks: the settings it is built with, the optimizers it drives, the state_dicts it loads.

Each is refused with an error that names the setting or the entry and the value, before
anything changes; a state_dict is checked against itself too (its history must end where
its scale, tracker and state are).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, fields
from typing import Any

from tinyamp.amp.loss_scale import EVENTS, GROWTH_RULES, MODES, SCALE_DTYPES, STATES, ScaleEvent, ScaleRule, round_scale
from tinyamp.tensor import Tensor

FORMAT = "tinyamp.amp.LossScaler"
VERSION = 1


class ScalerStateError(ValueError):
    """A scaler state_dict that is corrupt or was saved by a differently configured scaler."""


def _number(name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number; got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    return value


def checked_rule(**c: Any) -> ScaleRule:
    """The LossScaler constructor's arguments, checked and normalized (floats, init_scale rounded to scale_dtype)."""
    if c["mode"] not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {c['mode']!r}")
    if c["scale_dtype"] not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}; got {c['scale_dtype']!r}")
    if c["growth_rule"] not in GROWTH_RULES:
        raise ValueError(f"growth_rule must be one of {GROWTH_RULES}; got {c['growth_rule']!r}")
    for key in ("warmup", "start_below_floor"):
        if not isinstance(c[key], bool):
            raise TypeError(f"{key} must be True or False; got {c[key]!r}")
    if c["mode"] != "dynamic" and (c["warmup"] or c["growth_rule"] != "interval"):
        raise ValueError(f"warmup and growth_rule only apply to mode='dynamic'; this scaler has mode={c['mode']!r}")
    growth = _number("growth_factor", c["growth_factor"])
    if not growth > 1:
        raise ValueError(f"growth_factor must be > 1 (the scale grows after clean steps); got {growth}")
    backoff = _number("backoff_factor", c["backoff_factor"])
    if not 0 < backoff < 1:
        raise ValueError(f"backoff_factor must lie in (0, 1) (the scale shrinks after an overflow); got {backoff}")
    interval = c["growth_interval"]
    if not isinstance(interval, numbers.Integral) or isinstance(interval, bool) or interval < 1:
        raise ValueError(f"growth_interval must be an int >= 1; got {interval!r}")
    c.update(growth_factor=growth, backoff_factor=backoff, growth_interval=int(interval))

    def round_to_dtype(x: float) -> float:
        return round_scale(c["scale_dtype"], x)

    init = c["init_scale"]
    if init is None:
        init = 1.0 if c["mode"] == "off" else 2.0**16
    init = _number("init_scale", init)
    if c["mode"] == "off" and init != 1.0:
        raise ValueError(f"mode='off' scales by 1; init_scale={init} would be ignored, so it is an error")
    if not init > 0:
        raise ValueError(f"init_scale must be > 0; got {init}")
    rounded = round_to_dtype(init)  # as torch.full((), init_scale, dtype=torch.float32) does
    if not (math.isfinite(rounded) and rounded > 0):
        raise ValueError(f"init_scale={init} rounds to {rounded} in float32; pick a scale within float32's range")
    c["init_scale"] = rounded
    for key in ("min_scale", "max_scale"):
        if c[key] is None:
            continue
        value = _number(key, c[key])
        if not value > 0:
            raise ValueError(f"{key} must be > 0 (or None); got {value}")
        if round_to_dtype(value) != value:
            raise ValueError(
                f"{key}={value!r} is not exactly representable in float32 (nearest: {round_to_dtype(value)!r}); "
                "use a power of two, or that nearest value"
            )
        c[key] = value
    low = c["min_scale"] if c["min_scale"] is not None else 0.0
    high = c["max_scale"] if c["max_scale"] is not None else math.inf
    init = c["init_scale"]
    if not (low <= init <= high or (c["start_below_floor"] and init < low <= high)):
        # Below the floor, the first overflow would *raise* the scale to min_scale: allowed only when asked for.
        hint = "; or pass start_below_floor=True to start below the floor, as jmp and Apex do"
        raise ValueError(
            f"the bounds must satisfy min_scale <= init_scale <= max_scale; got min_scale={c['min_scale']}, "
            f"init_scale={init}, max_scale={c['max_scale']}{hint if init < low <= high else ''}"
        )
    return ScaleRule(**c)


def state_dict(scaler: Any) -> dict[str, Any]:
    """A LossScaler's state as plain Python values: what ``validated_state`` reads back."""
    return {
        "format": FORMAT, "version": VERSION, "config": scaler.config, "scale": scaler.scale,
        "growth_tracker": scaler.growth_tracker, "step_count": scaler.step_count,
        "overflow_seen": scaler.overflow_seen, "state": scaler.state, "history": scaler.history_columns(),
    }  # fmt: skip


def built_from_saved_config(cls: Any, d: Any) -> Any:
    """A new ``cls`` (LossScaler) with the settings saved in the state_dict `d`, or ScalerStateError."""
    if not isinstance(d, dict) or not isinstance(d.get("config"), dict):
        raise ScalerStateError("this is not a LossScaler state_dict: it has no 'config' dict")
    try:
        return cls(**d["config"])
    except (TypeError, ValueError) as exc:
        raise ScalerStateError(f"the saved config is not valid: {exc}") from exc


def validated_state(rule: ScaleRule, d: Any) -> tuple[float, int, int, bool, str, list[ScaleEvent]]:
    """A LossScaler state_dict's values, once checked against `rule` and against itself (else ScalerStateError)."""

    def fail(why: str) -> ScalerStateError:
        return ScalerStateError(f"cannot load this LossScaler state_dict: {why}")

    if not isinstance(d, dict):
        raise fail(f"expected a dict, got {type(d).__name__}")
    if d.get("format") != FORMAT:
        raise fail(f"its 'format' is {d.get('format')!r}, not {FORMAT!r} (is it another object's state?)")
    if d.get("version") != VERSION:
        raise fail(f"it has version {d.get('version')!r}; this tinyamp reads version {VERSION}")
    expected = {"format", "version", "config", "scale", "growth_tracker", "step_count", "overflow_seen", "state"}
    expected.add("history")
    if set(d) != expected:
        missing, extra = sorted(expected - set(d)), sorted(set(d) - expected)
        raise fail(f"missing keys {missing}, unexpected keys {extra}")
    config = d["config"]
    if isinstance(config, dict) and "start_below_floor" not in config:
        config = {**config, "start_below_floor": False}  # saved before this setting existed, when it was always False
    own = asdict(rule)
    if config != own:
        if not isinstance(config, dict):
            raise fail("'config' is not a dict")
        diff = [
            f"{k}={config.get(k)!r} (this scaler: {own.get(k)!r})"
            for k in sorted(set(config) | set(own))
            if config.get(k, "<missing>") != own.get(k, "<missing>")
        ]
        raise fail(
            "it was saved by a scaler configured differently: "
            + ", ".join(diff)
            + ". Build the scaler with LossScaler.from_state_dict(d), or LossScaler(**d['config'])"
        )
    scale, tracker, steps = d["scale"], d["growth_tracker"], d["step_count"]
    if not isinstance(scale, float) or not math.isfinite(scale) or scale < 0 or rule.round(scale) != scale:
        raise fail(f"scale={scale!r} is not a finite float >= 0 representable in {rule.scale_dtype}")
    if rule.max_scale is not None and scale > rule.max_scale:
        raise fail(f"scale={scale!r} is above max_scale={rule.max_scale!r}")
    if rule.mode != "dynamic" and scale != rule.init_scale:
        raise fail(f"scale={scale!r}, but in mode {rule.mode!r} the scale is always {rule.init_scale!r}")
    for key, value in (("growth_tracker", tracker), ("step_count", steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise fail(f"{key}={value!r} is not an int >= 0")
    overflow_seen = d["overflow_seen"]
    if not isinstance(overflow_seen, bool):
        raise fail(f"overflow_seen={overflow_seen!r} is not a bool")
    backed_off = rule.mode == "dynamic" and overflow_seen  # the floor binds from the first backoff on
    if rule.min_scale is not None and scale < rule.min_scale and (backed_off or not rule.start_below_floor):
        raise fail(f"scale={scale!r} is below min_scale={rule.min_scale!r}")
    interval_rule = rule.mode == "dynamic" and rule.growth_rule == "interval"
    if interval_rule and not (rule.warmup and not overflow_seen) and tracker >= rule.growth_interval:
        raise fail(f"growth_tracker={tracker} must be below growth_interval={rule.growth_interval}")
    history = _validated_history(d["history"], steps, fail)
    if history:
        last = history[-1]
        if (last.scale_after, last.growth_tracker, last.state) != (scale, tracker, d["state"]):
            raise fail(
                f"the last history record (scale {last.scale_after!r}, tracker {last.growth_tracker}, "
                f"state {last.state!r}) disagrees with scale={scale!r}, growth_tracker={tracker}, "
                f"state={d['state']!r}"
            )
        if overflow_seen != any(e.found_inf for e in history):
            raise fail(f"overflow_seen={overflow_seen} disagrees with the history")
    elif (scale, tracker, overflow_seen) != (rule.init_scale, 0, False):
        raise fail("the history is empty, but the scale, tracker or overflow_seen are not the initial ones")
    state = rule.state(scale, history[-1].found_inf if history else False, overflow_seen)
    if d["state"] != state:
        raise fail(f"state={d['state']!r}, but scale={scale!r} and the history give state {state!r}")
    return scale, tracker, steps, overflow_seen, state, history


def _validated_history(columns: Any, steps: int, fail: Any) -> list[ScaleEvent]:
    names = [f.name for f in fields(ScaleEvent)]
    if not isinstance(columns, dict) or set(columns) != set(names):
        raise fail(f"'history' must be a dict with the columns {names}")
    lengths = {len(v) if isinstance(v, list) else -1 for v in columns.values()}
    if lengths != {steps}:
        raise fail(f"each history column must be a list of step_count={steps} entries")
    checks = {
        "step": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "scale_before": lambda v: isinstance(v, float) and math.isfinite(v) and v >= 0,
        "scale_after": lambda v: isinstance(v, float) and math.isfinite(v) and v >= 0,
        "found_inf": lambda v: isinstance(v, bool),
        "event": lambda v: v in EVENTS,
        "growth_tracker": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "state": lambda v: v in STATES,
    }
    history = []
    for i in range(steps):
        row = {k: columns[k][i] for k in names}
        bad = [k for k in names if not checks[k](row[k])]
        if bad:
            raise fail(f"history row {i} has invalid {', '.join(f'{k}={row[k]!r}' for k in bad)}")
        if row["step"] != i:
            raise fail(f"history row {i} is numbered step {row['step']}")
        if i and row["scale_before"] != columns["scale_after"][i - 1]:
            raise fail(f"history row {i} starts from scale {row['scale_before']!r}, not the previous row's end")
        history.append(ScaleEvent(**row))
    return history


def optimizer_params(optimizer: Any) -> tuple[list[Tensor], list[str]]:
    """The optimizer protocol: ``.params`` (Tensors whose .grad step() reads), ``.names``, ``.step()``."""
    params, names = getattr(optimizer, "params", None), getattr(optimizer, "names", None)
    if params is None or names is None or not callable(getattr(optimizer, "step", None)):
        raise TypeError(
            f"the scaler needs an optimizer with .params, .names and .step() (a tinyamp optimizer, or "
            f"MasterWeights); got {type(optimizer).__name__}"
        )
    params, names = list(params), list(names)
    if len(params) != len(names):
        raise ValueError(f"the optimizer has {len(params)} params but {len(names)} names")
    return params, names


def check_max_norm(max_norm: Any) -> None:
    """A ValueError in one sentence unless `max_norm` is a real number above 0."""
    if not isinstance(max_norm, numbers.Real) or isinstance(max_norm, bool) or not max_norm > 0:
        raise ValueError(f"max_norm must be a number > 0; got {max_norm!r}")
