"""check_skip: an overflowed step changes nothing; a clean one is the unscaled step, bit for bit.

    from tinyamp.testing import check_skip

    def test_my_step():
        check_skip(my_skip_or_step)

``step_fn(optimizer, scale) -> skipped`` gets a tinyamp optimizer (SGD with momentum, or
Adam) whose float16 and float32 parameters hold gradients multiplied by `scale` in their
``.grad``, after one or two earlier steps (so that momentum and moments are not zero).  It
must unscale every gradient (multiply by float32(1/scale), in float32 at least, rounded once
into the gradient's dtype, as ``LossScaler.unscale_`` and PyTorch's ``GradScaler.unscale_``
do), then call ``optimizer.step()`` only when every unscaled gradient is finite, and return
True when it skipped.  Dividing by the scale instead agrees for a power of two (1/scale is
exact) but not always otherwise: one scale checked is 3, where float32(5) / 3 and
float32(5) * float32(1/3) are one ulp apart.

The check: after an overflow (an inf or NaN in some gradient) no weight, no optimizer
moment and not the step count changed, bit for bit; after a clean step everything equals
the reference (unscale, then ``optimizer.step()``), bit for bit; and after either, every
gradient is unscaled (the one after an inf too: ``unscale_`` unscales them all).  Scales
below 1 are drawn too, where unscaling can overflow a finite float16 gradient: a step is
skipped when an *unscaled* gradient is not finite, so finiteness is checked after unscaling.
After the drawn cases, five fixed ones every time: the scale 3, a finite float16 gradient that
overflows when unscaled by 2^-4, an inf in the first of two gradients, an inf in the second, and a NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tinyamp import kernels
from tinyamp.optim import SGD, Adam
from tinyamp.tensor import Tensor
from tinyamp.testing.counterexamples import blamed, check_settings, number, reported_at_the_call
from tinyamp.testing.strategies import shapes

OPTIMIZERS = {
    "SGD with momentum": lambda params: SGD(params, lr=0.1, momentum=0.9),
    "Adam": lambda params: Adam(params, lr=0.01),
}


@reported_at_the_call
def check_skip(step_fn: Callable[[Any, float], Any], *, max_examples: int | None = None) -> None:
    """Check that `step_fn(optimizer, scale)` skips every overflowed step and takes every clean one exactly.

    Raises AssertionError with the scale, the optimizer, where the inf or NaN was, and the
    first weight, moment or count that differs.
    """

    @check_settings(max_examples)
    @given(case=skip_cases())
    def overflow_changes_nothing(case: dict[str, Any]) -> None:
        check_one_step(step_fn, case)

    overflow_changes_nothing()
    for case in FIXED_CASES:  # after the drawn cases, so that their messages come first; these hold whatever was drawn
        check_one_step(step_fn, case)


def check_one_step(step_fn: Callable[[Any, float], Any], case: dict[str, Any]) -> None:
    """One case of check_skip: AssertionError in words unless `step_fn` does what reference_step does."""
    yours, expected = _build(case), _build(case)
    with blamed(f"{situation(case)}, your step"):
        skipped = step_fn(yours, case["scale"])
    overflow = reference_step(expected, case["scale"])
    if not isinstance(skipped, (bool, np.bool_)):
        raise AssertionError(f"{situation(case)}: return True when you skip the step, False when you take it; "
                             f"yours returned {skipped!r}")  # fmt: skip
    if bool(skipped) != overflow:
        raise AssertionError(
            f"{situation(case)}: your step returned skipped={bool(skipped)}, but "
            f"{'an unscaled gradient is not finite' if overflow else 'every gradient is finite'}"
        )
    difference = first_difference(yours, expected)
    if difference and overflow:
        raise AssertionError(
            f"{situation(case)}: after your step {difference} (as before it): an overflowed step must change no "
            "weight and no optimizer moment"
        )
    if difference:
        divided = _build(case)
        reference_step(divided, case["scale"], divide=True)
        raise AssertionError(
            f"{situation(case)}: after your step {difference}: unscale every gradient (multiply by 1/scale in "
            "float32, round once to its dtype), then call optimizer.step()"
            + (DIVIDED_HINT if not first_difference(yours, divided) else "")
        )
    gradient = first_gradient_difference(yours, expected)
    if gradient:
        divided = _build(case)
        reference_step(divided, case["scale"], divide=True)
        hint = DIVIDED_HINT if not first_gradient_difference(yours, divided) else ""
        raise AssertionError(
            f"{situation(case)}: after your step {gradient}: unscale every gradient (multiply by 1/scale in float32, "
            "round once to its dtype) in place, all of them, also after an inf or NaN is found, and check "
            f"finiteness on the unscaled values{hint}"
        )


DIVIDED_HINT = (" (not by dividing by the scale, as yours seems to: for a scale that is not a power of two, "
                "g / scale and g * float32(1/scale) can be one ulp apart)")  # fmt: skip


# a clean step with scale 3 and a float32 gradient of 5 (scaled): 5 * float32(1/3) is 1.6666667, 5 / 3 is 1.6666666
DIVIDED_BY_THREE: dict[str, Any] = dict(
    weights=[np.array([1.0], np.float32)], grads=[np.array([0.5], np.float64)], scaled=[np.array([5.0], np.float32)],
    scale=3.0, optimizer="SGD with momentum", earlier_steps=1,
)  # fmt: skip
# scale 2^-4: the finite float16 gradient 8192 unscales to 131072, beyond 65504: inf, so the step is skipped
UNSCALING_OVERFLOWS: dict[str, Any] = dict(
    weights=[np.array([1.0, -1.0], np.float16)], grads=[np.array([0.25, 0.5], np.float64)],
    scaled=[np.array([8192.0, 1.0], np.float16)], scale=2.0**-4, optimizer="SGD with momentum", earlier_steps=1,
)  # fmt: skip
# an inf in the first gradient: the second must be unscaled all the same (as GradScaler.unscale_ does)
INF_FIRST: dict[str, Any] = dict(
    weights=[np.array([1.0], np.float32), np.array([2.0, -2.0], np.float16)],
    grads=[np.array([0.5], np.float64), np.array([0.25, -0.25], np.float64)],
    scaled=[np.array([np.inf], np.float32), np.array([256.0, -512.0], np.float16)], scale=2.0**10,
    optimizer="Adam", earlier_steps=1,
)  # fmt: skip
# an inf in the second of two gradients only: a step that looks at the first gradient alone misses it (drawn cases
# seldom hold an overflow beyond w0: hypothesis draws the index 0 far more often than the others)
INF_SECOND: dict[str, Any] = dict(
    weights=[np.array([1.0], np.float32), np.array([1.0], np.float16)], grads=[np.array([0.5])] * 2,
    scaled=[np.array([5.0], np.float32), np.array([np.inf], np.float16)], scale=8.0, optimizer="Adam",
    earlier_steps=1,
)  # fmt: skip
# a NaN, not an inf: a step that looks for inf only (np.isinf) misses it (drawn cases hold a NaN far less often)
NAN_FIRST: dict[str, Any] = dict(
    weights=[np.array([1.0], np.float32), np.array([1.0], np.float16)], grads=[np.array([0.5])] * 2,
    scaled=[np.array([np.nan], np.float32), np.array([5.0], np.float16)], scale=8.0, optimizer="Adam",
    earlier_steps=1,
)  # fmt: skip
FIXED_CASES = (DIVIDED_BY_THREE, UNSCALING_OVERFLOWS, INF_FIRST, INF_SECOND, NAN_FIRST)


@st.composite
def skip_cases(draw: Any) -> dict[str, Any]:
    """Parameters (float16 or float32), scaled gradients maybe holding an inf or NaN, an optimizer, a scale."""
    scale = draw(
        st.integers(-8, 30).map(lambda k: 2.0**k)  # powers of two: exact, except among the subnormals and, below
        # 1, beyond 65504, where unscaling a finite float16 gradient overflows
        | st.sampled_from([3.0, 1000.0, 1.5 * 2.0**20])  # others: 1/scale in float16 is not 1/scale in float32
        | st.floats(1.0, 2.0**24, width=32)
    )
    weights, grads, scaled = [], [], []
    for _ in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from([np.float32, np.float16]))
        shape = draw(shapes(min_dims=1, max_dims=2, max_side=4))
        weights.append(draw(hnp.arrays(dtype, shape, elements=st.floats(-2, 2, width=16))))
        scaled.append(draw(hnp.arrays(dtype, shape, elements=st.floats(-(2.0**15), 2.0**15, width=16))))
        # the gradients of the earlier, clean steps: finite in the parameter's dtype (a scale below 1 would
        # make scaled / scale overflow float16, and those steps were not skipped)
        grads.append(scaled[-1].astype(np.float64) / max(scale, 1.0))
    spoilers = st.tuples(
        st.integers(0, len(scaled) - 1), st.integers(0, 99), st.sampled_from([np.inf, -np.inf, np.nan])
    )
    spoiler = draw(st.none() | spoilers)  # an inf or NaN at one place of one gradient, or none
    if spoiler is not None:
        which, element, value = spoiler
        scaled[which].reshape(-1)[element % scaled[which].size] = value
    return dict(
        weights=weights, grads=grads, scaled=scaled, scale=scale,
        optimizer=draw(st.sampled_from(sorted(OPTIMIZERS))), earlier_steps=draw(st.integers(1, 2)),
    )  # fmt: skip


def _build(case: dict[str, Any]) -> Any:
    """The optimizer after its earlier clean steps, with the scaled gradients in place."""
    params = [(f"w{i}", Tensor(w, dtype=w.dtype, requires_grad=True)) for i, w in enumerate(case["weights"])]
    optimizer = OPTIMIZERS[case["optimizer"]](params)
    for _ in range(case["earlier_steps"]):
        for (_, p), g in zip(params, case["grads"]):
            p.grad = g.astype(p.dtype)
        optimizer.step()
    for (_, p), g in zip(params, case["scaled"]):
        p.grad = g.copy()
    return optimizer


def reference_step(optimizer: Any, scale: float, divide: bool = False) -> bool:
    """Unscale as LossScaler does, step only if every gradient is finite; True when it skipped.
    (With `divide`, the common mistake instead: g / scale in float32, rounded once into g's dtype.)"""
    finite = True
    for p in optimizer.params:
        if divide:
            with np.errstate(over="ignore", invalid="ignore"):
                p.grad[...] = (p.grad.astype(np.float32) / np.float32(scale)).astype(p.grad.dtype)
        else:
            kernels.multiply_and_sum_squares_(p.grad, 1.0 / scale)  # in float32 at least, rounded once into g's dtype
        finite = finite and bool(np.isfinite(p.grad).all())
    if finite:
        optimizer.step()
    return not finite


def first_gradient_difference(yours: Any, expected: Any) -> str:
    """The first gradient that differs from the reference's after the step, in words ("" if none).

    Bit for bit, except that a NaN matches any NaN (its payload is not the rule's business)."""
    for name, p, q in zip(yours.names, yours.params, expected.params):
        a, b = np.asarray(p.grad), np.asarray(q.grad)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"the gradient of {name} has shape {a.shape} and dtype {a.dtype}, expected {b.shape} and {b.dtype}"
        bits = f"u{a.dtype.itemsize}"
        differ = (a.reshape(-1).view(bits) != b.reshape(-1).view(bits)) & ~(np.isnan(a) & np.isnan(b)).reshape(-1)
        if differ.any():
            i = np.unravel_index(int(np.flatnonzero(differ)[0]), a.shape)
            return f"the gradient of {name}[{', '.join(map(str, i))}] is {number(a[i])}, expected {number(b[i])}"
    return ""


def first_difference(yours: Any, expected: Any) -> str:
    """The first weight, optimizer state entry or count that differs, bit for bit, in words ("" if none)."""
    if yours.step_count != expected.step_count:
        return f"optimizer.step_count is {yours.step_count}, expected {expected.step_count}"
    for name, p, q in zip(yours.names, yours.params, expected.params):
        if p.data.tobytes() != q.data.tobytes():
            return _element(f"the weight {name}", p.data, q.data)
    for name, s, t in zip(yours.names, yours.state, expected.state):
        for key in sorted(set(s) | set(t)):
            a, b = s.get(key), t.get(key)
            if np.asarray(a).tobytes() != np.asarray(b).tobytes():
                return _element(f"the optimizer's {key} of {name}", a, b)
    return ""


def _element(what: str, a: Any, b: Any) -> str:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{what} has shape {a.shape} and dtype {a.dtype}, expected {b.shape} and {b.dtype}"
    bits = f"u{a.dtype.itemsize}"
    i = np.unravel_index(int(np.flatnonzero(a.reshape(-1).view(bits) != b.reshape(-1).view(bits))[0]), a.shape)
    where = f"[{', '.join(map(str, i))}]" if a.ndim else ""
    return f"{what}{where} is {number(a[i])}, expected {number(b[i])}"


def situation(case: dict[str, Any]) -> str:
    """In words: "with scale 1024 and an inf in the scaled gradient of w1, on Adam after 1 earlier step"."""
    bad = [(f"w{i}", g) for i, g in enumerate(case["scaled"]) if not np.isfinite(g).all()]
    params = ", ".join(f"w{i} {w.dtype} {w.shape}" for i, w in enumerate(case["weights"]))
    if bad:
        name, g = bad[0]
        kind = "a NaN" if np.isnan(g).any() else "an inf"
        what = f"{kind} in the scaled gradient of {name}"
    else:
        what = "finite scaled gradients"
    steps = case["earlier_steps"]
    return (f"with scale {number(case['scale'])} and {what}, on {case['optimizer']} ({params}) after {steps} earlier "
            f"step{'s' if steps > 1 else ''}")  # fmt: skip
