"""Looking inside a step: the saved-tensors report and the overflow locator.

The report's headline fact is an integer identity: under autocast (or with float16
parameters) the graph of an MLP holds exactly half the bytes of the FP32 graph.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import mlp_sizes

import tinyamp as ta
from tinyamp import autograd
from tinyamp.amp import autocast
from tinyamp.inspect import OverflowEvent, SavedTensor, find_overflow, saved_tensors
from tinyamp.nn import module as nn_module

pytestmark = pytest.mark.memory

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def batch(rows: int, features: int, dtype: np.dtype = F32, seed: int = 0) -> ta.Tensor:
    return ta.tensor(np.random.default_rng(seed).uniform(-1, 1, (rows, features)).astype(dtype))


@pytest.fixture(autouse=True)
def no_hooks_leak():
    """Every test starts and ends with no inspection hooks installed."""
    assert autograd.hooks == [] and nn_module.running_module_stacks == []
    yield
    assert autograd.hooks == [] and nn_module.running_module_stacks == []


# ---- saved tensors -----------------------------------------------------------------------------------
def test_the_report_lists_every_saved_array_of_an_mlp() -> None:
    ta.manual_seed(0)
    model = ta.nn.MLP([8, 16, 16, 4])
    report = saved_tensors(model(batch(5, 8)))
    assert report.rows == [
        SavedTensor("Linear", 0, (5, 8), "float32", 160, "leaf", None),  # the input batch
        SavedTensor("Linear", 1, (16, 8), "float32", 512, "leaf", None),  # the weight
        SavedTensor("ReLU", 0, (5, 16), "float32", 320, "activation", None),
        SavedTensor("Linear", 0, (5, 16), "float32", 320, "activation", 2),  # ReLU's output again
        SavedTensor("Linear", 1, (16, 16), "float32", 1024, "leaf", None),
        SavedTensor("ReLU", 0, (5, 16), "float32", 320, "activation", None),
        SavedTensor("Linear", 0, (5, 16), "float32", 320, "activation", 5),
        SavedTensor("Linear", 1, (4, 16), "float32", 256, "leaf", None),
    ]
    assert report.total_bytes == 160 + 512 + 320 + 1024 + 320 + 256  # each shared array once
    assert report.bytes_by_kind() == {"leaf": 160 + 512 + 1024 + 256, "activation": 640}
    assert report.bytes_by_dtype() == {"float32": report.total_bytes}


def test_under_autocast_the_rows_are_float16_copies_and_activations() -> None:
    ta.manual_seed(0)
    model = ta.nn.MLP([8, 16, 16, 4])
    with autocast():
        report = saved_tensors(model(batch(5, 8)))
    assert [(r.op, r.dtype, r.kind, r.shared_with) for r in report.rows] == [
        ("Linear", "float16", "cast", None),  # the input's float16 copy
        ("Linear", "float16", "cast", None),  # the weight's
        ("ReLU", "float16", "activation", None),
        ("Linear", "float16", "activation", 2),
        ("Linear", "float16", "cast", None),
        ("ReLU", "float16", "activation", None),
        ("Linear", "float16", "activation", 5),
        ("Linear", "float16", "cast", None),
    ]
    assert all(r.nbytes == 2 * math.prod(r.shape) for r in report.rows)


@given(sizes=mlp_sizes(), rows=st.integers(1, 5))
def test_autocast_and_float16_parameters_halve_the_saved_bytes_exactly(sizes: list[int], rows: int) -> None:
    ta.manual_seed(0)
    model = ta.nn.MLP(sizes)
    x = batch(rows, sizes[0])
    fp32 = saved_tensors(model(x))
    with autocast():
        amp = saved_tensors(model(x))
    model.half()
    fp16 = saved_tensors(model(x.half()))
    assert fp32.total_bytes == 2 * amp.total_bytes
    assert fp32.total_bytes == 2 * fp16.total_bytes
    assert set(amp.bytes_by_dtype()) == set(fp16.bytes_by_dtype()) == {"float16"}
    assert [r.shape for r in amp.rows] == [r.shape for r in fp16.rows] == [r.shape for r in fp32.rows]
    for report in (fp32, amp, fp16):
        assert sum(report.bytes_by_dtype().values()) == report.total_bytes
        assert sum(report.bytes_by_kind().values()) == report.total_bytes
        assert report.total_bytes == sum(r.nbytes for r in report.rows if r.shared_with is None)


def test_an_array_kept_by_two_nodes_is_counted_once() -> None:
    x = ta.tensor(np.ones((2, 3), F32), requires_grad=True)
    y = x.exp()  # Exp keeps its output ...
    z = y * y  # ... and Mul keeps its two inputs: the same array three times
    report = saved_tensors(z)
    exp_row = next(i for i, r in enumerate(report.rows) if r.op == "Exp")
    shared = [r for r in report.rows if r.shared_with == exp_row]
    assert len(shared) == 2 and all(r.op == "Mul" for r in shared)
    assert report.total_bytes == 24  # one (2, 3) float32 array
    assert sum(r.nbytes for r in report.rows) == 3 * 24


def test_the_report_prints_as_a_table() -> None:
    ta.manual_seed(0)
    model = ta.nn.MLP([3, 4, 2])
    report = saved_tensors(model(batch(2, 3)))
    lines = str(report).splitlines()
    assert lines[0].split() == ["op", "#", "shape", "dtype", "bytes", "kind"]
    assert len(lines) == 1 + len(report.rows) + 1
    assert "(same array as row 2)" in lines[4]
    assert lines[-1] == f"total {report.total_bytes:,} bytes (float32 {report.total_bytes:,})"


def test_after_backward_the_graph_holds_nothing() -> None:
    model = ta.nn.MLP([3, 4, 2])
    loss = model(batch(2, 3)).sum()
    assert saved_tensors(loss).total_bytes > 0
    loss.backward()
    assert saved_tensors(loss).rows == []


# ---- find_overflow -----------------------------------------------------------------------------------
def exploding_model() -> ta.nn.Module:
    """Sequential(Linear(4, 4), MLP([4, 8, 3])): the MLP's first layer, "1.0", overflows float16.

    Inputs of 10 pass layer "0" (an identity) unchanged; layer "1.0" sums 4 x 10 x 2000 = 80000.
    """
    model = ta.nn.Sequential(ta.nn.Linear(4, 4), ta.nn.MLP([4, 8, 3]))
    first, exploding = model[0], model[1][0]
    first.weight.data[...] = np.eye(4, dtype=F32)
    first.bias.data[...] = 0
    exploding.weight.data[...] = 2000.0
    exploding.bias.data[...] = 0
    return model


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_a_float16_forward_overflow_is_reported_with_the_dotted_module_name() -> None:
    model = exploding_model()
    assert dict(model.named_modules())["1.0"] is model[1][0]
    x = ta.tensor(np.full((2, 4), 10.0, F32))
    with find_overflow(model) as found:
        with autocast():
            ta.cross_entropy(model(x), np.array([0, 1]))
    first = found.first
    assert isinstance(first, OverflowEvent) and first is found.events[0]
    assert (first.direction, first.op, first.module) == ("forward", "Linear", "1.0")
    assert first.dtype == "float16" and first.shape == (2, 8) and first.count == 16
    assert math.isinf(first.value)
    assert "forward of Linear in module '1.0'" in str(first)


def test_a_float32_value_beyond_65504_is_reported_as_a_future_float16_overflow() -> None:
    model = exploding_model()
    with find_overflow(model) as found:
        model(ta.tensor(np.full((2, 4), 10.0, F32)))
    assert (found.first.direction, found.first.op, found.first.module) == ("forward", "Linear", "1.0")
    assert found.first.dtype == "float32" and found.first.value == 80000.0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_a_backward_overflow_is_reported_with_direction_backward() -> None:
    # Forward: logits 4 x 100 x 0.01 = 4, loss ~1.1, times a loss scale of 2^14 ~ 18000 < 65504.
    # Backward: dL/dW = g^T x with g ~ 2^14 / 2 / 2 and x = 100: far beyond 65504.
    layer = ta.nn.Linear(4, 3)
    layer.weight.data[...] = 0.01
    layer.bias.data[...] = 0
    model = ta.nn.Sequential(layer)
    with find_overflow(model) as found:
        with autocast():
            loss = ta.cross_entropy(model(ta.tensor(np.full((2, 4), 100.0, F32))), np.array([0, 1]))
        (loss * 2.0**14).backward()
    assert all(e.direction == "backward" for e in found.events)
    first = found.first
    assert (first.direction, first.op, first.module) == ("backward", "Linear", "0")
    assert first.dtype == "float16" and first.shape == (3, 4)
    assert math.isinf(first.value)
    assert model[0].weight.grad is not None and np.isinf(model[0].weight.grad).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_nan_counts_as_out_of_range() -> None:
    model = ta.nn.MLP([4, 3])
    x = np.ones((2, 4), F32)
    x[1, 2] = np.nan
    with find_overflow(model) as found:
        model(ta.tensor(x))
    assert (found.first.op, found.first.direction, found.first.module) == ("Linear", "forward", "0")
    assert found.first.count == 3  # the NaN row of the output
    assert math.isnan(found.first.value)


def test_a_healthy_step_reports_nothing() -> None:
    model = ta.nn.MLP([4, 5, 3])
    with find_overflow(model) as found:
        with autocast():
            loss = ta.cross_entropy(model(batch(3, 4)), np.array([0, 1, 2]))
        loss.backward()
    assert found.events == [] and found.first is None


def test_without_a_model_the_module_is_none() -> None:
    with find_overflow() as found:
        (ta.tensor([300.0]) * 300.0).sum()
    assert (found.first.op, found.first.module, found.first.value) == ("Mul", None, 90000.0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_raise_on_overflow_stops_at_the_first_event_naming_the_op() -> None:
    model = exploding_model()
    with pytest.raises(OverflowError, match=r"float16.*forward of Linear in module '1\.0'"):
        with find_overflow(model, raise_on_overflow=True) as found:
            with autocast():
                model(ta.tensor(np.full((2, 4), 10.0, F32)))
    assert len(found.events) == 1
    assert autograd.hooks == [] and nn_module.running_module_stacks == []


def test_hooks_are_removed_at_exit_and_after_an_exception() -> None:
    model = ta.nn.MLP([4, 3])
    with find_overflow(model) as found:
        assert autograd.hooks == [found._check]
        assert len(nn_module.running_module_stacks) == 1
    assert autograd.hooks == [] and nn_module.running_module_stacks == []
    with pytest.raises(RuntimeError, match="boom"):
        with find_overflow(model):
            model(batch(2, 4))
            raise RuntimeError("boom")
    assert autograd.hooks == [] and nn_module.running_module_stacks == []


def test_nothing_is_checked_outside_the_block() -> None:
    model = exploding_model()
    with find_overflow(model) as found:
        pass
    model(ta.tensor(np.full((2, 4), 10.0, F32)))
    assert found.events == []
