"""Graders of Exercises 5.1 (DynamicLossScaler), 5.2 (skip_or_step), 5.3 (scaling_is_exact) and 5.4
(HysteresisLossScaler)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tinyamp.amp import LossScaler
from tinyamp.exercises.remote import HARNESSES, harness, is_remote
from tinyamp.exercises.student_lines import error_record
from tinyamp.optim import SGD, Adam
from tinyamp.tensor import Tensor
from tinyamp.testing import check_scaler, check_skip
from tinyamp.testing.counterexamples import blamed, check_settings, flags_in_words, number
from tinyamp.testing.strategies import multiples_of_smallest_subnormal, shapes

REFERENCES = ("pytorch", "jmp")  # float32 scales both; jmp adds a floor


# neither preset has a ceiling, so max_scale is checked on its own: growths that reach it, pass it by a
# factor of 4, and land on a ceiling that is not a power of two; an overflow in between
CEILINGS = (
    dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=1, max_scale=3000.0),
    dict(init_scale=2.0**10, growth_factor=4.0, backoff_factor=0.5, growth_interval=2, max_scale=2.0**13),
)
CEILING_FLAGS = (False, False, False, False, True, False, False, False)
# jmp (and Apex) run a start below the floor: the scale grows as usual, and the first overflow lifts it to min_scale
BELOW_THE_FLOOR = dict(init_scale=2.0**-4, growth_factor=2.0, backoff_factor=0.5, growth_interval=2, min_scale=1.0,
                       max_scale=None)  # fmt: skip
BELOW_THE_FLOOR_FLAGS = (False, False, True, False, True, True)


def grade_dynamic_loss_scaler(scaler_class: type, examples: int) -> None:
    """Step by step against the pytorch preset, then the jmp preset (settings drawn by scaler_settings, a start
    below jmp's floor among them); then a start below the floor on fixed settings, whatever the draws met; then
    the ceiling, max_scale, which neither preset has, against the pytorch rule with that ceiling."""
    for reference in REFERENCES:
        check_scaler(lambda **settings: scaler_class(**settings), reference, max_examples=examples)
    below_the_floor(scaler_class)
    for settings in CEILINGS:
        reference = LossScaler.preset("pytorch", **settings)
        with blamed(f"with settings {settings}, your DynamicLossScaler"):
            yours = scaler_class(min_scale=None, **settings)
        for step, found_inf in enumerate(CEILING_FLAGS, 1):
            reference.update(found_inf)
            with blamed(f"with settings {settings}, at step {step}, your update({found_inf})"):
                yours.update(found_inf)
            if float(yours.scale) != reference.scale:
                raise AssertionError(
                    f"after {flags_in_words(list(CEILING_FLAGS[:step]))} your scale is {number(yours.scale)}, "
                    f"the rule says {number(reference.scale)} (settings: {settings}): a grown scale above max_scale "
                    "is lowered to max_scale"
                )


def below_the_floor(scaler_class: type) -> None:
    """init_scale below min_scale, as jmp's and Apex's rules allow: kept until the first overflow lifts it."""
    settings = BELOW_THE_FLOOR
    reference = LossScaler.preset("jmp", **settings)
    with blamed(f"with settings {settings}, your DynamicLossScaler"):
        yours = scaler_class(**settings)
    rule = ("min_scale bounds a backoff, not the start: a scale that starts below it grows as usual, and the first "
            "overflow lifts it to min_scale (jmp's and Apex's rules)")  # fmt: skip
    if float(yours.scale) != reference.scale:
        raise AssertionError(f"before any step your scale is {number(yours.scale)}, the jmp rule says "
                             f"{number(reference.scale)} (settings: {settings}): {rule}")  # fmt: skip
    for step, found_inf in enumerate(BELOW_THE_FLOOR_FLAGS, 1):
        reference.update(found_inf)
        with blamed(f"with settings {settings}, at step {step}, your update({found_inf})"):
            yours.update(found_inf)
        if float(yours.scale) != reference.scale:
            raise AssertionError(
                f"after {flags_in_words(list(BELOW_THE_FLOOR_FLAGS[:step]))} your scale is {number(yours.scale)}, "
                f"the jmp rule says {number(reference.scale)} (settings: {settings}): {rule}"
            )


def grade_skip_or_step(skip_or_step: Callable[[Any, float], bool], examples: int) -> None:
    """An overflowed step changes nothing; a clean one is unscale-then-step, bit for bit."""
    check_skip(mirrored(skip_or_step), max_examples=examples)  # the step in the student's process, compared here


@st.composite
def gradients_and_exponents(draw: Any) -> tuple[np.ndarray, int]:
    """(g, k): finite float16 gradients and k in -30..30, weighted to where exactness is decided: values
    using all 11 bits (n * 2^e, n odd) shifted by a small negative k into the subnormals, or up beyond 65504."""
    shape = draw(shapes(min_dims=1, max_dims=2))
    anything = st.floats(width=16, allow_nan=False, allow_infinity=False)
    near_zero = multiples_of_smallest_subnormal().map(lambda m: float(np.float16(m * 2.0**-24)))
    odd = st.tuples(st.integers(-1024, 1023), st.integers(-24, 5)).map(lambda n_e: (2 * n_e[0] + 1) * 2.0 ** n_e[1])
    g = draw(hnp.arrays(np.float16, shape, elements=anything | near_zero | odd.map(lambda v: float(np.float16(v)))))
    return g, draw(st.integers(-30, 30) | st.integers(-12, -1) | st.integers(1, 8))


def grade_scaling_is_exact(scaling_is_exact: Callable[[np.ndarray, int], np.ndarray], examples: int) -> None:
    """Against the round trip itself: float16(g * 2^k) is exactly g * 2^k (then unscaling gives g back).

    Drawn (g, k), then exhaustively: every finite float16 value, for every k from -30 to 30.
    """

    @check_settings(examples)
    @given(case=gradients_and_exponents())
    def exact_where_the_round_trip_gives_g_back(case: tuple[np.ndarray, int]) -> None:
        exact_at(scaling_is_exact, *case)

    exact_where_the_round_trip_gives_g_back()
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    every = every[np.isfinite(every)]  # 63,488 values
    for k in range(-30, 31):
        exact_at(scaling_is_exact, every, k, f"every finite float16 value g (63,488 of them) and k = {k} (S = 2^{k})")


def exact_at(scaling_is_exact: Callable[[np.ndarray, int], np.ndarray], g: np.ndarray, k: int, about: str = "") -> None:
    """AssertionError in words unless scaling_is_exact(g, k) is True exactly where float16(g * 2^k) == g * 2^k."""
    exact64 = g.astype(np.float64) * 2.0**k
    with np.errstate(over="ignore"):
        scaled = exact64.astype(np.float16)
    expected = np.isfinite(scaled) & (scaled.astype(np.float64) == exact64)
    about = about or f"g = {np.array2string(g, separator=', ')} (float16) and k = {k} (S = 2^{k})"
    try:
        got = scaling_is_exact(g.copy(), k)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"for {about} yours raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(got, np.ndarray) or got.shape != g.shape or got.dtype != np.bool_:
        what = f"{type(got).__name__} {getattr(got, 'dtype', '')} {getattr(got, 'shape', '')}"
        raise AssertionError(f"for {about} return a bool array of shape {g.shape}; yours returned {what}")
    if np.array_equal(got, expected):
        return
    i = int(np.flatnonzero(got != expected)[0])
    x, y = float(g.reshape(-1)[i]), float(scaled.reshape(-1)[i])
    why = (f"g * S = {number(exact64.reshape(-1)[i])} is a float16 value: scaling and unscaling only move the "
           "exponent" if expected.reshape(-1)[i] else f"g * S = {number(exact64.reshape(-1)[i])} is not a float16 "
           f"value: it rounds to {number(y)}")  # fmt: skip
    raise AssertionError(
        f"for {about}: at g.flat[{i}] = {number(x)} yours says {'exact' if got.reshape(-1)[i] else 'not exact'}, "
        f"but {why}"
    )


# Megatron's rule in one fixed run, after the drawn ones, whatever they met: an overflow tolerated, a clean step that
# must not restore the counter, the overflow that then backs off, a full window that grows and restores it, two
# overflows in a row after it (the second backs off, the counter going on to 0), and one more backoff at -1.
HYSTERESIS_SETTINGS = dict(initial_scale=2.0**10, min_scale=2.0**4, growth_interval=3, hysteresis=2,
                           growth_factor=2.0, backoff_factor=0.5)  # fmt: skip
HYSTERESIS_FLAGS = (True, False, True, False, False, False, True, True, True, False, False, False, True)


def grade_hysteresis_loss_scaler(scaler_class: type, examples: int) -> None:
    """Step by step against the megatron preset (settings drawn by hysteresis_settings("megatron"), state_dict
    round trips among the steps), comparing scale and hysteresis_tracker; then one fixed run that meets each
    clause of the rule, with a round trip part way to a growth."""
    from tinyamp.testing.scaler_hysteresis import hysteresis_machine

    make = lambda **settings: scaler_class(**settings)  # noqa: E731  (the student's class, built by keyword)
    check_scaler(make, "megatron", counter="hysteresis_tracker", max_examples=examples)
    state = hysteresis_machine(make, "megatron", "hysteresis_tracker", round_trip=True)()
    state.build(settings=dict(HYSTERESIS_SETTINGS))
    for step, found_inf in enumerate(HYSTERESIS_FLAGS):
        if step == 4:
            state.save_and_restore()
        state.one_step(found_inf=found_inf)


# ---- harnesses: the student's code run in their process on objects built from plain data ----------------------
# 5.2 hands the student's skip_or_step a tinyamp optimizer; 5.1 and 5.4 step a scaler hundreds of times.  The
# optimizer travels as what it is made of (``described_optimizer``), is built again in the student's process, and
# its state after their step comes back to be compared here; a run of scaler steps travels in one message.
OPTIMIZERS = {"SGD": SGD, "Adam": Adam}


def described_optimizer(optimizer: Any) -> dict[str, Any]:
    """An SGD or Adam optimizer as plain data: its hyperparameters, step count, weights, gradients and state."""
    return {
        "optimizer": type(optimizer).__name__,
        "hyperparameters": {h: getattr(optimizer, h) for h in optimizer.hyperparameters},
        "step_count": optimizer.step_count,
        "names": list(optimizer.names),
        "weights": [p.data for p in optimizer.params],
        "grads": [p.grad for p in optimizer.params],
        "state": [dict(s) for s in optimizer.state],
    }


def optimizer_from(description: dict[str, Any]) -> Any:
    """The optimizer `description` describes, its parameters and state copied in, bit for bit."""
    params = [(name, Tensor(w.copy(), dtype=w.dtype, requires_grad=True))
              for name, w in zip(description["names"], description["weights"])]  # fmt: skip
    optimizer = OPTIMIZERS[description["optimizer"]](params, **description["hyperparameters"])
    optimizer.step_count = description["step_count"]
    optimizer.state = [dict(s) for s in description["state"]]
    for (_, p), g in zip(params, description["grads"]):
        p.grad = g
    return optimizer


def take_state(optimizer: Any, description: dict[str, Any]) -> None:
    """Give `optimizer` the state `description` holds (what the student's step left in their process)."""
    optimizer.step_count = description["step_count"]
    for p, w, g in zip(optimizer.params, description["weights"], description["grads"]):
        p.data, p.grad = w, g
    optimizer.state = [dict(s) for s in description["state"]]


def skip_step(skip_or_step: Callable[[Any, float], Any], description: dict[str, Any], scale: float) -> Any:
    """5.2: the student's skip_or_step on the optimizer described; (what it returned, the optimizer after it)."""
    optimizer = optimizer_from(description)
    skipped = skip_or_step(optimizer, scale)
    return skipped, described_optimizer(optimizer)


def mirrored(skip_or_step: Any) -> Callable[[Any, float], Any]:
    """A step function for check_skip that runs the student's remote skip_or_step on a copy of the optimizer it is
    given and then puts the copy's state into it, so that the check compares the state here."""
    if not is_remote(skip_or_step):
        return skip_or_step

    def step(optimizer: Any, scale: float) -> Any:
        skipped, after = harness(skip_or_step, "skip_step", described_optimizer(optimizer), scale)
        take_state(optimizer, after)
        return skipped

    return step


def scaler_steps(graded: Any, scalers: list[Any], flags: list[bool], names: list[str]) -> Any:
    """5.1, 5.4: a run of steps of the student's scaler (the first of `scalers`) and its forks, in one message.

    For each flag what ``ScalerAndForks.step`` reads: your scale before, then ``update(flag)`` on each
    scaler and its `names` (a method's value, or the attribute), all in one flat list (one row per step:
    1 + len(names) * len(scalers) values); and where an exception stopped them (``(phase, record)``:
    "before", "update", "values" or "fork"), or None."""
    flat: list[Any] = []
    for flag in flags:
        phase = "before"
        try:
            row = [_raw(scalers[0], "scale")]
            phase = "update"
            scalers[0].update(flag)
            phase = "values"
            row += [_raw(scalers[0], name) for name in names]
            phase = "fork"
            for fork in scalers[1:]:
                fork.update(flag)
                row += [_raw(fork, name) for name in names]
        except Exception as exc:
            return flat, (phase, error_record(exc, Path.cwd()))
        flat += row
    return flat, None


def _raw(scaler: Any, name: str) -> Any:
    value = getattr(scaler, name)
    return value() if callable(value) else value


HARNESSES.update(skip_step=skip_step, scaler_steps=scaler_steps)
