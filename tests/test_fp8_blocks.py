"""tinyamp/fp8/blocks.py: MXFP8, MXFP4, NVFP4 and DeepSeek-V3's blocks meet an independent ml_dtypes reference,
their power-of-two scales are exact, "up" never saturates and the OCP "floor" rule clips about one
block in six, and with outliers every block scheme's error is below per-tensor scaling's."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tinyamp.fp8.blocks import SCHEMES, quantize, shared_exponents
from tinyamp.fp8.formats import E2M1, E4M3, E5M2, decode, encode
from tinyamp.fp8.scaling import next_scale

pytestmark = pytest.mark.fp8

POWER_OF_TWO = [s for s, (_, _, rounding) in SCHEMES.items() if rounding is not None]
ML = {"E4M3": ml_dtypes.float8_e4m3fn, "E5M2": ml_dtypes.float8_e5m2, "E2M1": ml_dtypes.float4_e2m1fn}


def gaussian(seed: int, shape=(256, 1024), outliers: float = 0.0) -> np.ndarray:
    """Standard normal values; with `outliers`, eight of them (one in 32768) are that many times larger."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if outliers:
        x.reshape(-1)[rng.choice(x.size, 8, replace=False)] *= np.float32(outliers)
    return x


def tiles_of(x: np.ndarray, scheme: str) -> np.ndarray:
    r, c = SCHEMES[scheme][1]
    return x.reshape(-1, r, x.shape[-1] // c, c)


@pytest.mark.parametrize("scheme", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4"])
@pytest.mark.parametrize("rounding", ["floor", "up"])
@given(seed=st.integers(0, 2**32 - 1))
def test_mx_meets_a_reference_written_with_ml_dtypes(scheme: str, rounding: str, seed: int) -> None:
    fmt = SCHEMES[scheme][0]
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((4, 64)) * 10.0 ** rng.uniform(-30, 30, (4, 1))).astype(np.float32)
    q = quantize(x, scheme, rounding)
    amax = np.abs(x.reshape(4, 2, 32)).max(axis=2).astype(np.float64)
    e = np.floor(np.log2(amax)) - np.floor(np.log2(fmt.max))  # the OCP rule, through log2
    if rounding == "up":
        e += amax / 2.0**e > fmt.max
    assert np.array_equal(q.scales, (2.0**e).astype(np.float32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))
    elements = np.clip(x.reshape(4, 2, 32) / 2.0 ** e[..., None], -fmt.max, fmt.max)  # saturate, then cast
    assert np.array_equal(q.codes, elements.astype(ML[fmt.name]).view(np.uint8).reshape(4, 64))
    assert np.array_equal(
        q.dequantize(), (elements.astype(ML[fmt.name]).astype(np.float64) * 2.0 ** e[..., None]).reshape(4, 64)
    )


@given(seed=st.integers(0, 2**32 - 1), spread=st.floats(-20, 20))
def test_nvfp4_meets_a_reference_written_with_ml_dtypes(seed: int, spread: float) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 64)) * 10.0 ** rng.uniform(-3, 3, (3, 4, 1)).repeat(16, 2).reshape(3, 64) * 10.0**spread
    x = x.astype(np.float32)
    q = quantize(x, "nvfp4")
    s = np.float32(448 * 6) / np.abs(x).max()
    amax = np.abs(x.reshape(3, 4, 16)).max(axis=2)
    block = np.clip(amax * s / np.float32(6), 0, 448).astype(ml_dtypes.float8_e4m3fn)
    block[(block == 0) & (amax > 0)] = ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).smallest_subnormal  # never 0
    assert q.tensor_scale == s and np.array_equal(q.scales, block.view(np.uint8).reshape(3, 4))
    decoded = block.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):  # a block of zeros has the scale 0
        elements = np.where(decoded > 0, x.reshape(3, 4, 16) * s / decoded, np.float32(0))  # x * S, then / scale
    fp4 = np.clip(elements, -6, 6).astype(ml_dtypes.float4_e2m1fn)
    assert np.array_equal(q.codes, (fp4.view(np.uint8) & 0xF).reshape(3, 64))
    expected = fp4.astype(np.float32) * block.astype(np.float32)[..., None] * (np.float32(1) / s)
    assert np.array_equal(q.dequantize(), expected.reshape(3, 64))


@pytest.mark.parametrize(("rounding", "share"), [("floor", 1 / 2), ("up", 1 / 3)])
@given(seed=st.integers(0, 2**32 - 1), power=st.floats(-33, 33), zeros=st.floats(0, 0.5))  # blocks in 2^+-120:
def test_mxfp4_errs_less_than_half_a_blocks_amax_a_third_rounded_up(
    rounding: str, share: float, seed: int, power: float, zeros: float
) -> None:
    # floor: 2^e <= amax / 4 and an element errs at most 1 (E2M1's gap from 4 to 6 is 2), or less than 2 where
    # it saturates from below 8: under 2^(e+1) <= amax / 2.  up: 2^e < amax / 3 and nothing saturates.  (E8M0's
    # clamp at 2^-127 and up's overflow near float32's max, tested apart, lie outside the blocks drawn.)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 64)) * 10.0 ** (power + rng.uniform(-3, 3, (8, 2, 1))).repeat(32, 2).reshape(8, 64)
    x[rng.random(x.shape) < zeros] = 0.0
    x = x.astype(np.float32)
    q = quantize(x, "mxfp4", rounding)
    block_amax = np.abs(x.reshape(8, 2, 32)).max(axis=2, keepdims=True).astype(np.float64)
    error = np.abs(q.dequantize().astype(np.float64) - x).reshape(8, 2, 32)
    assert np.all((error < share * block_amax) | (error == 0)) and q.codes.max() < 16


def test_mxfp4_under_floor_saturates_the_top_of_a_block_and_up_overflows_near_float32s_max() -> None:
    # floor puts a block's amax in [4, 8): 7 saturates to 6; up scales it to 3.5, which rounds (a tie, to
    # even) to 4, and from 1.75 * 2^127 on, 4 * 2^126 is 2^128: infinity.
    x = np.zeros(32, np.float32)
    x[0] = 7.0
    assert quantize(x, "mxfp4").dequantize()[0] == 6.0 and quantize(x, "mxfp4", "up").dequantize()[0] == 8.0
    x[0] = np.float32(1.75 * 2.0**127)
    assert quantize(x, "mxfp4").dequantize()[0] == 1.5 * 2.0**127
    assert quantize(x, "mxfp4", "up").dequantize()[0] == np.inf
    x[0] = np.nextafter(x[0], np.float32(0))
    assert quantize(x, "mxfp4", "up").dequantize()[0] == 1.5 * 2.0**127  # 3.4999998 rounds to 3


FLT_MAX = np.finfo(np.float32).max


def nvfp4_rule(amax: float) -> np.float32:
    """Transformer Engine's S: fminf(448 * 6 / amax, FLT_MAX) in float32 (its compute_global_encode_scaling_factor)."""
    with np.errstate(over="ignore"):
        return min(np.float32(448 * 6) / np.float32(amax), FLT_MAX)


@given(
    seed=st.integers(0, 2**32 - 1),
    top=st.integers(-149, 127),
    below=st.lists(st.integers(0, 40), min_size=15, max_size=15),
    zeros=st.floats(0, 0.5),
)
@example(seed=0, top=-110, below=[19] * 15, zeros=0.1)  # a block scale of 2^-9 under S ~ 2^118: S / 2^-9 overflows
@example(seed=0, top=-124, below=[0] * 15, zeros=0.1)  # the tensor: S clamped, zeros among the values
def test_nvfp4_errs_at_most_a_sixth_of_each_blocks_amax_at_any_magnitude(
    seed: int, top: int, below: list[int], zeros: float
) -> None:
    # The law: |dequantized - x| <= (17/96) block_amax (E4M3 rounds a normal scale within 1/16, E2M1's widest
    # half-gap is 1 element unit, between 4 and 6) + 6 * 2^-10 / S (a subnormal block scale is off by up to
    # 2^-10, and a flushed one loses a block below 6 * 2^-10 / S), plus float32's own roundings.
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((16, 16))  # 16 blocks of 16, each block's largest magnitude 1
    g /= np.abs(g).max(axis=1, keepdims=True)
    g[rng.random(g.shape) < zeros] = 0.0  # exact zeros: 0 x inf was a NaN
    g[0, 0] = 1.0  # the first block holds the tensor's amax, 2^top
    x = (g * np.ldexp(1.0, top - np.array([0] + below))[:, None]).reshape(4, 64).astype(np.float32)
    q = quantize(x, "nvfp4")
    s = nvfp4_rule(float(np.abs(x).max()))
    assert q.tensor_scale == s
    block_amax = np.abs(x.reshape(16, 16)).max(axis=1, keepdims=True).astype(np.float64)
    bound = block_amax * (17 / 96 + 2.0**-20) + 6 * 2.0**-10 / np.float64(s) + 2.0**-150
    error = np.abs(q.dequantize().astype(np.float64) - x).reshape(16, 16)
    assert np.all(error <= bound), float(np.max(error / bound))


@pytest.mark.parametrize("top", [-117, -124, -126, -128, -131])
def test_a_tiny_nvfp4_tensor_with_a_zero_errs_as_a_unit_one_does(top: int) -> None:
    # Before: S / block_scale overflowed to inf, every element saturated to +-6 (relative RMS error 1.47 on
    # this tensor) and the zero, 0 x inf, raised "E2M1 has no NaN".  S is clamped from 2^-116.6 on, and
    # with it the block scales: their E4M3 rounding differs, their relative error stays within 5%.
    x = gaussian(2, (4, 64))
    x[0, 0] = 0.0
    unit = quantize(x / np.abs(x).max(), "nvfp4").dequantize() * np.abs(x).max() - x
    tiny = x.astype(np.float64) * 2.0**top / np.abs(x).max()
    error = quantize(tiny.astype(np.float32), "nvfp4").dequantize() - tiny
    relative = np.linalg.norm(error) / np.linalg.norm(tiny)
    assert relative == pytest.approx(np.linalg.norm(unit) / np.linalg.norm(x), rel=0.05) and relative < 0.1


@pytest.mark.parametrize(("top", "kept"), [(-131, 66 / 64), (-134, 0.75), (-136, 1.0), (-138, 1.0), (-139, 0.0)])
def test_below_2_to_the_minus_131_nvfp4s_fp32_scale_runs_out(top: int, kept: float) -> None:
    # S cannot pass FLT_MAX.  The top block's scale amax * FLT_MAX / 6: at 2^-131, 10.67 * 2^-9, rounds to
    # 11 * 2^-9 and the element 5.8 to 6 (66/64 of the value); below 2^-131.4 it is subnormal: at 2^-134,
    # 1.33 * 2^-9 rounds to 2^-9 and the element, 8, saturates to 6 (3/4); below 2^-135.4 it would round to
    # 0 and is 2^-9 instead, so x * 2^128 / 2^-9 is 2 at 2^-136, 0.5 at 2^-138 (the smallest NVFP4 value
    # under this S) and 0.25 at 2^-139, a tie that rounds to 0.
    x = np.zeros(16, np.float32)
    x[0] = np.float32(2.0**top)
    q = quantize(x, "nvfp4")
    assert q.tensor_scale == FLT_MAX and q.dequantize()[0] == pytest.approx(kept * 2.0**top, rel=2.0**-20, abs=0)


@pytest.mark.parametrize(("block_amax", "top"), [(1.0625, 6.375), (1.4 * 2.0**-9, 8.4)])
def test_an_nvfp4_block_scale_rounded_down_saturates_its_top_element(block_amax: float, top: float) -> None:
    # The tensor amax 448 makes S = 6; the second block's scale block_amax * 6 / 6 rounds down in E4M3:
    # 1.0625 (a tie) to 1, and 1.4 * 2^-9 (a subnormal) to 2^-9, so its top element, 6 times more, passes 6.
    x = np.zeros(32, np.float32)
    x[0], x[16] = 448.0, block_amax
    q = quantize(x, "nvfp4")
    scale = block_amax * 6.0 / top  # the rounded-down block scale: 1, and 2^-9
    assert q.tensor_scale == 6.0 and q.block_scales()[0, 1] == pytest.approx(scale, rel=1e-12)
    assert top > 6.0 and decode(q.codes[16], E2M1) == 6.0  # saturated
    assert q.dequantize()[16] == pytest.approx(scale, rel=1e-6) and q.dequantize()[16] < block_amax


@pytest.mark.parametrize("scheme", POWER_OF_TWO)
@pytest.mark.parametrize("rounding", ["floor", "up"])
@given(seed=st.integers(0, 2**32 - 1))
def test_values_already_representable_come_back_exactly_with_their_scales(
    scheme: str, rounding: str, seed: int
) -> None:
    fmt, (r, c), _ = SCHEMES[scheme]
    rng = np.random.default_rng(seed)
    shape = (r * 2, c * 2)
    finite = np.flatnonzero(np.isfinite(fmt.values)).astype(np.uint8)
    codes = rng.choice(finite, shape)
    t = codes.reshape(2, r, 2, c)
    t[:, 0, :, 0] = encode(np.float32(fmt.max), fmt)  # each block's amax is the format's max: both rules keep e
    e = rng.integers(-120, 110, (2, 2))
    x = (decode(codes, fmt).reshape(2, r, 2, c) * 2.0 ** e[:, None, :, None]).astype(np.float32).reshape(shape)
    q = quantize(x, scheme, rounding)
    assert np.array_equal(q.dequantize(), x) and np.array_equal(q.scales, (e + 127).astype(np.uint8))


@pytest.mark.parametrize("scheme", POWER_OF_TWO)
@given(seed=st.integers(0, 2**32 - 1), rounding=st.sampled_from(["floor", "up"]))
def test_quantizing_twice_changes_nothing(scheme: str, seed: int, rounding: str) -> None:
    r, c = SCHEMES[scheme][1]
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((r * 2, c)) * 10.0 ** rng.uniform(-20, 20)).astype(np.float32)
    once = quantize(x, scheme, rounding).dequantize()
    assert np.array_equal(quantize(once, scheme, rounding).dequantize(), once)


@pytest.mark.parametrize("scheme", POWER_OF_TWO)
@given(seed=st.integers(0, 2**32 - 1), power=st.floats(-40, 37))
def test_rounding_up_never_saturates_and_every_scale_is_a_power_of_two(scheme: str, seed: int, power: float) -> None:
    fmt, (r, c), _ = SCHEMES[scheme]
    x = (np.random.default_rng(seed).standard_normal((r * 2, c * 2)) * 10.0**power).astype(np.float32)
    q = quantize(x, scheme, "up")
    scales = q.block_scales().astype(np.float64)
    mantissa, _ = np.frexp(scales)
    assert np.all(mantissa == 0.5)  # 2^e exactly
    top = np.abs(tiles_of(x, scheme)).max(axis=(1, 3)) / scales
    assert np.all(top <= fmt.max)  # the block's max element after scaling, before any rounding
    if np.all(top > 0):  # the smallest such power of two: half of it would saturate (unless E8M0 clamps)
        assert np.all((top * 2 > fmt.max) | (scales == 2.0**-127))


def test_the_ocp_floor_rule_clips_about_one_gaussian_block_in_six_and_rounding_up_none(capsys) -> None:
    x = gaussian(0, (1024, 1024))
    fractions = {}
    for rounding in ("floor", "up"):
        q = quantize(x, "mxfp8_e4m3", rounding)
        scaled = np.abs(tiles_of(x, "mxfp8_e4m3")) / q.block_scales()[:, None, :, None]
        clipped = scaled > E4M3.max
        error = np.linalg.norm(q.dequantize() - x) / np.linalg.norm(x)
        fractions[rounding] = (clipped.any(axis=(1, 3)).mean(), clipped.mean(), error)
    with capsys.disabled():
        for rounding, (blocks, elements, error) in fractions.items():
            print(f"\nMXFP8 E4M3 {rounding:5s}: {blocks:.4f} of blocks clipped, {elements:.5f} of elements, "
                  f"relative RMS error {error:.5f}", end="")  # fmt: skip
    assert 1 / 7 < fractions["floor"][0] < 1 / 5  # about one block in six
    assert fractions["floor"][1] < 0.01 and fractions["up"][0] == 0 and fractions["up"][1] == 0


def per_tensor(x: np.ndarray, fmt) -> np.ndarray:
    """Current per-tensor scaling: scale = FP8_MAX / amax (the chapter's rule), cast, scale back."""
    scale = np.float32(next_scale(float(np.abs(x).max()), 1.0, fmt.max, 0)[0])
    return decode(encode(x * scale, fmt), fmt) * (np.float32(1) / scale)


def bulk_errors(outliers: float) -> tuple[dict[str, float], dict[str, float]]:
    """Relative RMS errors on the Gaussian bulk (the outliers left out): per-tensor by format, and per scheme."""
    x, plain = gaussian(1, outliers=outliers), gaussian(1)
    bulk = x == plain

    def error(y: np.ndarray) -> float:
        return float(np.linalg.norm((y - x)[bulk]) / np.linalg.norm(x[bulk]))

    per = {f.name: error(per_tensor(x, f)) for f in (E4M3, E5M2, E2M1)}
    blocks = {s: error(quantize(x, s).dequantize()) for s in SCHEMES} | {
        "mxfp8_e4m3 up": error(quantize(x, "mxfp8_e4m3", "up").dequantize())
    }
    return per, blocks


def test_blocks_beat_a_per_tensor_scale_once_an_outlier_outruns_the_formats_range(capsys) -> None:
    table = {outliers: bulk_errors(outliers) for outliers in (0.0, 100.0, 1e5)}
    with capsys.disabled():
        for outliers, (per, blocks) in table.items():
            print(f"\noutliers x{outliers:g}: per-tensor", {k: round(v, 4) for k, v in per.items()},
                  "blocks", {k: round(v, 4) for k, v in blocks.items()}, end="")  # fmt: skip
    for per, blocks in table.values():  # FP4 spans 2^-1 to 6: one scale per tensor always loses, outliers or not
        assert blocks["nvfp4"] < blocks["mxfp4"] < per["E2M1"]  # E4M3 scales per 16 beat powers of two per 32
        assert 1.1 < blocks["mxfp4"] / blocks["nvfp4"] < 1.3
    per, blocks = table[100.0]
    assert per["E2M1"] == 1.0  # every bulk value flushed to zero
    assert per["E4M3"] < 1.01 * table[0.0][0]["E4M3"]  # E4M3's range, 2^-9 to 448, absorbs a 100x outlier ...
    assert per["E4M3"] < blocks["mxfp8_e4m3"]  # ... and the OCP floor rule's clipping makes MXFP8 the worse
    assert blocks["mxfp8_e4m3 up"] < blocks["mxfp8_e4m3"]  # rounding the scale up repairs it
    per, blocks = table[1e5]  # the bulk now lies in E4M3's subnormals under one scale
    assert per["E4M3"] > 5 * max(blocks["mxfp8_e4m3"], blocks["deepseek_1x128"], blocks["mxfp8_e4m3 up"])
    assert blocks["deepseek_128x128"] < per["E4M3"]  # 16384 values share an outlier's block: a smaller gain
    assert blocks["deepseek_1x128"] < blocks["deepseek_128x128"]


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: quantize(np.zeros((2, 48), np.float32), "mxfp8_e4m3"), ValueError, ["1x32", "(2, 48)", "pad"]),
        (lambda: quantize(np.zeros((128, 100), np.float32), "deepseek_1x128"), ValueError, ["1x128", "(128, 100)"]),
        (lambda: quantize(np.zeros((64, 128), np.float32), "deepseek_128x128"), ValueError, ["128x128", "(64, 128)"]),
        (lambda: quantize(np.zeros((2, 128, 128), np.float32), "deepseek_128x128"), ValueError, ["2-D"]),
        (lambda: quantize(np.float32(1), "nvfp4"), ValueError, ["shape ()"]),
        (lambda: quantize(np.zeros(32, np.float32), "mxfp9"), ValueError, ["'mxfp9'", "mxfp8_e4m3"]),
        (lambda: quantize(np.zeros(32, np.float32), "nvfp4", "up"), ValueError, ["unset"]),
        (lambda: quantize(np.zeros(32, np.float32), "mxfp8_e4m3", "down"), ValueError, ["'floor' or 'up'"]),
        (lambda: quantize(np.zeros(32), "mxfp8_e4m3"), TypeError, ["float64"]),
        (lambda: quantize(np.r_[np.nan, np.zeros(31)].astype(np.float32), "mxfp8_e4m3"), ValueError, ["1 NaN"]),
        (lambda: quantize(np.r_[np.inf, -np.inf, np.zeros(14)].astype(np.float32), "nvfp4"), ValueError, ["2 NaN"]),
        (lambda: quantize(np.zeros((2, 48), np.float32), "mxfp4"), ValueError, ["mxfp4", "1x32", "(2, 48)", "pad"]),
        (lambda: quantize(np.r_[np.nan, np.inf, np.zeros(30)].astype(np.float32), "mxfp4"), ValueError, ["2 NaN"]),
        (lambda: quantize(np.zeros(32, np.float32), "mxfp4", "even"), ValueError, ["mxfp4", "'floor' or 'up'"]),
    ],
)
def test_bad_input_is_refused_with_one_sentence_naming_the_fix(call, error, words: list[str]) -> None:
    with pytest.raises(error) as caught:
        call()
    assert all(w in str(caught.value) for w in words), str(caught.value)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_tensor_of_zeros_stays_zero_and_leading_axes_fold_into_rows(scheme: str) -> None:
    r, c = SCHEMES[scheme][1]
    shape = (r * 2, c) if r > 1 else (3, 2, c)
    q = quantize(np.zeros(shape, np.float16), scheme)
    assert q.codes.shape == shape and q.codes.dtype == np.uint8 and q.scales.dtype == np.uint8
    assert np.array_equal(q.dequantize(), np.zeros(shape, np.float32)) and q.dequantize().dtype == np.float32
    assert q.tensor_scale == 1.0 and q.codes.nbytes == np.prod(shape)  # one byte a value


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("shape", [(0,), (0, 128), (128, 0)])
def test_an_empty_tensor_has_no_blocks_and_quantizes_to_an_empty_one(scheme: str, shape: tuple) -> None:
    if SCHEMES[scheme][1][0] > 1 and len(shape) == 1:
        shape = (0, 0)  # 128 x 128 blocks need a 2-D tensor, even an empty one
    q = quantize(np.zeros(shape, np.float32), scheme)
    assert q.codes.shape == shape and q.scales.size == 0 and q.dequantize().shape == shape


def test_shared_exponents_of_zero_and_the_extremes_stay_in_e8m0() -> None:
    amax = np.array([0.0, 2.0**-149, 1.0, 448.0, 449.0, float(np.finfo(np.float32).max)])
    assert shared_exponents(amax, E4M3, "floor").tolist() == [-127, -127, -8, 0, 0, 119]
    assert shared_exponents(amax, E4M3, "up").tolist() == [-127, -127, -8, 0, 1, 120]


def test_rounding_up_sends_an_amax_within_3_percent_of_float32s_max_to_infinity() -> None:
    edge = np.float32(248 * 2.0**120)  # e = 120 and 248 rounds (a tie, to even) to 256: 2^128
    below = np.nextafter(edge, np.float32(0))
    for rounding, amax, expected in [
        ("up", edge, np.inf),
        ("up", below, 240 * 2.0**120),
        ("floor", edge, 448 * 2.0**119),
    ]:
        x = np.zeros(32, np.float32)
        x[0] = amax
        assert quantize(x, "mxfp8_e4m3", rounding).dequantize()[0] == expected
