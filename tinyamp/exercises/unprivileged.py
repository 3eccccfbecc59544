"""A grading command run as root runs the student's code as the unprivileged user ``nobody``, where it can.

Root's processes ignore resource limits (a hard limit only binds a process that lacks CAP_SYS_RESOURCE),
may open any file and any process's ``/proc/<pid>/fd``, and may kill or trace the grader.  So when the
grading command is root, each student's process gives root up for good before any student code loads:
``setgroups([])``, ``setgid``, then ``setuid`` (as root, ``setuid`` sets the real, effective and saved
user ids alike, so there is no way back).  The copy of the workspace it grades is handed to that user;
everything else stays root's.

That only works if ``nobody`` can read what the student's process still has to load: the folders on
``sys.path`` (Python's library, site-packages, tinyamp itself) and the temporary folder the copy lives
in.  A Python or a virtual environment inside a folder only root may enter is not readable, and then a
student's process as ``nobody`` would fail at its first lazy import.  ``plan`` checks first, in a
throwaway child that has given root up the same way.  Where it cannot, the student's process stays
user 0, but first sees every file system read-only except its copy (``read_only_except``: a mount
namespace of its own, each mount remounted read-only there, the copy bound onto itself writable), then
drops every *capability* (``drop_capabilities``): without CAP_SYS_ADMIN it cannot remount anything
writable again, without CAP_SYS_RESOURCE it cannot raise a hard limit, without CAP_SYS_PTRACE it cannot
open the grader's ``/proc/<pid>/fd``, and the secure bits keep a later ``exec`` from handing the
capabilities back.  It may still read what root may read and signal root's processes (ending a grading
early fails the exercise; it forges nothing), so the grading command warns.  Where even that fails, the
warning says that no limit binds.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

USER = "nobody"
_NOBODY_ID = 65534  # nobody's uid and gid on Linux distributions that have no passwd entry for it


@dataclass(frozen=True)
class User:
    """The user the student's code runs as: a name for the messages, and its ids."""

    name: str
    uid: int
    gid: int


def is_root() -> bool:
    """The grading command runs with root's rights (the effective user id 0)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def nobody() -> User:
    """``nobody`` as the password database has it (uid and gid 65534 if it has no entry)."""
    import pwd

    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        return User(USER, _NOBODY_ID, _NOBODY_ID)
    return User(USER, entry.pw_uid, entry.pw_gid)


def become(user: User) -> None:
    """Give root up for good (in a child, before any student code loads): no groups, `user`'s gid, then its uid."""
    os.setgroups([])
    os.setgid(user.gid)
    os.setuid(user.uid)
    if os.geteuid() != user.uid or os.getegid() != user.gid:  # setuid(2) cannot fail half way, but say so if it did
        raise PermissionError(f"could not become {user.name} (uid {user.uid}): still uid {os.geteuid()}")


def needed_folders() -> list[str]:
    """What the student's process must read as `nobody`: each existing folder on sys.path, tinyamp's own
    package, and the temporary folder the copy of the workspace is made in."""
    import tinyamp

    folders = [p for p in sys.path if p and os.path.isdir(p)]
    folders += [str(Path(tinyamp.__file__).resolve().parent), tempfile.gettempdir()]
    return list(dict.fromkeys(folders))


def unreadable(folders: list[str], user: User) -> str:
    """The first of `folders` that `user` cannot list, checked in a forked child that has become `user`
    ("" when every one can be listed; the child's verdict is its exit status and one line on a pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe: no Python cleanup, no buffered output shared with the parent
        os.close(read)
        status = 0
        try:
            become(user)
            for folder in folders:
                try:
                    os.listdir(folder)
                except OSError:
                    os.write(write, folder.encode(errors="replace")[:4096])
                    status = 1
                    break
        except OSError as exc:
            os.write(write, f"(setuid failed: {exc})".encode()[:4096])
            status = 2
        os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        found = pipe.read(4096).decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return found if status else ""


@dataclass(frozen=True)
class Plan:
    """How the student's process is confined: as `user` (root's grading only), then, with `sealed`, every file but
    its copy read-only and no capability left; `line` is what the grading command prints about it."""

    user: User | None = None
    sealed: bool = False
    line: str = ""

    def apply(self, copy: str) -> None:
        """In the student's process, before any student code loads (and before its limits are set); `copy` is
        the workspace's copy, the one folder it may write to (its temporary files go there too)."""
        if self.user is not None:
            become(self.user)
        if self.sealed:
            read_only_except(copy)
            drop_capabilities()
            os.environ["TMPDIR"] = tempfile.tempdir = copy


def _seal() -> None:
    read_only_except(tempfile.gettempdir())
    drop_capabilities()


def plan() -> Plan:
    """As root: become `nobody` where it can read the installation, else stay user 0 without capabilities; then,
    for any user, seal the files (``read_only_except``) where this kernel allows it (checked in a child)."""
    if not hasattr(os, "setuid") or not sys.platform.startswith("linux"):
        return Plan()
    if not is_root():
        return Plan(sealed=_in_a_child(_seal))
    user = nobody()
    blocked = unreadable(needed_folders(), user)
    if not blocked:
        sealed = _in_a_child(lambda: (become(user), _seal()))
        files = "; every file but its copy is read-only to it" if sealed else ""
        return Plan(user, sealed, f"note: grading as root: student code runs as the user {user.name} (uid "
                                  f"{user.uid}), which cannot raise its limits or open root's files"
                                  f"{files}")  # fmt: skip
    why = f"grading as root, and the user {user.name} cannot read {blocked}, so student code runs as root"
    fix = "grade as an unprivileged user, or install tinyamp where every user can read it"
    if _in_a_child(_seal):
        return Plan(sealed=True, line=f"warning: {why} with no capability and every file but its copy read-only: "
                                      "it cannot raise its limits or change a file, yet it may read what root may "
                                      f"read and signal root's processes: {fix}")  # fmt: skip
    return Plan(line=f"warning: {why} with root's rights, which no limit binds (it may raise its limits, open any "
                     f"file or process): {fix}")  # fmt: skip


_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_SET_NO_NEW_PRIVS = 4, 24, 28, 38
_SECBITS_LOCKED = 0b1111  # NOROOT and NO_SETUID_FIXUP, each locked: an exec as root grants nothing, ever
_LINUX_CAPABILITY_VERSION_3 = 0x20080522  # two 32-bit words per set: capabilities 0 to 63


def _call(result: int, what: str) -> None:
    """OSError naming `what` unless the C call returned 0."""
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


_CLONE_NEWNS, _CLONE_NEWUSER = 0x20000, 0x10000000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
_KEPT_FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}


def mount_points() -> list[tuple[str, int]]:
    """Each mount this process sees, as (mount point, the flags a read-only remount must keep), from
    /proc/self/mountinfo (field 5, octal escapes such as \\040 decoded; field 6, the per-mount options)."""
    points = []
    with open("/proc/self/mountinfo", "rb") as info:
        for line in info:
            fields = line.split()
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
            flags = sum(_KEPT_FLAGS.get(o.decode(), 0) for o in fields[5].split(b","))
            points.append((os.fsdecode(point), flags))
    return points


def read_only_except(folder: str) -> None:
    """In a mount namespace of this process's own: every mount read-only, but `folder`, bound onto itself.

    Root makes the namespace itself; any other user first makes a user namespace, where it holds the capabilities
    that mounting needs (and only there), with its own uid and gid mapped to themselves."""
    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() != 0:
        uid, gid = os.geteuid(), os.getegid()
        _call(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare(CLONE_NEWUSER | CLONE_NEWNS)")
        # /proc/self is root's while the process is not dumpable (the grading command's children, or one that was
        # root), so it is made dumpable for the three writes, before any student code exists to take advantage
        _call(libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:  # setgroups first: an unprivileged gid_map requires it
                    f.write(text)
        finally:
            _call(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    else:
        _call(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _call(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")  # nothing leaks out
    points = mount_points()  # before the bind below: that one stays writable
    target = os.fsencode(folder)
    _call(libc.mount(target, target, None, _MS_BIND, None), f"mount --bind {folder}")
    for point, flags in points:
        _call(libc.mount(None, os.fsencode(point), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags, None),
              f"remount {point} read-only")  # fmt: skip


def drop_capabilities() -> None:
    """Keep no capability and none to regain (OSError if the kernel refuses any step): user 0 keeps only its id;
    in a user namespace, the process gives up what it held there."""
    libc = ctypes.CDLL(None, use_errno=True)
    call = _call
    call(libc.prctl(_PR_SET_SECUREBITS, _SECBITS_LOCKED, 0, 0, 0), "PR_SET_SECUREBITS")
    for capability in range(64):  # the bounding set: what any later exec could ever hold
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            call(-1, f"PR_CAPBSET_DROP {capability}")  # EINVAL: past the last capability this kernel knows
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)  # version, pid 0: this thread
    sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (two words each): all zero
    call(libc.capset(header, sets), "capset")
    call(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    with open("/proc/self/status") as status:
        held = {k: v.strip() for k, _, v in (line.partition(":") for line in status) if k in ("CapEff", "CapBnd")}
    if any(int(v, 16) for v in held.values()):
        raise OSError(f"capabilities still held after dropping them: {held}")


def _in_a_child(act: Callable[[], None]) -> bool:
    """Whether `act` succeeds in a forked child (which then ends): trying changes nothing in this process."""
    pid = os.fork()
    if pid == 0:
        try:
            act()
            os._exit(0)
        except BaseException:  # noqa: BLE001  (the answer is the exit status)
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def hand_over(folder: Path, copy: Path, user: User) -> None:
    """Let `user` reach its copy and own it: `folder` (root's, holding the copy and the grader's private folder)
    may be entered, not listed; every file and folder of `copy` becomes `user`'s."""
    os.chmod(folder, 0o711)
    os.chown(copy, user.uid, user.gid, follow_symlinks=False)
    for parent, dirs, files in os.walk(copy):
        for name in dirs + files:
            os.chown(os.path.join(parent, name), user.uid, user.gid, follow_symlinks=False)
