"""Ctrl-C (SIGINT), SIGTERM and SIGHUP stop a run at a step boundary, so that its checkpoint is a real state.

SIGHUP is what a run receives when its terminal closes or its ssh connection drops; it used to
end the process at once with nothing saved.  A run started under ``nohup`` (SIGHUP ignored) was
asked to outlive its terminal: it keeps SIGHUP ignored.

A signal arrives between any two bytecodes.  Raising at that point could stop a run half
way through an optimizer step, with some weights updated and others not: nothing that
could be saved and resumed.  So while a run trains (and while it writes its files) the
handler only records the signal; the training loop looks at it after each step
(:meth:`Stop.check`), saves a checkpoint and stops.  Outside those stretches, and at a
second signal (someone pressing Ctrl-C again because they mean it), the handler raises
:class:`Interrupted` at once.

The exit status of a stopped command is the shell's convention, 128 + the signal
number: 130 after SIGINT, 143 after SIGTERM, 129 after SIGHUP.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))  # (Windows: none)


def handled(signum: int) -> bool:
    """Whether a run stops at `signum`: every one of SIGNALS, except a SIGHUP that nohup has made ignored."""
    return not (signum == getattr(signal, "SIGHUP", None) and signal.getsignal(signum) == signal.SIG_IGN)


class Interrupted(Exception):
    """The run was stopped by a signal; `step` is the number of steps done (None: before training)."""

    def __init__(self, signum: int, step: int | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.step = step

    @property
    def name(self) -> str:
        """SIGINT, SIGTERM or SIGHUP."""
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """128 + the signal number, as a shell reports a process stopped by that signal."""
        return 128 + self.signum


class Stop:
    """The signal received, if any, and whether it may interrupt right now."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._deferring = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        self.signum = signum
        if not (self._deferring and first):
            raise Interrupted(signum)

    @contextmanager
    def at_step_boundaries(self) -> Iterator[None]:
        """Inside this block a (first) signal is only recorded, for :meth:`check` to act on."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def check(self, step: int | None = None) -> None:
        """Raise Interrupted when a signal has arrived (call it where stopping leaves a consistent state)."""
        if self.signum is not None:
            raise Interrupted(self.signum, step)

    @property
    def name(self) -> str | None:
        """SIGINT, SIGTERM or SIGHUP, once one has arrived."""
        return None if self.signum is None else signal.Signals(self.signum).name

    @property
    def requested(self) -> bool:
        """Whether a signal has arrived."""
        return self.signum is not None


@contextmanager
def handle_signals() -> Iterator[Stop]:
    """Install the handlers for SIGINT, SIGTERM and SIGHUP (unless ignored: nohup) for the duration of the
    block, then restore the old ones.

    Only the main thread can install signal handlers; elsewhere (a test runner's worker
    thread) the block runs with the handlers it found.
    """
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, stop._handler) for s in SIGNALS if handled(s)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
