"""Moved to ``tinyamp.engine.cuda``: this name stays, with a DeprecationWarning, for one release."""

from tinyamp.engine import keep_old_name

keep_old_name(__name__, "cuda")
