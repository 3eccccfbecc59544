"""Shared pytest setup: hypothesis profiles, the `device` fixture, and `channel` (for student code's pids).

Profiles: "ci" (default; 25 examples per property, no deadline, because a finite-
difference check takes milliseconds that vary with the machine), "dev" (100) and
"thorough" (1000).  Pick one with HYPOTHESIS_PROFILE=dev python -m pytest.

Under a CI service (hypothesis recognizes one by its environment variables: CI,
GITHUB_ACTIONS, ...) hypothesis loads its own "ci" profile when it is imported, and these
profiles inherit from it derandomize=True and no example database: there every run draws
the same examples.  A test whose claim needs fresh random draws must ask for them itself.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# `python -m pytest` finds tinyamp through the working directory; plain `pytest` in an
# environment without `pip install -e .` finds it through this line.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared strategies module, for tests in subfolders

import tinyamp  # noqa: E402

# No profile fails a test for being slow to generate (HealthCheck.too_slow): that check
# measures the machine's load, not the property, and a shared CI machine is loaded.
QUIET = [HealthCheck.too_slow]
settings.register_profile("ci", deadline=None, max_examples=25, print_blob=True, suppress_health_check=QUIET)
settings.register_profile("dev", deadline=None, max_examples=100, suppress_health_check=QUIET)
settings.register_profile("thorough", deadline=None, max_examples=1000, suppress_health_check=QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=["cpu", "cuda"], scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """Each test that takes `device` runs on the CPU, and on the GPU when CuPy sees one."""
    if request.param == "cuda" and not tinyamp.cuda_is_available():
        pytest.skip("device='cuda' needs CuPy and a CUDA GPU; neither is usable here")
    return request.param


@pytest.fixture(autouse=True)
def deferred_checks_end_with_their_test() -> Any:
    """A range check a GPU deferred (tinyamp.backend.defer_check) and no read answered belongs to its test:
    left pending, it would raise at the next test's first read."""
    yield
    tinyamp.backend.take_pending_checks()


@pytest.fixture
def channel() -> Iterator[Any]:
    """A FIFO student code can write into whoever it runs as (exercise_helpers.Channel), removed afterwards."""
    from exercise_helpers import Channel

    made = Channel()
    yield made
    os.close(made.reading)
    shutil.rmtree(made.folder, ignore_errors=True)
