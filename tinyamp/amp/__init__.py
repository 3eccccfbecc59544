"""Mixed precision, in the open.

* ``formats``: FP16/BF16/FP32 facts as data, rounding and classification helpers;
* ``autocast`` and ``policy`` (``tinyamp.autocast``, ``tinyamp.policy``): which ops run in
  FP16 and which stay in FP32;
* ``MasterWeights``: FP32 master copies updated by the optimizer, rounded to FP16
  (``lost_updates``: the rule they exist for);
* ``LossScaler``: the loss-scaling state machine (``loss_scale``: the rule and its states),
  with published presets;
* ``save_checkpoint``/``load_checkpoint``: a whole training run in one file.
"""

from tinyamp import policy
from tinyamp.amp import formats
from tinyamp.amp.hysteresis import HysteresisEvent, HysteresisScaler, LossScaleFloorError
from tinyamp.amp.loss_scale import ScaleEvent, ScaleRule
from tinyamp.amp.lost_updates import UpdateRecord, lost_updates
from tinyamp.amp.master import MasterWeights
from tinyamp.amp.master_state import MasterWeightsStateError
from tinyamp.amp.presets import CLASSIC_PRESETS, HYSTERESIS_PRESETS, PRESETS, presets_table
from tinyamp.amp.scaler import LossScaler, ScalerOrderError, StepReport
from tinyamp.amp.scaler_checks import ScalerStateError
from tinyamp.amp.training_state import CheckpointError, load_checkpoint, save_checkpoint
from tinyamp.autocast import CastRecord, autocast, is_autocast_enabled
from tinyamp.policy import DEFAULT_POLICY, format_policy

__all__ = [
    "formats", "policy", "autocast", "is_autocast_enabled", "CastRecord", "DEFAULT_POLICY", "format_policy",
    "MasterWeights", "MasterWeightsStateError", "UpdateRecord", "lost_updates",
    "LossScaler", "ScaleEvent", "ScaleRule", "StepReport", "ScalerOrderError", "ScalerStateError",
    "PRESETS", "CLASSIC_PRESETS", "HYSTERESIS_PRESETS", "presets_table",
    "HysteresisScaler", "HysteresisEvent", "LossScaleFloorError",
    "save_checkpoint", "load_checkpoint", "CheckpointError",
]  # fmt: skip
