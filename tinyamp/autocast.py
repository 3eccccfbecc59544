"""autocast: run each op in the precision the op policy gives it.

    with tinyamp.amp.autocast("float16", log_casts=True) as ac:
        loss = cross_entropy(model(x), y)   # linears in FP16, the loss in FP32
    print(ac.format_cast_log())

Inside the block, every op listed in the policy (``tinyamp.policy``) casts its floating
inputs first: "lower" ops to float16 (or bfloat16), "fp32" ops to float32.  The ops ask
through ``cast_inputs(op, *tensors)`` and ``output_dtype(op)``, which change nothing
outside a block.  Each cast is an ordinary differentiable Cast node, so its gradient is
cast back: the float16 gradient of a float32 weight's copy arrives at the weight as float32.

A parameter (a leaf that requires grad) is cast *once per block* and the copy is reused
by every op that reads it: a weight shared by two layers is rounded once, and its two
gradients meet at one Cast node.  Run the optimizer outside the block: the cache would
otherwise serve the copy of a weight that has since changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyamp import dtypes
from tinyamp import policy as _policy
from tinyamp.casting import Cast
from tinyamp.grad_mode import is_grad_enabled
from tinyamp.tensor import Tensor

AUTOCAST_COPY = "autocast copy"

_active: autocast | None = None  # the innermost enabled block, or None


def cast_inputs(op: str, *tensors: Any) -> tuple[Any, ...]:
    """`tensors`, cast as the active block's policy says for `op` (unchanged outside autocast)."""
    return tensors if _active is None else _active.cast_inputs(op, tensors)


def output_dtype(op: str) -> np.dtype | None:
    """float32 when the active policy keeps `op`'s FP32 accumulator ("lower_fp32_out"), else None."""
    return None if _active is None else _active.output_dtype(op)


def is_autocast_enabled() -> bool:
    """True inside an enabled autocast block."""
    return _active is not None


def current() -> autocast | None:
    """The innermost enabled autocast block (None outside autocast)."""
    return _active


@dataclass(frozen=True)
class CastRecord:
    """One cast made by autocast: which op asked, from and to which dtype, the shape,
    and whether the copy came from the per-block cache of parameter casts."""

    op: str
    from_dtype: str
    to_dtype: str
    shape: tuple[int, ...]
    cached: bool


class autocast:  # noqa: N801  (lowercase: it reads as a verb, like no_grad)
    """Context manager: ops follow the policy table; parameter casts are cached per block.

    ``dtype`` is "float16" (default) or "bfloat16".  ``policy`` overrides entries of the
    default table (e.g. ``{"softmax": "lower"}`` to watch softmax fail in FP16).
    ``log_casts=True`` records every cast in ``cast_log``.
    """

    def __init__(
        self,
        dtype: Any = "float16",
        enabled: bool = True,
        policy: dict[str, str] | None = None,
        log_casts: bool = False,
    ) -> None:
        self.dtype = dtypes.resolve(dtype)
        if not dtypes.is_16bit(self.dtype):
            raise ValueError(f"autocast lowers to a 16-bit float (float16 or bfloat16); got {self.dtype}")
        self.enabled = enabled
        self.policy = dict(_policy.DEFAULT_POLICY)
        for op, rule in (policy or {}).items():
            if op not in _policy.DEFAULT_POLICY:
                known = ", ".join(_policy.DEFAULT_POLICY)
                raise ValueError(f"autocast policy: unknown op {op!r} (a typo?); the table has {known}")
            _policy.check_rule(op, rule)
            self.policy[op] = rule
        self.log_casts = log_casts
        self.cast_log: list[CastRecord] = []
        self._cache: dict[tuple[int, np.dtype], tuple[Tensor, Tensor]] = {}
        self._outer: autocast | None = None

    def __enter__(self) -> autocast:
        global _active
        self._outer, _active = _active, (self if self.enabled else None)
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        _active = self._outer
        self._cache.clear()

    # ---- what the ops call -----------------------------------------------------------------
    def target_dtype(self, op: str, tensors: tuple[Any, ...]) -> np.dtype | None:
        """The dtype `op` computes in under this policy (None: leave the inputs alone)."""
        rule = self.policy.get(op)
        if rule is None:
            return None
        if rule in (_policy.LOWER, _policy.LOWER_FP32_OUT):
            return self.dtype
        if rule == _policy.FP32:
            return dtypes.float32
        floats = [t.dtype for t in tensors if isinstance(t, Tensor) and dtypes.is_floating(t.dtype)]
        widest = max(floats, key=lambda d: d.itemsize, default=None)
        return widest

    def cast_inputs(self, op: str, tensors: tuple[Any, ...]) -> tuple[Any, ...]:
        target = self.target_dtype(op, tensors)
        if target is None:
            return tensors
        return tuple(self._cast(op, t, target) if self._eligible(t, target) else t for t in tensors)

    def output_dtype(self, op: str) -> np.dtype | None:
        """float32 for ops whose rule keeps the FP32 accumulator ("lower_fp32_out")."""
        return dtypes.float32 if self.policy.get(op) == _policy.LOWER_FP32_OUT else None

    @staticmethod
    def _eligible(t: Any, target: np.dtype) -> bool:
        # Only float32 is lowered and only 16-bit floats are raised: float64 is left
        # alone (a float64 computation asked for its precision on purpose).
        if not isinstance(t, Tensor) or t.dtype == target or not dtypes.is_floating(t.dtype):
            return False
        return t.dtype == dtypes.float32 if dtypes.is_16bit(target) else t.dtype.itemsize < target.itemsize

    def _cast(self, op: str, t: Tensor, target: np.dtype) -> Tensor:
        # Only copies that carry a graph are cached: a copy made under no_grad() has no
        # Cast node, and reusing it later would cut the parameter off from its gradient.
        cacheable = t.is_leaf and t.requires_grad and is_grad_enabled()
        key = (id(t), target)
        hit = self._cache.get(key) if cacheable else None
        if hit is not None and hit[1].creator is not None and hit[1].creator.saved is None:
            hit = None  # a backward has walked (and freed) that Cast node: cast afresh
        if hit is not None and hit[0] is t:
            out, cached = hit[1], True
        else:
            dtypes.check_supported(target, t.device)  # bfloat16 is CPU-only: say so, do not cast
            out, cached = Cast.apply(t, dtype=target), False
            out.name = AUTOCAST_COPY  # so reports can tell this copy from a user's tensor
            if cacheable:
                self._cache[key] = (t, out)  # keep t alive so its id cannot be reused
        if self.log_casts:
            self.cast_log.append(CastRecord(op, t.dtype.name, target.name, t.shape, cached))
        return out

    def format_cast_log(self) -> str:
        """The cast log as a printable table."""
        lines = [f"{'op':<15}{'from':<10}{'to':<10}{'shape':<18}cached"]
        for r in self.cast_log:
            lines.append(f"{r.op:<15}{r.from_dtype:<10}{r.to_dtype:<10}{str(r.shape):<18}{'yes' if r.cached else ''}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"autocast(dtype={self.dtype.name}, enabled={self.enabled}, {len(self.cast_log)} casts logged)"
