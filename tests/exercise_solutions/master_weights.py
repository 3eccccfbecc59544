"""Exercises 4.1 and 4.2: the lost update, and the master-weight step that saves it (tutorials/04)."""

from __future__ import annotations

import math  # hint: math.frexp gives the exponent of a float

import numpy as np


def update_is_lost(weight: float, update: float) -> bool:
    """Exercise 4.1: True when the update, added to the float16 weight, leaves the weight unchanged.

    Task: `weight` is a float16 value and `update` a float32 value (both as Python floats).
    An optimizer adds them in float32 and rounds the sum once to float16; return True when
    that gives `weight` back and the update is not 0.  Decide it with the gaps between
    float16 values, not by rounding: no conversion to float16 (``np.float16(v)``,
    ``astype(np.float16)``, ``dtype=np.float16``, however spelled), the grader refuses it.

    Math: let d = float32(weight + update) - weight, what the sum moved.  The sum rounds back
    to w when |d| is below half the gap from w to its neighbour *in the direction of d*; at
    exactly half (a tie) it goes to the even neighbour, so it stays when w's last mantissa
    bit is 0.  That bit is the parity of the integer q = |w| / ulp(w), the last bit of w
    counted in ulps: q < 2^11 and ulp(w) is a power of two, so the division is exact in float32
    and in float64, and ``q % 2`` reads the bit with no conversion (w = 1 + 2^-10: q = 1025,
    odd).  The gap is one ulp of w (2^(k-10) for 2^k <= |w| < 2^(k+1), 2^-24 below 2^-14),
    except toward zero from a power of two 2^k with k > -14 (2^-14 excluded), where the values
    below are half an ulp apart.  2^-14 itself, the smallest normal, is not such a power: the
    subnormals below it are 2^-24 apart, one full ulp.  So w = 1 loses +2^-11 (a tie, and
    q = 1024 is even) but not -2^-11.

    Read: tutorials/01_number_formats.py, section 5; tutorials/04_fp32_master_weights.py,
    section 1 (The 2048x rule, exactly).

    Time: about 25 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    # >>> exercise 4.1
    if update == 0:
        return False
    moved = float(np.float32(weight) + np.float32(update)) - weight  # the sum, in float32 as an optimizer forms it
    if moved == 0:
        return True
    w = abs(weight)
    ulp = 2.0**-24 if w < 2.0**-14 else 2.0 ** (math.frexp(w)[1] - 11)
    toward_zero = weight != 0 and (moved < 0) == (weight > 0)
    power_of_two = math.frexp(w)[0] == 0.5
    gap = ulp / 2 if toward_zero and power_of_two and w > 2.0**-14 else ulp
    if abs(moved) != gap / 2:
        return abs(moved) < gap / 2
    return (w / ulp) % 2 == 0  # a tie: the weight stays when its last mantissa bit is 0
    # <<< exercise 4.1


def master_step(
    w16: np.ndarray, master: np.ndarray, grad16: np.ndarray, lr: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """Exercise 4.2: one SGD step on the float32 master, rounded back to float16, with its lost updates counted.

    Task: `w16` (float16) is the model's weight, `master` (float32) its master copy (w16 is
    master rounded to float16), `grad16` (float16) the gradient, `lr` the learning rate.
    Return ``(new_w16, new_master, lost)``:

    * new_master = master - float32(lr) * grad16 widened to float32, computed in float32;
    * new_w16 = new_master rounded once to float16;
    * lost = how many elements changed in the master and would have been lost in float16:
      their update (new_master - master), added to w16 in float32 and rounded to float16,
      leaves w16 unchanged.  Those are the updates FP16 training without a master drops.

    Math: float16 keeps 11 significant bits, so an update 4096 or more times smaller than a
    normal weight is always lost, and one under 2048 times smaller never is (in between it
    depends on the weight's place in its binade: tutorial 4, section 1); float32 keeps 24,
    and the master adds up the small updates until they move the float16 copy.

    Read: tutorials/04_fp32_master_weights.py, sections 2 and 3 (master weights on one
    weight, then on the digits MLP).

    Time: about 15 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    # >>> exercise 4.2
    new_master = master - np.float32(lr) * grad16.astype(np.float32)
    update = new_master - master
    stays = (w16.astype(np.float32) + update).astype(np.float16) == w16
    lost = (new_master != master) & (update != 0) & stays
    return new_master.astype(np.float16), new_master, int(np.count_nonzero(lost))
    # <<< exercise 4.2
