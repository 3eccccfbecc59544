"""The engine room: the same kernels as ``tinyamp.kernels``, faster on a CPU (``fast``) or on a GPU (``cuda``).

Not on the reading path, and nothing on it imports this package: ``tinyamp/__init__.py``
registers each package's ``IMPLEMENTATIONS`` behind ``tinyamp.kernels``, the one seam, and
``TINYAMP_ENGINE_ROOM=off`` leaves the references alone.  The engine room imports that seam
and the modules it rests on (``backend``, ``dtypes``, ``rounding``), and ``tinyamp.optim``
for the fused optimizer updates whose arithmetic it repeats; never the rest of the course or
the tools (tests/test_layering.py checks both directions).
"""

import importlib
import pkgutil
import sys
import warnings


def keep_old_name(old: str, package: str) -> None:
    """Make the module `old` (``tinyamp.fast``, ``tinyamp.cuda``) be ``tinyamp.engine.<package>``, submodules
    included (the same module objects, not second copies), with a DeprecationWarning; for one release."""
    moved = importlib.import_module(f"{__name__}.{package}")
    warnings.warn(f"{old} is now {moved.__name__} (the engine room has one folder); the old name goes in the next "
                  "release", DeprecationWarning, stacklevel=3)  # fmt: skip
    for info in pkgutil.iter_modules(moved.__path__):
        sys.modules[f"{old}.{info.name}"] = importlib.import_module(f"{moved.__name__}.{info.name}")
    sys.modules[old] = moved
