"""tinyamp's optional extras (pyproject.toml's ``[project.optional-dependencies]``), and the pip line that adds one.

The command line names this line wherever something optional is missing: ``tinyamp info`` and
the figures of a run (``plots``), a GPU (``cuda12``), ``tinyamp exercises check`` (``exercises``).
"""

from __future__ import annotations

from pathlib import Path


def install_hint(extras: str) -> str:
    """The pip line that adds tinyamp's optional `extras` ("plots", "cuda12"), in the form that fits this copy.

    A source checkout (run from it, or installed with ``pip install -e .``) has its
    pyproject.toml beside the package and needs ``pip install -e ".[plots]"``; an installed
    wheel has none, and ``pip install 'tinyamp[plots]'`` is what adds the extra to it.
    """
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        checkout = 'name = "tinyamp"' in pyproject.read_text(encoding="utf-8")
    except OSError:
        checkout = False
    return f'pip install -e ".[{extras}]"' if checkout else f"pip install 'tinyamp[{extras}]'"
