"""What the exercise tests share: the catalog's ids, and each exercise's stub, solution and grader."""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tinyamp.exercises import holes
from tinyamp.exercises.catalog import EXERCISES, find

ROOT = Path(__file__).resolve().parents[1]
IDS = [e.id for e in EXERCISES]


def module_of(kind: str, module: str) -> Any:
    """graders/<module>.py of the package, or the reference solution (tests/exercise_solutions/, not in the package)."""
    if kind == "solutions":
        return importlib.import_module(f"exercise_solutions.{module}")
    return importlib.import_module(f"tinyamp.exercises.{kind}.{module}")


@functools.cache
def stub_module(module: str) -> types.ModuleType:
    """The stub a workspace gets (``holes.stub``), run as a module."""
    stub = types.ModuleType(f"myamp.{module}")
    exec(compile(holes.stub(module), f"myamp/{module}.py", "exec"), stub.__dict__)  # noqa: S102
    return stub


def solution(exercise_id: str) -> Any:
    e = find(exercise_id)
    return getattr(module_of("solutions", e.module), e.name)


def grader(exercise_id: str) -> Callable[[Any, int], None]:
    e = find(exercise_id)
    return getattr(module_of("graders", e.module), e.grader)
