"""Eight bits: FP8 training's numerics on NumPy, every scale inspectable (no FP8 GPU needed).

The chapter, in reading order (``CHAPTER``; at most 400 lines, each mechanism on one screen):

* ``formats``: E4M3, E5M2 and FP4's E2M1 rounded by hand with saturation, one byte a value;
  E8M0 power-of-two scales;
* ``scaling``: the per-tensor scale rule, current and delayed scaling (an amax history), and
  each tensor's state machine: its scale, history, and what every cast saturated or flushed;
* ``products``: FP8 x FP8 products, exact, summed in FP32 and scaled back; a narrow
  accumulator and the promotion to FP32 that repairs long sums.

Beside it, read next: ``blocks`` (block scaling: MXFP8, MXFP4, NVFP4 and DeepSeek-V3's tiles,
a scale per block of 16 to 128 x 128 values), a module of its own with a budget of its own
(at most 150 lines), since the chapter had 17 of its 400 lines left.
Around them, off the reading path: ``seam`` (the chapter's casts and product through
``tinyamp.kernels``, where the engine room answers with the same bits, faster: what the rest
calls), ``scales`` (a model's tensors by name, a format per pass),
``scaling_checks`` (the refusals of bad settings and damaged states), ``tables``, and
``training`` with ``training_state``: training with FP8 Linear products (``tinyamp train
--precision fp8``, ``fp8-current`` or ``mxfp8``) and its scales in a checkpoint.
``ml_dtypes`` is never needed: the tests use it as the reference the hand-written casts meet.
"""

from tinyamp.fp8.blocks import SCHEMES as BLOCK_SCHEMES
from tinyamp.fp8.blocks import BlockTensor
from tinyamp.fp8.blocks import quantize as quantize_blocks
from tinyamp.fp8.formats import E2M1, E4M3, E5M2, FORMATS, Minifloat, decode, decode_e8m0, encode, encode_e8m0
from tinyamp.fp8.products import fp8_matmul
from tinyamp.fp8.scales import Fp8Scales
from tinyamp.fp8.scaling import CastEvent, Fp8Tensor, ScalingRecipe, TensorScaling, next_scale

CHAPTER = ("tinyamp/fp8/formats.py", "tinyamp/fp8/scaling.py", "tinyamp/fp8/products.py")
BLOCKS = "tinyamp/fp8/blocks.py"  # beside the chapter, at most 150 lines

__all__ = [
    "E4M3", "E5M2", "E2M1", "FORMATS", "Minifloat", "encode", "decode", "encode_e8m0", "decode_e8m0",
    "ScalingRecipe", "TensorScaling", "CastEvent", "Fp8Tensor", "next_scale", "Fp8Scales", "fp8_matmul", "CHAPTER",
    "BlockTensor", "BLOCK_SCHEMES", "quantize_blocks", "BLOCKS",
]  # fmt: skip
