"""Lost updates: an update added to a 16-bit weight that leaves the weight unchanged.

float16 keeps 11 significant bits, so $1 + 2^{-11}$ rounds back to 1.  For a normal
weight w and a nonzero update $\\Delta$, with round to nearest, ties to even:

* only a small update is lost: $|\\Delta|$ is then at most half the gap from w to its
  neighbour in the update's direction, which is at most half an ulp of w, $|w| / 2048$;
* every update of at most $|w| / 4096$ is lost.  Away from zero, and toward zero from a
  weight that is not a power of two, half the gap is half an ulp, more than $|w| / 4096$;
  toward zero from a power of two the gap is half an ulp, so half of it is exactly
  $|w| / 4096$, a tie that rounds to the power of two (its mantissa is even).
  So $w = 1$ loses $\\Delta = +2^{-11}$ (a tie, kept at 1) but not $-2^{-11}$:
  $1 - 2^{-11}$ is a float16 value.

Micikevicius et al. (2018) sum this up as a weight 2048 times its update.  bfloat16,
with 8 significant bits, loses updates from 256 (some) and 512 (all) times smaller.

That rule rounds the exact $w + \\Delta$ once.  ``lost_updates``, the one definition tinyamp
uses (``MasterWeights.history``, the demo, ``formats.update_is_lost``), rounds twice, as the
optimizers do: the sum to float32, then to the weight's format.  For a float16 update that is
the same (24 >= 2 * 11 + 2 bits: Figueroa 1995).  Otherwise float32's rounding, monotone, can
bring a sum onto an FP16 tie (never across one), which then goes to the even neighbour: $w = 1$
loses $\\Delta = 1/2047.9$ (tutorial 4).  So the second bullet holds for both; the first
becomes: a lost update is at most $|w| \\cdot 2^{-11}(1 + 2^{-12})$.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from tinyamp import kernels


def lost_updates(weight: Any, update: Any) -> Any:
    """Where the float32 `update`, applied to the 16-bit `weight`, leaves it unchanged (a bool array).

    The arithmetic is that of tinyamp's optimizers on a 16-bit weight: widen the weight
    (exact), add the update in float32 (one rounding), round that sum to the weight's format
    (a second; the module docstring says where the two differ from one).  An update of 0 is
    not counted as lost.
    """
    rounded = kernels.cast(kernels.widen(weight) + update, weight.dtype)
    return (update != 0) & (rounded == weight)


class UpdateRecord(NamedTuple):
    """What one step did to the 16-bit weights, in element counts (over the parameters with a master copy).

    ``changed``: elements whose master changed.  Of those, ``lost``: the update
    Δ = master_new - master_old would have been lost had it been added to the 16-bit weight
    directly (``lost_updates``); and ``unchanged``: the 16-bit copy did not change this step
    (the update waits in the master until it adds up).
    """

    step: int
    changed: int
    lost: int
    unchanged: int

    @property
    def lost_update_fraction(self) -> float:
        """lost / changed (NaN when no master changed: nothing to measure)."""
        return self.lost / self.changed if self.changed else math.nan

    @property
    def unchanged_fraction(self) -> float:
        """unchanged / changed (NaN when no master changed)."""
        return self.unchanged / self.changed if self.changed else math.nan
