"""Random numbers for initialization and dropout, from one seedable generator per device.

``tinyamp.manual_seed(0)`` makes a run repeatable.  Parameters are initialized on the
CPU generator (and then moved), so a model starts from the same weights on either
device.  ``get_state``/``set_state`` snapshot the generators; activation checkpointing
uses them to replay the same dropout masks when it recomputes a segment.

On the CPU the generator is NumPy's.  On the GPU it is a ``CounterGenerator``: CuPy's
generators keep their state in device memory with no way to copy it, so a snapshot
would be impossible there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyamp import backend

_generators: dict[str, Any] = {}
_seed = 0

# SplitMix64 (Steele, Lea and Flood 2014): a Weyl step, then a finalizer of xor-shifts and
# multiplies in which every input bit affects every output bit.
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


class CounterGenerator:
    """Uniform random numbers in [0, 1) whose whole state is one integer, the position.

    The number at position n of the stream is a fixed function of (key, n), the SplitMix64
    finalizer, as PyTorch's CUDA generator is a function of (seed, offset) (Philox).  A draw
    of k numbers takes positions offset .. offset + k - 1 and advances the offset by k, so
    saving the offset saves the generator, and any draw can be replayed.  Each number has
    24 random bits: every float32 multiple of 2^-24 in [0, 1) is equally likely.
    """

    def __init__(self, seed: int, xp: Any = np) -> None:
        self.xp = xp
        self.key = int(np.random.SeedSequence(int(seed)).generate_state(1, np.uint64)[0])
        self.offset = 0

    def random(self, shape: Any, dtype: Any = "float32") -> Any:
        """An array of `shape` of uniform float32 numbers in [0, 1)."""
        if np.dtype(dtype) != np.float32:
            raise TypeError(f"CounterGenerator draws float32 numbers; got dtype={dtype}")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = math.prod(shape)
        u = uniform(self.xp, self.key, self.offset, n)
        self.offset += n
        return u.reshape(shape)

    @property
    def state(self) -> dict[str, int]:
        """The position in the stream (and the key, to check a restore is for this seed)."""
        return {"key": self.key, "offset": self.offset}

    @state.setter
    def state(self, value: dict[str, int]) -> None:
        if int(value["key"]) != self.key:
            raise ValueError("this random state was saved under another seed; call manual_seed first")
        self.offset = int(value["offset"])


def uniform(xp: Any, key: int, offset: int, n: int) -> Any:
    """Positions offset .. offset + n - 1 of the stream, as `xp` (NumPy or CuPy) float32 values.

    uint64 arithmetic wraps modulo 2^64 in both libraries, and the top 24 bits of each
    number become a float32 exactly, so both give the same numbers.
    """
    z = xp.arange(offset, offset + n, dtype=np.uint64) * np.uint64(_GOLDEN) + np.uint64(key)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)  # 24 bits: exact in float32


def manual_seed(seed: int) -> None:
    """Reseed every device's generator; `seed` is a whole number in [0, 2^64)."""
    global _seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ValueError(f"manual_seed takes a whole number from 0 to 2^64 - 1, like manual_seed(0); got {seed!r}")
    _seed = int(seed)
    _generators.clear()


def generator(device: str = "cpu") -> Any:
    """The generator for `device`: a numpy.random.Generator, or a CounterGenerator on the GPU."""
    if device not in _generators:
        xp = backend.array_module(device)
        _generators[device] = np.random.default_rng(_seed) if xp is np else CounterGenerator(_seed, xp)
    return _generators[device]


def get_state() -> dict[str, Any]:
    """A snapshot of every generator created so far (to restore with set_state)."""
    return {"seed": _seed, "generators": {d: _state_of(g) for d, g in _generators.items()}}


def set_state(state: dict[str, Any]) -> None:
    """Restore the generators to a snapshot taken by get_state."""
    manual_seed(state["seed"])
    for device, saved in state["generators"].items():
        g = generator(device)
        if isinstance(g, CounterGenerator):
            g.state = saved
        else:
            g.bit_generator.state = saved


def _state_of(g: Any) -> dict[str, Any]:
    return g.state if isinstance(g, CounterGenerator) else g.bit_generator.state
