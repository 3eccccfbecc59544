"""Looking inside a training step: what the graph holds, and where values overflow."""

from tinyamp.inspect.memory import format_training_memory, peak_memory, training_memory
from tinyamp.inspect.overflow import OverflowEvent, find_overflow
from tinyamp.inspect.saved import SavedTensor, SavedTensorsReport, saved_tensors

__all__ = [
    "training_memory",
    "format_training_memory",
    "peak_memory",
    "saved_tensors",
    "SavedTensorsReport",
    "SavedTensor",
    "find_overflow",
    "OverflowEvent",
]
