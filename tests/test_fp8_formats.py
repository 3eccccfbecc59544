"""tinyamp/fp8/formats.py: E4M3, E5M2 and E2M1 rounded by hand give ml_dtypes' bits after a clip.

The reference is "clip to the largest finite value, then ml_dtypes' cast": a saturating round
to nearest even.  Checked on every float16 value, on every rounding boundary of each format
(values, ties, their float32 neighbours, the overflow edge, half the smallest subnormal), on
a million random float32 bit patterns and on drawn ones; decoding on every bit pattern.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import float32_bit_patterns, fp8_format_names, fp8_rounding_arrays, fp8_rounding_points

from tinyamp.fp8.formats import E2M1, E4M3, E5M2, FORMATS, decode, decode_e8m0, encode, encode_e8m0, get_format

ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.fp8

ML = {"E4M3": ml_dtypes.float8_e4m3fn, "E5M2": ml_dtypes.float8_e5m2, "E2M1": ml_dtypes.float4_e2m1fn}
ALL_FLOAT16 = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def saturating_reference(x: np.ndarray, name: str) -> np.ndarray:
    """Clip to +-max (NaN stays NaN), then ml_dtypes' round to nearest even: the bytes."""
    top = np.float32(get_format(name).max)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.clip(x.astype(np.float32), -top, top).astype(ML[name]).view(np.uint8)


def without_nan_for_fp4(x: np.ndarray, name: str) -> np.ndarray:
    return x[~np.isnan(x)] if name == "E2M1" else x  # E2M1 has no NaN: encode refuses it (tested below)


@pytest.mark.parametrize("name", FORMATS)
def test_decoding_every_bit_pattern_gives_ml_dtypes_float32_bits(name: str) -> None:
    codes = np.arange(2 ** FORMATS[name].bits, dtype=np.uint8)
    ours = decode(codes, name)
    assert ours.dtype == np.float32
    assert ours.tobytes() == codes.view(ML[name]).astype(np.float32).tobytes()  # NaN payloads, -0 and all


@pytest.mark.parametrize("name", FORMATS)
def test_encoding_every_float16_value(name: str) -> None:
    x = without_nan_for_fp4(ALL_FLOAT16, name)
    assert np.array_equal(encode(x, name), saturating_reference(x, name))


@pytest.mark.parametrize("name", FORMATS)
def test_encoding_every_rounding_boundary(name: str) -> None:
    x = fp8_rounding_points(name)
    assert x.size > 6 * np.isfinite(FORMATS[name].values).sum()  # values, ties and both neighbours, both signs
    assert np.array_equal(encode(x, name), saturating_reference(x, name))


@pytest.mark.parametrize("name", FORMATS)
def test_encoding_a_million_random_float32_bit_patterns(name: str) -> None:
    x = np.random.default_rng(29).integers(0, 2**32, size=2**20, dtype=np.uint32).view(np.float32)
    x = without_nan_for_fp4(x, name)
    assert np.array_equal(encode(x, name), saturating_reference(x, name))


@given(fp8_format_names(), float32_bit_patterns(256))
@example("E4M3", np.array([464.0, 465.0, 480.0, 2.0**-10, 3 * 2.0**-11, np.inf, -np.nan, -0.0], np.float32))
@example("E5M2", np.array([57344.0, 61440.0, 61441.0, 2.0**-17, 1.25, np.inf, np.nan], np.float32))
def test_encoding_any_float32_bit_pattern(name: str, x: np.ndarray) -> None:
    x = without_nan_for_fp4(x, name)
    assert np.array_equal(encode(x, name), saturating_reference(x, name))


@given(fp8_rounding_arrays())
def test_rounding_is_to_the_nearest_value_and_never_beyond_the_largest(case: tuple[str, np.ndarray]) -> None:
    """|decode(encode(x)) - clip(x)| is at most half the spacing of the format's values around x."""
    name, x = case
    f = FORMATS[name]
    x = x[np.isfinite(x)].astype(np.float64)
    got = decode(encode(x.astype(np.float32), name), name).astype(np.float64)
    grid = np.unique(f.values[np.isfinite(f.values)].astype(np.float64))
    clipped = np.clip(x, -f.max, f.max)
    below = grid[np.clip(np.searchsorted(grid, clipped, side="right") - 1, 0, grid.size - 1)]
    above = grid[np.clip(np.searchsorted(grid, clipped, side="left"), 0, grid.size - 1)]
    assert np.all(np.abs(got) <= f.max)
    assert np.all(np.abs(got - clipped) <= np.minimum(np.abs(clipped - below), np.abs(above - clipped)))


@given(fp8_format_names(), st.lists(st.floats(-1e6, 1e6, width=32), min_size=2, max_size=64))
def test_rounding_is_monotone(name: str, values: list[float]) -> None:
    x = np.sort(np.array(values, np.float32))
    assert np.all(np.diff(decode(encode(x, name), name)) >= 0)


def test_ml_dtypes_fp8_casts_do_not_saturate_and_these_do() -> None:
    with np.errstate(invalid="ignore", over="ignore"):
        assert np.isnan(np.float32(465).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
        assert np.isinf(np.float32(61440).astype(ml_dtypes.float8_e5m2).astype(np.float32))
    x = np.array([465, 1e30, np.inf, -np.inf], np.float32)
    assert decode(encode(x, "E4M3"), "E4M3").tolist() == [448, 448, 448, -448]
    assert decode(encode(x * 200, "E5M2"), "E5M2").tolist() == [57344, 57344, 57344, -57344]
    assert decode(encode(np.float32([464, 449]), "E4M3"), "E4M3").tolist() == [448, 448]  # the tie goes to even
    nan = encode(np.array([np.nan, -np.nan], np.float32), "E4M3")
    assert nan.tolist() == [0x7F, 0xFF] and np.isnan(decode(nan, "E4M3")).all()  # NaN stays NaN, sign kept


def test_ml_dtypes_fp4_cast_saturates_and_casts_nan_to_zero_as_formats_py_says() -> None:
    # formats.py's docstring states this of ml_dtypes (0.7.0): the test fails if a release changes it.
    x = np.array([7, 1e30, np.inf, -np.inf, 6.5, np.nan, -np.nan], np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        got = x.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert got[:5].tolist() == [6, 6, 6, -6, 6] and got[5:].tolist() == [0, 0]  # saturated; NaN a zero
    assert decode(encode(x[:5], "E2M1"), "E2M1").tolist() == [6, 6, 6, -6, 6]  # tinyamp saturates alike
    with pytest.raises(ValueError, match="E2M1 has no NaN"):  # and refuses the NaN ml_dtypes makes 0
        encode(x[5:], "E2M1")


def test_the_limits_are_those_of_the_formats() -> None:
    for name, f in FORMATS.items():
        info = ml_dtypes.finfo(ML[name])
        assert (f.max, f.min_normal, f.min_subnormal) == (info.max, info.smallest_normal, info.smallest_subnormal)
    assert (E4M3.max, E5M2.max, E2M1.max) == (448.0, 57344.0, 6.0)
    assert sorted(set(np.abs(E2M1.values).tolist())) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert np.isnan(E4M3.values).sum() == 2 and not np.isinf(E4M3.values).any()  # NaN only at S.1111.111
    assert np.isinf(E5M2.values).sum() == 2


def test_one_byte_per_value_and_the_bytes_are_ml_dtypes_bytes() -> None:
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    for name in ("E4M3", "E5M2"):
        bits = encode(x, name)
        assert bits.dtype == np.uint8 and bits.shape == x.shape and bits.nbytes == x.size == x.nbytes // 4
        assert np.array_equal(bits.view(ML[name]).astype(np.float32), decode(bits, name))


def test_e8m0_scales_against_ml_dtypes() -> None:
    codes = np.arange(256, dtype=np.uint8)
    assert decode_e8m0(codes).tobytes() == codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32).tobytes()
    k = np.arange(-127, 128)
    powers = np.ldexp(np.float32(1.0), k).astype(np.float32)
    assert np.array_equal(encode_e8m0(k), powers.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))
    assert np.array_equal(decode_e8m0(encode_e8m0(k)), powers)  # 2^-127, a float32 subnormal, is exact


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: encode(np.float32([1.0]), "E4M3FNUZ"), ValueError, ["'E4M3FNUZ'", "E4M3, E5M2, E2M1"]),
        (lambda: encode(np.array([1.0]), "E4M3"), TypeError, ["float64", "float32 first"]),
        (lambda: encode(np.float32([1.0, np.nan]), "E2M1"), ValueError, ["E2M1 has no NaN", "1 NaN"]),
        (lambda: encode_e8m0(np.array([128])), ValueError, ["-127 to 127"]),
        (lambda: encode_e8m0(np.array([0.5])), ValueError, ["integers k"]),
    ],
)
def test_bad_input_gets_one_sentence(call, error: type, words: list[str]) -> None:
    with pytest.raises(error) as raised:
        call()
    assert all(w in str(raised.value) for w in words), str(raised.value)


@pytest.mark.parametrize(
    ("code", "name", "match"),
    [
        (np.float32([1.5, 448.0]), "E4M3", "E4M3 codes are integers from 0 to 255, .* got float32 values, not codes"),
        (np.array([300]), "E5M2", "E5M2 codes are integers from 0 to 255, .* got integers from 300 to 300"),
        (np.array([-1, 3]), "E4M3", "got integers from -1 to 3"),
        (np.uint8([16]), "E2M1", "E2M1 codes are integers from 0 to 15"),
    ],
)  # fmt: skip
def test_decode_refuses_what_is_not_a_code_of_the_format(code: np.ndarray, name: str, match: str) -> None:
    # before: 1.5 read as code 1 (0.00195), 300 wrapped to 44, -1 to 255 (NaN), 16 masked to 0: values, silently
    with pytest.raises(ValueError, match=match):
        decode(code, name)


def test_decode_e8m0_refuses_what_is_not_a_byte() -> None:
    with pytest.raises(ValueError, match="E8M0 codes are integers from 0 to 255, as encode_e8m0 returns them"):
        decode_e8m0(np.array([300]))  # before: 300 wrapped to 44, the scale 2^-83
    assert decode_e8m0(np.array([127, 128])).tolist() == [1.0, 2.0] and decode(np.int64(68), "E4M3") == 3.0
