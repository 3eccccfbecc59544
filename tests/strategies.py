"""The shared hypothesis strategies of tinyamp's tests: they live in ``tinyamp.testing.strategies``
(installed, so that anyone can draw the same inputs); this module re-exports them for ``from strategies import``."""

from tinyamp.testing.strategies import *  # noqa: F403
from tinyamp.testing.strategies import __all__  # noqa: F401
