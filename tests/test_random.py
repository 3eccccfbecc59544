"""The GPU's random generator: a counter-based stream whose state is one integer.

CuPy's own generators cannot be snapshotted, and activation checkpointing must replay
dropout masks exactly, so on the GPU tinyamp draws from ``CounterGenerator``.  Its laws
are checked here on the CPU; the same arithmetic in CuPy's uint64 operations is checked
against NumPy's bit for bit where a GPU is present.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from strategies import draw_sizes

import tinyamp as ta
from tinyamp import random as ta_random
from tinyamp.random import CounterGenerator

pytestmark = pytest.mark.nn


@given(sizes=draw_sizes())
def test_the_stream_is_the_same_however_it_is_cut_into_draws(sizes: list[int]) -> None:
    g, whole = CounterGenerator(7), CounterGenerator(7)
    pieces = [g.random(n) for n in sizes]
    assert np.array_equal(np.concatenate(pieces), whole.random(sum(sizes)))
    assert g.state == whole.state


def test_restoring_the_state_replays_the_next_draw() -> None:
    g = CounterGenerator(3)
    g.random((4, 5))
    saved = g.state
    first = g.random((2, 3))
    g.state = saved
    assert np.array_equal(g.random((2, 3)), first)
    assert not np.array_equal(g.random((2, 3)), first)  # and then moves on


def test_a_state_from_another_seed_is_refused() -> None:
    with pytest.raises(ValueError, match="another seed"):
        CounterGenerator(1).state = CounterGenerator(2).state


def test_numbers_are_uniform_float32_in_the_unit_interval() -> None:
    u = CounterGenerator(0).random(1_000_000)
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    assert np.all(u * 2**24 == np.floor(u * 2**24))  # multiples of 2^-24: 24 random bits each
    assert abs(u.mean() - 0.5) < 0.002  # the standard error is 0.00029
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    chi2 = ((counts - 50_000) ** 2 / 50_000).sum()
    assert chi2 < 50  # 19 degrees of freedom: above 50 has probability ~1e-4
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.005  # neighbours are uncorrelated
    assert not np.array_equal(CounterGenerator(1).random(100), CounterGenerator(2).random(100))


def test_only_float32_is_drawn() -> None:
    with pytest.raises(TypeError, match="float32"):
        CounterGenerator(0).random(3, dtype="float64")


@pytest.mark.skipif(not ta.cuda_is_available(), reason="needs CuPy and a GPU")
def test_cuda_draws_the_numpy_streams_bits() -> None:
    import cupy

    gpu, cpu = CounterGenerator(11, cupy), CounterGenerator(11)
    for n in (1, 1000, 3, 65_537):
        assert np.array_equal(cupy.asnumpy(gpu.random(n)), cpu.random(n))
    ta.manual_seed(5)
    assert isinstance(ta_random.generator("cuda"), CounterGenerator)
    snapshot = ta_random.get_state()
    a = ta_random.generator("cuda").random((8, 8))
    ta_random.set_state(snapshot)
    assert cupy.array_equal(ta_random.generator("cuda").random((8, 8)), a)
