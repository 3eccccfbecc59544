"""The engine room's float16 <-> float32 casts return exactly the bits NumPy's astype returns.

Every test runs twice: with the NumPy passes and with the compiled loops (numba; skipped
where numba is not installed).
"""

from __future__ import annotations

import operator
import os
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from strategies import float16_bit_patterns, float32_bit_patterns

from tinyamp import kernels
from tinyamp.engine.fast import casts
from tinyamp.engine.fast.casts import BLOCK, SMALL, add, cast, fast_cast_applies, round_to_float16, widen_float16

pytestmark = pytest.mark.engine_room

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


@pytest.fixture(scope="module", params=casts.KERNELS, autouse=True)
def cast_kernels(request: pytest.FixtureRequest) -> Any:
    """Run the module's tests with each implementation of the casts."""
    try:
        previous = casts.set_kernels(request.param)
    except ImportError as e:
        pytest.skip(str(e))
    yield request.param
    casts.set_kernels(previous)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


ALL_FLOAT16 = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
FINITE_FLOAT16 = ALL_FLOAT16[np.isfinite(ALL_FLOAT16)]


def test_widen_every_float16_bit_pattern() -> None:
    assert same_bits(widen_float16(FINITE_FLOAT16), FINITE_FLOAT16.astype(F32))  # all in the fast path
    assert same_bits(widen_float16(ALL_FLOAT16), ALL_FLOAT16.astype(F32))  # NaN payloads through NumPy


def rounding_boundaries() -> np.ndarray:
    """Every finite float16 value, every midpoint between neighbours, and the float32 values beside each."""
    v = np.sort(FINITE_FLOAT16.astype(np.float64))
    v = np.unique(v)
    mids = (v[:-1] + v[1:]) / 2  # exact in float64, and representable in float32 (<= 12 significant bits)
    points = np.concatenate([v, mids, [65520.0, 2.0**-25, 3 * 2.0**-26]]).astype(F32)
    neighbours = [np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(-np.inf))]
    return np.concatenate([points, *neighbours])


def test_round_every_rounding_boundary() -> None:
    x = rounding_boundaries()
    assert x.size > 6 * 60000
    with np.errstate(over="ignore"):
        assert same_bits(round_to_float16(x), x.astype(F16))


def test_round_ties_go_to_even() -> None:
    # 1 + 2^-11 is halfway between 1 and 1 + 2^-10: the even mantissa (1) wins; 1 + 3*2^-11 goes up
    x = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-25, 3 * 2.0**-25, 65504 + 16], F32)
    with np.errstate(over="ignore"):
        got = round_to_float16(x).astype(np.float64)
    assert list(got) == [1.0, 1 + 2.0**-9, 0.0, 2 * 2.0**-24, np.inf]


@given(float32_bit_patterns())
def test_round_any_float32_bits(x: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        assert same_bits(round_to_float16(x), x.astype(F16))


@given(float16_bit_patterns())
def test_widen_any_float16_bits(h: np.ndarray) -> None:
    assert same_bits(widen_float16(h), h.astype(F32))


def test_blocks_are_independent() -> None:
    """A NaN in one block sends only that block through NumPy; the others keep the fast path."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(3 * BLOCK + 5) * 1e-3).astype(F32).reshape(-1, 1)
    x[BLOCK + 7] = np.nan
    x[2 * BLOCK + 1] = 7e4  # rounds to inf
    with np.errstate(over="ignore"):
        assert same_bits(round_to_float16(x), x.astype(F16))
        h = x.astype(F16)
    assert same_bits(widen_float16(h), h.astype(F32))


def test_overflow_warns_as_numpy_does() -> None:
    x = np.full(SMALL, 1e6, F32)
    with pytest.warns(RuntimeWarning, match="overflow"):
        round_to_float16(x)


def test_out_arrays_are_written_in_place() -> None:
    x = np.linspace(-3, 3, 5000, dtype=F32).reshape(50, 100)
    out16 = np.empty((50, 100), F16)
    assert round_to_float16(x, out16) is out16 and same_bits(out16, x.astype(F16))
    out32 = np.empty((50, 100), F32)
    assert widen_float16(out16, out32) is out32 and same_bits(out32, out16.astype(F32))


def test_convert_routes_large_contiguous_arrays_only() -> None:
    big = np.ones((64, 128), F32)
    assert fast_cast_applies(big, F16) and fast_cast_applies(big.astype(F16), F32)
    assert not fast_cast_applies(big[:, ::2], F16)  # strided: NumPy's cast
    assert not fast_cast_applies(big[:2], F16)  # small: NumPy's cast is cheaper than our passes
    assert not fast_cast_applies(big, np.dtype(np.float64))
    rng = np.random.default_rng(1)
    for x in (rng.standard_normal((64, 128)).astype(F32), rng.standard_normal((64, 128)).astype(F32)[:, ::2]):
        assert same_bits(cast(x, F16), x.astype(F16))
        out = np.empty(x.shape, F16)
        assert cast(x, F16, out) is out and same_bits(out, x.astype(F16))


@pytest.mark.skipif(not os.environ.get("TINYAMP_EXHAUSTIVE"), reason="every float32 (8 min): TINYAMP_EXHAUSTIVE=1")
def test_round_every_float32() -> None:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        for high in range(0, 2**32, 2**26):
            x = np.arange(high, high + 2**26, dtype=np.uint64).astype(np.uint32).view(np.float32)
            assert same_bits(round_to_float16(x), x.astype(F16)), f"block at {high:#x}"


@pytest.mark.parametrize("layout", ["large", "small", "strided", "transposed"])
@pytest.mark.parametrize("pair", [(F32, F16), (F16, F32), (F32, F32)])
def test_astype_returns_numpys_bits(layout: str, pair: tuple[np.dtype, np.dtype]) -> None:
    """``casts.astype`` is NumPy's ``astype(copy=False)`` whichever path it takes (gradients of every size)."""
    source, target = pair
    rng = np.random.default_rng(3)
    n = {"large": 3 * BLOCK + 17, "small": SMALL // 2, "strided": 2 * SMALL, "transposed": 64 * SMALL}[layout]
    x = (rng.standard_normal(n) * rng.choice([1e-7, 1e-3, 1.0, 300.0], size=n)).astype(source)
    x[::7] = 0
    if layout == "strided":
        x = x[::2]
    if layout == "transposed":  # a BLAS operand such as rows.T: cast through the array under the view
        x = x.reshape(64, -1).T
    out = cast(x, target)
    assert same_bits(out, x.astype(target))
    if layout == "transposed":
        assert out.strides == x.astype(target).strides  # the same layout as NumPy's cast (order "K")
    if source == target:
        assert out is x  # no copy, as astype(copy=False)


@pytest.mark.parametrize("shapes", [((64, 128), (64, 128)), ((64, 128), (128,)), ((1, 128), (64, 1))])
def test_add_returns_numpys_float16_bits(shapes: tuple) -> None:
    """The vectorized float16 add gives what NumPy's scalar float16 loop gives, bit for bit,
    on normals, subnormals, zeros, infinities, NaNs and results that overflow."""
    op = operator.add
    rng = np.random.default_rng(4)
    a, b = ((rng.standard_normal(s) * rng.choice([1e-7, 1e-4, 1.0, 3e2, 1e4], size=s)).astype(F16) for s in shapes)
    a.reshape(-1)[::11] = 0
    a.reshape(-1)[5::97] = np.inf
    b.reshape(-1)[3::89] = np.nan
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, want = kernels.add(a, b), op(a, b)
        engine = add(a, b)
    assert want.size >= SMALL and got.dtype == F16
    assert same_bits(got, want)
    assert (engine is NotImplemented) == (max(a.size, b.size) < SMALL)  # two small operands: NumPy's own loop


def test_add_leaves_other_operands_to_the_reference() -> None:
    x = np.arange(SMALL, dtype=F16)
    assert add(x, 0.5) is NotImplemented  # a Python scalar: NumPy's rules, in the reference
    assert add(x, x.astype(F32)) is NotImplemented  # mixed: NumPy promotes, in the reference
    assert add(x[:8], x[:8]) is NotImplemented  # small: NumPy's own loop is cheaper


@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan, -np.nan])
def test_widen_finds_a_lone_inf_or_nan_in_any_block(special: float) -> None:
    """One non-finite value, positive or negative, sends its block (only) through NumPy's cast."""
    rng = np.random.default_rng(5)
    h = rng.standard_normal(3 * BLOCK + 9).astype(F16)
    for position in (0, BLOCK - 1, 2 * BLOCK + 3):
        x = h.copy()
        x[position] = special
        assert same_bits(widen_float16(x), x.astype(F32))


def test_out_must_be_a_contiguous_array_of_the_right_shape_and_dtype() -> None:
    """A strided `out` would be written through a copy: refused, not silently left unwritten."""
    x = np.linspace(-3, 3, 2 * SMALL, dtype=F32)
    with pytest.raises(ValueError, match="out must be a C-contiguous float16 array of shape"):
        round_to_float16(x, np.empty(4 * SMALL, F16)[::2])
    with pytest.raises(ValueError, match="out must be a C-contiguous float32 array of shape"):
        widen_float16(x.astype(F16), np.empty(2 * SMALL, np.float64))
