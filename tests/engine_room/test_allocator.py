"""keep_freed_memory: glibc keeps freed heap memory mapped, so a repeated step stops page-faulting."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from tinyamp.engine.fast.allocator import keep_freed_memory

pytestmark = pytest.mark.engine_room

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Allocate 200 arrays of 100 KB (below glibc's mmap threshold: they live on the heap) and free
# them, six times; count the page faults of the last five rounds.
CHURN = """
import resource, sys
import numpy as np
from tinyamp.engine.fast.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory(64)
def churn():
    arrays = [np.ones(100_000 // 8) for _ in range(200)]
    del arrays
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not GLIBC, reason="mallopt(M_TOP_PAD) is glibc's")
def test_kept_memory_removes_the_page_faults_of_a_repeated_step() -> None:
    trimmed = page_faults("default")
    if trimmed < 1000:
        pytest.skip(f"this glibc did not trim the heap between rounds ({trimmed} page faults)")
    assert page_faults("keep") < trimmed / 100


def test_keep_freed_memory_checks_its_argument() -> None:
    for bad in (-1, 5000, 1.5, True, "64"):
        with pytest.raises(ValueError, match="megabytes must be an int from 0 to 4096"):
            keep_freed_memory(bad)  # type: ignore[arg-type]
    assert keep_freed_memory(64) is GLIBC
