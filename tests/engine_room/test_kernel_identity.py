"""Every implementation the engine room registers behind ``tinyamp.kernels`` gives the reference's bits.

Each test runs one kernel twice on the same arrays, once as the library runs it (the engine
room asked first) and once inside ``kernels.reference_only()``, and compares bit patterns:
-0.0 differs from +0.0 and NaN payloads count.  The CPU implementations are checked here;
the GPU ones on a GPU (test_fused_cuda.py, test_cublas_plan.py) and by benchmarks/gpu_check.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import bit_pattern_arrays

from tinyamp import kernels
from tinyamp.engine import cuda, fast
from tinyamp.engine.fast import bits16

try:
    import ml_dtypes
except ImportError:  # bfloat16 is optional
    ml_dtypes = None

pytestmark = pytest.mark.engine_room

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
SIXTEEN_BIT = [F16] + ([np.dtype(ml_dtypes.bfloat16)] if ml_dtypes is not None else [])


def bits(array: Any) -> np.ndarray:
    array = np.asarray(array)
    return np.ascontiguousarray(array).view(f"u{array.dtype.itemsize}")


def same_bits(a: Any, b: Any) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(bits(a), bits(b))


def both_ways(kernel: str, *args: Any) -> tuple[Any, Any]:
    """(with the engine room, reference only) results of kernels.<kernel>(*args), each on fresh copies."""
    fn = getattr(kernels, kernel)
    with np.errstate(all="ignore"):
        engine = fn(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])
        with kernels.reference_only():
            reference = fn(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])
    return engine, reference


def test_the_engine_room_is_registered_and_can_be_switched_off() -> None:
    """import tinyamp registers both packages; reference_only() makes every kernel skip them."""
    for package in (fast, cuda):
        for name, implementation in package.IMPLEMENTATIONS.items():
            assert implementation in kernels._engine_room[name]
    x = np.ones(8192, F32)
    calls: list[str] = []

    def spy(*args: Any) -> Any:
        calls.append("engine")
        return NotImplemented

    kernels.register("cast", spy)
    try:
        kernels.cast(x, F16)
        with kernels.reference_only():
            kernels.cast(x, F16)
    finally:
        kernels.unregister("cast", spy)
    assert calls == ["engine"]
    with pytest.raises(ValueError, match="no kernel is called 'gemm'"):
        kernels.register("gemm", spy)


def every_kind_of_float32(n: int) -> np.ndarray:
    """float32 values of every class for a float16 cast: all float16 values widened, random bit
    patterns (NaN payloads, float32 subnormals, huge values), ties, and the thresholds."""
    rng = np.random.default_rng(0)
    halves = np.arange(65536, dtype=np.uint16).view(F16).astype(F32)
    edges = np.array(
        [65504, 65519.996, 65520, 65536, 1e6, 3.4e38, np.inf, -np.inf, np.nan, 2**-25, 2**-24, 2**-26, 1 + 2**-11],
        F32,
    )
    ties = (np.arange(1024, dtype=F32) + 0.5) * np.float32(2**-24)  # exact halfway between subnormals
    random_bits = rng.integers(0, 2**32, n, dtype=np.uint32).view(F32)
    out = np.concatenate([halves, edges, -edges, ties, random_bits])[:n]
    return rng.permutation(out)


@pytest.mark.parametrize("size", [100_000, 100, 1])
def test_cast_to_float16_and_back(size: int) -> None:
    x = every_kind_of_float32(size)
    engine, reference = both_ways("cast", x, F16)
    with np.errstate(over="ignore"):
        h = x.astype(F16)
    assert same_bits(engine, reference) and same_bits(reference, h)
    engine, reference = both_ways("cast", h, F32)
    assert same_bits(engine, reference) and same_bits(reference, h.astype(F32))


def test_cast_into_an_existing_array() -> None:
    x = every_kind_of_float32(100_000)
    out = np.empty(x.shape, F16)
    with np.errstate(over="ignore", invalid="ignore"):
        result = kernels.cast(x, F16, out=out)
        with kernels.reference_only():
            reference = kernels.cast(x, F16, out=np.empty(x.shape, F16))
        expected = x.astype(F16)
    assert result is out and same_bits(out, reference) and same_bits(out, expected)


def test_cast_to_the_same_dtype_returns_the_array_itself() -> None:
    x = np.ones(3, F32)
    assert kernels.cast(x, F32) is x
    with kernels.reference_only():
        assert kernels.cast(x, F32) is x


@pytest.mark.parametrize("shapes", [((64, 128), (64, 128)), ((64, 128), (128,)), ((3,), (3,))])
def test_add(shapes: tuple) -> None:
    rng = np.random.default_rng(4)
    a, b = ((rng.standard_normal(s) * rng.choice([1e-7, 1e-4, 1.0, 3e2, 1e4], size=s)).astype(F16) for s in shapes)
    a.reshape(-1)[::11] = np.inf
    b.reshape(-1)[3::89] = np.nan
    engine, reference = both_ways("add", a, b)
    assert same_bits(engine, reference)


def all_patterns(dtype: np.dtype) -> np.ndarray:
    return np.arange(65536, dtype=np.uint16).view(dtype)


@pytest.mark.parametrize("dtype", SIXTEEN_BIT, ids=str)
def test_relu_and_its_backward_on_every_16bit_pattern(dtype: np.dtype) -> None:
    x = all_patterns(dtype)
    engine, reference = both_ways("relu", x)
    assert same_bits(engine, reference)
    assert bits(engine)[0x8000] == 0  # -0.0 becomes +0.0
    nan = np.isnan(x.astype(F32))
    assert same_bits(engine[nan], x[nan])  # every NaN, with its sign and payload
    rng = np.random.default_rng(0)
    for g in (rng.permutation(x), x[::-1].copy()):  # every pattern as g too, NaNs and infs included
        engine, reference = both_ways("relu_backward", g, x)
        assert same_bits(engine, reference)


@pytest.mark.parametrize("dtype", [F32, F64])
@given(data=st.data())
def test_relu_and_its_backward_on_wide_floats(dtype: np.dtype, data: st.DataObject) -> None:
    x = data.draw(bit_pattern_arrays(dtype, (64,)))
    g = data.draw(bit_pattern_arrays(dtype, (64,)))
    assert same_bits(*both_ways("relu", x))
    assert same_bits(*both_ways("relu_backward", g, x))


def test_the_16bit_relu_is_numpys_maximum_except_negative_zero() -> None:
    """NumPy's float16 maximum(-0.0, 0) keeps -0.0; ReLU gives +0.0, as NumPy's float32 maximum does."""
    x = all_patterns(F16)
    with np.errstate(invalid="ignore"):
        expected = np.maximum(x, np.zeros_like(x))
    differ = np.flatnonzero(bits(bits16.relu(x)) != bits(expected))
    assert differ.tolist() == [0x8000]
