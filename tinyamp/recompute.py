"""Activation recomputation ("activation checkpointing"): keep a segment's inputs, recompute the rest.

The functions keep PyTorch's names (``torch.utils.checkpoint``); the module is named for what
it does, because in tinyamp a checkpoint is a file on disk (``amp/checkpoint_file.py``).

A network of n blocks normally keeps every block's activations for backward: memory
grows linearly with depth.  ``checkpoint(fn, *args)`` runs a segment and keeps only its
inputs (and the parameters it read); during backward it runs the segment again, with
the same autocast policy and the same random state (so dropout draws the same masks),
and backpropagates through the recomputed graph.  Checkpointing every sqrt(n) blocks
keeps about sqrt(n) segment inputs plus one segment's activations at a time: memory
grows like sqrt(n), for one extra forward pass of compute.

The gradients are the same bits as without checkpointing: the recomputation repeats the
same operations on the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tinyamp import autocast, autograd, random
from tinyamp.function import Function
from tinyamp.grad_mode import enable_grad, is_grad_enabled
from tinyamp.tensor import Tensor


def _leaf_copy(t: Tensor) -> Tensor:
    """A new leaf on the same array: the segment's input, cut off from the outer graph."""
    copy = Tensor._make(t.data, False, None)
    if t.requires_grad:
        copy.requires_grad = True
    return copy


def _parameters_read(out: Tensor, inputs: Sequence[Tensor]) -> list[Tensor]:
    """The leaves that need grad in the graph of `out`, other than the segment's inputs."""
    own = {id(t) for t in inputs}
    found: dict[int, Tensor] = {}
    for fn in autograd.walk(out):
        for t in fn.inputs:
            if t.is_leaf and t.requires_grad and id(t) not in own:
                found.setdefault(id(t), t)
    return list(found.values())


class Checkpoint(Function):
    """Forward: run the segment and drop its graph.  Backward: run it again, then backprop."""

    def forward(self, *arrays: Any, segment: Callable[..., Tensor], n_inputs: int, context: dict[str, Any]) -> Any:
        # The forward already ran (in checkpoint()) to find the parameters; only the output
        # and what is needed to replay the segment are kept.
        self.segment = segment
        self.n_inputs = n_inputs
        self.context = context
        self.save_for_backward(*arrays[:n_inputs])
        return context.pop("output")

    def backward(self, g: Any) -> tuple[Any, ...]:
        inputs = [Tensor._make(a, False, None) for a in self.saved]
        for t, needs in zip(inputs, self.needs_input_grad):
            t.requires_grad = needs
        params = self.inputs[self.n_inputs :]
        stashed = [p.grad for p in params]
        for p in params:
            p.grad = None
        current_rng = random.get_state()
        try:
            random.set_state(self.context["rng"])
            with enable_grad(), self.context["autocast"]:  # the forward's policy, whatever is active now
                out = self.segment(*inputs)
        finally:
            random.set_state(current_rng)
        try:
            out.backward(g)
            grads = [t.grad for t in inputs] + [p.grad for p in params]
        finally:
            for p, grad in zip(params, stashed):
                p.grad = grad
        return tuple(grads)


def checkpoint(segment: Callable[..., Tensor], *args: Tensor) -> Tensor:
    """``segment(*args)``, keeping only `args` (and the parameters it reads) for backward.

    `segment` must return one Tensor and be deterministic given its inputs, the random
    state and the autocast policy (all three are replayed).  Returns the same values
    as ``segment(*args)``; gradients are bit-identical to the unchecked ones.
    """
    if not callable(segment):
        raise TypeError(f"checkpoint: the segment {segment!r} ({type(segment).__name__}) is not a function; pass "
                        "the function to recompute first, then its Tensors: checkpoint(block, x)")  # fmt: skip
    for i, a in enumerate(args):
        if not isinstance(a, Tensor):
            raise TypeError(f"checkpoint: argument {i} is a {type(a).__name__}; pass Tensors (close over the rest)")
    if not is_grad_enabled():
        return segment(*args)
    context: dict[str, Any] = {"rng": random.get_state(), "autocast": _replay_of(autocast.current())}
    inputs = [_leaf_copy(a) for a in args]
    out = segment(*inputs)
    if not isinstance(out, Tensor):
        raise TypeError(f"checkpoint: the segment returned a {type(out).__name__}; it must return one Tensor")
    params = _parameters_read(out, inputs) if out.requires_grad else []
    context["output"] = out.data
    del out  # drop the segment's graph: its activations are freed here
    return Checkpoint.apply(*args, *params, segment=segment, n_inputs=len(args), context=context)


def _replay_of(active: autocast.autocast | None) -> autocast.autocast:
    """A fresh autocast block with the same dtype and policy (and no cast log) for the replay;
    a disabled one when the segment ran outside autocast."""
    if active is None:
        return autocast.autocast(enabled=False)
    return autocast.autocast(active.dtype, policy=dict(active.policy))


def checkpoint_sequential(blocks: Sequence[Callable[[Tensor], Tensor]], every: int, x: Tensor) -> Tensor:
    """Run `blocks` in order on `x`, checkpointing each run of `every` consecutive blocks.

    With n blocks, ``every = round(sqrt(n))`` keeps about sqrt(n) segment inputs.
    """
    blocks = list(blocks)
    wrong = next((i for i, b in enumerate(blocks) if not callable(b)), None)
    if wrong is not None:
        raise TypeError(f"checkpoint_sequential: block {wrong} is {blocks[wrong]!r} ({type(blocks[wrong]).__name__}), "
                        "not a function; pass a list of Modules or functions of one Tensor")  # fmt: skip
    if every < 1:
        raise ValueError(f"checkpoint_sequential: every must be at least 1; got {every}")

    def run(chunk: list[Callable[[Tensor], Tensor]]) -> Callable[[Tensor], Tensor]:
        def segment(h: Tensor) -> Tensor:
            for block in chunk:
                h = block(h)
            return h

        return segment

    for start in range(0, len(blocks), every):
        x = checkpoint(run(blocks[start : start + every]), x)
    return x
