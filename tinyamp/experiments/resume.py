"""What ``--resume CHECKPOINT`` reads, for ``tinyamp train`` in one process and on N ranks alike.

The file is input like the command line: its settings are checked by the rules of
run_settings.py and its history by history.py, before anything is built from them, and a
setting given on the command line that differs from the saved run's is refused (a resumed
run keeps its settings).  Every refusal is a ResumeError in one sentence that starts with
the option it is about; each command turns it into its own usage error.
"""

from __future__ import annotations

import os
from typing import Any

from tinyamp.experiments import history, run_settings

KEPT = ("model", "precision", "scaler", "batch_size", "lr", "seed", "schedule")  # what a resumed run keeps


class ResumeError(ValueError):
    """A --resume checkpoint that cannot be continued from, or an option that contradicts it."""


def read_resume(path: str, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    """(the saved settings, checked; the saved history or None; the checkpoint's whole extra).

    `given` maps each name of KEPT to the command line's value, None where it was left out.
    """
    from tinyamp.amp import CheckpointError
    from tinyamp.amp.training_state import read_extra

    try:
        extra = read_extra(path)  # the settings alone: the model they describe bounds the rest
    except FileNotFoundError as exc:
        raise ResumeError(f"--resume: {exc}" if os.path.islink(path) else f"--resume {path}: no such file") from exc
    except (CheckpointError, OSError) as exc:
        raise ResumeError(f"--resume: {exc}") from exc
    try:
        saved = run_settings.checked_extra(extra, path)
        past = None if "history" not in extra else history.from_extra(extra["history"], saved["step"], path)
    except (ValueError, KeyError, TypeError) as exc:
        raise ResumeError(f"--resume {exc}") from exc
    for key in KEPT:
        if given.get(key) is not None and given[key] != saved[key]:
            flag = "--" + key.replace("_", "-")
            raise ResumeError(
                f"{flag} {given[key]} differs from the checkpoint's {flag} {saved[key]}: a resumed run keeps its "
                f"settings; leave out {flag}"
            )
    return saved, past, extra
