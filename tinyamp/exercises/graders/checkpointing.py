"""Grader of Exercise 7.1 (checkpoint_segment): the same gradients, bit for bit, and less memory held."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tinyamp.autocast import autocast
from tinyamp.exercises.remote import HARNESSES, harness
from tinyamp.ops import linear
from tinyamp.tensor import Tensor
from tinyamp.testing.counterexamples import blamed, check_settings, number

Checkpoint = Callable[..., Tensor]
MEMORY_CASE = dict(depth=8, width=128, batch=256)  # float32 activations of 128 KiB: far above allocator noise


def blocks(weights: list[tuple[Tensor, Tensor]]) -> Callable[[Tensor], Tensor]:
    """The segment: tanh(linear(h)) per (weight, bias) pair."""

    def segment(h: Tensor) -> Tensor:
        for w, b in weights:
            h = linear(h, w, b).tanh()
        return h

    return segment


@st.composite
def segment_cases(draw: Any) -> dict[str, Any]:
    """A segment of 1 to 4 blocks of width 1 to 4 on a batch of 1 to 3 rows, float32 or float16, run outside
    autocast or inside autocast("float16") or autocast("bfloat16"); maybe W0 used outside it too; maybe two
    forward and backward passes, whose gradients add up in .grad (gradient accumulation)."""
    depth, width, batch = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    values = st.floats(-1.0, 1.0, width=16)  # float16 values, exact in float32 too
    return dict(
        x=draw(hnp.arrays(dtype, (batch, width), elements=values)),
        weights=[draw(hnp.arrays(dtype, (width, width), elements=values)) for _ in range(depth)],
        biases=[draw(hnp.arrays(dtype, (width,), elements=values)) for _ in range(depth)],
        x_requires_grad=draw(st.booleans()),
        w0_outside=draw(st.booleans()),
        twice=draw(st.booleans()),
        autocast=draw(st.sampled_from([None, "float16", "bfloat16"])),
    )


def fixed_case(dtype: Any, under: str | None) -> dict[str, Any]:
    """Two blocks of width 2 on 2 rows of `dtype`, inside autocast(`under`) or outside it."""
    x = np.array([[0.5, -0.25], [1.0, 0.75]], dtype)
    w = np.array([[0.5, -1.0], [0.25, 0.125]], dtype)
    return dict(x=x, weights=[w, w.T.copy()], biases=[np.array([0.125, -0.5], dtype)] * 2, x_requires_grad=True,
                w0_outside=False, twice=False, autocast=under)  # fmt: skip


# After the drawn cases, every time: the two ways mixed precision runs a segment (float32 weights under autocast,
# and float16 weights without it), which a recompute in float32, or outside the forward's autocast, gets wrong.
FIXED_CASES = (fixed_case(np.float32, "float16"), fixed_case(np.float16, None), fixed_case(np.float32, "bfloat16"))


def run(case: dict[str, Any], checkpoint_segment: Checkpoint | None) -> tuple[Any, dict[str, Any]]:
    """Forward and backward, plain (None) or through `checkpoint_segment`; the output and every gradient."""
    x = Tensor(case["x"], requires_grad=case["x_requires_grad"])
    pairs = [(Tensor(w, requires_grad=True), Tensor(b, requires_grad=True)) for w, b in zip(case["weights"],
                                                                                         case["biases"])]  # fmt: skip
    params = [t for pair in pairs for t in pair]
    segment = blocks(pairs)
    for _ in range(2 if case["twice"] else 1):  # the second backward finds every .grad already holding one
        with autocast(case["autocast"]) if case["autocast"] else nullcontext():
            out = segment(x) if checkpoint_segment is None else checkpoint_segment(segment, x, params)
            loss = (out * 0.75).sum()
            if case["w0_outside"]:  # W0 also used outside the segment: its two gradients meet
                loss = loss + (pairs[0][0] * 0.5).sum()
        loss.backward()  # after the autocast block has ended, as in a training step
    grads = {"x": x.grad} if case["x_requires_grad"] else {}
    for i, (w, b) in enumerate(pairs):
        grads[f"W{i}"], grads[f"b{i}"] = w.grad, b.grad
    return out.data, grads


def _describe(case: dict[str, Any]) -> str:
    depth, (batch, width), dtype = len(case["weights"]), case["x"].shape, case["x"].dtype
    extra = ", W0 also used outside the segment" if case["w0_outside"] else ""
    extra += ", two forward and backward passes (the gradients add up in .grad)" if case["twice"] else ""
    if case["autocast"]:
        extra += f", the forward inside autocast({case['autocast']!r}) and backward after it"
    return (f"for {depth} block{'s' if depth > 1 else ''} tanh(linear(h)) of width {width} on x of shape "
            f"({batch}, {width}), {dtype} x and parameters, x requiring grad: {case['x_requires_grad']}"
            f"{extra}")  # fmt: skip


def _first_difference(yours: Any, plain: Any) -> str:
    if yours is None or plain is None:
        return f"is {'None' if yours is None else 'an array'}, expected {'None' if plain is None else 'an array'}"
    yours, plain = np.asarray(yours), np.asarray(plain)
    if yours.shape != plain.shape or yours.dtype != plain.dtype:
        return f"has shape {yours.shape} and dtype {yours.dtype}, expected {plain.shape} and {plain.dtype}"
    bits = f"u{plain.dtype.itemsize}"  # bit for bit, in the array's own width
    wrong = np.flatnonzero(yours.reshape(-1).view(bits) != plain.reshape(-1).view(bits))
    if wrong.size == 0:
        return ""
    i = np.unravel_index(int(wrong[0]), plain.shape)
    return f"[{', '.join(map(str, i))}] is {number(yours[i])}, expected {number(plain[i])}"


def held_after_forward(forward: Callable[[], Tensor]) -> int:
    """Bytes allocated by `forward` and still held once it returned (its output kept alive while measuring)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = forward()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del out
    return held


def memory_held(checkpoint_segment: Checkpoint | None) -> int:
    """Bytes the big MEMORY_CASE segment holds after its forward, plain (None) or checkpointed."""
    depth, width, batch = (MEMORY_CASE[k] for k in ("depth", "width", "batch"))
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((batch, width)).astype(np.float32), requires_grad=True)
    pairs = [(Tensor(rng.standard_normal((width, width)).astype(np.float32) / width**0.5, requires_grad=True),
              Tensor(np.zeros(width, np.float32), requires_grad=True)) for _ in range(depth)]  # fmt: skip
    params, segment = [t for pair in pairs for t in pair], blocks(pairs)
    if checkpoint_segment is None:
        return held_after_forward(lambda: segment(x))
    return held_after_forward(lambda: checkpoint_segment(segment, x, params))


def same_as_the_plain_segment(checkpoint_segment: Checkpoint, case: dict[str, Any]) -> None:
    """AssertionError in words unless output and gradients equal the plain segment's, bit for bit."""
    plain_out, plain = run(case, None)
    with blamed(lambda: f"{_describe(case)}: your checkpoint_segment, its forward or its backward"):
        out, yours = harness(checkpoint_segment, "checkpoint_run", case)  # in the student's process
    difference = _first_difference(out, plain_out)
    if difference:
        raise AssertionError(f"{_describe(case)}: your output {difference} (the segment's own output)")
    for name, g in plain.items():
        difference = _first_difference(yours[name], g)
        if difference:
            raise AssertionError(f"{_describe(case)}: the gradient of {name} {difference}, as backpropagating "
                                 "through the segment itself gives: the recomputation must repeat the forward in "
                                 "its dtypes and under its autocast policy")  # fmt: skip


def grade_checkpoint_segment(checkpoint_segment: Checkpoint, examples: int) -> None:
    """Output and every gradient bit for bit equal to the plain segment's; at most half its memory held."""

    @check_settings(examples)
    @given(case=segment_cases())
    def same_output_same_gradients(case: dict[str, Any]) -> None:
        same_as_the_plain_segment(checkpoint_segment, case)

    same_output_same_gradients()
    for case in FIXED_CASES:  # after the drawn cases, so that their messages come first
        same_as_the_plain_segment(checkpoint_segment, case)
    plain = memory_held(None)
    with blamed("on the memory case, your checkpoint_segment"):
        yours = harness(checkpoint_segment, "checkpoint_memory")
    if yours > plain / 2:
        depth, width, batch = (MEMORY_CASE[k] for k in ("depth", "width", "batch"))
        raise AssertionError(
            f"with {depth} blocks of width {width} on a batch of {batch} (float32), your forward leaves "
            f"{yours / 2**20:.2f} MiB held until backward, the plain segment {plain / 2**20:.2f} MiB: a checkpointed "
            "segment keeps only its input, and computes the activations again in backward"
        )


# ---- harnesses: the segment is built and run in the student's process, its output and gradients compared here ----
def checkpoint_run(checkpoint_segment: Callable[..., Any], case: dict[str, Any]) -> Any:
    """7.1: forward and backward through the student's checkpoint_segment (graders.checkpointing.run)."""
    return run(case, checkpoint_segment)


def checkpoint_memory(checkpoint_segment: Callable[..., Any]) -> int:
    """7.1: the bytes the big segment holds after a forward through the student's checkpoint_segment.

    Measured in the student's process, by tracemalloc there: the one number a grader takes on the word of
    that process (the gradients are compared with the grader's own)."""
    return int(memory_held(checkpoint_segment))


HARNESSES.update(checkpoint_run=checkpoint_run, checkpoint_memory=checkpoint_memory)
