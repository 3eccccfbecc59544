"""`tinyamp exercises init` on a full disk, for real: a file-size limit (RLIMIT_FSIZE) in the child makes
every write past it fail as a full disk does, part way through a stub."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tinyamp.exercises.catalog import PACKAGE

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE as a full disk: Linux")
def test_init_on_a_full_disk_leaves_no_truncated_stub_and_says_so_in_one_sentence(tmp_path: Path) -> None:
    import resource

    def full_disk_after_3000_bytes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the child
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    folder = tmp_path / "ws"
    done = subprocess.run([sys.executable, "-m", "tinyamp", "exercises", "init", str(folder)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60, preexec_fn=full_disk_after_3000_bytes)  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (f"tinyamp: error: cannot write the workspace into {folder} (File too large); nothing was "
                           "left there\n")  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # before: myamp/formats.py cut at 3000 bytes, and both folders
    again = subprocess.run([sys.executable, "-m", "tinyamp", "exercises", "init", str(folder)], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=60)  # fmt: skip
    assert again.returncode == 0 and (folder / PACKAGE / "formats.py").stat().st_size > 3000, again.stderr
    assert not [p for p in folder.rglob(".*") if p.is_file()]  # no temporary file left beside the stubs
