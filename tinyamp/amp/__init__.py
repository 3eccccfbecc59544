"""Mixed precision, in the open: formats, the autocast op policy, and (soon) scaling."""

from tinyamp.amp import formats, policy
from tinyamp.amp.autocast import CastRecord, autocast, is_autocast_enabled
from tinyamp.amp.policy import DEFAULT_POLICY, format_policy

__all__ = ["formats", "policy", "autocast", "is_autocast_enabled", "CastRecord", "DEFAULT_POLICY", "format_policy"]
