"""Looking inside a training step: what the graph holds, and where values overflow."""

from tinyamp.inspect.overflow import OverflowEvent, find_overflow
from tinyamp.inspect.saved import SavedTensor, SavedTensorsReport, saved_tensors

__all__ = ["saved_tensors", "SavedTensorsReport", "SavedTensor", "find_overflow", "OverflowEvent"]
