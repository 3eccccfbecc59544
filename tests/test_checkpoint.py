"""Activation checkpointing: same gradients, bit for bit, from fewer saved bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import depth_and_segment

import tinyamp as ta
from tinyamp import nn
from tinyamp.amp import autocast
from tinyamp.backend import to_device
from tinyamp.inspect import saved_tensors

pytestmark = pytest.mark.memory

WIDTH, BATCH = 8, 3


def make_blocks(depth: int, dropout: float) -> list[nn.Module]:
    ta.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(depth):
        layers: list[nn.Module] = [nn.Linear(WIDTH, WIDTH), nn.GELU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        blocks.append(nn.Sequential(*layers))
    return blocks


def gradients(blocks: list[nn.Module], x: ta.Tensor, every: int | None, half: bool) -> list[np.ndarray]:
    params = [p for b in blocks for p in b.parameters()]
    for p in params + [x]:
        p.grad = None
    ta.manual_seed(123)  # the dropout masks of this step
    with autocast(enabled=half):
        h = nn.Sequential(*blocks)(x) if every is None else ta.checkpoint_sequential(blocks, every, x)
        loss = (h.float() * h.float()).mean()
    loss.backward()
    return [x.grad] + [p.grad for p in params]


@settings(max_examples=15)
@given(shape=depth_and_segment(), dropout=st.sampled_from([0.0, 0.3]), half=st.booleans())
def test_checkpointed_gradients_equal_the_plain_ones_bit_for_bit(
    shape: tuple[int, int], dropout: float, half: bool
) -> None:
    depth, every = shape
    blocks = make_blocks(depth, dropout)
    x = ta.tensor(np.random.default_rng(depth).standard_normal((BATCH, WIDTH)), dtype="float32", requires_grad=True)
    plain = gradients(blocks, x, None, half)
    checked = gradients(blocks, x, every, half)
    for a, b in zip(plain, checked):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_checkpointing_replays_dropout_masks_on_every_device(device: str) -> None:
    """The replayed segments draw the same dropout masks on the CPU and on the GPU."""
    blocks = [b.to(device) for b in make_blocks(4, 0.5)]
    data = np.random.default_rng(1).standard_normal((BATCH, WIDTH))
    x = ta.tensor(data, dtype="float32", device=device, requires_grad=True)
    plain = gradients(blocks, x, None, False)
    checked = gradients(blocks, x, 2, False)
    no_dropout = gradients([b.to(device) for b in make_blocks(4, 0.0)], x, None, False)
    assert not np.array_equal(to_device(plain[0], "cpu"), to_device(no_dropout[0], "cpu"))  # masks did act
    for a, b in zip(plain, checked):
        np.testing.assert_array_equal(to_device(a, "cpu"), to_device(b, "cpu"))


def test_parameters_get_gradients_when_the_input_needs_none() -> None:
    blocks = make_blocks(3, 0.0)
    x = ta.tensor(np.ones((BATCH, WIDTH), np.float32))  # data: no gradient wanted
    out = ta.checkpoint_sequential(blocks, 2, x)
    assert out.requires_grad
    out.sum().backward()
    assert all(p.grad is not None for b in blocks for p in b.parameters())


def test_a_checkpointed_graph_keeps_only_the_segment_inputs() -> None:
    # Linear+ReLU blocks, batch 3, width 8, float32 (one activation: 96 bytes).  Without
    # checkpointing, Linear keeps its input and its weight, ReLU its output (the next
    # Linear's input: one array, counted once): 8 blocks keep 9 activations plus 8 weights.
    # Checkpointing every 2 blocks keeps only the 4 segment inputs.
    ta.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(8)]
    x = ta.tensor(np.ones((BATCH, WIDTH), np.float32))
    row = BATCH * WIDTH * 4
    plain = saved_tensors(nn.Sequential(*blocks)(x)).bytes_by_kind()
    checked = saved_tensors(ta.checkpoint_sequential(blocks, 2, x)).bytes_by_kind()
    assert plain["activation"] + plain["leaf"] == 9 * row + 8 * WIDTH * WIDTH * 4
    assert checked.get("activation", 0) + checked.get("leaf", 0) == 4 * row


def test_checkpoint_under_no_grad_is_a_plain_call() -> None:
    blocks = make_blocks(2, 0.0)
    x = ta.tensor(np.ones((BATCH, WIDTH), np.float32), requires_grad=True)
    with ta.no_grad():
        out = ta.checkpoint(nn.Sequential(*blocks), x)
    assert out.creator is None and not out.requires_grad


def test_the_random_state_after_a_checkpointed_step_is_the_plain_one() -> None:
    blocks = make_blocks(2, 0.5)
    x = ta.tensor(np.ones((BATCH, WIDTH), np.float32), requires_grad=True)
    ta.manual_seed(7)
    nn.Sequential(*blocks)(x).sum().backward()
    after_plain = ta.random.generator().random()
    ta.manual_seed(7)
    ta.checkpoint_sequential(blocks, 1, x).sum().backward()  # the replay must not consume draws
    assert ta.random.generator().random() == after_plain


def test_bad_arguments_are_clear_errors() -> None:
    x = ta.tensor(np.ones((2, 2), np.float32), requires_grad=True)
    with pytest.raises(TypeError, match="argument 0 is a ndarray"):
        ta.checkpoint(lambda a: a, np.ones(2))
    with pytest.raises(TypeError, match="returned a tuple"):
        ta.checkpoint(lambda a: (a, a), x)
    with pytest.raises(ValueError, match="every must be at least 1; got 0"):
        ta.checkpoint_sequential([lambda a: a], 0, x)
