"""Finding ``mpiexec`` from Python, where a student's Python runs: a venv, a Jupyter kernel, a conda env.

``pip install mpich`` (the ``[mpi]`` extra) puts ``mpiexec`` in the environment's ``bin/``,
beside its ``python``.  A script run as ``venv/bin/python script.py``, or a Jupyter kernel of
that venv, runs without ``venv/bin`` on PATH, so ``shutil.which("mpiexec")`` misses it (or
finds another MPI's, whose processes cannot talk to this mpi4py's).  So ``find_mpiexec``
looks, in this order:

1. beside ``sys.executable`` (not resolved: a venv's ``python`` is a link to the base
   interpreter, and the venv's ``bin/`` is what we want), then in the environment's scripts
   folder (``sysconfig``), where pip installs MPICH's ``mpiexec``;
2. where the MPI library that mpi4py loads lives: the ``bin/`` beside the ``lib/`` that
   holds it (a system or conda MPI that mpi4py was built against), and the folder of the
   ``mpicc`` that mpi4py's build recorded (``mpi4py.get_config()``);
3. on PATH.

When none has it, the error names every place it looked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

MPIEXEC = "mpiexec.exe" if os.name == "nt" else "mpiexec"

# Run in a child Python: importing mpi4py.MPI in this process would start MPI here (a singleton
# rank), which the process launching the job must not be.  rc.initialize=False loads the library only.
_WHERE_IS_LIBMPI = """
import mpi4py
mpi4py.rc.initialize = mpi4py.rc.finalize = False
from mpi4py import MPI
with open("/proc/self/maps") as maps:
    print(next((line.split()[-1] for line in maps if "libmpi" in line.rsplit("/", 1)[-1]), ""))
"""


def _executable(folder: Path) -> Path | None:
    path = folder / MPIEXEC
    return path if path.is_file() and os.access(path, os.X_OK) else None


def beside_python() -> list[Path]:
    """The folders of this interpreter's environment: beside sys.executable, then its scripts folder."""
    folders = [Path(sys.executable).parent]
    scripts = sysconfig.get_path("scripts")
    if scripts and Path(scripts) not in folders:
        folders.append(Path(scripts))
    return folders


def beside_mpi4py_library() -> list[Path]:
    """The bin/ folders where mpi4py's MPI says it lives: its build's mpicc, and the library it loads."""
    folders: list[Path] = []
    try:
        import mpi4py
    except ImportError:
        return folders
    for value in mpi4py.get_config().values():  # source builds record e.g. {"mpicc": "/opt/mpich/bin/mpicc"}
        if os.path.isabs(value):
            folders.append(Path(value).parent)
    if sys.platform.startswith("linux"):  # the library's file name, read where the loader mapped it
        try:
            done = subprocess.run([sys.executable, "-c", _WHERE_IS_LIBMPI], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        library = done.stdout.strip() if done is not None and done.returncode == 0 else ""
        if library:
            lib = Path(library).parent  # <prefix>/lib, or <prefix>/lib/<multiarch> (Debian): bin/ is in <prefix>
            folders.append((lib.parent if lib.name.startswith("lib") else lib.parent.parent) / "bin")
    return list(dict.fromkeys(folders))


def find_mpiexec() -> str:
    """The path of the ``mpiexec`` this Python's mpi4py goes with; FileNotFoundError naming where it looked."""
    looked: list[str] = []
    for folders in (beside_python, beside_mpi4py_library):
        for folder in folders():
            found = _executable(folder)
            if found is not None:
                return str(found)
            looked.append(str(folder))
    on_path = shutil.which(MPIEXEC)
    if on_path is not None:
        return on_path
    looked.append(f"PATH ({os.environ.get('PATH', '')})")
    raise FileNotFoundError(
        f"no {MPIEXEC} found; looked in: {'; '.join(looked)}. Install MPI into this Python's environment: "
        f'{sys.executable} -m pip install mpi4py mpich (or pip install -e ".[mpi]")'
    )
