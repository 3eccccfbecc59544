"""What check_scaler's two state machines share: your scaler and the ones restored from its state_dict().

``scaler.py`` (the presets that back off at the first overflow) and ``scaler_hysteresis.py``
(Megatron's, DeepSpeed's and fairseq's rules) each say what their reference rule expects after
a step (``compare``).  This class builds your scaler, steps it and its forks with the same
found_inf flags, and fails when a fork reads differently from yours: a state_dict round trip
must continue identically.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

from tinyamp.testing.counterexamples import blamed, flags_in_words, number


def read(scaler: Any, name: str, kind: type) -> Any:
    """``scaler.name`` as `kind`: an attribute, or a method that returns the value (``scale()``)."""
    value = getattr(scaler, name)
    return kind(value() if callable(value) else value)


def settings_in_words(settings: dict[str, Any]) -> str:
    """init_scale=65536, growth_factor=2, ..., consecutive_hysteresis=True (numbers as ``number`` writes them)."""
    return ", ".join(f"{k}={repr(v) if v is None or isinstance(v, bool) else number(v)}" for k, v in settings.items())


class ScalerAndForks(RuleBasedStateMachine):
    """Your scaler (``yours``), the flags it has been given, and the forks restored from its state_dict().

    A subclass writes ``compare`` and calls ``start``, ``step`` and ``restore_a_fork`` from its rules.
    """

    def start(self, make_scaler: Callable[..., Any], names: list[str], settings: dict[str, Any]) -> tuple[Any, ...]:
        """Build your scaler, ``make_scaler(**settings)``; returns the `names` it reads before any step
        (``"scale"``, then the counter compared, if any)."""
        self.make_scaler, self.names, self.settings = make_scaler, names, settings
        self.queued: list[Any] = []  # steps a scaler in another process has taken ahead (``take_ahead``)
        self.flags: list[bool] = []
        self.forks: list[tuple[Any, int]] = []  # (restored scaler, len(flags) when it was restored)
        with blamed(f"make_scaler(**{settings}) or reading its {' and '.join(self.names)}"):
            self.yours = self.make_scaler(**settings)
            return self.values(self.yours)

    def values(self, scaler: Any) -> tuple[Any, ...]:
        return tuple(read(scaler, name, float if name == "scale" else int) for name in self.names)

    def when(self) -> str:
        return "before any step" if not self.flags else f"after {flags_in_words(self.flags)}"

    def step(self, found_inf: bool) -> None:
        """``update(found_inf)`` on your scaler and its forks; then yours against the rule, the forks against yours."""
        n = len(self.flags)  # the flags before this step, put in words only if it fails (a run has thousands)
        self.flags.append(found_inf)
        reading = " and ".join(self.names)
        with blamed(lambda: f"after {flags_in_words(self.flags[:n])}, update({found_inf}) or reading {reading}"):
            if not self.queued:
                self.take_ahead([found_inf])
            if self.queued:  # taken in the scaler's own process: what it read there, in the same order
                row = self.queued.pop(0)
                if isinstance(row, tuple):
                    raise row[1]
                before, raw, raw_forks = row
                before, values = float(before), self.converted(raw)
                forks = [(self.converted(r), at) for r, (_, at) in zip(raw_forks, self.forks)]
            else:
                before = read(self.yours, "scale", float)
                self.yours.update(found_inf)
                values = self.values(self.yours)
                forks = []
                for fork, at in self.forks:
                    fork.update(found_inf)
                    forks.append((self.values(fork), at))
        self.compare(values, found_inf, before)
        for restored, at in forks:
            self.compare_fork(restored, values, at)

    def converted(self, raw: list[Any]) -> tuple[Any, ...]:
        return tuple((float if name == "scale" else int)(value) for name, value in zip(self.names, raw))

    def take_ahead(self, flags: list[bool]) -> None:
        """When your scaler lives in another process (``tinyamp exercises check`` grades it in the student's), step
        it and its forks through `flags` there in one message, keeping what each step read (``step`` takes them in
        order; an exception is kept as ``(phase, exception)``, and ends the run there).  Here, nothing."""
        from tinyamp.exercises.remote import harness, is_remote

        if not is_remote(self.yours):
            return
        flat, error = harness(self.yours, "scaler_steps", [self.yours] + [f for f, _ in self.forks], flags,
                              [str.__str__(n) for n in self.names])  # fmt: skip
        k, forks = len(self.names), len(self.forks)
        stride = 1 + k * (1 + forks)  # one row per step: your scale before, then each scaler's names
        self.queued = [[flat[i], flat[i + 1 : i + 1 + k], [flat[i + 1 + k * j : i + 1 + k * (j + 1)]
                                                          for j in range(1, forks + 1)]]
                       for i in range(0, len(flat) - stride + 1, stride)]  # fmt: skip
        if error is not None:
            from tinyamp.exercises.remote import rebuilt

            self.queued.append((error[0], rebuilt(error[1])))

    def compare(self, values: tuple[Any, ...], found_inf: bool | None, before: float) -> None:
        """Your scaler's `values` against the reference rule's (``found_inf`` None: before any step)."""
        raise NotImplementedError

    def failure(self, wrong: list[str], law: str) -> AssertionError:
        """When, what your scaler reads wrong, the law that breaks ("" where none is named), and the settings."""
        law = f": {law}" if law else ""
        return AssertionError(
            f"{self.when()} {' and '.join(wrong)}{law} (settings: {settings_in_words(self.settings)})"
        )

    def restore_a_fork(self) -> None:
        """A new scaler loaded from your state_dict(): it must read as yours does, now and after every later step."""
        with blamed(lambda: f"after {flags_in_words(self.flags)}, state_dict() and load_state_dict()"):
            saved = copy.deepcopy(self.yours.state_dict())
            fork = self.make_scaler(**self.settings)
            fork.load_state_dict(saved)
            restored, yours = self.values(fork), self.values(self.yours)
        self.forks.append((fork, len(self.flags)))
        self.compare_fork(restored, yours, len(self.flags))

    def compare_fork(self, restored: tuple[Any, ...], yours: tuple[Any, ...], at: int) -> None:
        for name, r, y in zip(self.names, restored, yours):
            if not r == y:
                since = self.flags[at:]
                then = f" and then {flags_in_words(since)}" if since else ""
                raise AssertionError(
                    f"a scaler restored from your state_dict() after {flags_in_words(self.flags[:at])}{then} "
                    f"has {name} {number(r)}, yours has {number(y)}: a state_dict round trip must "
                    f"continue identically (settings: {settings_in_words(self.settings)})"
                )
