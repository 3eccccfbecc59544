"""Switching graph recording off and on: ``no_grad()`` and ``enable_grad()``.

Inside ``no_grad()`` an operation records no node and saves nothing for backward: the
mode for evaluation and for optimizer updates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_grad_enabled = True


def is_grad_enabled() -> bool:
    """True unless inside a ``no_grad()`` block."""
    return _grad_enabled


class _GradMode:
    """Context manager (and decorator) that switches graph recording on or off."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._previous: list[bool] = []

    def __enter__(self) -> None:
        global _grad_enabled
        self._previous.append(_grad_enabled)
        _grad_enabled = self.enabled

    def __exit__(self, *exc: object) -> None:
        global _grad_enabled
        _grad_enabled = self._previous.pop()

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _GradMode(self.enabled):
                return fn(*args, **kwargs)

        return wrapper


def no_grad() -> _GradMode:
    """Record no graph inside the block (evaluation, optimizer updates): nothing is saved for backward.

    ``with tinyamp.no_grad(): logits = model(x)``
    """
    return _GradMode(False)


def enable_grad() -> _GradMode:
    """Record the graph again inside a ``no_grad()`` block."""
    return _GradMode(True)
