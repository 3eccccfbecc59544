"""Range checks of labels and indices: raised at the call on the CPU; on a GPU kept on the device
and answered at the next read, which a training step makes once, before it changes any weight.

The GPU's side runs here with NumPy arrays standing in for device arrays (the check's code is
plain array operations; only where its flag is read differs), and with the fused scaler step's
NumPy stand-ins of test_fused_cuda.py.  On the strict CuPy stand-in, the test named "cuda"
counts the reads of a whole mixed-precision step.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_fused_cuda import OPTIMIZERS, kernels_on_numpy  # noqa: F401  (a fixture, used by name)

import tinyamp as ta
from tinyamp import backend, nn, optim
from tinyamp.amp import LossScaler, MasterWeights, autocast
from tinyamp.backend import OutOfRangeError
from tinyamp.engine.cuda import range_check

pytestmark = pytest.mark.engine_room


def esc(*parts: object) -> str:
    return ".*".join(re.escape(str(p)) for p in parts)


@pytest.fixture
def checks_on_the_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """NumPy arrays take the GPU's range check: kept with a flag, not read, until the next read."""
    monkeypatch.setattr(range_check, "on_gpu", lambda *arrays: all(isinstance(x, np.ndarray) for x in arrays))
    yield
    backend.take_pending_checks()  # nothing left behind for the next test


def test_out_of_range_is_both_a_value_error_and_an_index_error() -> None:
    """Cross-entropy's labels raised ValueError and an embedding's indices IndexError: both still hold."""
    assert issubclass(OutOfRangeError, ValueError) and issubclass(OutOfRangeError, IndexError)


def test_on_the_cpu_the_check_raises_at_the_call_and_keeps_nothing() -> None:
    with pytest.raises(OutOfRangeError, match=r"^cross_entropy labels must lie in \[0, 3\); got values from 0 to 3$"):
        ta.cross_entropy(ta.zeros((3, 3)), [0, 3, 1])
    with pytest.raises(OutOfRangeError, match=r"^embedding indices must lie in \[0, 4\); got values from -2 to 1$"):
        ta.embedding(ta.zeros((4, 2)), [1, -2])
    assert backend.take_pending_checks() == []


@pytest.mark.usefixtures("checks_on_the_device")
def test_on_the_device_the_check_waits_for_the_next_read_and_is_answered_once() -> None:
    ta.cross_entropy(ta.zeros((3, 3)), [0, 3, 1])  # no read here: no error yet
    ta.embedding(ta.zeros((4, 2)), [[1, 2], [3, 0]])  # in range
    assert len(backend._pending_checks) == 2
    message = esc("labels must lie in [0, 3); got values from 0 to 3", "checked on the GPU without making the host")
    with pytest.raises(ValueError, match=message + ".*at the test"):
        backend.settle_checks("at the test")
    backend.settle_checks("again")  # answered: nothing is raised twice
    ta.embedding(ta.zeros((4, 2)), np.array([5, 1], dtype=np.uint8))
    with pytest.raises(IndexError, match=esc("embedding indices must lie in [0, 4); got values from 1 to 5")):
        backend.host_floats([np.float64(1.0)])  # any read of floats takes the flags along


@pytest.mark.usefixtures("checks_on_the_device")
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint64, np.int64])
def test_the_device_check_of_any_integer_dtype_decides_as_the_reference_and_clips_into_range(dtype: Any) -> None:
    """Small dtypes against a larger table (an int8 label and 300 classes), and the largest values of each."""
    info = np.iinfo(dtype)
    for size in (3, 300):
        for values in ([0, 1], [0, 2], [0, 3], [info.min, 1], [0, info.max], [info.min, info.max]):
            values = np.array(values, dtype=dtype)
            expected = None
            try:
                backend.check_in_range(values, size, "values")
            except OutOfRangeError as error:
                expected = str(error)
            safe = range_check.check_in_range(values, size, "values")
            assert safe.dtype == values.dtype and safe.min() >= 0 and safe.max() < size
            if expected is None:
                backend.settle_checks("at the test")
                assert (safe == values).all()
            else:
                with pytest.raises(OutOfRangeError) as raised:
                    backend.settle_checks("at the test")
                assert str(raised.value).startswith(expected + " (checked on the GPU")


@pytest.mark.usefixtures("checks_on_the_device")
def test_checks_held_without_a_read_are_bounded() -> None:
    """An evaluation loop that reads nothing holds at most MAX_PENDING_CHECKS; then they are read."""
    logits = ta.zeros((2, 3))
    for _ in range(3 * backend.MAX_PENDING_CHECKS):
        ta.cross_entropy(logits, [0, 2])
        assert len(backend._pending_checks) < backend.MAX_PENDING_CHECKS
    for _ in range(backend.MAX_PENDING_CHECKS - 1 - len(backend._pending_checks)):
        ta.cross_entropy(logits, [0, 2])
    with pytest.raises(ValueError, match=esc("from 0 to 7", f"after {backend.MAX_PENDING_CHECKS} checks")):
        ta.cross_entropy(logits, [7, 0])  # the one that fills the list: read at once


# ---- a bad batch in a training step -------------------------------------------------------------------------
BAD = np.array([0, 1, 2, 3, 4, 5, 0, 1])  # 5 is out of range for 5 classes


def run(name: str, bad_step: int | None, steps: int = 4, clip: float | None = None) -> tuple[Any, ...]:
    """Mixed-precision steps of a small MLP; the batch of `bad_step` has a label out of range and is skipped
    by the loop once its error arrives.  Returns the weights, masters, optimizer state, scaler and errors."""
    ta.manual_seed(0)
    rng = np.random.default_rng(0)
    model = nn.MLP([12, 16, 5]).half()
    opt = MasterWeights(OPTIMIZERS[name](model.named_parameters()), track_lost_updates=False)
    scaler = LossScaler(init_scale=2.0**10)
    x, good = ta.tensor(rng.standard_normal((8, 12)).astype(np.float32)), np.arange(8) % 5
    errors = []
    for step in range(steps):
        opt.zero_grad()
        with autocast():
            loss = ta.cross_entropy(model(x), BAD if step == bad_step else good)
        scaler.scale_loss(loss).backward()
        try:
            if clip is not None:
                scaler.unscale_(opt)
                scaler.clip_grad_norm_(opt, clip)
            scaler.step(opt)
        except OutOfRangeError as error:
            errors.append(str(error))
            assert scaler.phase == "ready"  # the next loss can be scaled
    weights = [p.data.tobytes() for p in opt.model_params + opt.master_params]
    state = [(opt.optimizer.step_count, {k: np.asarray(v).tobytes() for k, v in s.items()})
             for s in opt.optimizer.state]  # fmt: skip
    history = [(e.step, e.scale_after, e.found_inf) for e in scaler.history]
    return weights, state, history, scaler.scale, errors


@pytest.mark.usefixtures("checks_on_the_device")
@pytest.mark.parametrize("name", ["sgd-momentum-wd", "adamw"])
def test_the_fused_step_skips_a_bad_batch_changes_nothing_and_raises(kernels_on_numpy: list[str], name: str) -> None:  # noqa: F811
    """The flag sits among the step's sums: the update kernels skip, the counters roll back, then the error."""
    weights, state, history, scale, errors = run(name, bad_step=1)
    assert "scaled squares" in kernels_on_numpy  # the fused step ran
    assert len(errors) == 1 and "from 0 to 5" in errors[0]
    assert "at the loss scaler's step, which changed no weight" in errors[0]
    clean = run(name, bad_step=None, steps=3)
    assert (weights, state, history, scale) == clean[:4]  # as if the bad batch had never come


@pytest.mark.usefixtures("checks_on_the_device")
@pytest.mark.parametrize("clip", [None, 0.05])
def test_the_host_step_and_unscale_raise_before_any_weight_changes(clip: float | None) -> None:
    """Without the fused step: the one read of the sums (host_floats) takes the flags along."""
    weights, state, history, scale, errors = run("adamw", bad_step=2, clip=clip)
    assert len(errors) == 1 and "from 0 to 5" in errors[0]
    assert (weights, state, history, scale) == run("adamw", bad_step=None, steps=3, clip=clip)[:4]


@pytest.mark.usefixtures("checks_on_the_device")
def test_an_fp32_optimizer_step_reads_the_checks_before_it_changes_a_weight() -> None:
    ta.manual_seed(0)
    model = nn.MLP([4, 3])
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ta.cross_entropy(model(ta.ones((2, 4))), [0, 3]).backward()
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ValueError, match=esc("[0, 3)", "from 0 to 3", "before the optimizer's step changed any")):
        opt.step()
    assert opt.step_count == 0 and all((b == p.data).all() for b, p in zip(before, model.parameters()))


@pytest.mark.usefixtures("checks_on_the_device")
def test_a_transformer_step_reads_once_with_its_three_checks(kernels_on_numpy: list[str],  # noqa: F811
                                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Token and position embeddings and the loss: three checks, answered by the step's one read."""
    reads: list[str] = []
    to_device = backend.to_device

    def counted(array: Any, device: str) -> Any:
        if device == "cpu":
            reads.append(type(array).__name__)
        return to_device(array, device)

    monkeypatch.setattr(backend, "to_device", counted)
    ta.manual_seed(0)
    model = nn.CharTransformer(11, 8, 16, 2, 1).half()
    opt = MasterWeights(optim.AdamW(model.named_parameters(), lr=1e-3), track_lost_updates=False)
    scaler = LossScaler(init_scale=2.0**8)
    tokens = np.random.default_rng(0).integers(0, 11, size=(2, 9))
    for targets in (tokens[:, 1:], np.where(tokens[:, 1:] == 3, 11, tokens[:, 1:])):
        opt.zero_grad()
        with autocast():
            loss = ta.cross_entropy(model(ta.tensor(tokens[:, :-1])), targets)
        assert len(backend._pending_checks) == 3  # tokens, positions, targets: waiting, not read
        scaler.scale_loss(loss).backward()
        reads.clear()
        if (targets == 11).any():
            with pytest.raises(ValueError, match=esc("[0, 11)", "to 11", "changed no weight")):
                scaler.step(opt)
            assert reads == ["ndarray", "ndarray"]  # the step's read, then the error's bounds
        else:
            assert not scaler.step(opt).skipped and reads == ["ndarray"]  # the one read of the step


def test_a_mixed_step_on_cuda_reads_the_device_once() -> None:
    """On the strict CuPy stand-in, which counts every device-to-host read: one per mixed-precision step,
    for an MLP (the loss's check) and a transformer (two embeddings and the loss)."""
    cupy = pytest.importorskip("cupy")
    if not hasattr(cupy, "READS"):
        pytest.skip("counts reads on the strict CuPy stand-in; on a GPU, benchmarks/gpu_check.py counts them")
    rng = np.random.default_rng(0)
    mlp = (nn.MLP([12, 16, 5]).half().to("cuda"), ta.tensor(rng.standard_normal((8, 12)), dtype="float32",
           device="cuda"), ta.tensor(np.arange(8) % 5, device="cuda"))  # fmt: skip
    tokens = rng.integers(0, 11, size=(2, 9))
    gpt = (nn.CharTransformer(11, 8, 16, 2, 1).half().to("cuda"), ta.tensor(tokens[:, :-1], device="cuda"),
           ta.tensor(tokens[:, 1:], device="cuda"))  # fmt: skip
    for model, x, y in (mlp, gpt):
        opt = MasterWeights(optim.AdamW(model.named_parameters(), lr=1e-3), track_lost_updates=False)
        scaler = LossScaler(init_scale=2.0**8)
        for _ in range(3):
            cupy.READS[0] = 0
            opt.zero_grad()
            with autocast():
                loss = ta.cross_entropy(model(x), y)
            scaler.scale_loss(loss).backward()
            scaler.step(opt)
            assert cupy.READS[0] == 1, f"{type(model).__name__}: {cupy.READS[0]} reads in one step"


def test_a_bad_batch_on_cuda_is_refused_by_the_step_with_nothing_changed() -> None:
    """On a GPU (or the strict stand-in): the fused step, or the host step, skips and raises; the next batch trains."""
    if not ta.cuda_is_available():
        pytest.skip("needs CuPy and a CUDA GPU (or the strict CuPy stand-in)")
    ta.manual_seed(0)
    model = nn.MLP([12, 16, 5]).half().to("cuda")
    opt = MasterWeights(OPTIMIZERS["adamw"](model.named_parameters()), track_lost_updates=False)
    scaler = LossScaler(init_scale=2.0**10)
    x = ta.tensor(np.random.default_rng(0).standard_normal((8, 12)), dtype="float32", device="cuda")

    def step(labels: np.ndarray) -> Any:
        opt.zero_grad()
        with autocast():
            loss = ta.cross_entropy(model(x), ta.tensor(labels, device="cuda"))
        scaler.scale_loss(loss).backward()
        return scaler.step(opt)

    step(np.arange(8) % 5)
    weights = [backend.to_device(p.data, "cpu").copy() for p in opt.model_params + opt.master_params]
    history = len(scaler.history)
    with pytest.raises(ValueError, match=esc("cross_entropy labels must lie in [0, 5); got values from 0 to 5")):
        step(BAD)
    after = [backend.to_device(p.data, "cpu") for p in opt.model_params + opt.master_params]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(weights, after)) and len(scaler.history) == history
    assert scaler.phase == "ready" and opt.optimizer.step_count == 1
    assert not step(np.arange(8) % 5).skipped and opt.optimizer.step_count == 2
