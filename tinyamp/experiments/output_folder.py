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

import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
        """Clean up after a run that was killed while writing here; return what was done, in sentences."""
        done = []
        for leftover in self._siblings():
            kind = _OLD if _OLD in leftover.name else _NEW
            if kind == _OLD and not self.path.exists():
                leftover.rename(self.path)  # killed between the two renames: the old set goes back
                done.append(f"put back {self.path.name}, which a killed run had moved aside to {leftover.name}")
            else:
                shutil.rmtree(leftover, ignore_errors=True)
                done.append(f"removed {leftover.name}, left by a run killed while writing")
        if self.path.is_dir():
            for legacy in self.path.glob(f"{_LEGACY}*"):
                shutil.rmtree(legacy, ignore_errors=True)
                done.append(f"removed {self.path.name}/{legacy.name}, left by a run killed while writing")
        return done

    def check(self) -> dict[str, Any] | None:
        """Fail early (before training) unless `path` can be replaced; return its manifest, if any.

        Raises OutputFolderError when `path` is a file, holds files tinyamp did not write, or
        its parent folder cannot be written to.
        """
        if self.path.exists() and not self.path.is_dir():
            raise OutputFolderError(f"{self.flag} {self.path}: this is a file, not a folder")
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
            probe.rmdir()
        except OSError as exc:
            raise OutputFolderError(f"{self.flag} {self.path}: cannot write there ({exc.strerror or exc})") from exc
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


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) or ["nothing"]


def _flush(path: Path) -> None:
    """fsync a file or a folder (a folder's entries are on disk only once it is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
