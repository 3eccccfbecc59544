"""`tinyamp train --resume` of an FP8 run whose checkpoint lost one tensor's FP8 state, for real in a subprocess.

A tensor missing from ``extra["fp8"]`` used to resume silently: its next cast started again from
scale 1 and an empty amax history, and the run went on on other bits.  The file is rewritten here
as an editor would leave it (the tensor's entry and its arrays gone, everything else untouched).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.fp8

ROOT = Path(__file__).resolve().parents[1]
METADATA = "tinyamp_checkpoint.npy"


def tinyamp(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "tinyamp", *argv], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)  # fmt: skip


def rewritten(source: Path, target: Path, edit: Callable[[dict[str, Any]], None], drop: str = "\x00") -> None:
    """A copy of the checkpoint `source` at `target`: its metadata document changed by `edit`, and its arrays whose
    names start with `drop` left out."""
    with zipfile.ZipFile(source) as z, zipfile.ZipFile(target, "w") as out:
        for name in z.namelist():
            data = z.read(name)
            if name == METADATA:
                document = json.loads(np.load(io.BytesIO(data)).tobytes())
                edit(document)
                buffer = io.BytesIO()
                np.save(buffer, np.frombuffer(json.dumps(document).encode("utf-8"), dtype=np.uint8))
                data = buffer.getvalue()
            if not name.startswith(drop):
                out.writestr(name, data)


def without_tensor(source: Path, target: Path, tensor: str) -> None:
    """A copy of the checkpoint `source` at `target` whose FP8 state has no entry for `tensor`."""
    prefix = f"extra/fp8/tensors/{tensor}/"
    with zipfile.ZipFile(source) as z:
        assert any(n.startswith(prefix) for n in z.namelist()), z.namelist()
    rewritten(source, target, lambda document: document["extra"]["fp8"]["tensors"].pop(tensor), prefix)


@pytest.mark.parametrize(("recipe", "tensor"), [("fp8", "2.weight"), ("mxfp8", "0.input.T")])
def test_a_checkpoint_missing_one_tensors_fp8_state_is_refused_naming_it(
    tmp_path: Path, recipe: str, tensor: str
) -> None:
    run = tmp_path / "run"
    done = tinyamp("train", "--precision", recipe, "--steps", "4", "--quiet", "--out", str(run))
    assert done.returncode == 0, done.stderr
    cut = tmp_path / "cut.npz"
    without_tensor(run / "checkpoint.npz", cut, tensor)
    refused = tinyamp("train", "--resume", str(cut), "--steps", "6", "--extend", "--quiet")
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stdout[-2000:] + refused.stderr[-2000:]
    assert refused.stderr == (
        f"tinyamp: error: --resume {cut}: the checkpoint's FP8 state has no tensor {tensor!r} (its scale, amax "
        "history and casts), which every step of this model casts; the file was edited or damaged\n"
    )
    whole = tinyamp("train", "--resume", str(run / "checkpoint.npz"), "--steps", "6", "--extend", "--quiet")
    assert whole.returncode == 0, whole.stderr[-2000:]  # the file it was cut from resumes


def test_an_mxfp8_checkpoint_whose_block_scales_were_rounded_otherwise_is_refused(tmp_path: Path) -> None:
    """The recipe's block scales round up; a checkpoint that says floor (OCP's rule, which this recipe used until
    2026-12-07) would go on with other scales than it started with."""
    run, floor = tmp_path / "run", tmp_path / "floor.npz"
    assert tinyamp("train", "--precision", "mxfp8", "--steps", "4", "--quiet", "--out", str(run)).returncode == 0
    rewritten(run / "checkpoint.npz", floor, lambda document: document["extra"]["fp8"].update(rounding="floor"))
    refused = tinyamp("train", "--resume", str(floor), "--steps", "6", "--extend", "--quiet")
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stdout[-2000:] + refused.stderr[-2000:]
    assert refused.stderr == (
        f"tinyamp: error: --resume {floor}: the checkpoint's MXFP8 block scales were rounded 'floor', this recipe "
        "rounds them 'up': resume it with the tinyamp version that made it\n"
    )
