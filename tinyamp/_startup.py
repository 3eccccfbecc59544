"""The first thing ``import tinyamp`` runs: when the process is the `tinyamp` command, a quiet Ctrl-C.

Importing NumPy and the rest of tinyamp takes a tenth of a second or more, before the
command's own code (and its signal handlers, ``experiments/interrupts.py``) can run.  A
Ctrl-C in that time would print a KeyboardInterrupt traceback through the import machinery.
So, only when this process is the command (the ``tinyamp`` script, or ``python -m`` while it
imports the module it runs), SIGINT, SIGTERM and SIGHUP (unless nohup ignores it) here end the
process at once with the shell's status (130, 143, 129) and one line; nothing has been written yet.  A program that
imports tinyamp keeps its own handlers.  (The interpreter's own start-up, before this line
runs, is beyond any package's reach.)
"""

from __future__ import annotations

import os
import signal
import sys


def running_as_command() -> bool:
    """Whether this process is the `tinyamp` command, or ``python -m tinyamp...`` (not another module run
    with -m whose package happens to import tinyamp: its program keeps Python's own Ctrl-C)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "tinyamp":
        return True
    original = getattr(sys, "orig_argv", [])  # Python >= 3.10: the interpreter's own command line
    module = next((original[i + 1] for i, a in enumerate(original[:-1]) if a == "-m"), "")
    return module == "tinyamp" or module.startswith("tinyamp.")


def _stopped_while_starting(signum: int, frame: object) -> None:
    name = signal.Signals(signum).name
    os.write(2, f"\ntinyamp: stopped by {name} while starting; nothing was written\n".encode())
    os._exit(128 + signum)  # nothing to save or clean up yet; no exception through the import machinery


if running_as_command():
    _hangup = getattr(signal, "SIGHUP", None)
    for _signum in (signal.SIGINT, signal.SIGTERM, _hangup):
        if _signum is None or (_signum == _hangup and signal.getsignal(_signum) == signal.SIG_IGN):
            continue  # no SIGHUP on Windows; under nohup the command was asked to outlive its terminal
        signal.signal(_signum, _stopped_while_starting)
