"""A grading command run as root: the student's process becomes ``nobody`` where that user can read the
installation, else stays user 0 without any capability, and the command says which.  The pieces are tried for
real in forked children (as root only); the whole command in a subprocess, on the path this machine allows."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from test_exercises_containment import check, first_statement, row, solutions  # noqa: F401  (a fixture)

from tinyamp.exercises import unprivileged

pytestmark = [
    pytest.mark.cli,
    pytest.mark.skipif(not sys.platform.startswith("linux") or not unprivileged.is_root(),
                       reason="giving root up: for a grading command run as root, on Linux"),
]  # fmt: skip

NOBODY = unprivileged.nobody()


def in_a_child(probe: str, give_up: Callable[[], None] = lambda: unprivileged.become(NOBODY)
                         ) -> tuple[int, str]:  # fmt: skip
    """Fork; the child gives root up (`give_up`: becomes nobody) and runs `probe` (Python source that may set
    `said`); return its exit status and what it said."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            give_up()
            scope: dict[str, object] = {}
            exec(probe, scope)
            os.write(write, str(scope.get("said", "")).encode())
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001  (the test reads what happened)
            os.write(write, f"{type(exc).__name__}: {exc}".encode())
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), said


def test_a_child_that_gave_root_up_cannot_take_it_back_nor_raise_a_limit() -> None:
    code, said = in_a_child("import os\nos.setuid(0)")
    assert code == 1 and said.startswith("PermissionError"), said
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    code, said = in_a_child(
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 32, 1 << 32))\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 32, 1 << 33))"
    )  # lowering the hard limit is allowed; raising it back is not
    assert code == 1 and said.startswith("ValueError"), said
    code, said = in_a_child("import os\nsaid = (os.getuid(), os.geteuid(), os.getgid(), os.getgroups())")
    assert code == 0 and said == str((NOBODY.uid, NOBODY.uid, NOBODY.gid, [])), said


def test_the_probe_names_the_first_folder_nobody_cannot_read() -> None:
    top = Path(tempfile.mkdtemp())  # not under pytest's tmp_path: its base folder is root's alone (0700)
    try:
        os.chmod(top, 0o755)
        open_folder, closed = top / "open", top / "closed"
        open_folder.mkdir(mode=0o755)
        closed.mkdir(mode=0o700)
        assert unprivileged.unreadable([str(open_folder)], NOBODY) == ""
        assert unprivileged.unreadable([str(open_folder), str(closed)], NOBODY) == str(closed)
    finally:
        shutil.rmtree(top)


def test_the_copy_is_handed_over_and_the_folder_around_it_cannot_be_listed(tmp_path: Path) -> None:
    folder, copy = tmp_path / "grading", tmp_path / "grading" / "copy"
    (copy / "pkg").mkdir(parents=True)
    (copy / "pkg" / "a.py").write_text("x = 1\n")
    (folder / "grader-private").mkdir(mode=0o700)
    unprivileged.hand_over(folder, copy, NOBODY)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o711 and folder.stat().st_uid == 0
    assert (folder / "grader-private").stat().st_uid == 0
    for path in (copy, copy / "pkg", copy / "pkg" / "a.py"):
        assert (path.stat().st_uid, path.stat().st_gid) == (NOBODY.uid, NOBODY.gid), path


def test_without_capabilities_user_0_cannot_raise_a_limit_nor_regain_them_by_exec() -> None:
    drop = unprivileged.drop_capabilities
    code, said = in_a_child("said = open('/proc/self/status').read()", drop)
    assert code == 0 and "\nCapEff:\t0000000000000000\n" in said and "\nCapBnd:\t0000000000000000\n" in said, said
    code, said = in_a_child(
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 32, 1 << 32))\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 32, 1 << 33))", drop
    )
    assert code == 1 and said.startswith("ValueError"), said
    code, said = in_a_child("import os\nos.setuid(12345)", drop)  # no CAP_SETUID: not even to another user
    assert code == 1 and said.startswith("PermissionError"), said
    code, said = in_a_child(  # a new program, run as user 0: the secure bits grant it nothing
        "import subprocess\nsaid = subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout",
        drop,
    )
    assert code == 0 and "\nCapEff:\t0000000000000000\n" in said and "\nCapPrm:\t0000000000000000\n" in said, said


def test_in_its_own_mount_namespace_every_file_but_one_folder_is_read_only(tmp_path: Path) -> None:
    mine, elsewhere = tmp_path / "copy", tmp_path / "elsewhere.txt"
    mine.mkdir()
    elsewhere.write_text("kept")
    mounts = Path("/proc/self/mountinfo").read_text()
    code, said = in_a_child(f"""import pathlib
pathlib.Path({str(mine / "new.txt")!r}).write_text("written")
try:
    pathlib.Path({str(elsewhere)!r}).write_text("changed")
except OSError as exc:
    said = exc.errno""", lambda: (unprivileged.read_only_except(str(mine)), unprivileged.drop_capabilities()))
    assert code == 0 and said == str(errno.EROFS), said
    assert (mine / "new.txt").read_text() == "written" and elsewhere.read_text() == "kept"
    assert Path("/proc/self/mountinfo").read_text() == mounts  # the remounts stayed in the child's namespace
    (elsewhere).write_text("still writable here")


def test_the_grading_command_says_which_way_it_went(solutions: Path) -> None:  # noqa: F811
    """Where nobody can read the installation, student code runs as nobody (its uid is in its own error);
    elsewhere the command names the folder nobody cannot read, and student code runs as user 0 with no
    capability (its effective set, read from /proc, is in its error)."""
    first_statement(solutions, "backward", "softmax_backward", """import os
caps = open('/proc/self/status').read().split('CapEff:')[1].split()[0]
raise RuntimeError(f'uid {os.geteuid()} caps {caps}')""")
    done = check(solutions, "2.1")
    planned = unprivileged.plan()
    if planned.user is not None:
        assert f"\nnote: grading as root: student code runs as the user nobody (uid {NOBODY.uid}), which cannot " \
            "raise its limits or open root's files" in done.stdout
        assert f"raised RuntimeError: uid {NOBODY.uid} caps 0000000000000000" in row(done.stdout, "2.1"), done.stdout
        return
    blocked = unprivileged.unreadable(unprivileged.needed_folders(), NOBODY)
    assert blocked and f"\nwarning: grading as root, and the user nobody cannot read {blocked}," in done.stdout
    if planned.sealed:
        assert "so student code runs as root with no capability and every file but its copy read-only" in done.stdout
        assert "raised RuntimeError: uid 0 caps 0000000000000000" in row(done.stdout, "2.1"), done.stdout
    else:
        assert "so student code runs as root with root's rights, which no limit binds" in done.stdout
