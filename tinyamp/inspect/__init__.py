"""Looking inside a training step: what the graph holds, where values overflow, and pictures of both.

The ``draw_*`` functions return a matplotlib Figure; matplotlib is imported only when one is drawn.
"""

from tinyamp.inspect.draw_graph import draw_graph, to_dot
from tinyamp.inspect.draw_scaler import draw_scaler_states, scaler_state_machine
from tinyamp.inspect.draw_step import draw_mixed_precision_step, draw_step_record, record_step
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
    "draw_scaler_states",
    "scaler_state_machine",
    "draw_mixed_precision_step",
    "record_step",
    "draw_step_record",
    "draw_graph",
    "to_dot",
]
