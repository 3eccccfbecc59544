"""The peers that define FP8 and block scaling, and the edges where tinyamp decides otherwise.

Where the peers agree, tinyamp gives their bits: torchao 0.18's ``to_mx`` (FLOOR) for MXFP8 and
MXFP4.  Where they part, each test below shows the difference and asserts the reason tinyamp's
rule gives (its docstrings and tutorial 10 say the same).  torchao's tests skip when it is absent
(``pip install torchao==0.18.0`` with a CPU torch; tinyamp never needs torch).  microxcaling and
Transformer Engine appear as small reference functions written here from what their code does,
each one citing it; none is a copy of their code.
"""

from __future__ import annotations

import numpy as np
import pytest

from tinyamp.fp8.blocks import SCHEMES, quantize, shared_exponents
from tinyamp.fp8.formats import E2M1, E4M3, decode, encode
from tinyamp.fp8.scaling import ScalingRecipe, TensorScaling

pytestmark = pytest.mark.fp8

# name: torch's element dtype, as to_mx takes it
TORCH_ELEMENTS = {"mxfp8_e4m3": "float8_e4m3fn", "mxfp8_e5m2": "float8_e5m2", "mxfp4": "float4_e2m1fn_x2"}


def torchao_to_mx(x: np.ndarray, scheme: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torchao's ``to_mx`` (FLOOR) and ``to_dtype`` on float32 `x`: E8M0 bytes, element codes, decoded values."""
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.kernels import unpack_uint4

    elem = getattr(torch, TORCH_ELEMENTS[scheme])
    scales, data = mx.to_mx(torch.from_numpy(x), elem, 32, ScaleCalculationMode.FLOOR)
    values = mx.to_dtype(data, scales, elem, 32, torch.float32).numpy()
    codes = unpack_uint4(data.view(torch.uint8)) if scheme == "mxfp4" else data.view(torch.uint8)
    return scales.view(torch.uint8).numpy(), codes.numpy().reshape(x.shape), values


@pytest.mark.parametrize("scheme", list(TORCH_ELEMENTS))
@pytest.mark.parametrize("seed", range(4))
def test_mx_scales_and_elements_are_torchaos_bit_for_bit(scheme: str, seed: int) -> None:
    rng = np.random.default_rng(seed)  # blocks from 2^-66 to 2^66: no E8M0 code 0 (next test)
    x = (rng.standard_normal((64, 256)) * 2.0 ** rng.integers(-66, 66, (64, 8)).repeat(32, axis=1)).astype(np.float32)
    scales, codes, values = torchao_to_mx(x, scheme)
    q = quantize(x, scheme)
    assert np.array_equal(q.scales, scales) and np.array_equal(q.codes, codes)
    assert np.array_equal(q.dequantize(), values)


@pytest.mark.parametrize(
    ("scheme", "elements"), [("mxfp8_e4m3", [448, 3, 1.25, -0.5, 0.0625]), ("mxfp4", [6, 3, 1, -4, 2])]
)
def test_at_e8m0_code_0_torchao_divides_by_2_to_the_126_and_decodes_half_of_each_value(
    scheme: str, elements: list[float]
) -> None:
    # A block whose floor(log2 amax) - emax_elem is -127 or less gets code 0, the scale 2^-127.  torchao
    # clamps the float32 scale to 2^-126 (its comment: Triton flushes the subnormal 2^-127) before dividing,
    # so its elements are half of what code 0 says, and its own to_dtype, reading 2^-127, returns x / 2.
    # tinyamp divides by 2^-127 itself (exact: x / 2^-127 is x times a power of two) and returns x.
    x = np.zeros(32, np.float32)
    x[: len(elements)] = np.ldexp(np.float32(elements), -127)
    q = quantize(x, scheme)
    assert q.scales.ravel().tolist() == [0] and np.array_equal(q.dequantize(), x)
    scales, codes, values = torchao_to_mx(x, scheme)
    assert scales.ravel().tolist() == [0] and np.array_equal(values, x / 2)  # every halved element is exact here


def microxcaling_exponent(amax: np.ndarray, emax_elem: int) -> np.ndarray:
    """microxcaling's shared exponent (``mx/mx_ops.py``, ``_shared_exponents`` with method "max", then
    ``- emax``): ``floor(log2(amax))`` evaluated on float32 values, minus the element format's emax."""
    return np.floor(np.log2(np.asarray(amax, np.float32))).astype(np.int64) - emax_elem


@pytest.mark.parametrize("k", [8, 20, -20, 100])
def test_microxcalings_float32_log2_gives_a_scale_one_too_high_a_few_ulp_below_a_power_of_two(k: int) -> None:
    # log2(2^k (1 - d)) = k - d / ln 2: for d one or two float32 ulp (2^-24 each) that is nearer k than the
    # float32 below k (2^-21 below 8, and more for larger |k|), so float32 log2 returns k and the floor stays
    # there: for that block microxcaling's floor rule rounds up.  tinyamp reads floor(log2 amax) = k - 1
    # exactly, from the exponent field.
    power = np.float32(2.0**k)
    below = np.array([np.nextafter(power, np.float32(0)), power * np.float32(1 - 2 * 2.0**-24), power], np.float32)
    assert np.log2(below).tolist() == [k, k, k]  # what makes the difference: float32 log2 rounds to k
    ours = shared_exponents(below, E4M3, "floor")
    assert ours.tolist() == [k - 9, k - 9, k - 8] and microxcaling_exponent(below, 8).tolist() == [k - 8] * 3
    x = np.zeros(32, np.float32)
    x[0], x[1] = below[0], np.float32(power / 300)
    q = quantize(x, "mxfp8_e4m3")
    top, small = decode(q.codes[:2], E4M3)
    mx_top, mx_small = decode(encode(x[:2] / np.float32(2.0 ** (k - 8)), E4M3), E4M3)
    assert top == 448 and mx_top == 256  # floor saturates the top; microxcaling's scale does not ...
    assert small == 2 * mx_small  # ... and puts every element one binade lower, nearer E4M3's subnormals


def torchao_nvfp4(x: np.ndarray) -> np.ndarray:
    """torchao's NVFP4 (``nvfp4_quantize`` with ``per_tensor_amax_to_scale``), decoded: E2M1 x E4M3 x S_dec."""
    torch = pytest.importorskip("torch")
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4

    t = torch.from_numpy(x)
    per_tensor = nv.per_tensor_amax_to_scale(t.abs().max())
    block_scales, data = nv.nvfp4_quantize(t, 16, per_tensor)
    elements = f4_unpacked_to_f32(unpack_uint4(data)).reshape(x.shape[0], -1, 16)
    return (elements * block_scales.to(torch.float32).unsqueeze(-1) * per_tensor).reshape(x.shape).numpy()


@pytest.mark.parametrize(("outliers", "ours_at_most", "theirs_at_least"), [(1e5, 0.11, 0.13), (5e5, 0.12, 0.58)])
def test_torchaos_nvfp4_clamps_block_scales_to_2_to_the_minus_6_and_errs_more_on_the_bulk(
    outliers: float, ours_at_most: float, theirs_at_least: float, capsys
) -> None:
    # Eight outliers 10^5 times the Gaussian bulk: a bulk block's scale block_amax * S / 6 is then near 2^-8,
    # an E4M3 subnormal; at 5 * 10^5 nearly every block's is 2^-9, E4M3's smallest (for about one block in
    # nine raised to it from a 0).  torchao clamps the scale up to 2^-6, so the block's elements
    # shrink toward 0 and use fewer of E2M1's values; tinyamp keeps the subnormal scale.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    chosen = rng.choice(x.size, 8, replace=False)
    x.reshape(-1)[chosen] *= np.float32(outliers)
    bulk = np.ones(x.size, bool)
    bulk[chosen] = False
    bulk = bulk.reshape(x.shape)
    q = quantize(x, "nvfp4")
    bulk_scales = q.block_scales().reshape(256, 64)[bulk.reshape(256, 64, 16).all(axis=2)]
    assert np.median(bulk_scales) < E4M3.min_normal  # the bulk's block scales are subnormal

    def rms(y: np.ndarray) -> float:
        return float(np.linalg.norm((y - x)[bulk]) / np.linalg.norm(x[bulk]))

    ours, theirs = rms(q.dequantize()), rms(torchao_nvfp4(x))
    with capsys.disabled():
        print(
            f"\nNVFP4 bulk relative RMS error, outliers x{outliers:g}: tinyamp {ours:.3f}, torchao {theirs:.3f}", end=""
        )
    assert ours < ours_at_most and theirs > theirs_at_least


def te_satfinite_cast(x: np.ndarray, scale: float) -> np.ndarray:
    """Transformer Engine's FP8 cast of x * scale: ``cvt.rn.satfinite`` rounds to nearest even, clamps a
    finite or infinite value beyond 448 to +-448 and keeps NaN (PTX ISA, cvt with .satfinite)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return encode(np.clip(x * np.float32(scale), -E4M3.max, E4M3.max), E4M3)


def test_current_scaling_casts_an_inf_to_nan_where_tes_satfinite_gives_448() -> None:
    # Same scale, same finite values: only the inf differs.  448 / scale would be a finite value wrong by an
    # unbounded factor, and the product carries no sign of the overflow; the NaN reaches the loss scaler.
    x = np.array([0.5, -2.0, np.inf, 1.0], np.float32)
    tensor = TensorScaling("x", E4M3, ScalingRecipe(recipe="current"))
    q = tensor.quantize(x)
    theirs = te_satfinite_cast(x, q.scale)
    assert np.array_equal(q.bits[[0, 1, 3]], theirs[[0, 1, 3]])
    assert np.isnan(decode(q.bits[2], E4M3)) and decode(theirs[2], E4M3) == 448
    assert tensor.history[-1].nonfinite == 1 and tensor.history[-1].saturated == 0  # reported, not saturated
    ones = np.ones(4, np.float32)
    assert np.isnan(q.dequantize() @ ones) and np.isfinite(decode(theirs, E4M3) @ ones)


def te_delayed_scales(amaxes: list[float], history_len: int) -> tuple[list[float], list[float]]:
    """Transformer Engine's delayed scaling for E4M3 (``common/recipe/delayed_scaling.cu``, its per-tensor
    kernel, margin 0): the step's amax, an inf included, rolls into the history; "max" is an ``fmaxf``
    reduction (it skips a NaN, not an inf); scale = 448 / amax, the previous one kept when that amax is 0,
    inf or NaN.  Returns the scale each step was cast with, and the history after each step's maximum."""
    history, scale, used, reduced = np.zeros(history_len, np.float32), 1.0, [], []
    for amax in amaxes:
        used.append(scale)
        history = np.append(history[1:], np.float32(amax))
        top = np.fmax.reduce(history)
        reduced.append(float(top))
        if np.isfinite(top) and top > 0:
            scale = float(np.float32(448) / top)
    return used, reduced


def test_delayed_scaling_keeps_an_inf_amax_out_of_the_history_where_te_keeps_it_for_the_whole_window() -> None:
    # An inf step: both hold the scale for it.  In TE's history the inf is the maximum for the next 3 steps,
    # so the scale stays at 448 while the tensor has grown to amax 2: those steps clip half of each value.
    # tinyamp's history never held it: the next step's scale is learned from the amax 2, one step late.
    amaxes = [1.0, np.inf, 2.0, 2.0, 2.0, 2.0, 2.0]
    te_used, te_reduced = te_delayed_scales(amaxes, 4)
    tensor = TensorScaling("x", E4M3, ScalingRecipe(amax_history_len=4))
    for amax in amaxes:
        tensor.quantize(np.array([amax, 1.0], np.float32))
    ours = [c.scale for c in tensor.history]
    assert te_used == [1.0, 448.0, 448.0, 448.0, 448.0, 448.0, 224.0] and te_reduced[1:5] == [np.inf] * 4
    assert ours == [1.0, 448.0, 448.0, 224.0, 224.0, 224.0, 224.0] and np.isfinite(tensor.amax_history).all()
    te_clipped = sum(a * s > 448 for a, s in zip(amaxes, te_used) if np.isfinite(a))
    assert te_clipped == 4 and sum(c.saturated > 0 for c in tensor.history) == 1


def test_every_scheme_that_torchao_has_is_compared_here() -> None:
    mx = {s for s, (fmt, (r, c), rounding) in SCHEMES.items() if c == 32 and rounding == "floor"}
    assert mx == set(TORCH_ELEMENTS) and SCHEMES["mxfp4"][0] is E2M1
