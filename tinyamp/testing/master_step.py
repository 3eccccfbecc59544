"""check_master_step: one SGD step on an FP32 master copy, the round back to FP16, the lost updates counted.

    from tinyamp.testing import check_master_step

    def test_my_master_step():
        check_master_step(my_master_step)

``step_fn(w16, master, grad16, lr) -> (new_w16, new_master, lost)``:

* ``new_master = master - float32(lr) * widen(grad16)``, in float32 (widening float16 is exact);
* ``new_w16`` is ``new_master`` rounded once to float16 (to nearest, ties to even);
* ``lost`` counts the elements whose master changed and whose update
  ``new_master - master``, added to ``w16`` directly and rounded to float16, would have left
  it unchanged (``tinyamp.amp.lost_updates``): what FP16 training without a master loses.

The reference is tinyamp's own ``MasterWeights(SGD(..., lr))``: the check compares bits.
Inputs include updates that float16 loses and float32 keeps
(``strategies.lost_update_cases``) and masters that are not float16 values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from tinyamp.amp.master import MasterWeights
from tinyamp.optim import SGD
from tinyamp.tensor import Tensor
from tinyamp.testing.counterexamples import array_in_words, blamed, check_settings, number, reported_at_the_call
from tinyamp.testing.strategies import half_arrays, lost_update_cases, shapes

# Two cases every run checks, whatever hypothesis draws: where the master carries bits below
# float16's, "w16 did not move" and "the update was lost" part ways.  The float16 ulp of 1 is
# u = 2^-10 above it and u/2 below it; the step adds -lr * grad = +0.25u or +0.625u.
_U = 2.0**-10
LOST_BUT_MOVES_W16 = (  # 1 + 0.375u + 0.25u = 1 + 0.625u rounds up to 1 + u; 1 + 0.25u alone rounds back to 1
    np.array([1.0], np.float16),
    np.array([1 + 0.375 * _U], np.float32),
    np.array([-0.25], np.float16),
    _U,
)
KEPT_BUT_LEAVES_W16 = (  # 1 - 0.21875u + 0.625u = 1 + 0.40625u rounds to 1; 1 + 0.625u alone rounds up: kept
    np.array([1.0], np.float16),
    np.array([1 - 0.21875 * _U], np.float32),
    np.array([-0.625], np.float16),
    _U,
)


@reported_at_the_call
def check_master_step(step_fn: Callable[..., Any], *, max_examples: int | None = None) -> None:
    """Check `step_fn(w16, master, grad16, lr)` against ``MasterWeights(SGD)``, bit for bit, and its lost count.

    Raises AssertionError with the inputs, the first element that differs and the rule it breaks.
    """

    @check_settings(max_examples)
    @given(case=master_step_cases())
    @example(case=LOST_BUT_MOVES_W16)
    @example(case=KEPT_BUT_LEAVES_W16)
    def step_in_float32_round_once(case: tuple[np.ndarray, np.ndarray, np.ndarray, float]) -> None:
        w16, master, grad16, lr = case
        where = (f"for {array_in_words(w16, 'w16')}, {array_in_words(master, 'master')}, "
                 f"{array_in_words(grad16, 'grad16')} and lr = {lr!r}")  # fmt: skip
        with blamed(f"{where}, your step"):
            result = step_fn(w16.copy(), master.copy(), grad16.copy(), lr)
            new_w16, new_master, lost = result
        expected_w16, expected_master, expected_lost = reference_master_step(w16, master, grad16, lr)
        for name, yours, dtype in (("new w16", new_w16, np.float16), ("new master", new_master, np.float32)):
            if not isinstance(yours, np.ndarray) or yours.dtype != dtype or yours.shape != w16.shape:
                raise AssertionError(f"{where}: your {name} must be a {np.dtype(dtype)} array of shape {w16.shape}; "
                                     f"it is {type(yours).__name__} {getattr(yours, 'dtype', '')}")  # fmt: skip
        i = _first_unequal(new_master, expected_master)
        if i is not None:
            raise AssertionError(
                f"{where}: your new master[{_index(i)}] is {number(new_master[i])}, expected "
                f"{number(expected_master[i])}: master - float32(lr) * widened grad16, computed in float32 "
                "(not in the float16 copy)"
            )
        i = _first_unequal(new_w16, expected_w16)
        if i is not None:
            raise AssertionError(
                f"{where}: your new w16[{_index(i)}] is {number(new_w16[i])}, expected {number(expected_w16[i])}: "
                "the new master rounded once to float16"
            )
        if int(lost) != expected_lost:
            raise AssertionError(
                f"{where}: you count {int(lost)} lost updates, expected {expected_lost}: the elements whose master "
                "changed and whose update (new master - master), added to w16 directly and rounded to float16, "
                "would leave w16 unchanged"
            )

    step_in_float32_round_once()


def reference_master_step(w16: np.ndarray, master: np.ndarray, grad16: np.ndarray, lr: float) -> tuple[Any, ...]:
    """(new w16, new master, lost updates) from tinyamp's MasterWeights wrapped around SGD."""
    weight = Tensor(w16, dtype="float16", requires_grad=True)
    opt = MasterWeights(SGD([("w", weight)], lr=lr))
    opt.master_params[0].data[...] = master  # a master that carries more bits than its float16 copy
    weight.grad = grad16.copy()
    opt.step()
    return weight.data, opt.master_params[0].data, opt.history[-1].lost


@st.composite
def master_step_cases(draw: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(w16, master, grad16, lr), of three kinds: updates that float16 loses and float32 keeps
    (``lost_update_cases``); masters that carry bits below float16's (up to 7/16 ulp from w16,
    where a lost update can still move w16, and a kept one leave it); any float32 master in [-2, 2]."""
    shape = draw(shapes(min_dims=1, max_dims=2))
    kind = draw(st.sampled_from(["lost", "residual", "residual", "any"]))
    if kind == "lost":
        w16, lr, grad16 = draw(lost_update_cases(shape))
        return w16, w16.astype(np.float32), grad16, lr
    grad16 = draw(half_arrays(shape))
    if kind == "residual":  # weights near 1 and updates near their ulp (2^-11 to 2^-10): both cases are common
        lr = draw(st.sampled_from([2.0**-11, 1e-3, 2.0**-12]))
        w = draw(half_arrays(shape, 0.5, 2.0)) * np.where(draw(hnp.arrays(np.bool_, shape)), -1, 1).astype(np.float16)
        fraction = draw(hnp.arrays(np.float32, shape, elements=st.floats(-0.4375, 0.4375, width=32)))  # 7/16 ulp
        master = (w.astype(np.float32) + fraction * np.spacing(np.abs(w)).astype(np.float32)).astype(np.float32)
    else:
        lr = draw(st.sampled_from([1e-4, 1e-3, 0.01, 0.1, 0.5]))
        master = draw(hnp.arrays(np.float32, shape, elements=st.floats(-2, 2, width=32)))
    return master.astype(np.float16), master, grad16, lr


def _first_unequal(a: np.ndarray, b: np.ndarray) -> tuple[int, ...] | None:
    bits = f"u{a.dtype.itemsize}"
    wrong = np.flatnonzero(a.reshape(-1).view(bits) != b.reshape(-1).view(bits))
    if wrong.size == 0:
        return None
    i = np.unravel_index(int(wrong[0]), a.shape)
    return tuple(int(k) for k in i)


def _index(i: tuple[int, ...]) -> str:
    return ", ".join(map(str, i))
