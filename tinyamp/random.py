"""Random numbers for initialization and dropout, from one seedable generator per device.

``tinyamp.manual_seed(0)`` makes a run repeatable.  Parameters are initialized on the
CPU generator (and then moved), so a model starts from the same weights on either
device.  ``get_state``/``set_state`` snapshot the generators; activation checkpointing
uses them to replay the same dropout masks when it recomputes a segment.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp import backend

_generators: dict[str, Any] = {}
_seed = 0


def manual_seed(seed: int) -> None:
    """Reseed every device's generator."""
    global _seed
    _seed = int(seed)
    _generators.clear()


def generator(device: str = "cpu") -> Any:
    """The generator for `device`: a numpy.random.Generator or a cupy.random.Generator."""
    if device not in _generators:
        xp = backend.array_module(device)
        if xp is np:
            _generators[device] = np.random.default_rng(_seed)
        else:
            _generators[device] = xp.random.default_rng(_seed)
    return _generators[device]


def get_state() -> dict[str, Any]:
    """A snapshot of every generator created so far (to restore with set_state)."""
    return {"seed": _seed, "generators": {d: g.bit_generator.state for d, g in _generators.items()}}


def set_state(state: dict[str, Any]) -> None:
    """Restore the generators to a snapshot taken by get_state."""
    manual_seed(state["seed"])
    for device, bit_state in state["generators"].items():
        generator(device).bit_generator.state = bit_state
