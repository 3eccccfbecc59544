"""Keeping a student's code inside its grading process: the limits it cannot raise, the processes it cannot hide.

``isolation`` grades each exercise in a child process.  A child is only a boundary if what runs in it
cannot reach past it, so on Linux (each piece does nothing where the OS lacks it):

* **Every process it starts is found and killed.**  The grading command is a *child subreaper*
  (``prctl(PR_SET_CHILD_SUBREAPER)``): a process whose parent has died is handed to it rather than
  to init, so a daemon that left with ``setsid`` and a double fork is still one of its descendants.
  When an exercise ends, its whole tree is stopped (SIGSTOP: a fork bomb cannot fork while stopped)
  and then killed, until a scan of ``/proc`` finds none left.
* **Limits it cannot raise.**  Memory (``RLIMIT_AS``), the size of any file it writes
  (``RLIMIT_FSIZE``: an endless ``print`` ends at ``OUTPUT_LIMIT`` bytes) and core files are set with
  the hard limit equal to the soft one; an unprivileged process may lower a hard limit, never raise it.
* **Nothing to read and nothing of the grader's to write.**  Standard input is ``/dev/null`` (a read
  returns at once), and the grading command is not *dumpable* while it grades, so a process of the
  same user cannot open ``/proc/<its pid>/fd/1`` to write into its table.
* **Not as root.**  Root ignores these limits and may open any file and any process's descriptors, so
  as root the student's process becomes the user ``nobody`` first (``unprivileged``), or, where that
  user cannot read the installation, the grading command says that no limit binds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

LINUX = sys.platform.startswith("linux")
OUTPUT_LIMIT = 64 * 2**20  # bytes any one file written by a child may reach: what it prints included
PROCESS_LIMIT = 64  # processes one exercise may run at once; more is a fork bomb
_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 4, 36


def _prctl(option: int, value: int) -> bool:
    if not LINUX:
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def guard_the_grader(on: bool) -> None:
    """While grading (`on`): adopt orphaned descendants, and keep /proc/<pid>/fd closed to the children."""
    _prctl(_PR_SET_CHILD_SUBREAPER, int(on))
    _prctl(_PR_SET_DUMPABLE, int(not on))


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter), for every process ``/proc`` lists now (empty where there is no /proc)."""
    found: dict[int, tuple[int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "(comm)", which may hold spaces
            found[int(name)] = (int(fields[1]), fields[0].decode())
        except (OSError, IndexError, ValueError):  # ended while we read
            continue
    return found


def descendants(pid: int, processes: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """Every living process below `pid` in the tree (a zombie has ended: it is not counted)."""
    processes = _processes() if processes is None else processes
    children: dict[int, list[int]] = {}
    for child, (parent, state) in processes.items():
        if state != "Z":
            children.setdefault(parent, []).append(child)
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, [])]
        found += frontier
    return found


def orphans(known: set[int]) -> list[int]:
    """This process's living children that it did not start itself (not in `known`): orphans it adopted."""
    me = os.getpid()
    return [pid for pid, (parent, state) in _processes().items() if parent == me and state != "Z" and pid not in known]


def kill_orphans(known: set[int]) -> None:
    """Kill every orphan this grader adopted (its children not in `known`) and all below them, at once."""
    kill_trees(orphans(known))


def kill_tree(pid: int, include_root: bool = True) -> None:
    """Stop, then kill, `pid` (unless it has ended) and everything below it."""
    kill_trees([pid], include_root)


def kill_trees(roots: list[int], include_roots: bool = True) -> None:
    """Stop every process of the trees below `roots` (SIGSTOP: a stopped process cannot fork), then kill them all;
    again until a scan of /proc finds none alive (a process forked between scan and stop is found next round)."""
    for _ in range(100):
        processes = _processes()
        tree = [p for root in roots for p in descendants(root, processes)]
        tree += [r for r in roots if include_roots and processes.get(r, (0, "Z"))[1] != "Z"]
        stopped = [p for p in tree if _signal(p, signal.SIGSTOP)]
        if not stopped:
            break
        for p in stopped:
            _signal(p, signal.SIGKILL)
        _reap()
    _reap()


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


STARTED: set[int] = set()  # the children the grader started itself (multiprocessing collects their status)


def _reap() -> None:
    """Collect the exit status of adopted orphans that have died (this process is their parent now)."""
    me = os.getpid()
    for pid, (parent, state) in _processes().items():
        if parent == me and state == "Z" and pid not in STARTED:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def contain_child(memory_bytes: int | None) -> None:
    """In the child, before student code loads: its own session, standard input empty, limits it cannot raise."""
    if hasattr(os, "setsid"):
        os.setsid()  # its own session and process group: the terminal's Ctrl-C never reaches it
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (lives as long as the child)
    if not LINUX:
        return
    import resource

    # Python ignores SIGXFSZ, so a write past RLIMIT_FSIZE would raise OSError (EFBIG) in whatever code wrote,
    # the grader's own messages included; the default action ends the child with a signal the verdict can name.
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    limits = {resource.RLIMIT_FSIZE: OUTPUT_LIMIT, resource.RLIMIT_CORE: 0}
    if memory_bytes is not None:
        with open("/proc/self/statm") as statm:
            held = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limits[resource.RLIMIT_AS] = held + memory_bytes
    if os.geteuid() != 0:  # root's process count is not limited (the census still ends a fork bomb)
        # The census (isolation.CENSUS_EVERY) is the limit that speaks, with its sentence; this is the backstop that
        # cannot be raised, set past it so that a fast fork loop is still over PROCESS_LIMIT when the census counts.
        limits[resource.RLIMIT_NPROC] = _user_processes() + 2 * PROCESS_LIMIT
    for which, value in limits.items():
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def _user_processes() -> int:
    """Processes of this user now: RLIMIT_NPROC counts them all, not only this one's children."""
    uid, count = os.getuid(), 0
    for pid in _processes():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                count += 1
        except OSError:
            continue
    return count


def tree_size(pid: int) -> int:
    """How many processes run below `pid`."""
    return len(descendants(pid))
