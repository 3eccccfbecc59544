"""Choosing what runs the float16 <-> float32 casts: compiled loops (numba) or NumPy passes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tinyamp.engine.fast import casts

pytestmark = pytest.mark.engine_room


def test_set_kernels_checks_the_name_and_returns_the_previous_choice() -> None:
    with pytest.raises(ValueError, match="choose one of numba, numpy"):
        casts.set_kernels("fortran")
    before = casts.active_kernels()
    with casts.kernels("numpy"):
        assert casts.active_kernels() == "numpy" and casts.why_not_compiled()
        assert casts.set_kernels("numpy") == "numpy"
    assert casts.active_kernels() == before


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "TINYAMP_CAST_KERNELS"} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120)


def test_import_tinyamp_does_not_import_numba() -> None:
    """numba is imported at the first large cast, not by `import tinyamp` (importing it takes time)."""
    done = run_python("import sys, tinyamp; print('numba' in sys.modules)")
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_environment_variable_chooses_and_is_checked() -> None:
    show = "from tinyamp.engine.fast import casts; print(casts.active_kernels())"
    assert run_python(show, TINYAMP_CAST_KERNELS="numpy").stdout.strip() == "numpy"
    bad = run_python(show, TINYAMP_CAST_KERNELS="fast")
    assert bad.returncode != 0 and "TINYAMP_CAST_KERNELS='fast': use one of numba, numpy" in bad.stderr


def test_without_numba_the_numpy_passes_run_and_say_why() -> None:
    """A Python where `import numba` fails (sys.modules entry None) falls back, and asking for numba says why."""
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "from tinyamp.engine.fast import casts\n"
        "print(casts.active_kernels()); print(casts.why_not_compiled())\n"
        "with casts.kernels('numpy'):\n    pass\n"
        "assert 'tinyamp[fast]' in casts.why_not_compiled()  # the reason survives a kernels() block\n"
        "try:\n    casts.set_kernels('numba')\nexcept ImportError as e:\n    print('refused:', e)\n"
    )
    done = run_python(code)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[0] == "numpy", done.stderr
    assert "tinyamp[fast]" in lines[1] and lines[2].startswith("refused: numba cannot be imported")
    forced = run_python(code.replace("print(casts.active_kernels())", "pass"), TINYAMP_CAST_KERNELS="numba")
    assert forced.returncode != 0 and "TINYAMP_CAST_KERNELS=numba, but numba cannot be imported" in forced.stderr
