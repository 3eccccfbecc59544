"""The chapter's casts and product as training calls them: through ``tinyamp.kernels``, the one seam.

The chapter (formats, scaling, products) and ``blocks`` are the reference, written to be read,
and they name no faster code.  Everything off the reading path that casts to FP8 (``Fp8Scales``,
``training``, the benchmarks) calls these instead: each asks the seam, where the engine room may
answer with the same bits (compiled loops, ``tinyamp/engine/fast/fp8.py``), and runs the
chapter's own function otherwise.  ``TINYAMP_ENGINE_ROOM=off`` or ``kernels.reference_only()``
leaves the chapter alone; tests/engine_room/test_fp8_kernels.py checks the two bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp import kernels
from tinyamp.fp8 import blocks, formats, products, scaling, scaling_checks
from tinyamp.fp8.blocks import BlockTensor
from tinyamp.fp8.formats import E4M3, Minifloat
from tinyamp.fp8.scaling import Fp8Tensor


def encode(x: np.ndarray, fmt: str | Minifloat) -> np.ndarray:
    """``formats.encode``: float16/float32 values -> uint8 codes of `fmt`, saturated, rounded to nearest even."""
    return kernels.call("fp8_encode", formats.encode, x, formats.get_format(fmt))


class TensorScaling(scaling.TensorScaling):
    """``scaling.TensorScaling`` whose two passes over the values (amax, the counted cast) go through the seam."""

    def amax_of(self, x: np.ndarray) -> float:
        return kernels.call("fp8_amax", super().amax_of, x)

    def cast_counted(self, x: np.ndarray, scale: float) -> tuple[np.ndarray, int, int, int]:
        return kernels.call("fp8_scaled_cast", self._chapters_cast, x, scale, self.format)

    def _chapters_cast(self, x: np.ndarray, scale: float, fmt: Minifloat) -> tuple[np.ndarray, int, int, int]:
        return super().cast_counted(x, scale)  # `fmt` is self.format: the engine room reads it from the arguments


def _block_arrays(x: np.ndarray, scheme: str, fmt: Minifloat, block: tuple, rounding: Any, e4m3: Minifloat) -> tuple:
    """``blocks.quantize`` as (codes, scales, S); fmt, block and e4m3 spell the scheme out for the engine room."""
    q = blocks.quantize(x, scheme, rounding)
    return q.codes, q.scales, q.tensor_scale


def quantize_blocks(x: np.ndarray, scheme: str, rounding: str | None = None) -> BlockTensor:
    """``blocks.quantize``: float16/float32 `x` -> a ``BlockTensor`` of `scheme`."""
    fmt, block, default = scaling_checks.checked_block_scheme(scheme, rounding, blocks.SCHEMES)
    codes, scales, s = kernels.call("fp8_block_quantize", _block_arrays, x, scheme, fmt, block, rounding or default,
                                    E4M3)  # fmt: skip
    return BlockTensor(codes, scales, scheme, s)


def fp8_matmul(a: Fp8Tensor, b: Fp8Tensor, accumulator_bits: int | None = None, promote_every: int | None = None,
               rounding: str = "toward_zero") -> np.ndarray:  # fmt: skip
    """``products.fp8_matmul``: (M, K) @ (K, N) of two FP8 tensors, float32 out, scaled back."""
    return kernels.call("fp8_matmul", products.fp8_matmul, a, b, accumulator_bits, promote_every, rounding)
