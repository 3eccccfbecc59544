"""An output folder written as a unit: all of a run's new files are in place, or the folder is as it was.

A run never writes into its output folder ``NAME`` directly.  It writes the whole new set
of files (results.json, the figures, checkpoint.npz, and ``tinyamp-run.json``, the list
of them) into a hidden sibling folder ``.NAME.tinyamp-new-XXXX``, flushes every file to
disk, and then swaps the two folders with two renames::

    NAME                       ->  .NAME.tinyamp-old-XXXX   (the previous set, if any)
    .NAME.tinyamp-new-XXXX     ->  NAME

and deletes the old set.  A rename within one file system is atomic, so a run killed at
any moment (even by SIGKILL, which no program can catch) leaves one of three states:
``NAME`` as it was, plus a hidden ``-new`` sibling; ``NAME`` complete and new, plus a
hidden ``-old`` sibling; or, between the two renames, no ``NAME`` and both siblings.  The
next run that writes to ``NAME`` finds those leftovers (:meth:`OutputFolder.recover`),
puts the old set back when ``NAME`` is missing, deletes the rest, and says what it did.

Because a swap replaces the whole folder, tinyamp only swaps folders it wrote itself: an
empty folder, or one whose ``tinyamp-run.json`` lists every file in it.  A folder with
any other file in it is refused before training starts, with the files named.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock (two runs on one folder are then not detected)
    fcntl = None  # type: ignore[assignment]

MANIFEST = "tinyamp-run.json"  # what wrote this folder, and the files it wrote
_NEW, _OLD = "tinyamp-new-", "tinyamp-old-"
_LEGACY = ".tinyamp-partial-"  # the temporary folders of earlier tinyamp versions, inside NAME


class OutputFolderError(OSError):
    """An output folder that cannot be used, or a write that failed: the message says which and why."""


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of `folder` ({"command", "files", ...}), or None when there is none (or it is unreadable)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        return None
    return manifest


class OutputFolder:
    """The folder ``--out`` names, replaced as a unit by :meth:`write`."""

    def __init__(self, path: str | os.PathLike[str], flag: str = "--out") -> None:
        self.path = Path(os.path.abspath(path))  # absolute: the swap renames siblings in its parent
        self.flag = flag
        self._lock: int | None = None  # the descriptor holding the lock (lock())

    # ---- one run at a time --------------------------------------------------------------------------
    def lock_path(self) -> Path:
        """The lock file of this folder: in the temporary folder, so that nothing is left beside the folder."""
        digest = hashlib.sha256(os.fsencode(self.path)).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"tinyamp-out-{digest}.lock"

    def lock(self) -> None:
        """Hold this folder against other runs until :meth:`unlock` (or the process ends: the system lets go).

        Two runs swapping one folder would each replace the other's files.  The second is
        refused at once, with the process that holds the folder named.  (Without a usable
        temporary folder, or on a system without ``fcntl``, a run goes on unlocked.)
        """
        path = self.lock_path()
        while self._lock is None and fcntl is not None:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except PermissionError:  # another user's lock file: it can still be locked, read-only
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    return  # no lock to be had here (a temporary folder that cannot be used): the run goes on
            except OSError:
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 1000).decode("utf-8", "replace").strip() or "another process"
                os.close(fd)
                raise OutputFolderError(
                    f"{self.flag} {self.path}: another tinyamp run is writing this folder ({holder}); wait for it "
                    f"to finish, or choose another folder"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:  # its holder removed it just before we locked it: lock the next one
                same = False
            if not same:
                os.close(fd)
                continue
            self._lock = fd
        with contextlib.suppress(OSError):  # name the holder, for the run that is refused
            os.ftruncate(self._lock, 0)
            os.write(self._lock, f"process {os.getpid()}: {_command_line()}".encode())

    def unlock(self) -> None:
        """Let go of the folder (removing the lock file while still holding it)."""
        if self._lock is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.lock_path())
            os.close(self._lock)
            self._lock = None

    def _siblings(self) -> list[Path]:
        prefix = f".{self.path.name}."
        try:
            return sorted(
                p for p in self.path.parent.iterdir()
                if p.name.startswith(prefix) and p.name[len(prefix):].startswith((_NEW, _OLD))
            )  # fmt: skip
        except OSError:
            return []

    def recover(self) -> list[str]:
        """Clean up after a run that was killed while writing here; return what was done, in sentences.

        A leftover that cannot be removed (a file the user cannot delete, say) is kept, and
        the sentence says so and why: it is never reported removed while it is still there.
        """
        done = []
        for leftover in self._siblings():
            kind = _OLD if _OLD in leftover.name else _NEW
            if kind == _OLD and not self.path.exists() and leftover.is_dir():
                leftover.rename(self.path)  # killed between the two renames: the old set goes back
                done.append(f"put back {self.path.name}, which a killed run had moved aside to {leftover.name}")
            else:
                done.append(_removed(leftover, leftover.name))
        if self.path.is_dir():
            for legacy in self.path.glob(f"{_LEGACY}*"):
                done.append(_removed(legacy, f"{self.path.name}/{legacy.name}"))
        return done

    def check(self) -> dict[str, Any] | None:
        """Fail early (before training) unless `path` can be replaced; return its manifest, if any.

        Raises OutputFolderError when `path` is a file, holds files tinyamp did not write, or
        its parent folder cannot be written to.
        """
        if self.path.exists() and not self.path.is_dir():
            raise OutputFolderError(f"{self.flag} {self.path}: this is a file, not a folder")
        if self.path.is_dir() and os.path.ismount(self.path):
            raise OutputFolderError(
                f"{self.flag} {self.path}: this is a mount point, and a run replaces its output folder by renaming "
                f"it, which a mount point does not allow; name a folder inside it, e.g. {self.flag} {self.path / 'run'}"
            )
        cwd = Path.cwd().resolve()
        if self.path.resolve() in (cwd, *cwd.parents):
            raise OutputFolderError(
                f"{self.flag} {self.path}: this folder contains the current directory, and a run replaces its "
                f"output folder as a whole; name a folder of its own, e.g. {self.flag} runs/mlp"
            )
        manifest = None
        if self.path.is_dir():
            manifest = read_manifest(self.path)
            listed = set(manifest["files"]) | {MANIFEST} if manifest else set()
            foreign = sorted(p.name for p in self.path.iterdir() if p.name not in listed)
            if foreign:
                shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                raise OutputFolderError(
                    f"{self.flag} {self.path}: the folder holds files tinyamp did not write ({shown}), and a run "
                    "replaces its output folder as a whole; choose an empty or new folder"
                )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            probe = self.path.parent / f".{self.path.name}.{_NEW}probe-{secrets.token_hex(4)}"
            probe.mkdir()
            (probe / MANIFEST).write_text("{}\n", "utf-8")  # a file too: a full or read-only disk says so now
            shutil.rmtree(probe)
        except OSError as exc:
            raise OutputFolderError(f"{self.flag} {self.path}: cannot write there ({exc.strerror or exc})") from exc
        if self.path.is_dir():  # the swap renames it: try that now (a killed probe is put back by recover())
            aside = self.path.parent / f".{self.path.name}.{_OLD}probe-{secrets.token_hex(4)}"
            try:
                self.path.rename(aside)
            except OSError as exc:
                raise OutputFolderError(
                    f"{self.flag} {self.path}: a run replaces its output folder by renaming it, and this one cannot "
                    f"be renamed ({exc.strerror or exc}); choose another folder"
                ) from exc
            aside.rename(self.path)
        return manifest

    @contextmanager
    def _new_folder(self) -> Iterator[Path]:
        new = self.path.parent / f".{self.path.name}.{_NEW}{secrets.token_hex(4)}"
        new.mkdir()
        try:
            yield new
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise

    def write(self, fill: Callable[[Path], list[str]], manifest: dict[str, Any]) -> list[str]:
        """Replace the folder with the files ``fill(folder)`` writes (it returns their names).

        `manifest` (the command, its settings) is completed with the list of files and written
        as ``tinyamp-run.json``.  On any failure (a full disk, an error in `fill`) the folder is
        left as it was and OutputFolderError says what happened.
        """
        self.recover()
        with self._new_folder() as new:
            try:
                names = fill(new)
                (new / MANIFEST).write_text(json.dumps({**manifest, "files": names}, indent=1) + "\n", "utf-8")
                for path in new.iterdir():
                    _flush(path)  # every byte on disk before the rename makes the set visible
                _flush(new)
            except OSError as exc:
                raise OutputFolderError(
                    f"{self.flag} {self.path}: writing the new files failed ({exc.strerror or exc}); the folder was "
                    "left as it was"
                    + (f" and still holds {', '.join(_listing(self.path))}" if self.path.is_dir() else "")  # fmt: skip
                ) from exc
            old = self.path.parent / f".{self.path.name}.{_OLD}{secrets.token_hex(4)}"
            if self.path.exists():
                self.path.rename(old)
            new.rename(self.path)
        shutil.rmtree(old, ignore_errors=True)
        _flush(self.path.parent)
        return names


def _command_line() -> str:
    """This process's command line as typed: ``python -m tinyamp.distributed ...`` rather than a __main__.py path."""
    argv0 = Path(sys.argv[0]) if sys.argv else Path("python")
    if argv0.name == "__main__.py":
        parts = argv0.parent.parts
        package = ".".join(parts[len(parts) - 1 - parts[::-1].index("tinyamp") :]) if "tinyamp" in parts else "?"
        return " ".join(["python -m", package, *sys.argv[1:]])
    return " ".join([argv0.name, *sys.argv[1:]])


def _removed(path: Path, name: str) -> str:
    """Remove a leftover file or folder; the sentence saying so, or saying why it is kept."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError as exc:
        return f"kept {name}, left by a run killed while writing: it could not be removed ({exc.strerror or exc})"
    return f"removed {name}, left by a run killed while writing"


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) or ["nothing"]


def _flush(path: Path) -> None:
    """fsync a file or a folder (a folder's entries are on disk only once it is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
