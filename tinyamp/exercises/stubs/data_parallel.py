"""Exercise 9.1: the gradient all-reduce of data parallelism, in its dtype and its order (tutorials/09).

Write the stub below; ``tinyamp exercises check`` grades it (``--only 9.1``).
"""

from __future__ import annotations

import numpy as np


def mean_gradient(grads: list[np.ndarray], reduction: str) -> np.ndarray:
    """Exercise 9.1: the mean of N ranks' float16 gradients, summed in the reduction's dtype and in rank order.

    Task: `grads` holds one float16 array per rank (all of one shape); `reduction` is
    "float32", "float16" or "float16-predivide".  Return their mean as a float32 array,
    computed as the all-reduce of ``tinyamp.distributed`` computes it:

    * "float32": widen each gradient to float32, sum in float32, divide by N in float32;
    * "float16": sum in float16, widen the sum to float32, divide by N in float32;
    * "float16-predivide": divide each gradient by N in float16 first, then sum in float16,
      and widen the sum to float32.

    Every sum goes in rank order, ``((g_0 + g_1) + g_2) + ...``, each add rounded once to the
    dtype of the sum, and every division is rounded once too (a float16 division: compute in
    float32, round once to float16).

    Math: float16's largest value is 65504, so the float16 sum of two gradients of 40000 is
    inf although their mean, 40000, is not; dividing first keeps the sum finite but sends
    values below N * 2^-24 to 0 or to fewer bits.  Rounded additions are not associative: in
    float16, (2048 + 1) + 1 = 2048 but 2048 + (1 + 1) = 2050, so the order is part of the
    answer; a fixed order is what gives every rank the same bits.

    Read: tutorials/09_mixed_precision_across_processes.py, section 1 (The sum across ranks,
    and its dtype).

    Time: about 20 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    raise NotImplementedError("Exercise 9.1: the mean gradient of N ranks, in rank order")
