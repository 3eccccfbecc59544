"""Names that moved keep working for one release, with a DeprecationWarning that names the new place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinyamp as ta

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", ["fast", "cuda"])
def test_the_engine_rooms_old_names_warn_and_are_the_same_modules(old: str) -> None:
    """In a fresh interpreter (an import warns once): tinyamp.<old>.x is tinyamp.engine.<old>.x, not a copy."""
    sub = {"fast": "allocator", "cuda": "gemm"}[old]
    code = (
        "import warnings, importlib\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module('tinyamp.{old}.{sub}')\n"
        f"new = importlib.import_module('tinyamp.engine.{old}.{sub}')\n"
        "print(old is new)\n"
        "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    same, messages = out.splitlines()
    assert same == "True"
    assert f"tinyamp.{old} is now tinyamp.engine.{old}" in messages


@pytest.mark.parametrize(("name", "value"), [("zeros_", 0.0), ("ones_", 1.0)])
def test_init_zeros_and_ones_warn_and_still_fill(name: str, value: float) -> None:
    t = ta.tensor(np.full(3, 7.0, np.float32))
    with pytest.warns(DeprecationWarning, match=rf"{name}\(t\) goes in the next release; use constant_\(t, {value}\)"):
        getattr(ta.nn.init, name)(t)
    assert t.data.tolist() == [value] * 3
    with pytest.raises(AttributeError, match="has no attribute 'twos_'"):
        ta.nn.init.twos_  # noqa: B018
