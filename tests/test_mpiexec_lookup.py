"""Finding mpiexec where a student's Python runs: beside the interpreter, where mpi4py's MPI lives, then PATH.

A venv's Python run by its full path (a Jupyter kernel, an IDE) does not have the venv's ``bin/``
on PATH; ``tinyamp.distributed.launch.find_mpiexec`` must find the ``mpiexec`` that goes with
its mpi4py anyway, and say where it looked when there is none.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")
from tinyamp.distributed import launch  # noqa: E402

pytestmark = pytest.mark.docs
ROOT = Path(__file__).resolve().parents[1]


def fake_mpiexec(folder: Path, says: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / launch.MPIEXEC
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(0o755)
    return path


def venv_over_this_python(folder: Path) -> Path:
    """A real venv at ``folder`` that imports this test's packages (numpy, mpi4py); its ``bin/python``.

    Its python is a link to the base interpreter, as in any venv.  A bare link to sys.executable
    would not do: without a pyvenv.cfg beside it, Python resolves the link and starts with the
    base interpreter's site-packages, so when these tests run in a venv the child lacks the
    venv's packages.  ``--system-site-packages`` would not do either: from inside a venv it gives
    the base interpreter's site-packages, not this venv's.  So a .pth adds this interpreter's site
    folders (with their own .pth files: editable installs) to the new venv.  Its mpi4py imports but
    cannot start MPI: it looks for libmpi in its own environment's lib/, and mpich put it in ours.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    ours = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    ours = [d for d in ours if os.path.isdir(d)]
    # A .pth line that starts with "import" is executed at startup (by exec in a function of site, so no
    # comprehension: it would not see the names imported); folders already on sys.path are skipped, so
    # that their .pth files do not run twice.
    lines = "".join(f"import site, sys; {d!r} in sys.path or site.addsitedir({d!r})\n" for d in ours)
    (Path(purelib) / "outer_environment.pth").write_text(lines)
    return python


def a_venv_python_with_this_mpi(tmp_path: Path) -> Path:
    """A venv's python that can start this Python's MPI: this one if it is a venv's, else a venv over it.

    mpi4py's wheel loads libmpi from the lib/ of the environment it runs in (the venv, the user
    base, and with --system-site-packages the base interpreter's), where mpich's wheel put it; a
    venv over this one (``venv_over_this_python``) would import mpi4py but find no libmpi.
    """
    if sys.prefix != sys.base_prefix:
        return Path(sys.executable)  # as invoked: bin/python of the venv these tests run in
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    return venv / "bin" / "python"


def without_path_env() -> dict[str, str]:
    """The environment of a kernel started by a venv's python: no venv (nor any Python) bin/ on PATH."""
    return dict(os.environ, PATH="/usr/bin:/bin", PYTHONPATH=str(ROOT))


def test_the_mpiexec_beside_the_python_wins_over_the_one_on_path(tmp_path: Path) -> None:
    python = venv_over_this_python(tmp_path / "venv")  # its bin/python: a link, which find_mpiexec must not resolve
    mine = fake_mpiexec(python.parent, "mine")
    fake_mpiexec(tmp_path / "elsewhere", "other")
    env = dict(without_path_env(), PATH=f"{tmp_path / 'elsewhere'}:/usr/bin:/bin")
    code = "from tinyamp.distributed.launch import find_mpiexec; print(find_mpiexec())"
    done = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(mine)


def test_a_missing_mpiexec_names_every_place_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setattr(launch.sysconfig, "get_path", lambda name: str(tmp_path / "venv" / "scripts"))
    monkeypatch.setattr(launch, "beside_mpi4py_library", lambda: [tmp_path / "mpi" / "bin"])
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError) as caught:
        launch.find_mpiexec()
    message = str(caught.value)
    for place in ("venv/bin", "venv/scripts", "mpi/bin", "empty"):
        assert str(tmp_path / place) in message, message
    assert "pip install mpi4py mpich" in message


def test_the_library_folder_is_searched_before_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setattr(launch.sysconfig, "get_path", lambda name: str(tmp_path / "venv" / "bin"))
    mpi = fake_mpiexec(tmp_path / "mpi" / "bin", "mpi")
    monkeypatch.setattr(launch, "beside_mpi4py_library", lambda: [tmp_path / "mpi" / "bin"])
    monkeypatch.setenv("PATH", str(fake_mpiexec(tmp_path / "on_path", "path").parent))
    assert launch.find_mpiexec() == str(mpi)


def test_a_venv_python_without_its_bin_on_path_launches_two_ranks(tmp_path: Path) -> None:
    """The real case: a venv's python (with mpi4py and mpich, or over a Python that has them), run by its full path."""
    try:
        expected = launch.find_mpiexec()
    except FileNotFoundError:
        pytest.skip("no mpiexec for this Python (pip install mpich)")
    python = a_venv_python_with_this_mpi(tmp_path)
    rank = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(f'rank{c.rank}of{c.size}')"
    code = (
        "import subprocess, sys\n"
        "from tinyamp.distributed.launch import find_mpiexec\n"
        f"cmd = [find_mpiexec(), '-n', '2', sys.executable, '-c', {rank!r}]\n"
        "print(cmd[0]); print(subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout)\n"
    )
    env = without_path_env()
    done = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    found, ranks = done.stdout.split("\n", 1)
    assert Path(found).resolve() == Path(expected).resolve()  # the MPI this mpi4py was installed with
    assert "rank0of2" in ranks and "rank1of2" in ranks, ranks
