"""Faults injected on purpose, to show (and test) what the other ranks do when one rank goes wrong.

``--fault KIND@STEP:RANK`` makes rank RANK, at the start of step STEP:

=========  ===================================================================================
raise      raise an exception: ``abort_on_error`` turns it into MPI_Abort, which stops every rank
exit       leave at once with status 7, as a crash would: mpiexec sees it and stops the others
kill       kill itself with SIGKILL (out of memory, say): mpiexec sees it and stops the others
hang       sleep instead of computing: the others wait in their next collective until its
           timeout (``--timeout``), then abort the job
sigint     send itself SIGINT (Ctrl-C), as if only this rank had seen it: every rank stops
           after this step, the step they agree on, and a run with ``--out`` saves a checkpoint
sigterm    the same with SIGTERM (what a batch scheduler sends before it kills a job)
sighup     the same with SIGHUP (the terminal or ssh session of that rank went away)
=========  ===================================================================================

``--overflow-at STEP:RANK`` is not a fault but an overflow that only rank RANK sees at step STEP
(``DataParallel.inject_overflow``): with the agreement every rank skips that step, without it
the ranks part ways (``agreement.py``).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

FAULTS = ("raise", "exit", "kill", "hang", "sigint", "sigterm", "sighup")


def parse_at(text: str, what: str = "--overflow-at") -> tuple[int, int]:
    """``"STEP:RANK"`` as two whole numbers >= 0."""
    try:
        step, rank = (int(v) for v in text.split(":"))
    except ValueError:
        raise ValueError(f"{what} takes STEP:RANK, two whole numbers, e.g. 3:1; got {text!r}") from None
    if step < 0 or rank < 0:
        raise ValueError(f"{what} takes STEP:RANK, both at least 0; got {text!r}")
    return step, rank


@dataclass(frozen=True)
class Fault:
    """A fault of one kind, at one step, on one rank."""

    kind: str
    step: int
    rank: int

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``"KIND@STEP:RANK"``, e.g. ``"raise@3:1"``."""
        kind, _, at = text.partition("@")
        if kind not in FAULTS or not at:
            raise ValueError(f"--fault takes KIND@STEP:RANK with KIND one of {', '.join(FAULTS)}; got {text!r}")
        return cls(kind, *parse_at(at, "--fault"))

    def trigger(self, step: int, rank: int) -> None:
        """Do the fault if this is its step and its rank."""
        if (step, rank) != (self.step, self.rank):
            return
        if self.kind == "raise":
            raise RuntimeError(f"a fault injected on purpose (--fault raise@{step}:{rank})")
        if self.kind == "exit":
            os._exit(7)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind in ("sigint", "sigterm", "sighup"):
            os.kill(os.getpid(), getattr(signal, self.kind.upper()))
            return  # the handler only notes it: the step goes on, and the ranks stop after it
        time.sleep(10**6)  # "hang"
