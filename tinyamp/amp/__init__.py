"""Mixed precision, in the open.

* ``formats``: FP16/BF16/FP32 facts as data, rounding and classification helpers;
* ``autocast`` and ``policy``: which ops run in FP16 and which stay in FP32;
* ``MasterWeights``: FP32 master copies updated by the optimizer, rounded to FP16;
* ``LossScaler``: the loss-scaling state machine, with published presets;
* ``save_checkpoint``/``load_checkpoint``: a whole training run in one file.
"""

from tinyamp.amp import formats, policy
from tinyamp.amp.autocast import CastRecord, autocast, is_autocast_enabled
from tinyamp.amp.master import MasterWeights
from tinyamp.amp.policy import DEFAULT_POLICY, format_policy
from tinyamp.amp.presets import PRESETS, presets_table
from tinyamp.amp.scaler import LossScaler, ScaleEvent, ScalerOrderError, StepReport
from tinyamp.amp.training_state import CheckpointError, load_checkpoint, save_checkpoint

__all__ = [
    "formats", "policy", "autocast", "is_autocast_enabled", "CastRecord", "DEFAULT_POLICY", "format_policy",
    "MasterWeights", "LossScaler", "ScaleEvent", "StepReport", "ScalerOrderError", "PRESETS", "presets_table",
    "save_checkpoint", "load_checkpoint", "CheckpointError",
]  # fmt: skip
