"""Counterexamples in words: how tinyamp.testing's checks say what went wrong.

Every check runs a hypothesis property; when it fails, hypothesis shrinks the input to the
simplest one that still fails and raises that example's AssertionError again.  The
sentence in it is written here, from the shrunk input: "after 3 clean steps and 1
overflow your scale is 2048, the rule says 1024", not a dump of arrays.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import hypothesis
import numpy as np
from hypothesis import HealthCheck, Phase, settings

Check = Callable[..., Any]
F = TypeVar("F", bound=Callable[..., Any])

# the frames a failure report leaves out: tinyamp.testing's own, hypothesis's (the machinery that found the
# counterexample) and contextlib's (blamed's __exit__); the caller's test and the code under test stay
MACHINERY = tuple(
    str(Path(f).resolve()) for f in (Path(__file__).parent, Path(hypothesis.__file__).parent, contextlib.__file__)
)

_SAME_EXAMPLES: contextvars.ContextVar[bool | None] = contextvars.ContextVar("same_examples", default=None)


@contextmanager
def same_examples_every_run(on: bool = True) -> Iterator[None]:
    """Inside this block every check draws the same examples on every run (hypothesis's derandomize).

    For grading: the same code gets the same verdict each time it is checked, with the same
    versions of Python, hypothesis and tinyamp.  With `on=False` every run draws new random
    examples, whatever the loaded profile says (``--deep``).  Outside any block the loaded
    hypothesis profile decides; note that hypothesis's own "ci" profile, which it loads when it
    sees a CI service's environment variables (CI, GITHUB_ACTIONS, ...), derandomizes.
    """
    token = _SAME_EXAMPLES.set(on)
    try:
        yield
    finally:
        _SAME_EXAMPLES.reset(token)


def check_settings(max_examples: int | None = None, **overrides: Any) -> settings:
    """The hypothesis settings of a check: the loaded profile's, with `max_examples` if given.

    No deadline (a student's first version may be slow, and a slow example is not a wrong
    one), and one failure reported: the simplest, the one a student reads first.  No
    "explain" phase: the sentence explains, and that phase replays the example hundreds of times.
    """
    if max_examples is not None:
        overrides["max_examples"] = max_examples
    same = _SAME_EXAMPLES.get()
    if same is not None:
        overrides.setdefault("derandomize", same)
    if same:
        overrides.setdefault("database", None)  # nothing replayed from an earlier run either
    overrides.setdefault("phases", [p for p in Phase if p != Phase.explain])
    return settings(
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        **overrides,
    )


def reported_at_the_call(check: F) -> F:
    """Make a check's AssertionError read, in pytest and in a plain traceback, as the user's failure.

    The report keeps the message (the values and the rule they break), hypothesis's falsifying
    example, the line of the user's test that called the check and any frame of the code under
    test; it drops the frames of tinyamp.testing and hypothesis that found the counterexample,
    here and in the exceptions chained to it (``blamed``'s cause).  The wrapper's own frame sets
    ``__tracebackhide__``, which pytest honours.
    """

    @functools.wraps(check)
    def reported(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841  (read by pytest from the frame)
        try:
            return check(*args, **kwargs)
        except AssertionError as exc:
            seen: set[int] = set()
            chained: BaseException | None = exc
            while chained is not None and id(chained) not in seen:  # the cause a blamed() call chained, and so on
                seen.add(id(chained))
                chained.with_traceback(without_machinery(chained.__traceback__))
                chained = chained.__cause__ or chained.__context__
            raise exc  # from this frame, which pytest hides: the report starts at the caller's line

    return reported  # type: ignore[return-value]


def without_machinery(tb: types.TracebackType | None) -> types.TracebackType | None:
    """`tb` without the frames of tinyamp.testing and hypothesis (see MACHINERY)."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(MACHINERY):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for frame in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return rebuilt


def number(x: Any) -> str:
    """A float as a student reads it: 2048, 0.5, 2^-14, 2^-149, inf; exact (repr) otherwise.

    A power of two is written 2^k (as the tutorials write the formats' limits and ulps)
    unless it is one of 0.125 ... 2^24, which read as well in decimal.
    """
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x) or x == 0:
        return ("-" if math.copysign(1.0, x) < 0 else "") + ("inf" if math.isinf(x) else "0")
    mantissa, exponent = math.frexp(abs(x))
    sign = "-" if x < 0 else ""
    if mantissa == 0.5 and not -3 <= exponent - 1 <= 24:
        return f"{sign}2^{exponent - 1}"
    if x.is_integer() and abs(x) < 2**53:
        return str(int(x))
    return repr(x)


def binade_in_words(x: Any, significand_bits: int = 11, min_normal_exponent: int = -14) -> str:
    """Where a nonzero finite value sits on its format's grid (float16 by default), with the ulp there:
    "in [2^15, 2^16), where float16's values are 2^5 apart"; "a subnormal (below 2^-14), ... 2^-24 apart"."""
    name = {11: "float16", 8: "bfloat16", 24: "float32"}.get(significand_bits, "the format")
    x = abs(float(x))
    k = math.frexp(x)[1] - 1
    if k < min_normal_exponent:
        ulp = min_normal_exponent - significand_bits + 1
        return f"a subnormal (below 2^{min_normal_exponent}), where {name}'s values are 2^{ulp} apart"
    return f"in [2^{k}, 2^{k + 1}), where {name}'s values are 2^{k - significand_bits + 1} apart"


def flags_in_words(flags: list[bool]) -> str:
    """A found_inf sequence as runs: "3 clean steps and 1 overflow", "1 overflow, 2 clean steps and 1 overflow"."""
    if not flags:
        return "no step"
    runs: list[list[Any]] = []
    for flag in flags:
        if runs and runs[-1][0] == flag:
            runs[-1][1] += 1
        else:
            runs.append([flag, 1])
    parts = [f"{n} {'overflow' if flag else 'clean step'}{'s' if n > 1 else ''}" for flag, n in runs]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def array_in_words(a: Any, name: str = "x") -> str:
    """`name` = its values (up to 12 of them, exact), with the shape and dtype when they matter."""
    a = np.asarray(a)
    if a.ndim == 0:
        return f"{name} = {number(a)} ({a.dtype})"
    values = np.array2string(a.ravel()[:12], separator=", ", floatmode="unique", max_line_width=10_000)
    more = f" ... ({a.size} values)" if a.size > 12 else ""
    return f"{name} = {values}{more} (shape {a.shape}, {a.dtype})"


@contextmanager
def blamed(what: str | Callable[[], str]) -> Iterator[None]:
    """Run the code under test: an exception other than NotImplementedError becomes an AssertionError
    that says `what` raised it (a string, or a function that writes one from the state when it
    failed), so that hypothesis shrinks it and the check reports it in words.

    NotImplementedError passes through unchanged: a stub that is not written yet is "not started".
    (A check raises its own AssertionError outside this block.)
    """
    try:
        yield
    except NotImplementedError:
        raise
    except Exception as exc:  # any bug in the code under test is a counterexample
        raise AssertionError(f"{what if isinstance(what, str) else what()} raised {type(exc).__name__}: {exc}") from exc


def call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` under ``blamed(what)``."""
    with blamed(what):
        return fn(*args, **kwargs)
