"""The engine room's FP8 kernels (tinyamp/engine/fast/fp8.py) give the chapter's bits and counts.

Each test runs ``tinyamp.fp8.seam`` twice on the same arrays: as the library runs it (the compiled
loops answer) and under ``kernels.reference_only()`` (the chapter's own functions), and compares
codes, scales, counts and states bit for bit: on every rounding point of each format (ties, the
saturation edge, half the smallest subnormal), NaN with both signs and payloads, inf, -0, float32
subnormals, empty arrays, random and adversarial data.  Skipped where numba is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import amax_values, float32_bit_patterns, fp8_format_names, fp8_rounding_arrays, fp8_rounding_points

from tinyamp import kernels
from tinyamp.engine.fast import casts
from tinyamp.engine.fast import fp8 as fast
from tinyamp.fp8 import blocks, formats, scaling, seam
from tinyamp.fp8.formats import E2M1, E4M3, E5M2, FORMATS
from tinyamp.fp8.scaling import Fp8Tensor, ScalingRecipe

pytestmark = [pytest.mark.engine_room, pytest.mark.fp8]


@pytest.fixture(autouse=True)
def compiled_loops():
    try:
        with casts.kernels("numba"):
            yield
    except ImportError as e:
        pytest.skip(str(e))


def both_ways(fn, *args):  # type: ignore[no-untyped-def]
    """(as the library runs it, the chapter's reference) results of fn(*args), each on fresh copies."""
    copies = [[a.copy() if isinstance(a, np.ndarray) else a for a in args] for _ in range(2)]
    engine = fn(*copies[0])
    with kernels.reference_only():
        reference = fn(*copies[1])
    return engine, reference


def outcome(fn, *args):  # type: ignore[no-untyped-def]
    """fn(*args), or the error it raised as (type, message): a refusal must be the reference's own."""
    try:
        return fn(*args)
    except (ValueError, TypeError) as e:
        return type(e), str(e)


def same(a, b) -> bool:  # type: ignore[no-untyped-def]
    """Arrays equal bit for bit (float NaNs by their bits), tuples and errors element by element."""
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return np.array_equal(a.view(np.uint8), b.view(np.uint8)) if a.size else True
    if isinstance(a, blocks.BlockTensor):
        return same((a.codes, a.scales, a.scheme, a.tensor_scale), (b.codes, b.scales, b.scheme, b.tensor_scale))
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return a == b


def nasty_float32() -> np.ndarray:
    """NaNs (both signs, other payloads), infs, signed zeros, float32 subnormals, float32's extremes."""
    words = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000,
             0x00000001, 0x807FFFFF, 0x00400000, 0x7F7FFFFF, 0xFF7FFFFF, 0x00800000]  # fmt: skip
    return np.array(words, np.uint32).view(np.float32)


def random_float32(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 6, n)).astype(np.float32)  # every binade's width


# ---- encode --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(FORMATS))
def test_encode_gives_the_chapters_codes_on_every_rounding_point_and_random_values(name: str) -> None:
    x = np.concatenate([fp8_rounding_points(name), random_float32(1 << 16)])
    assert fast.encode(x, FORMATS[name]) is not NotImplemented  # the compiled loop answered
    engine, reference = both_ways(seam.encode, x, name)
    assert same(engine, reference)


@pytest.mark.parametrize("name", ["E4M3", "E5M2"])
def test_encode_of_nan_inf_zeros_and_subnormals_is_the_chapters(name: str) -> None:
    x = nasty_float32()
    engine, reference = both_ways(seam.encode, x, name)
    assert same(engine, reference)
    assert engine[0] == FORMATS[name].nan_bits and engine[1] == FORMATS[name].nan_bits | 0x80  # the sign kept


def test_encode_refuses_nan_for_e2m1_in_the_chapters_words() -> None:
    x = np.array([1.0, np.nan], np.float32)
    assert fast.encode(x, E2M1) is NotImplemented  # handed back: the reference raises
    engine, reference = both_ways(lambda x: outcome(seam.encode, x, "E2M1"), x)
    assert engine == reference and engine[0] is ValueError


@pytest.mark.parametrize("shape", [(0,), (3, 0), (), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_encode_of_empty_scalar_and_shaped_arrays_float16_included(shape: tuple, dtype: type) -> None:
    x = np.full(shape, 300.5, dtype)
    engine, reference = both_ways(seam.encode, x, "E4M3")
    assert same(engine, reference) and engine.shape == shape


def test_encode_of_a_strided_view_and_of_float64_is_the_chapters() -> None:
    x = random_float32(400).reshape(20, 20)
    assert same(*both_ways(seam.encode, x.T, "E5M2"))  # not contiguous: the reference runs
    assert same(*both_ways(lambda v: outcome(seam.encode, v, "E4M3"), x.astype(np.float64)))  # both refuse


@settings(max_examples=200, deadline=None)
@given(fp8_rounding_arrays())
def test_encode_property_on_drawn_rounding_points(case: tuple[str, np.ndarray]) -> None:
    name, x = case
    assert same(*both_ways(seam.encode, x, name))


@settings(max_examples=200, deadline=None)
@given(float32_bit_patterns(), fp8_format_names(with_fp4=False))
def test_encode_property_on_any_float32_bit_patterns(x: np.ndarray, name: str) -> None:
    assert same(*both_ways(seam.encode, x, name))


# ---- per-tensor scaling: the amax and the counted cast -------------------------------------------------
def history(tensor: scaling.TensorScaling) -> str:
    """A tensor's whole state, NaN amaxes included, as text (NaN == NaN there)."""
    state = tensor.state_dict()
    state["history"] = [asdict(e) for e in tensor.history]
    return json.dumps(state, sort_keys=True, default=str)


def cast_sequence() -> list[np.ndarray]:
    """Steps a tensor is cast through: ordinary, a spike that saturates, NaN and inf, zeros, empty, tiny."""
    x = random_float32(5000, seed=1)
    spike = x.copy()
    spike[17] = 3e38  # overflows float32 once scaled: saturated
    bad = x.copy()
    bad[[3, 4, 5]] = [np.nan, np.inf, -np.inf]
    tiny = (x * np.float32(1e-30)).astype(np.float32)  # float32 subnormals among them: flushed
    edges = np.concatenate([nasty_float32(), fp8_rounding_points("E4M3"), fp8_rounding_points("E5M2")])
    return [x, spike, x, bad, np.zeros(64, np.float32), np.zeros(0, np.float32), tiny, edges, x * 1e6, x]


@pytest.mark.parametrize("recipe", [{"recipe": "current"}, {"recipe": "delayed"},
                                    {"recipe": "delayed", "amax_history_len": 2, "margin": 2},
                                    {"recipe": "current", "fp8_format": "E5M2", "margin": 31}])  # fmt: skip
@pytest.mark.parametrize("pass_", ["forward", "backward"])
def test_a_tensors_casts_and_state_are_the_chapters_step_by_step(recipe: dict, pass_: str) -> None:
    settings_ = ScalingRecipe(**recipe)
    fmt = settings_.format_for(pass_)
    ours, chapters = seam.TensorScaling("t", fmt, settings_), seam.TensorScaling("t", fmt, settings_)
    for step, x in enumerate(cast_sequence()):
        q = ours.quantize(x)
        with kernels.reference_only():
            r = chapters.quantize(x.copy())
        assert same(q.bits, r.bits) and q.scale == r.scale, step
        assert history(ours) == history(chapters), step


def test_the_fast_amax_and_cast_answer_and_count_like_the_chapter() -> None:
    x = np.concatenate([random_float32(3000), nasty_float32()])
    assert fast.scaled_cast(x, 0.5, E4M3) is not NotImplemented
    assert fast.amax(x) is NotImplemented  # a NaN: NumPy's max chooses which one, so the reference answers
    assert fast.amax(x[:3000]) == float(np.max(np.abs(x[:3000]))) and fast.amax(np.zeros(0, np.float32)) == 0.0
    assert fast.amax(np.array([-0.0, -3.5, 2.0], np.float32)) == 3.5
    tensor = scaling.TensorScaling("t", E4M3, ScalingRecipe(recipe="current"))
    for scale in (1.0, 448.0 / 3e-38, 2.0**-20, float(np.finfo(np.float32).max)):
        bits, *counts = fast.scaled_cast(x, scale, E4M3)
        expected_bits, *expected = tensor.cast_counted(x, scale)
        assert same(bits, expected_bits) and counts == expected, scale


@settings(max_examples=150, deadline=None)
@given(float32_bit_patterns(), amax_values(), fp8_format_names(with_fp4=False))
def test_counted_cast_property_on_any_bit_patterns_and_scales(x: np.ndarray, amax: float, name: str) -> None:
    scale, _ = scaling.next_scale(amax, 1.0, FORMATS[name].max, 0)
    tensor = seam.TensorScaling("t", name, ScalingRecipe(recipe="current"))
    assert same(*both_ways(tensor.cast_counted, x, scale))
    assert same(*both_ways(tensor.amax_of, x))


def test_float16_and_empty_inputs_take_the_chapters_path_with_its_results() -> None:
    for x in (np.clip(random_float32(100), -6e4, 6e4).astype(np.float16), np.zeros((0, 4), np.float32)):
        ours, chapters = (seam.TensorScaling("t", E4M3, ScalingRecipe(recipe="current")) for _ in range(2))
        q = ours.quantize(x)
        with kernels.reference_only():
            r = chapters.quantize(x)
        assert same(q.bits, r.bits) and history(ours) == history(chapters)


# ---- block scaling -------------------------------------------------------------------------------------
def block_inputs(c: int) -> list[np.ndarray]:
    """Tensors whose last axis blocks of `c` split: Gaussian with outliers; powers of two and values a few
    ulp below them (where floor(log2 amax) turns); rounding points placed in blocks; float32 subnormal
    blocks; blocks of zeros and of -0; a tensor of float32's extremes."""
    rng = np.random.default_rng(2)
    gauss = rng.standard_normal((64, 4 * c)).astype(np.float32)
    gauss.reshape(-1)[rng.choice(gauss.size, 9, replace=False)] *= np.float32(1e5)
    powers = np.ldexp(np.float32(1.0), rng.integers(-140, 120, (16, c))).astype(np.float32)
    below = (powers.view(np.uint32) - rng.integers(0, 4, powers.shape).astype(np.uint32)).view(np.float32)
    points = np.concatenate([fp8_rounding_points(n)[np.isfinite(fp8_rounding_points(n))] for n in FORMATS])
    points = np.resize(points, (points.size // c + 1) * c).reshape(-1, c).astype(np.float32)
    subnormal = (rng.integers(0, 1 << 23, (8, c)).astype(np.uint32)).view(np.float32) * np.float32(rng.choice([-1, 1]))
    zeros = np.zeros((2, c), np.float32)
    zeros[1] = -0.0
    extremes = np.full((1, c), np.finfo(np.float32).max, np.float32) * np.where(np.arange(c) % 2, 1, -1)
    return [gauss, gauss * np.float32(1e-38), powers, below, points, subnormal, zeros, extremes.astype(np.float32)]


ONE_ROW_SCHEMES = [s for s, (_, block, _) in blocks.SCHEMES.items() if block[0] == 1]


@pytest.mark.parametrize("scheme", ONE_ROW_SCHEMES)
@pytest.mark.parametrize("rounding", [None, "floor", "up"])
def test_block_quantize_gives_the_chapters_codes_and_scales(scheme: str, rounding: str | None) -> None:
    fmt, block, default = blocks.SCHEMES[scheme]
    if default is None and rounding is not None:
        pytest.skip("nvfp4's scales are E4M3: no rounding to choose")
    for i, x in enumerate(block_inputs(block[1])):
        answered = fast.block_quantize(x, scheme, fmt, block, rounding or default, E4M3)
        assert answered is not NotImplemented, i
        engine, reference = both_ways(seam.quantize_blocks, x, scheme, rounding)
        assert same(engine, reference), (i, scheme)


def test_nvfp4_on_tensors_whose_amax_clamps_s_or_is_zero() -> None:
    rng = np.random.default_rng(3)
    for amax in (2.0**-110, 2.0**-131, 2.0**-140, 1e-45):
        x = (rng.standard_normal((4, 64)) * amax).astype(np.float32)  # S clamps to float32's max
        assert same(*both_ways(seam.quantize_blocks, x, "nvfp4"))
    assert same(*both_ways(seam.quantize_blocks, np.zeros((2, 32), np.float32), "nvfp4"))  # S = 1


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ONE_ROW_SCHEMES), st.integers(1, 4), st.data())
def test_block_quantize_property_on_drawn_finite_values(scheme: str, rows: int, data: st.DataObject) -> None:
    c = blocks.SCHEMES[scheme][1][1]
    words = st.integers(0, 0x7F7FFFFF) | st.integers(0x80000000, 0xFF7FFFFF)  # every finite float32
    values = data.draw(st.lists(words, min_size=rows * c, max_size=rows * c))
    x = np.array(values, np.uint32).view(np.float32).reshape(rows, c)
    rounding = data.draw(st.sampled_from([None, "up"] if blocks.SCHEMES[scheme][2] else [None]))
    assert same(*both_ways(seam.quantize_blocks, x, scheme, rounding))


@pytest.mark.parametrize("x", [np.array([[1.0, np.nan] * 16], np.float32), np.array([[np.inf] * 32], np.float32),
                               np.ones((2, 48), np.float32), np.zeros((0, 32), np.float32),
                               np.ones((3, 32), np.float16), np.ones((2, 2, 64), np.float32)])  # fmt: skip
@pytest.mark.parametrize("scheme", ["mxfp8_e4m3", "mxfp4", "nvfp4", "deepseek_128x128"])
def test_bad_empty_float16_and_3d_block_inputs_get_the_chapters_result_or_refusal(x: np.ndarray, scheme: str) -> None:
    engine, reference = both_ways(lambda v: outcome(seam.quantize_blocks, v, scheme), x)
    assert same(engine, reference)


# ---- the product ---------------------------------------------------------------------------------------
def fp8_operands(seed: int) -> list[tuple[Fp8Tensor, Fp8Tensor]]:
    """(a, b) pairs: random codes (NaN codes included) under non-power-of-two scales, C order and transposed."""
    rng = np.random.default_rng(seed)
    pairs = []
    for fa, fb in ((E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2)):
        a = rng.integers(0, 256, (33, 70)).astype(np.uint8)
        b = rng.integers(0, 256, (70, 21)).astype(np.uint8)
        sa, sb = float(np.float32(rng.uniform(0.01, 300))), float(np.float32(rng.uniform(0.01, 300)))
        pairs.append((Fp8Tensor(a, fa, sa), Fp8Tensor(b, fb, sb)))
        pairs.append((Fp8Tensor(np.ascontiguousarray(a.T).T, fa, sa), Fp8Tensor(np.ascontiguousarray(b.T).T, fb, sb)))
    return pairs


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")  # NaN and inf codes, in both
@pytest.mark.parametrize("seed", [0, 1])
def test_fp8_matmul_gives_the_chapters_float32_bits(seed: int) -> None:
    for a, b in fp8_operands(seed):
        assert fast.fp8_matmul(a, b) is not NotImplemented
        engine, reference = both_ways(seam.fp8_matmul, a, b)
        assert same(engine, reference)


def test_fp8_matmul_with_a_narrow_accumulator_or_a_bad_shape_is_the_chapters() -> None:
    a, b = fp8_operands(2)[0]
    assert fast.fp8_matmul(a, b, 14, 32) is NotImplemented
    assert same(*both_ways(seam.fp8_matmul, a, b, 14, 32, "nearest"))
    engine, reference = both_ways(lambda a: outcome(seam.fp8_matmul, a, a), a)  # (33, 70) @ (33, 70)
    assert same(engine, reference) and engine[0] is ValueError


# ---- the pieces that must agree with the chapter by construction ---------------------------------------
@settings(max_examples=200, deadline=None)
@given(amax_values())
def test_the_engine_rooms_nvfp4_tensor_scale_is_the_chapters(amax: float) -> None:
    assert same(float(fast.nvfp4_tensor_scale(amax)), float(blocks.nvfp4_tensor_scale(amax)))


def test_format_numbers_are_read_from_the_formats() -> None:
    assert fast.format_numbers(E4M3) == (3, 127 + 23 + 1 - 7 - 3, 0x43E00000, 8, 0x7F)
    assert fast.format_numbers(E2M1)[3:] == (4, 0)


def test_with_the_numpy_casts_every_fp8_kernel_hands_back() -> None:
    x = random_float32(64)
    with casts.kernels("numpy"):
        assert fast.encode(x, E4M3) is NotImplemented and fast.amax(x) is NotImplemented
        assert fast.block_quantize(x.reshape(2, 32), "mxfp8_e4m3", E4M3, (1, 32), "floor", E4M3) is NotImplemented
        assert same(seam.encode(x, "E4M3"), formats.encode(x, "E4M3"))


def test_training_in_fp8_is_the_same_with_and_without_the_engine_room() -> None:
    """A few steps of each FP8 recipe on a small MLP: the same weights and the same record, bit for bit."""
    import tinyamp as ta
    from tinyamp import nn, optim
    from tinyamp.fp8.training import fp8_training

    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((32, 64)).astype(np.float32), rng.integers(0, 10, 32)

    def train(recipe: str) -> tuple[list[np.ndarray], str]:
        ta.manual_seed(0)
        model, casts_ = nn.MLP([64, 96, 10]), fp8_training(recipe)
        opt = optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            opt.zero_grad()
            with casts_.autocast(model):
                loss = ta.cross_entropy(model(ta.tensor(x)), ta.tensor(y))
            loss.backward()
            opt.step()
        return [p.data.copy() for p in model.parameters()], json.dumps(casts_.summary(), default=str)

    for recipe in ("fp8", "fp8-current", "mxfp8"):
        engine, reference = both_ways(train, recipe)
        assert same(engine[0], reference[0]) and engine[1] == reference[1], recipe


def test_import_tinyamp_fp8_does_not_import_numba() -> None:
    code = "import sys, tinyamp, tinyamp.fp8, tinyamp.fp8.seam; print('numba' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


SEAM_RUN = (
    "import sys, hashlib, numpy as np\n"
    "from tinyamp.fp8 import seam\n"
    "x = (np.random.default_rng(5).standard_normal(1 << 12) * 100).astype(np.float32)\n"
    "q = seam.quantize_blocks(x.reshape(4, -1), 'mxfp8_e4m3')\n"
    "t = seam.TensorScaling('x', 'E4M3', seam.scaling.ScalingRecipe(recipe='current')).quantize(x)\n"
    "parts = (seam.encode(x, 'E5M2'), q.codes, q.scales, t.bits)\n"
    "print(hashlib.sha256(b''.join(p.tobytes() for p in parts)).hexdigest(), sys.modules.get('numba') is not None)\n"
)


@pytest.mark.parametrize("setting", [{"TINYAMP_ENGINE_ROOM": "off"}, {"NUMBA": "absent"}])
def test_with_the_engine_room_off_or_without_numba_the_chapter_runs_alone_with_the_same_bits(setting: dict) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TINYAMP_ENGINE_ROOM", "TINYAMP_CAST_KERNELS")}
    code = SEAM_RUN if "NUMBA" not in setting else "import sys; sys.modules['numba'] = None\n" + SEAM_RUN
    env |= {k: v for k, v in setting.items() if k != "NUMBA"}
    engine_on = {k: v for k, v in env.items() if k != "TINYAMP_ENGINE_ROOM"}
    runs = [subprocess.run([sys.executable, "-c", c], capture_output=True, text=True, timeout=300, env=e)
            for c, e in ((code, env), (SEAM_RUN, engine_on))]  # fmt: skip
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    (alone, numba_loaded), (with_engine, numba_used) = (r.stdout.split() for r in runs)
    assert alone == with_engine and numba_loaded == "False" and numba_used == "True", (runs[0].stdout, runs[1].stdout)
