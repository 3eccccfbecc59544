"""The exercises, as data: what each asks for, where it lives in a workspace, which tutorial teaches it.

A workspace (``tinyamp exercises init DIR``) holds the package ``myamp``: one module per
tutorial, each with the stubs of its exercises.  Exercise 5.1 is the class
``DynamicLossScaler`` in ``myamp/loss_scaling.py``, graded by
``tinyamp/exercises/graders/loss_scaling.py``'s ``grade_dynamic_loss_scaler``; its pytest
marker is ``ex5_1``.  Nothing here imports hypothesis: the command builds its parser from this table.

``Exercise.tutorial`` is the one list of what to read before each exercise: ``exercises list``
and the workspace's README print it, ``exercises --help`` its short form ``read_first``, and the
copies in README.md and the syllabus's lab table are checked against them
(tests/test_exercises_catalog.py), as the stubs' "Read:" paragraphs are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PACKAGE = "myamp"  # the student's package in a workspace: "my automatic mixed precision"


@dataclass(frozen=True)
class Exercise:
    """One exercise: its id (the pytest marker), the name the student writes, its grader and its tutorial."""

    id: str  # "ex5_1": the pytest marker and the value of --only
    number: str  # "5.1": the tutorial's number, then the exercise's
    title: str
    module: str  # myamp/<module>.py; tinyamp/exercises/{stubs,graders}/<module>.py, tests/exercise_solutions/
    name: str  # the function or class the student writes, and the grader checks
    grader: str  # the function in graders/<module>.py
    tutorial: str  # the tutorial file and the sections to read
    examples: int  # hypothesis examples per property in a normal check; --deep runs DEEP times as many
    forbidden: tuple[str, ...] = ()  # tinyamp's own implementations of the mechanism, which the stub must not use
    no_float16_casts: bool = False  # the point is to round by hand: no astype(float16), np.float16(x), dtype=float16
    no_float8_casts: bool = False  # the same for FP8: no ml_dtypes' float8 types, by name or by dtype string
    by_hand: str = "do the rounding yourself (build the bits and .view(np.float16) them)"  # what to do instead
    points: int = 1  # what passing it is worth in --json and --format gradescope (failed or not started: 0)
    # the time a student should expect for writing it, once the reading is done: an estimate for planning a lab
    # (from the reference solution's size and the traps its grader sets), not a measurement
    minutes: int = field(kw_only=True)

    @property
    def path(self) -> str:
        """The stub's file, relative to the workspace."""
        return f"{PACKAGE}/{self.module}.py"

    @property
    def read_first(self) -> str:
        """`tutorial` in short, as the lists print it: "tutorial 5, sections 1, 2 and 4" (no file names, no titles)."""
        short = re.sub(r"tutorials/(\d\d)_\w+\.py", lambda m: f"tutorial {int(m[1])}", self.tutorial)
        return re.sub(r" \([^()]*\)", "", re.sub(r"tutorials/(A\d)_\w+\.py", r"appendix \1", short))

    @property
    def first_steps(self) -> str:
        """What to do for an exercise not started: the stub to write, the tutorial to read."""
        return f"write {self.name} in {self.path}; read {self.tutorial} first (then about {self.minutes} minutes)"


DEEP = 10

T1 = "tutorials/01_number_formats.py"
T2 = "tutorials/02_autograd_from_the_inside.py"
T4 = "tutorials/04_fp32_master_weights.py"
T5 = "tutorials/05_loss_scaling.py"
T6 = "tutorials/06_the_op_policy.py"
T7 = "tutorials/07_memory_and_checkpointing.py"
T9 = "tutorials/09_mixed_precision_across_processes.py"
T10 = "tutorials/10_eight_bits.py"
A1 = "tutorials/A1_inside_the_converters.py"
FP8_OWN = ("tinyamp.fp8", "tinyamp.testing", "tinyamp.exercises", "ml_dtypes")  # tinyamp's FP8 and the reference casts

EXERCISES: tuple[Exercise, ...] = (
    Exercise("ex1_1", "1.1", "float32 to float16 with one float32 addition", "formats", "round_to_float16",
             "grade_round_to_float16", f"{T1}, section 3; {A1}, sections 2 and 3 (FP32 to FP16 with one addition)", 60,
             ("tinyamp.rounding", "tinyamp.kernels", "tinyamp.engine.fast", "tinyamp.fast", "tinyamp.amp.formats"),
             no_float16_casts=True, minutes=30),
    Exercise("ex1_2", "1.2", "the ulp of a float16 value", "formats", "float16_ulp", "grade_float16_ulp",
             f"{T1}, section 5 (The ulp, and the additions that are lost)", 300, ("tinyamp.amp.formats",), minutes=10),
    Exercise("ex1_3", "1.3", "FP16 x FP16 -> FP32 products, rounded once", "formats", "fp16_matmul",
             "grade_fp16_matmul", f"{T1}, sections 6 and 7 (A product of two FP16 numbers is exact in FP32; Sums)",
             200, ("tinyamp.kernels", "tinyamp.ops", "tinyamp.engine.fast", "tinyamp.engine.cuda", "tinyamp.fast",
                   "tinyamp.cuda", "tinyamp.matmul", "tinyamp.linear"), minutes=10),
    Exercise("ex2_1", "2.1", "the backward of softmax", "backward", "softmax_backward", "grade_softmax_backward",
             f"{T2}, sections 3, 4 and 6; {T6}, section 2 (exp and softmax)", 60,
             ("tinyamp.ops", "tinyamp.softmax"), minutes=15),
    Exercise("ex2_2", "2.2", "the backward of log_softmax", "backward", "log_softmax_backward",
             "grade_log_softmax_backward", f"{T2}, sections 4 and 6; {T6}, section 3 (log, and the loss)", 60,
             ("tinyamp.ops", "tinyamp.log_softmax"), minutes=10),
    Exercise("ex2_3", "2.3", "the backward of layer_norm", "backward", "layer_norm_backward",
             "grade_layer_norm_backward", f"{T2}, sections 4 and 6; {T6}, section 5 (Layer norm)", 60,
             ("tinyamp.ops", "tinyamp.layer_norm"), minutes=25),
    Exercise("ex4_1", "4.1", "is an update lost? both directions", "master_weights", "update_is_lost",
             "grade_update_is_lost", f"{T1}, section 5; {T4}, section 1 (The 2048x rule, exactly)", 400,
             ("tinyamp.amp.lost_updates", "tinyamp.amp.formats", "tinyamp.kernels"),
             no_float16_casts=True,
             by_hand="decide it with the gaps between float16 values, not by rounding (w's last mantissa bit is the "
                     "parity of the integer |w| / ulp(w))", minutes=25),
    Exercise("ex4_2", "4.2", "the master-weight step, lost updates counted", "master_weights", "master_step",
             "grade_master_step", f"{T4}, sections 2 and 3 (Master weights on one weight, on the MLP)", 100,
             ("tinyamp.amp", "tinyamp.optim", "tinyamp.kernels"), minutes=15),
    Exercise("ex5_1", "5.1", "the dynamic loss-scale rule (pytorch, jmp)", "loss_scaling", "DynamicLossScaler",
             "grade_dynamic_loss_scaler", f"{T5}, sections 3 and 5 (The dynamic scaler; The published rules)", 60,
             ("tinyamp.amp",), minutes=30),
    Exercise("ex5_2", "5.2", "the overflow-skipping step", "loss_scaling", "skip_or_step", "grade_skip_or_step",
             f"{T5}, sections 1 (its paragraph on unscaling), 2 and 4 (Static loss scaling; A real run)",
             100, ("tinyamp.amp", "tinyamp.kernels"), minutes=20),
    Exercise("ex5_3", "5.3", "the exactness law: unscale(scale(g)) == g", "loss_scaling", "scaling_is_exact",
             "grade_scaling_is_exact", f"{T5}, section 1 (Gradients that FP16 cannot hold)", 200, ("tinyamp.amp",),
             minutes=10),
    Exercise("ex5_4", "5.4", "hysteresis: the overflows Megatron tolerates", "loss_scaling",
             "HysteresisLossScaler", "grade_hysteresis_loss_scaler", f"{T5}, sections 7 and 3 (Tolerating one "
             "overflow; The dynamic scaler)", 60, ("tinyamp.amp",), minutes=20),
    Exercise("ex6_1", "6.1", "the autocast decision for an op", "op_policy", "autocast_dtypes",
             "grade_autocast_dtypes", f"{T6}, sections 1 and 7 (The table; Overriding one entry)", 200,
             ("tinyamp.autocast", "tinyamp.amp.autocast"), minutes=15),
    Exercise("ex7_1", "7.1", "checkpointing: same gradients, lower peak", "checkpointing",
             "checkpoint_segment", "grade_checkpoint_segment", f"{T7}, section 3 (Checkpointing: keep less, compute "
             "again)", 40, ("tinyamp.checkpoint", "tinyamp.checkpoint_sequential", "tinyamp.recompute"), minutes=25),
    Exercise("ex9_1", "9.1", "the mean gradient of N ranks, in rank order", "data_parallel",
             "mean_gradient", "grade_mean_gradient", f"{T9}, section 1 (The sum across ranks, and its dtype)", 200,
             ("tinyamp.distributed",), minutes=20),
    Exercise("ex10_1", "10.1", "E4M3 by hand: saturate, round to nearest even", "eight_bits", "round_to_e4m3",
             "grade_round_to_e4m3", f"{T10}, section 1 (FP8's range against a real gradient's); "
             f"tinyamp/fp8/formats.py's docstring; {T1}, section 3 (if ties are new to you)", 100,
             FP8_OWN + ("tinyamp.rounding", "tinyamp.kernels"), no_float8_casts=True,
             by_hand="round by hand (the gaps between E4M3 values, then the bit fields), not with ml_dtypes' cast",
             minutes=40),
    Exercise("ex10_2", "10.2", "the delayed-scaling update of an FP8 scale", "eight_bits",
             "DelayedScaling", "grade_delayed_scaling", f"{T10}, section 3 (Delayed against current scaling, and "
             "one spike); the table at the top of tinyamp/fp8/scaling.py", 60, FP8_OWN, minutes=30),
    Exercise("ex10_3", "10.3", "an MX block's shared scale, as E8M0 bytes", "eight_bits", "mx_block_scales",
             "grade_mx_block_scales", f"{T10}, section 4 (Block scaling: a scale for every 32 values); "
             "tinyamp/fp8/blocks.py's docstring, \"The shared exponent\"", 100, FP8_OWN,
             minutes=25),
)  # fmt: skip

BY_ID = {e.id: e for e in EXERCISES}


def find(name: str) -> Exercise:
    """The exercise called "ex5_1", "5.1" or "5_1"; KeyError with the list of ids otherwise."""
    key = name.strip().lower().removeprefix("ex").replace(".", "_")
    exercise = BY_ID.get(f"ex{key}")
    if exercise is None:
        raise KeyError(f"no exercise {name!r}; the exercises are {', '.join(e.number for e in EXERCISES)}")
    return exercise
