"""Property tests of mixed precision that anyone can point at their own code.

    from tinyamp.testing import check_scaler

    def test_my_scaler_follows_pytorchs_rule():
        check_scaler(lambda **settings: MyScaler(**settings), reference="pytorch")

Each check is a hypothesis property with tinyamp's own implementation (or the format's
rounding) as the reference; a failure raises AssertionError with the shortest
counterexample hypothesis finds, in words: "after 3 clean steps and 1 overflow your
scale is 2048, the pytorch rule says 1024".  The report (pytest's, or a plain traceback)
starts at your call of the check and shows the values, the rule they break and your own
line where your code raised, not the frames of tinyamp.testing and hypothesis that found
them (``counterexamples.reported_at_the_call``).

* ``check_scaler(make_scaler, reference=...)``: a loss-scale rule, step by step, against a preset
  (PyTorch's own ``torch.amp.GradScaler`` through ``tinyamp.testing.pytorch.GradScalerAdapter``;
  ``reference="megatron" | "deepspeed" | "fairseq"``: a hysteresis rule, with the library's settings);
* ``check_rounding(fn, fmt)``: float32 -> FP16 or BF16, bit for bit, on every FP16 pattern and more;
* ``check_backward(fn)``: a backward against float64 finite differences on drawn shapes;
* ``check_skip(step_fn)``: an overflowed step changes no weight and no optimizer moment;
* ``check_master_step(step_fn)``: the update in FP32, the round back, lost updates counted;
* ``check_delayed_scaling(make_scaling)``: an FP8 delayed-scaling recipe (amax history, margin,
  the held and clamped scales), step by step, against tinyamp's rule;
* ``strategies``: the hypothesis strategies tinyamp's own tests use.

Needs hypothesis (``pip install hypothesis``); ``import tinyamp`` alone never imports it.
"""

try:
    import hypothesis  # noqa: F401  (checked here, so the error says what to install)
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("tinyamp.testing needs hypothesis: pip install hypothesis, or 'tinyamp[test]'") from None

from tinyamp.testing import strategies
from tinyamp.testing.backward import check_backward
from tinyamp.testing.delayed_scaling import check_delayed_scaling
from tinyamp.testing.master_step import check_master_step
from tinyamp.testing.rounding import check_rounding
from tinyamp.testing.scaler import check_scaler
from tinyamp.testing.skip import check_skip

__all__ = [
    "check_scaler", "check_rounding", "check_backward", "check_skip", "check_master_step", "check_delayed_scaling",
    "strategies",
]  # fmt: skip
