"""Bad input gets an error of the right type whose message names the offending values.

Each ``match=`` is a regex that checks the message names the shapes, dtypes, values or
devices involved, not just that something went wrong.
"""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import tinyamp as ta

pytestmark = pytest.mark.ops


def esc(*parts: object) -> str:
    """A regex that finds str(part) for each part, in order, anywhere in the message."""
    return ".*".join(re.escape(str(p)) for p in parts)


# ---- shapes -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("sa", "sb"), [((2, 3), (4, 5)), ((3,), (2, 2)), ((2, 2, 3), (2,)), ((5,), (4,))])
def test_matmul_with_mismatched_shapes_names_both_shapes(sa: tuple, sb: tuple, device: str) -> None:
    a, b = ta.zeros(sa, device=device), ta.zeros(sb, device=device)
    with pytest.raises(ValueError, match=esc(sa, sb)):
        ta.matmul(a, b)


def test_matmul_batch_axes_that_do_not_broadcast_name_both_shapes(device: str) -> None:
    a, b = ta.zeros((2, 3, 4), device=device), ta.zeros((3, 4, 5), device=device)
    with pytest.raises(ValueError, match=esc((2, 3, 4), (3, 4, 5))):
        a @ b


def test_matmul_of_a_0d_tensor_names_the_shapes() -> None:
    with pytest.raises(ValueError, match=esc((), (3,))):
        ta.matmul(ta.tensor(2.0), ta.zeros(3))


def test_linear_with_the_wrong_input_size_names_input_and_weight(device: str) -> None:
    x, w = ta.zeros((8, 3), device=device), ta.zeros((4, 5), device=device)
    with pytest.raises(ValueError, match=esc((8, 3), (4, 5), "must be 5")):
        ta.linear(x, w)


def test_linear_with_a_bias_of_the_wrong_size_names_it() -> None:
    with pytest.raises(ValueError, match=esc((3,), (4, 5), "(4,)")):
        ta.linear(ta.zeros((2, 5)), ta.zeros((4, 5)), ta.zeros(3))


@pytest.mark.parametrize(("sa", "sb"), [((2, 3), (4,)), ((2, 3), (3, 2)), ((5,), (4, 3))])
def test_broadcasting_failure_names_the_op_and_both_shapes(sa: tuple, sb: tuple, device: str) -> None:
    a, b = ta.zeros(sa, device=device), ta.zeros(sb, device=device)
    with pytest.raises(ValueError, match=esc("Add", sa, sb)):
        a + b
    with pytest.raises(ValueError, match=esc("Mul", sa, sb)):
        a * b


@pytest.mark.parametrize("target", [(4, 2), (5,), (-1, 4), (-1, -1), (0, -1)])
def test_reshape_to_an_incompatible_shape_names_both_shapes(target: tuple, device: str) -> None:
    x = ta.zeros((2, 3), device=device)
    with pytest.raises(ValueError, match=esc((2, 3), "6 elements", target)):
        x.reshape(target)


def test_concatenate_with_mismatched_shapes_names_them() -> None:
    with pytest.raises(ValueError, match=esc((2, 3), (2, 4))):
        ta.concatenate([ta.zeros((2, 3)), ta.zeros((2, 4))], axis=0)


def test_getitem_out_of_range_names_index_and_shape() -> None:
    with pytest.raises(IndexError, match=esc("5", (2, 3))):
        ta.zeros((2, 3))[5]


# ---- backward -------------------------------------------------------------------------------
def test_backward_of_a_non_scalar_without_a_seed_names_the_shape(device: str) -> None:
    y = ta.ones((2, 3), device=device, requires_grad=True) * 2.0
    with pytest.raises(ta.GradientError, match=esc("scalar", "shape (2, 3)")):
        y.backward()


def test_backward_with_a_seed_of_the_wrong_shape_names_both_shapes() -> None:
    y = ta.ones((2, 3), requires_grad=True) * 2.0
    with pytest.raises(ta.GradientError, match=esc((3, 2), (2, 3))):
        y.backward(np.ones((3, 2), dtype=np.float32))


# ---- devices ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: ta.tensor([1.0], device="tpu"),
        lambda: ta.zeros(3, device="tpu"),
        lambda: ta.randn(3, device="tpu"),
        lambda: ta.arange(3, device="tpu"),
    ],
    ids=["tensor", "zeros", "randn", "arange"],
)
def test_unknown_device_names_it_and_the_valid_devices(make) -> None:  # noqa: ANN001
    with pytest.raises(ta.DeviceError, match=r"'tpu'.*cpu.*cuda"):
        make()


@pytest.mark.skipif(ta.cuda_is_available(), reason="this machine has a usable GPU")
@pytest.mark.parametrize(
    "make",
    [
        lambda: ta.tensor([1.0], device="cuda"),
        lambda: ta.zeros(3, device="cuda"),
        lambda: ta.tensor([1.0]).to("cuda"),
        lambda: ta.tensor([1.0]).cuda(),
    ],
    ids=["tensor", "zeros", "to", "cuda"],
)
def test_cuda_without_a_gpu_is_a_device_error(make) -> None:  # noqa: ANN001
    with pytest.raises(ta.DeviceError, match=r"device='cuda'.*device='cpu'"):
        make()


def test_cupy_without_the_cuda_compiler_is_a_device_error_that_names_the_install() -> None:
    """The plain cupy-cuda12x wheel imports and sees the GPU, then fails at the first kernel: say so up front."""
    from types import SimpleNamespace

    from tinyamp.backend import missing_cuda_compiler

    def not_found() -> None:
        raise RuntimeError('Failure finding "libnvrtc.so.13 or libnvrtc.so.12"\n')  # as cuda-pathfinder raises it

    bare = SimpleNamespace(cuda=SimpleNamespace(nvrtc=SimpleNamespace(getVersion=not_found)))
    why = missing_cuda_compiler(bare)
    assert why is not None and "cannot load NVRTC" in why and 'libnvrtc.so.12")' in why  # the newline stripped
    assert "cupy-cuda12x[ctk]" in why and "device='cpu'" in why
    assert (
        missing_cuda_compiler(SimpleNamespace(cuda=SimpleNamespace(nvrtc=SimpleNamespace(getVersion=lambda: (12, 9)))))
        is None
    )
    assert missing_cuda_compiler(SimpleNamespace(cuda=SimpleNamespace())) is None  # nothing to ask


# ---- dtypes -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: ta.tensor([1.0], dtype="complex128"), "complex128"),
        (lambda: ta.tensor(np.array([1 + 2j])), "complex128"),
        (lambda: ta.zeros(3, dtype="complex64"), "complex64"),
        (lambda: ta.tensor([1.0]).astype("complex128"), "complex128"),
        (lambda: ta.tensor(np.array([1, None], dtype=object)), "object"),
        (lambda: ta.tensor(["a", "bc"]), "<U2"),
        (lambda: ta.tensor(np.array(["a", "bc"])), "<U2"),
        (lambda: ta.tensor([1.0], dtype="float17"), "'float17'"),
        (lambda: ta.zeros(2, dtype="quux"), "'quux'"),
    ],
    ids=["complex_name", "complex_array", "complex_zeros", "complex_cast", "object", "str_list", "str_array",
         "unknown_name", "unknown_name_zeros"],
)  # fmt: skip
def test_a_dtype_the_backend_cannot_hold_is_a_type_error_naming_it(make, named: str) -> None:  # noqa: ANN001
    with pytest.raises(TypeError, match=re.escape(named)):
        make()


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_requires_grad_on_a_non_float_tensor_names_the_dtype(dtype: str, device: str) -> None:
    with pytest.raises(TypeError, match=esc("floating-point", dtype)):
        ta.tensor([1, 0], dtype=dtype, device=device, requires_grad=True)
    with pytest.raises(TypeError, match=esc("floating-point", dtype)):
        ta.zeros(2, dtype=dtype, device=device, requires_grad=True)


# ---- cross_entropy labels ------------------------------------------------------------------------
@pytest.mark.parametrize(("labels", "low", "high"), [([0, 5, 1], 0, 5), ([-1, 2, 0], -1, 2), ([7, 9, 8], 7, 9)])
def test_cross_entropy_labels_out_of_range_name_the_range_and_values(labels: list, low: int, high: int) -> None:
    logits = ta.zeros((3, 5), requires_grad=True)
    with pytest.raises(ValueError, match=esc("[0, 5)", f"from {low} to {high}")):
        ta.cross_entropy(logits, labels)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bool"])
def test_cross_entropy_labels_of_a_non_integer_dtype_name_it(dtype: str) -> None:
    with pytest.raises(TypeError, match=esc("integers", dtype)):
        ta.cross_entropy(ta.zeros((2, 4)), ta.tensor([1, 0], dtype=dtype))


@pytest.mark.parametrize("labels_shape", [(3,), (2, 1), ()])
def test_cross_entropy_labels_of_the_wrong_shape_name_both_shapes(labels_shape: tuple) -> None:
    with pytest.raises(ValueError, match=esc((2, 4), "(2,)", labels_shape)):
        ta.cross_entropy(ta.zeros((2, 4)), np.zeros(labels_shape, dtype=np.int64))


def test_cross_entropy_unknown_reduction_is_named() -> None:
    with pytest.raises(ValueError, match="'average'"):
        ta.cross_entropy(ta.zeros((2, 4)), [0, 1], reduction="average")


@pytest.mark.parametrize(("logits_shape", "labels_shape"), [((0, 5), (0,)), ((2, 0, 5), (2, 0)), ((0, 1), (0,))])
def test_cross_entropy_of_an_empty_batch_names_the_shapes_before_any_numpy_warning(
    logits_shape: tuple, labels_shape: tuple, device: str
) -> None:
    """It used to return -0.0 (a perfect loss) and divide by N = 0 in backward; the scaler then counted a clean step."""
    logits = ta.zeros(logits_shape, device=device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would be raised here, and fail the match below
        with pytest.raises(ValueError, match=esc("empty batch", logits_shape, labels_shape, "reduction='sum'")):
            ta.cross_entropy(logits, np.zeros(labels_shape, dtype=np.int64))


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_cross_entropy_sum_or_none_of_an_empty_batch_is_defined_and_warns_nothing(reduction: str) -> None:
    logits = ta.zeros((0, 5), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = ta.cross_entropy(logits, np.zeros(0, dtype=np.int64), reduction=reduction)
        loss.sum().backward()
    assert loss.shape == ((0,) if reduction == "none" else ()) and float(loss.sum().item()) == 0.0
    assert logits.grad.shape == (0, 5)


def test_cross_entropy_with_no_classes_names_the_shape() -> None:
    with pytest.raises(ValueError, match=esc("(0, 0)", "no classes")):
        ta.cross_entropy(ta.zeros((0, 0)), np.zeros(0, dtype=np.int64), reduction="sum")


# ---- embedding ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("idx", "low", "high"), [([0, 4], 0, 4), ([-1, 2], -1, 2), ([[1, 2], [9, -3]], -3, 9)])
def test_embedding_index_out_of_range_names_the_range_and_values(idx: list, low: int, high: int, device: str) -> None:
    table = ta.zeros((4, 2), device=device, requires_grad=True)
    with pytest.raises(IndexError, match=esc("[0, 4)", f"from {low} to {high}")):
        ta.embedding(table, idx).sum().item()  # a GPU answers the check at the first read, here


@pytest.mark.parametrize(("labels", "low", "high"), [([0, 5, 1], 0, 5), ([-1, 2, 0], -1, 2)])
def test_cross_entropy_labels_out_of_range_are_reported_by_the_first_read(
    labels: list, low: int, high: int, device: str
) -> None:
    """At the call on the CPU; on a GPU, which checks without making the host wait, at the first read."""
    logits = ta.zeros((3, 5), device=device, requires_grad=True)
    with pytest.raises(ValueError, match=esc("[0, 5)", f"from {low} to {high}")):
        ta.cross_entropy(logits, ta.tensor(labels, device=device)).item()
    assert ta.cross_entropy(logits, ta.tensor([0, 4, 1], device=device)).item() > 0  # nothing left to raise


def test_embedding_float_indices_name_the_dtype() -> None:
    with pytest.raises(TypeError, match="float32"):
        ta.embedding(ta.zeros((4, 2)), ta.tensor([1.0]))


# ---- dropout -------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1.0, -0.1, 1.5])
def test_dropout_probability_out_of_range_names_it(p: float) -> None:
    with pytest.raises(ValueError, match=esc("[0, 1)", p)):
        ta.dropout(ta.zeros(3), p=p)


# ---- reductions and axes ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0)])
def test_max_of_an_empty_tensor_names_the_shape(shape: tuple) -> None:
    with pytest.raises(ValueError, match=esc("empty", shape)):
        ta.zeros(shape).max()


@pytest.mark.parametrize(
    ("shape", "axis", "axes"), [((0,), None, (0,)), ((0, 3), None, (0, 1)), ((0, 3), 0, (0,)), ((2, 0), -1, (1,))]
)
def test_mean_over_no_elements_names_the_shape_before_any_numpy_warning(
    shape: tuple, axis: int | None, axes: tuple
) -> None:
    x = ta.zeros(shape, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's "Mean of empty slice" would be raised here instead
        expected = esc(f"mean over axes {axes}", shape, "no elements", "is the batch empty?")
        with pytest.raises(ValueError, match=expected):
            x.mean(axis=axis)


def test_mean_over_a_nonempty_axis_of_an_empty_tensor_is_empty() -> None:
    x = ta.zeros((0, 3), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = x.mean(axis=1)
        y.sum().backward()
    assert y.shape == (0,) and x.grad.shape == (0, 3)


@pytest.mark.parametrize("axis", [None, 1])
def test_max_of_a_nan_gives_nan_gradients_without_a_numpy_warning(axis: int | None) -> None:
    x = ta.tensor([[np.nan, 1.0, 2.0], [0.0, 3.0, 3.0]], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the 0/0 of a NaN maximum (no element equals it) used to warn here
        x.max(axis=axis).sum().backward()
    if axis is None:
        assert np.isnan(x.grad).all()
    else:  # the row holding the NaN gets NaN gradients; the other splits its gradient between its two maxima
        assert np.isnan(x.grad[0]).all() and x.grad[1].tolist() == [0.0, 0.5, 0.5]


AXIS_OPS = {
    "sum": lambda x, axis: x.sum(axis=axis),
    "mean": lambda x, axis: x.mean(axis=axis),
    "max": lambda x, axis: x.max(axis=axis),
    "softmax": lambda x, axis: ta.softmax(x, axis=axis),
    "log_softmax": lambda x, axis: ta.log_softmax(x, axis=axis),
    "concatenate": lambda x, axis: ta.concatenate([x, x], axis=axis),
}


@pytest.mark.parametrize("axis", [2, -3, 5])
@pytest.mark.parametrize("op", list(AXIS_OPS))
def test_axis_out_of_range_names_the_axis(op: str, axis: int, device: str) -> None:
    x = ta.zeros((2, 3), device=device)
    with pytest.raises(ValueError, match=esc(f"axis {axis}", "out of range")):
        AXIS_OPS[op](x, axis)


def test_reduction_with_an_axis_tuple_out_of_range_names_the_axis() -> None:
    with pytest.raises(ValueError, match=esc("axis 4", "out of range")):
        ta.zeros((2, 3)).sum(axis=(0, 4))


@pytest.mark.parametrize("axes", [(0, 2), (2, 1), (0, 0), (1,), (0, 1, 2)])
def test_transpose_with_a_bad_permutation_names_the_axes_and_shape(axes: tuple) -> None:
    with pytest.raises(ValueError, match=esc("permutation", (2, 3))):
        ta.zeros((2, 3)).transpose(*axes)


# ---- combining tensors ---------------------------------------------------------------------------
def test_combining_a_tensor_with_an_unsupported_object_names_its_type() -> None:
    with pytest.raises(TypeError, match="str"):
        ta.zeros(2) + "1"


def test_item_of_a_tensor_with_many_elements_names_the_shape() -> None:
    with pytest.raises(ValueError, match=esc("(3,)")):
        ta.zeros(3).item()


# ---- recomputation given something that is not a function ---------------------------------------
def test_checkpoint_given_a_segment_that_is_not_a_function_names_it_and_the_order() -> None:
    """ta.checkpoint(5, x) raised Python's own "'int' object is not callable" from deep inside the call."""
    x = ta.tensor([1.0, 2.0], requires_grad=True)
    says = esc("checkpoint: the segment 5 (int) is not a function", "checkpoint(block, x)")
    with pytest.raises(TypeError, match=says):
        ta.checkpoint(5, x)
    with pytest.raises(TypeError, match=esc("checkpoint: the segment", "(Tensor) is not a function")):
        ta.checkpoint(x, x)  # the arguments swapped
    with pytest.raises(TypeError, match=esc("checkpoint_sequential: block 1 is 5 (int), not a function")):
        ta.checkpoint_sequential([ta.nn.ReLU(), 5], 1, x)
    assert ta.checkpoint(lambda t: t * 2.0, x).numpy().tolist() == [2.0, 4.0]


# ---- tensors made from nothing, and the seed ------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: ta.zeros(-1), ValueError, esc("zeros", ">= 0", "(-1,)")),
        (lambda: ta.ones((2, -3)), ValueError, esc("ones", ">= 0", "(2, -3)")),
        (lambda: ta.randn(-2), ValueError, esc("randn", ">= 0", "(-2,)")),
        (lambda: ta.rand((1, -1)), ValueError, esc("rand", ">= 0", "(1, -1)")),
        (lambda: ta.full(2.5, 0.0), TypeError, esc("full", "tuple of ints", "2.5")),
        (lambda: ta.zeros(True), TypeError, esc("zeros", "tuple of ints", "True")),
        (lambda: ta.arange(0, 5, 0), ValueError, esc("arange", "step of 0")),
        (lambda: ta.arange(0.5), TypeError, esc("arange", "ints", "0.5")),
        (lambda: ta.arange(0, 2**70), ValueError, esc(f"arange(0, {2**70}): {2**70} is beyond int64", "2^63-1")),
        (lambda: ta.arange(0, 10, -(2**64)), ValueError, esc(f"{-(2**64)} is beyond int64")),
        (lambda: ta.arange(0, 2**62), ValueError, esc(f"arange(0, {2**62}): {2**62:,} values of int64 would take",
                                                      "more than an array can address (2^63 - 1 bytes)")),
        (lambda: ta.manual_seed(-1), ValueError, esc("manual_seed", "0 to 2^64 - 1", "-1")),
        (lambda: ta.manual_seed(1.5), ValueError, esc("manual_seed", "1.5")),
        (lambda: ta.manual_seed(2**64), ValueError, esc("manual_seed", str(2**64))),
    ],
)  # fmt: skip
def test_shapes_and_seeds_that_mean_nothing_are_refused_with_the_fix(make, error: type, match: str) -> None:  # noqa: ANN001
    with pytest.raises(error, match=match):
        make()


def test_an_arange_larger_than_memory_says_how_much_it_needs_in_a_child_with_2_gib() -> None:
    """NumPy's MemoryError names a shape and bytes; tinyamp's names the call, the values, the GiB and the fix."""
    code = ("import resource, tinyamp as ta\nresource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))\n"
            "try:\n    ta.arange(0, 2**30)\nexcept MemoryError as e:\n    print(e)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == (f"arange(0, {2**30}): 1,073,741,824 values of int64 need 8.0 GiB, more than could be "
                           "allocated on cpu; pass a shorter range\n")  # fmt: skip


def test_shapes_and_seeds_that_mean_something_are_taken() -> None:
    assert ta.arange(2**63 - 3, 2**63 - 1).numpy().tolist() == [2**63 - 3, 2**63 - 2]  # int64's own end still works
    assert ta.zeros(np.int64(3)).shape == (3,) and ta.ones([2, 0]).shape == (2, 0)
    assert ta.arange(np.int64(4)).numpy().tolist() == [0, 1, 2, 3] and ta.arange(5, 0, -2).numpy().tolist() == [5, 3, 1]
    ta.manual_seed(np.uint64(2**64 - 1))
    ta.manual_seed(0)
    first = ta.randn(3).numpy()
    ta.manual_seed(0)
    assert np.array_equal(ta.randn(3).numpy(), first)


# ---- tensors made from nothing, with a dtype or a value that cannot hold what they make -----------
@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: ta.randn(3, dtype="int64"), TypeError, esc("randn", "int64", "dtype='float32'")),
        (lambda: ta.rand(3, dtype="bool"), TypeError, esc("rand", "bool", "dtype='float32'")),
        (lambda: ta.full(2, None), TypeError, esc("full", "one number", "None")),
        (lambda: ta.full(2, "1"), TypeError, esc("full", "one number", "'1'")),
        (lambda: ta.arange(3, dtype="complex64"), TypeError, esc("complex64")),
        (lambda: ta.arange(2040, 2060, dtype="float16"), ValueError, esc("2049", "float16", "2048.0", "int64")),
        (lambda: ta.arange(250, 260, dtype="uint8"), ValueError, esc("259", "uint8", "it would become 3")),
        (lambda: ta.arange(-1, 2, dtype="uint8"), ValueError, esc("-1", "uint8", "255")),
        (lambda: ta.arange(70000, 70001, dtype="float16"), ValueError, esc("70000", "float16", "inf")),
        (lambda: ta.arange(3, dtype="bool"), ValueError, esc("2", "bool", "True")),
    ],
)  # fmt: skip
def test_samples_and_ranges_a_dtype_cannot_hold_are_refused_not_rounded(make, error: type, match: str) -> None:  # noqa: ANN001
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before NumPy warns about an overflowing cast
        with pytest.raises(error, match=match):
            make()


def test_ranges_and_fills_a_dtype_holds_are_taken() -> None:
    assert ta.arange(2049, dtype="float16").numpy()[-1] == 2048 and ta.arange(256, dtype="uint8").numpy()[-1] == 255
    assert ta.arange(2, dtype="bool").tolist() == [False, True] and ta.arange(3, dtype="float32").tolist() == [0, 1, 2]
    assert ta.full(2, np.float32(1.5)).tolist() == [1.5, 1.5] and ta.randn(2, dtype="float16").dtype == ta.float16


# ---- a tensor in Python's if, for and len -----------------------------------------------------------
def test_the_truth_of_a_tensor_is_its_one_value_and_ambiguous_for_more() -> None:
    assert not ta.tensor(0.0) and not ta.tensor([False]) and ta.tensor([[2]])
    with pytest.raises(ValueError, match=esc("(2,)", "ambiguous", ".numpy().all()")):
        bool(ta.tensor([1.0, -1.0]) > 0)
    with pytest.raises(ValueError, match=esc("(0,)", "ambiguous")):
        bool(ta.zeros(0))


def test_a_0d_tensor_has_no_length_and_cannot_be_iterated() -> None:
    with pytest.raises(TypeError, match=esc("0-d", ".item()")):
        list(ta.tensor(1.0))  # before: [], the old __getitem__ protocol stopping at its first IndexError
    with pytest.raises(TypeError, match=esc("0-d", ".item()")):
        len(ta.tensor(1.0))
    rows = list(ta.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert [r.tolist() for r in rows] == [[1.0, 2.0], [3.0, 4.0]]


# ---- a NumPy array or a list where an op needs a Tensor ----------------------------------------------
@pytest.mark.parametrize(
    ("op", "name"),
    [
        (ta.relu, "relu"), (ta.exp, "exp"), (ta.log, "log"), (ta.sqrt, "sqrt"), (ta.tanh, "tanh"),
        (ta.sigmoid, "sigmoid"), (ta.gelu, "gelu"), (ta.ops.neg, "neg"), (ta.softmax, "softmax"),
        (ta.log_softmax, "log_softmax"), (ta.ops.sum, "sum"), (ta.ops.mean, "mean"), (ta.ops.max, "max"),
        (lambda x: ta.dropout(x, 0.5), "dropout"), (lambda x: ta.layer_norm(x), "layer_norm"),
        (lambda x: ta.cross_entropy(x, [0, 1]), "cross_entropy"), (lambda x: ta.matmul(x, x.T), "matmul"),
        (lambda x: ta.equal(x, x), "equal"), (lambda x: ta.concatenate([x, x]), "concatenate"),
        (lambda x: ta.nn.Linear(3, 2)(x), "linear"), (lambda x: ta.nn.LayerNorm(3)(x), "layer_norm"),
    ],
)  # fmt: skip
def test_an_op_given_a_numpy_array_or_a_list_says_to_wrap_it(op, name: str) -> None:  # noqa: ANN001
    x = np.ones((2, 3), dtype=np.float32)  # before: "Cannot interpret '<memory at 0x...>' as a data type" and kin
    with pytest.raises(TypeError, match=esc(name, "takes a tinyamp Tensor", "numpy array of shape (2, 3)", "float32",
                                            "ta.tensor(x)")):  # fmt: skip
        op(x)
    if name not in ("matmul", "equal"):
        with pytest.raises(TypeError, match=esc(name, "takes a tinyamp Tensor", "got list")):
            op(x.tolist())


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda x: x.sum(axis=0.0), esc("axis is an int", "got 0.0")),
        (lambda x: x.mean(axis="rows"), esc("axis is an int", "'rows'")),
        (lambda x: x.max(axis=True), esc("axis is an int", "True")),
        (lambda x: x.reshape(2.0), esc("reshape takes whole numbers", "(2.0,)")),
        (lambda x: x.reshape(3, None), esc("reshape takes whole numbers", "(3, None)")),
    ],
)  # fmt: skip
def test_an_axis_or_a_shape_that_is_not_whole_numbers_is_named(make, match: str) -> None:  # noqa: ANN001
    with pytest.raises(TypeError, match=match):  # before: "'float' object is not iterable" and kin
        make(ta.ones((2, 3)))
    assert ta.ones((2, 3)).sum(axis=np.int64(1)).shape == (2,) and ta.ones(6).reshape(np.int64(2), 3).shape == (2, 3)


@pytest.mark.parametrize("eps", [0, -1.0, float("nan"), float("inf"), "1e-5", True])
def test_layer_norm_function_refuses_an_eps_that_is_not_a_positive_number(eps: object) -> None:
    """The LayerNorm module checked eps; the function let eps <= 0 make NaN from a constant row."""
    with pytest.raises(ValueError, match=esc("layer_norm: eps must be a finite number > 0", repr(eps))):
        ta.layer_norm(ta.ones((2, 3)), eps=eps)


def test_an_optimizer_given_a_model_instead_of_its_parameters_says_which_to_pass() -> None:
    from tinyamp import nn, optim

    with pytest.raises(TypeError, match=esc("not the Linear itself", "model.named_parameters()")):
        optim.SGD(nn.Linear(3, 2), lr=0.1)


@pytest.mark.parametrize("flag", ["yes", "no", 1, None])
def test_requires_grad_must_be_a_bool_not_something_truthy(flag: object) -> None:
    """"no" is truthy: it used to make a tensor that requires a gradient."""
    for make in (lambda: ta.tensor([1.0], requires_grad=flag), lambda: ta.zeros(2, requires_grad=flag),
                 lambda: ta.ones(2).requires_grad_(flag)):  # fmt: skip
        with pytest.raises(TypeError, match=esc("requires_grad must be True or False", repr(flag))):
            make()
    assert ta.tensor([1.0], requires_grad=np.bool_(True)).requires_grad


# ---- a loss scale far above float32's range: taken, and a checkpoint of it is read back ---------------
def test_a_loss_scale_of_1e300_is_taken_and_its_checkpoint_loads_after_real_steps(tmp_path) -> None:  # noqa: ANN001
    """The constructor and the checkpoint agree: a float64 scale of 1e300 is a valid (if useless) start."""
    from tinyamp import nn, optim
    from tinyamp.amp import LossScaler, MasterWeights, load_checkpoint, save_checkpoint

    ta.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, dtype="float16"), nn.ReLU(), nn.Linear(8, 3, dtype="float16"))
    optimizer = MasterWeights(optim.SGD(model.named_parameters(), lr=0.1))
    scaler = LossScaler(init_scale=1e300)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        for step in range(3):  # every scaled loss overflows: each step is skipped and the scale backs off
            rng = np.random.default_rng(step)
            x = ta.tensor(rng.standard_normal((8, 4)).astype("float16"))
            loss = ta.cross_entropy(model(x), ta.tensor(rng.integers(0, 3, 8)))
            scaler.scale_loss(loss).backward()
            scaler.step(optimizer)
            optimizer.zero_grad()
    assert scaler.scale == 1e300 / 8 and [e.found_inf for e in scaler.history] == [True] * 3
    save_checkpoint(tmp_path / "run.npz", model, optimizer, scaler)
    again = LossScaler(init_scale=1e300)
    load_checkpoint(tmp_path / "run.npz", model, optimizer, again)
    assert again.state_dict() == scaler.state_dict()
    with pytest.raises(ValueError, match=esc("init_scale=1e+300 rounds to inf in float32")):
        LossScaler(init_scale=1e300, scale_dtype="float32")  # where the scale is float32, refused at once
