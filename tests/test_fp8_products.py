"""tinyamp/fp8/products.py: FP8 products are exact in float32, the sums are float32's, the scales come
off again; a narrow accumulator loses a long sum and promotion to FP32 every N products repairs it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyamp.fp8.formats import E4M3, E5M2, decode, encode
from tinyamp.fp8.products import fp8_matmul, keep_bits
from tinyamp.fp8.scaling import Fp8Tensor, ScalingRecipe, TensorScaling

pytestmark = pytest.mark.fp8

K = 4096


@pytest.mark.parametrize(("f", "g"), [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E5M2)])
def test_every_product_of_two_fp8_values_is_exact_in_float32(f, g) -> None:
    x, y = f.values[np.isfinite(f.values)], g.values[np.isfinite(g.values)]
    in_float32 = np.multiply.outer(x, y)
    assert in_float32.dtype == np.float32
    assert np.array_equal(in_float32.astype(np.float64), np.multiply.outer(x.astype(np.float64), y))
    nonzero = np.abs(in_float32[in_float32 != 0])
    assert nonzero.min() >= np.finfo(np.float32).smallest_normal and nonzero.max() < np.finfo(np.float32).max


def quantized(x: np.ndarray, fmt=E4M3) -> Fp8Tensor:
    return TensorScaling("x", fmt, ScalingRecipe(recipe="current", fp8_format=fmt.name)).quantize(x)


@given(st.integers(0, 2**32 - 1), st.integers(1, 200), st.sampled_from([-6, 0, 3]))
def test_the_product_is_a_float32_sum_of_exact_products_scaled_back(seed: int, k: int, power: int) -> None:
    rng = np.random.default_rng(seed)
    a = Fp8Tensor(encode(rng.standard_normal((3, k)).astype(np.float32) * 50, E4M3), E4M3, 2.0**power)
    b = Fp8Tensor(encode(rng.standard_normal((k, 2)).astype(np.float32), E5M2), E5M2, 2.0**-power)
    exact = a.dequantize().astype(np.float64) @ b.dequantize().astype(np.float64)  # power-of-two scales: exact
    got = fp8_matmul(a, b)
    assert got.dtype == np.float32
    bound = k * 2.0**-24 * (np.abs(a.dequantize()).astype(np.float64) @ np.abs(b.dequantize()))  # float32 sums
    assert np.all(np.abs(got - exact) <= bound)


def test_a_24_bit_accumulator_promoted_every_product_is_a_sequential_float32_sum() -> None:
    rng = np.random.default_rng(1)
    a = quantized(rng.standard_normal((2, 300)).astype(np.float32))
    b = quantized(rng.standard_normal((300, 3)).astype(np.float32))
    got = fp8_matmul(a, b, accumulator_bits=24, promote_every=1, rounding="nearest")
    x, y = decode(a.bits, a.fmt), decode(b.bits, b.fmt)  # the FP8 values
    total = np.zeros((2, 3), np.float32)
    for k in range(300):
        total += np.multiply.outer(x[:, k], y[k])  # exact products, one float32 rounding each
    assert np.array_equal(got, total * (np.float32(1) / np.float32(a.scale)) * (np.float32(1) / np.float32(b.scale)))


def test_keep_bits() -> None:
    s = np.array([1 + 2.0**-14, 1 + 3 * 2.0**-14, -(1 + 3 * 2.0**-14), -(1 + 2.0**-13), 0.0, 2.0**-1074])
    one_up, two_up = 1 + 2.0**-13, 1 + 2 * 2.0**-13  # 14 significant bits: a spacing of 2^-13 in [1, 2)
    assert keep_bits(s, 14, "toward_zero").tolist() == [1.0, one_up, -one_up, -one_up, 0.0, 2.0**-1074]
    assert keep_bits(s, 14, "nearest").tolist() == [1.0, two_up, -two_up, -one_up, 0.0, 2.0**-1074]  # ties to even


def test_at_k_4096_a_14_bit_accumulator_loses_the_sum_and_promotion_every_128_products_repairs_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = np.random.default_rng(4096)
    a = quantized(rng.standard_normal((16, K)).astype(np.float32))
    b = quantized(rng.standard_normal((K, 16)).astype(np.float32))
    exact = a.dequantize().astype(np.float64) @ b.dequantize().astype(np.float64)

    def error(c: np.ndarray) -> float:  # the largest error, relative to the largest output
        return float(np.max(np.abs(c - exact)) / np.max(np.abs(exact)))

    fp32 = error(fp8_matmul(a, b))
    measured = {
        (rounding, every): error(fp8_matmul(a, b, accumulator_bits=14, promote_every=every, rounding=rounding))
        for rounding in ("toward_zero", "nearest")
        for every in (None, 128)
    }
    with capsys.disabled():
        print(f"\nK={K}, 16x16 outputs, E4M3 inputs: max error / max |output|, float32 sums {fp32:.2e}")
        for (rounding, every), e in measured.items():
            print(f"  14-bit accumulator, {rounding:<11}, promoted every {every or K:>4} products: {e:.2e}")
    for rounding in ("toward_zero", "nearest"):
        unpromoted, promoted = measured[rounding, None], measured[rounding, 128]
        assert unpromoted > 5 * promoted > 50 * fp32  # what promotion fixes, and what it leaves
    # Truncation's bias grows with K: percents (DeepSeek-V3 reports nearly 2% at K = 4096 on its GPUs).
    assert measured["toward_zero", None] > 0.01


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"accumulator_bits": 25}, ["accumulator_bits=25", "1 to 24"]),
        ({"accumulator_bits": 14, "promote_every": 0}, ["promote_every=0", ">= 1"]),
        ({"accumulator_bits": 14, "rounding": "up"}, ["'up'", "'toward_zero'"]),
    ],
)
def test_bad_settings_get_one_sentence(kwargs: dict, words: list[str]) -> None:
    a = quantized(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError) as raised:
        fp8_matmul(a, quantized(np.ones((3, 2), np.float32)), **kwargs)
    assert all(w in str(raised.value) for w in words), str(raised.value)
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(2, 3\)"):
        fp8_matmul(a, a)
