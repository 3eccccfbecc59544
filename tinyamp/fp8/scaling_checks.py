"""The checks around scaling (``scaling.py`` per tensor, ``blocks.py`` per block): settings, inputs and
saved states, each refused with one sentence that names the value and the fix; and the printed summary
of a tensor."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

RECIPES = ("delayed", "current")
AMAX_ALGORITHMS = ("max", "most_recent")
PASSES = ("forward", "backward")
BLOCK_ROUNDINGS = ("floor", "up")  # of a power-of-two block scale: OCP's floor, or up (nothing saturates)
PASS_FORMATS = {  # TE's recipe.Format: HYBRID is E4M3 forward and E5M2 for gradients
    "HYBRID": {"forward": "E4M3", "backward": "E5M2"},
    "E4M3": {"forward": "E4M3", "backward": "E4M3"},
    "E5M2": {"forward": "E5M2", "backward": "E5M2"},
}
MAX_MARGIN = 126  # beyond it FP8_MAX * 2^-margin leaves float32's normal range (2^-126) for every format


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_recipe(recipe: Any) -> None:
    """Refuse a ScalingRecipe whose settings are not among those the rule defines."""
    if recipe.recipe not in RECIPES:
        raise ValueError(f"unknown scaling recipe {recipe.recipe!r}; use 'delayed' (scale from the amax history) "
                         "or 'current' (scale from the tensor itself)")  # fmt: skip
    if recipe.fp8_format not in PASS_FORMATS:
        raise ValueError(f"unknown fp8_format {recipe.fp8_format!r}; use 'HYBRID' (E4M3 forward, E5M2 for "
                         "gradients), 'E4M3' or 'E5M2'")  # fmt: skip
    margin = recipe.margin
    if not _whole(margin) or not 0 <= margin <= MAX_MARGIN:
        raise ValueError(f"margin={margin!r}: the margin is a whole number of powers of two from 0 to {MAX_MARGIN} "
                         "(scale = FP8_MAX / amax / 2^margin); use e.g. margin=0 or margin=1")  # fmt: skip
    length = recipe.amax_history_len
    if not _whole(length) or length < 1:
        raise ValueError(f"amax_history_len={length!r}: the history holds at least one step; use a whole number "
                         ">= 1 (Transformer Engine's default is 1024)")  # fmt: skip
    if recipe.amax_compute_algo not in AMAX_ALGORITHMS:
        raise ValueError(f"unknown amax_compute_algo {recipe.amax_compute_algo!r}; use 'max' (the largest amax "
                         "in the history) or 'most_recent' (the newest)")  # fmt: skip


def checked_pass(pass_: Any) -> str:
    if pass_ not in PASSES:
        raise ValueError(f"unknown pass {pass_!r}; use 'forward' (weights, activations) or 'backward' (gradients)")
    return pass_


def checked_format(fmt: Any) -> Any:
    if fmt.name not in ("E4M3", "E5M2"):
        raise ValueError(f"per-tensor scaling casts to E4M3 or E5M2, not {fmt.name}; {fmt.name} is a block format")
    return fmt


def check_fp8_tensor(bits: Any, fmt: Any, scale: Any) -> None:
    """Refuse an Fp8Tensor whose bytes are not a uint8 array or whose scale cannot be divided out."""
    if not isinstance(bits, np.ndarray) or bits.dtype != np.uint8:
        what = f"a {bits.dtype} array" if isinstance(bits, np.ndarray) else type(bits).__name__
        raise TypeError(f"Fp8Tensor: bits is {what}; it holds the {getattr(fmt, 'name', fmt)} bit patterns, one uint8 "
                        "a value (encode(x, fmt) makes them)")  # fmt: skip
    ok = isinstance(scale, numbers.Real) and not isinstance(scale, bool) and math.isfinite(scale) and scale > 0
    if not ok:
        raise ValueError(f"Fp8Tensor: scale {scale!r} is not a positive finite number; the values were multiplied by "
                         "it before the cast and dequantizing divides by it, so pass the scale the tensor was cast "
                         "with (TensorScaling.quantize gives both)")  # fmt: skip


def checked_input(name: str, x: Any) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in (np.float16, np.float32):
        raise TypeError(f"tensor {name!r} is {x.dtype}; FP8 casts take float16 or float32 values "
                        "(x.astype(np.float32) first, if rounding a float64 twice is what you want)")  # fmt: skip
    return x


def checked_block_scheme(scheme: Any, rounding: Any, schemes: dict[str, tuple]) -> tuple:
    """`scheme`'s (element format, block, default rounding), refused unless `rounding` is one it defines."""
    if scheme not in schemes:
        raise ValueError(f"unknown block scheme {scheme!r}; use one of {', '.join(schemes)}")
    default = schemes[scheme][2]
    if rounding is not None and (default is None or rounding not in BLOCK_ROUNDINGS):
        fix = "leave it unset: its scale is E4M3, not a power of two" if default is None else "use 'floor' or 'up'"
        raise ValueError(f"{scheme} cannot round its scales {rounding!r}; {fix}")
    return schemes[scheme]


def checked_block_input(x: Any) -> np.ndarray:
    """`x` as float16/float32 values, refused if any is NaN or infinite (it would leave its block no scale)."""
    x = np.asarray(x)
    if x.dtype not in (np.float16, np.float32):
        raise TypeError(f"block quantization takes float16 or float32 values, not {x.dtype}: round to float32 first")
    if not np.isfinite(x).all():
        bad = int(np.count_nonzero(~np.isfinite(x)))
        raise ValueError(f"x holds {bad} NaN or infinite value(s), which leave their blocks no scale: remove them")
    return x


def checked_block_shape(shape: tuple, block: tuple[int, int], scheme: str) -> tuple[int, int]:
    """`block`, refused unless it tiles `shape`: the last axis (and, for r x c blocks, a 2-D tensor's rows)."""
    (r, c), last = block, shape[-1] if shape else 1
    if not shape or last % c or (r > 1 and (len(shape) != 2 or shape[0] % r)):
        need = f"a 2-D tensor with both axes multiples of {r}" if r > 1 else f"a last axis a multiple of {c}"
        raise ValueError(f"{scheme} blocks are {r}x{c} and x has shape {shape}; it needs {need}: pad with zeros")
    return block


def check_product(a_shape: tuple, b_shape: tuple, bits: Any, promote_every: Any, rounding: Any) -> None:
    """Refuse an FP8 product whose shapes or accumulator settings ``fp8_matmul`` does not define."""
    if len(a_shape) != 2 or len(b_shape) != 2 or a_shape[1] != b_shape[0]:
        raise ValueError(f"fp8_matmul multiplies (M, K) by (K, N); got {a_shape} and {b_shape}: reshape to 2-D "
                         "with matching inner sizes")  # fmt: skip
    if bits is not None and (not _whole(bits) or not 1 <= bits <= 24):
        raise ValueError(f"accumulator_bits={bits!r}: use a whole number from 1 to 24 (float32 keeps 24), or None "
                         "for float32 sums")  # fmt: skip
    if promote_every is not None and (not _whole(promote_every) or promote_every < 1):
        raise ValueError(f"promote_every={promote_every!r}: use a whole number of products >= 1 (DeepSeek-V3 used "
                         "128), or None to promote only at the end")  # fmt: skip
    if rounding not in ("toward_zero", "nearest"):
        raise ValueError(f"unknown rounding {rounding!r} for the accumulator; use 'toward_zero' or 'nearest'")


def _float32_values(name: str, values: Any, allow: str) -> list[float]:
    """`values` as Python floats, refused unless each is a float32 value that `allow` accepts."""
    out = []
    for v in values if isinstance(values, list) else [values]:
        if not isinstance(v, numbers.Real) or isinstance(v, bool) or not 0 <= v < math.inf or \
                (allow == "positive finite" and v == 0) or float(np.float32(v)) != v:  # fmt: skip
            raise ValueError(f"saved {name} holds {v!r}, and only {allow} float32 values load (NaN or inf means a "
                             "damaged state): save the state again from a healthy run")  # fmt: skip
        out.append(float(v))
    return out


def validated_state(tensor: Any, state: Any, event_class: type) -> tuple[float, np.ndarray, list[Any]]:
    """(scale, amax history, casts) from a saved ``TensorScaling.state_dict()``, all checked before any is used."""
    keys = {"name", "format", "recipe", "scale", "amax_history", "history"}
    if not isinstance(state, dict) or set(state) != keys:
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"a tensor's scaling state is a dict with keys {sorted(keys)}; got {got}")
    mine = {"name": tensor.name, "format": tensor.format.name, "recipe": dataclasses.asdict(tensor.recipe)}
    for key, value in mine.items():
        if state[key] != value:
            raise ValueError(f"saved {key} {state[key]!r} is not this tensor's {value!r}: load the state of the same "
                             "tensor into a TensorScaling built with the same recipe")  # fmt: skip
    scale = _float32_values("scale", state["scale"], "positive finite")[0]
    history = _float32_values("amax_history", state["amax_history"], "finite non-negative")
    if len(history) != tensor.recipe.amax_history_len:
        raise ValueError(f"saved amax_history has {len(history)} entries; this recipe keeps "
                         f"{tensor.recipe.amax_history_len}: load it into a recipe of the same length")  # fmt: skip
    names = [f.name for f in dataclasses.fields(event_class)]
    casts = state["history"]
    if not isinstance(casts, list) or any(not isinstance(c, dict) or sorted(c) != sorted(names) or c["step"] != i
                                          for i, c in enumerate(casts)):  # fmt: skip
        raise ValueError(f"saved history must list the casts in order, each a dict with keys {names}")
    return scale, np.array(history, dtype=np.float32), [event_class(**c) for c in casts]


def describe(tensor: Any) -> str:
    """The printable state of one tensor: settings, scale, amax history, counts, reported steps."""
    casts, r = tensor.history, tensor.recipe
    total = {k: sum(getattr(c, k) for c in casts) for k in ("saturated", "flushed", "nonfinite")}
    lines = [
        f"{tensor.name}: {tensor.format.name}, {r.recipe} scaling (margin {r.margin}, history {r.amax_history_len}, "
        f"{r.amax_compute_algo}), state {tensor.state!r} after {len(casts)} casts",
        f"  scale {tensor.scale!r} (next cast); amax history, newest last: {tensor.amax_history[-8:].tolist()}",
        f"  saturated {total['saturated']}, flushed to zero {total['flushed']}, not finite {total['nonfinite']}",
    ]
    for c in casts:
        if c.nonfinite:
            lines.append(f"  step {c.step}: {c.nonfinite} values not finite (inf or NaN before the cast): cast to "
                         "NaN, not saturated; the scale was held")  # fmt: skip
    return "\n".join(lines)
