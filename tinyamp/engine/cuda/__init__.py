"""The engine room, GPU side: cuBLAS Tensor Core products and fused CUDA kernels, for CuPy arrays.

Not on the reading path.  Importing this package never imports CuPy; each function answers
for ``tinyamp.kernels`` only for CuPy arrays (``device.on_gpu``) and returns ``NotImplemented``
otherwise, so on a CPU the reference runs.  The CuPy kernels repeat the reference's float32
arithmetic one IEEE instruction at a time (``exact_float32.PREAMBLE``), so they give its bits.

* ``gemm``: FP16 x FP16 -> FP32 products as single cuBLAS GemmEx calls, bias fused; sums of
  rows (bias gradients) as products by a row of ones;
* ``unscale``: unscaling and sums of squares in one pass each, in many blocks;
* ``fused_ops``: ReLU, GELU, softmax, layer norm and cross-entropy, each forward and backward
  pass in one kernel (or a few, for their row reductions);
* ``scaler_step``: a whole loss-scaler step with the skip decided on the device, over the
  fused master-weight updates of ``master_update``;
* ``range_check``: range checks of labels and indices answered at the step's one read.
"""

from __future__ import annotations

from tinyamp.engine.cuda import fused_ops, gemm, range_check, scaler_step, unscale

IMPLEMENTATIONS = {
    "product": gemm.product,
    "sum_rows": gemm.sum_rows,
    "multiply_and_sum_squares_": unscale.multiply_and_sum_squares_,
    "sum_of_squares": unscale.sum_of_squares,
    "scaled_step": scaler_step.scaled_step,
    "relu": fused_ops.relu,
    "relu_backward": fused_ops.relu_backward,
    "gelu": fused_ops.gelu,
    "gelu_backward": fused_ops.gelu_backward,
    "softmax": fused_ops.softmax,
    "softmax_backward": fused_ops.softmax_backward,
    "layer_norm": fused_ops.layer_norm,
    "layer_norm_backward": fused_ops.layer_norm_backward,
    "cross_entropy": fused_ops.cross_entropy,
    "cross_entropy_backward": fused_ops.cross_entropy_backward,
    "check_in_range": range_check.check_in_range,
}
# tinyamp/__init__.py registers them behind tinyamp.kernels

__all__ = ["IMPLEMENTATIONS"]
