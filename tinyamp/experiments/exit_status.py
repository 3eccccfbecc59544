"""The exit statuses of ``tinyamp demo`` and ``tinyamp train``, in one process or on N ranks: written once.

A script or a course's grading job reads them: 0 the run is done; 2 bad input (one sentence
says what to type instead); 3 the run diverged (the message says when and why); 74 standard
output closed or full, the run's files written (sysexits' EX_IOERR); 128 + the signal's
number when SIGINT, SIGTERM or SIGHUP stopped it (130, 143, 129), as a shell reports a process it killed.
"""

from __future__ import annotations

import sys
from typing import Any

DONE = 0
BAD_INPUT = 2
DIVERGED = 3  # divergence.diverged: a NaN or inf loss, a loss scale of 0, most steps skipped
STDOUT_FAILED = 74

EXPLAINED = (
    "exit status: 0 done; 2 bad input (a message says what to type instead); 3 the run diverged (the message says "
    "when and why); 74 standard output closed or full (the files were written); 130, 143 or 129 stopped by Ctrl-C, "
    "SIGTERM or SIGHUP (train --out saves a checkpoint first)"
)


def stopped_by(signum: int) -> int:
    """128 + the signal's number, as a shell reports a process stopped by that signal."""
    return 128 + signum


def at_the_end(failed: str | None, stop: Any, say: bool = True) -> int:
    """The status of a run that went through its last step: DIVERGED (saying why), 128 + a signal that
    arrived after the last step (the finished run was written), or DONE.  `say`: print the sentence
    (on N ranks, rank 0 speaks for all; every rank returns the same status)."""
    if failed:
        if say:
            print(f"tinyamp: the run diverged: {failed}", file=sys.stderr)
        return DIVERGED
    if stop.requested:
        if say:
            print(f"tinyamp: {stop.name} arrived after the last step; the finished run was written", file=sys.stderr)
        return stopped_by(stop.signum)
    return DONE
