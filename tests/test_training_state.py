"""tinyamp.amp.training_state: one-file checkpoints that resume training bit for bit.

The central property: train k steps, save, train m more (run A); load the file into a
fresh model and optimizer built from other initial weights, train m steps (run B); A and
B agree in every bit of the model, the FP32 masters, the optimizer moments, the loss
scaler and the random generators.  Two controls show that the test can fail: resuming
without the random state, or without the masters, gives different weights.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import bit_pattern_arrays, json_values

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp import random as ta_random
from tinyamp.amp.master import MasterWeights
from tinyamp.amp.scaler import LossScaler
from tinyamp.amp.training_state import (
    CheckpointError,
    describe_checkpoint,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
# the loss scaler's steps at scale 2^16 overflow float16 on purpose (those steps are skipped);
# NumPy's warnings about the resulting inf and NaN say nothing a test needs
pytestmark = [
    pytest.mark.checkpoints,
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]
tmp_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---- two small training runs ---------------------------------------------------------------------
def mixed_run(seed: int, growth_interval: int = 2) -> tuple[nn.Module, MasterWeights, LossScaler]:
    """float16 MLP with dropout (so the random state matters), FP32 masters under AdamW, a loss scaler."""
    ta.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(4, 16, dtype="float16"), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3, dtype="float16")
    )
    opt = MasterWeights(optim.AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1))
    return model, opt, LossScaler(init_scale=2.0**15, growth_interval=growth_interval)


def fp32_run(seed: int) -> tuple[nn.Module, optim.SGD, None]:
    """float32 MLP, plain SGD with momentum, no scaler."""
    ta.manual_seed(seed)
    model = nn.MLP([4, 16, 3])
    return model, optim.SGD(model.named_parameters(), lr=0.1, momentum=0.9, nesterov=True), None


def train(model: nn.Module, opt: Any, scaler: Any, steps: range) -> None:
    """One step per batch; batch `step` is the same whichever run asks for it."""
    dtype = model.parameters()[0].dtype
    for step in steps:
        rng = np.random.default_rng(1000 + step)
        x = ta.tensor(rng.standard_normal((8, 4)).astype(dtype))
        loss = ta.cross_entropy(model(x), ta.tensor(rng.integers(0, 3, 8)))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale_loss(loss).backward()
            scaler.step(opt)
        opt.zero_grad()


def everything(model: nn.Module, opt: Any, scaler: Any) -> list[tuple[str, Any]]:
    """Every value the future of a run depends on, as (name, bytes or plain value) pairs."""
    out: list[tuple[str, Any]] = [(f"model {k}", (v.dtype.name, v.tobytes())) for k, v in model.state_dict().items()]
    inner = opt.optimizer if isinstance(opt, MasterWeights) else opt
    if isinstance(opt, MasterWeights):
        out += [(f"master {n}", m.data.tobytes()) for n, m in zip(opt.names, opt.master_params)]
        for p, m in zip(opt.model_params, opt.master_params):
            assert p.data.tobytes() == m.data.astype(p.dtype).tobytes()  # the model holds the rounded masters
    for i, s in enumerate(inner.state):
        out += [(f"state {i} {k}", v.tobytes() if isinstance(v, np.ndarray) else v) for k, v in sorted(s.items())]
    out += [("step_count", inner.step_count), ("hyperparameters", inner.state_dict()["hyperparameters"])]
    if scaler is not None:
        out += [("scaler", scaler.state_dict())]
    return out + [("rng", ta_random.get_state())]


# ---- the key property -----------------------------------------------------------------------------
@pytest.mark.parametrize("make", [mixed_run, fp32_run], ids=["fp16_masters_adamw_scaler", "fp32_sgd_momentum"])
def test_resumed_training_continues_bit_identically(make: Any, tmp_path: Path) -> None:
    k, m = 5, 6
    model, opt, scaler = make(0)
    train(model, opt, scaler, range(k))
    path = tmp_path / "run.npz"
    save_checkpoint(path, model, opt, scaler, extra={"step": k})
    train(model, opt, scaler, range(k, k + m))
    a = everything(model, opt, scaler)
    if scaler is not None:  # the resumed steps include a skipped (overflowed) step and a growth
        assert {"grew", "backed_off"} <= {e.event for e in scaler.history[k:]}

    model2, opt2, scaler2 = make(1)  # other initial weights, other random state
    assert everything(model2, opt2, scaler2) != a
    assert load_checkpoint(path, model2, opt2, scaler2) == {"step": k}
    train(model2, opt2, scaler2, range(k, k + m))
    assert everything(model2, opt2, scaler2) == a

    # control 1: the same resume with a different random state gives other dropout masks
    if make is mixed_run:
        model3, opt3, scaler3 = make(1)
        load_checkpoint(path, model3, opt3, scaler3)
        ta.manual_seed(123)
        train(model3, opt3, scaler3, range(k, k + m))
        assert everything(model3, opt3, scaler3)[:4] != a[:4]


def test_resuming_without_the_masters_would_diverge(tmp_path: Path) -> None:
    """The control that shows why the masters are saved: rounding them to float16 loses
    the small updates still adding up in them."""
    model, opt, scaler = mixed_run(0)
    train(model, opt, scaler, range(5))
    path = tmp_path / "run.npz"
    save_checkpoint(path, model, opt, scaler)
    model2, opt2, scaler2 = mixed_run(1)
    load_checkpoint(path, model2, opt2, scaler2)
    masters = [m.data.copy() for m in opt2.master_params]
    opt2.copy_model_to_masters()  # what a checkpoint of the model alone could restore
    assert any(a.tobytes() != m.data.tobytes() for a, m in zip(masters, opt2.master_params))


def test_the_file_is_a_plain_npz_with_readable_keys(tmp_path: Path) -> None:
    model, opt, scaler = mixed_run(0)
    train(model, opt, scaler, range(3))
    path = tmp_path / "run.npz"
    save_checkpoint(path, model, opt, scaler, extra={"epoch": 1})
    with np.load(path, allow_pickle=False) as archive:  # no pickle needed to read it
        files = set(archive.files)
        assert archive["model/0.weight"].dtype == np.float16
        assert archive["optimizer/master/0.weight"].dtype == np.float32
    assert {"model/0.weight", "optimizer/master/3.bias", "optimizer/optimizer/state/0/exp_avg"} <= files
    content = read_checkpoint(path)
    assert content["optimizer_type"] == "MasterWeights" and content["scaler"] == scaler.state_dict()
    assert content["optimizer"]["optimizer"]["hyperparameters"]["betas"] == (0.9, 0.999)  # tuples stay tuples
    text = describe_checkpoint(path)
    assert "optimizer/master/0.weight" in text and "float32" in text and "{'epoch': 1}" in text
    assert [p.name for p in tmp_path.iterdir()] == ["run.npz"]  # no temporary file left behind


# ---- round trips ------------------------------------------------------------------------------------------
class Holder(nn.Module):
    """A module holding one array of any dtype: a parameter if floating, else a buffer."""

    def __init__(self, value: np.ndarray) -> None:
        super().__init__()
        if value.dtype.kind == "f" or value.dtype == BF16:
            self.w = nn.Parameter(value)
        else:
            self.register_buffer("w", ta.tensor(value))


@tmp_ok
@given(
    st.sampled_from([np.float16, BF16, np.float32, np.float64, np.int64, np.uint8]).flatmap(
        lambda dt: bit_pattern_arrays(dt)
    )
)
def test_arrays_round_trip_bit_exactly(tmp_path: Path, value: np.ndarray) -> None:
    src = Holder(value)
    opt = optim.SGD([nn.Parameter(np.zeros(1, np.float32))], lr=0.1)
    path = tmp_path / "arrays.npz"
    save_checkpoint(path, src, opt, extra={"copy": value})
    dst = Holder(np.zeros_like(value))
    extra = load_checkpoint(path, dst, opt)
    for got in (dst.w.data, extra["copy"], read_checkpoint(path)["model"]["w"]):
        assert got.dtype == value.dtype and got.shape == value.shape
        assert got.tobytes() == value.tobytes()


def same_structure(a: Any, b: Any) -> bool:
    """== that also tells a tuple from a list, True from 1, and -0.0 from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_structure(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_structure(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a.hex() == b.hex()
    return a == b


@tmp_ok
@given(json_values())
def test_extra_round_trips_with_its_types(tmp_path: Path, extra: Any) -> None:
    model = nn.MLP([2, 2])
    opt = optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(tmp_path / "x.npz", model, opt, extra=extra)
    assert same_structure(load_checkpoint(tmp_path / "x.npz", model, opt), extra)


def test_numpy_scalars_keep_their_type(tmp_path: Path) -> None:
    """NumPy scalars in `extra` come back as NumPy scalars; an optimizer's hyperparameters are
    Python numbers (the optimizer converts them), and come back equal."""
    model = nn.MLP([2, 2])
    opt = optim.SGD(model.parameters(), lr=np.float32(0.1))
    extra = {"f16": np.float16(1.5), "i": np.int64(7), "f": 0.1}
    save_checkpoint(tmp_path / "s.npz", model, opt, extra=extra)
    opt2 = optim.SGD(model.parameters(), lr=0.5)
    back = load_checkpoint(tmp_path / "s.npz", model, opt2)
    assert type(opt2.lr) is float and opt2.lr == float(np.float32(0.1))
    assert type(back["f16"]) is np.float16 and type(back["i"]) is np.int64 and type(back["f"]) is float


# ---- errors: unreadable files --------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, tuple[Any, Any, Any]]:
    run = mixed_run(0)
    train(*run, range(2))
    path = tmp_path / "run.npz"
    save_checkpoint(path, *run)
    return path, run


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    model, opt, scaler = mixed_run(0)
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*nowhere.npz"):
        load_checkpoint(tmp_path / "nowhere.npz", model, opt, scaler)


def test_saving_to_a_folder_or_into_a_missing_folder_names_the_path_and_the_fix(tmp_path: Path) -> None:
    model, opt, scaler = mixed_run(0)
    # before: "[Errno 21] Is a directory: '.../.tmp....tmp' -> '...'", naming a hidden temporary file
    with pytest.raises(IsADirectoryError, match=re.escape(f"{tmp_path}: it is a folder; name a file in it, e.g. ")):
        save_checkpoint(tmp_path, model, opt, scaler)
    missing = tmp_path / "runs" / "a"
    with pytest.raises(FileNotFoundError, match=re.escape(f"the folder {missing} does not exist; create it first")):
        save_checkpoint(missing / "ckpt.npz", model, opt, scaler)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, no temporary file left


def write_npy(path: Path) -> None:
    with open(path, "wb") as f:
        np.save(f, np.zeros(3))


def write_npz_without_metadata(path: Path) -> None:
    with open(path, "wb") as f:
        np.savez(f, weights=np.zeros(3))


@pytest.mark.parametrize(
    "write, match",
    [
        (lambda p: p.write_text("step,loss\n1,0.5\n"), "not a zip archive"),
        (lambda p: p.write_bytes(b""), "not a zip archive"),
        (write_npy, "holds a single .npy array"),
        (write_npz_without_metadata, "without the 'tinyamp_checkpoint' entry"),
        (lambda p: p.write_bytes(b"PK\x03\x04" + b"\x00" * 64), "damaged"),
    ],
    ids=["text", "empty", "npy", "npz_without_metadata", "zip_header_only"],
)
def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path: Path, write: Any, match: str) -> None:
    path = tmp_path / "other.npz"
    write(path)
    model, opt, scaler = mixed_run(0)
    with pytest.raises(CheckpointError, match=f"is not a tinyamp checkpoint.*{match}"):
        load_checkpoint(path, model, opt, scaler)


def rewrite_member(src_path: Path, dst_path: Path, name: str, data: bytes) -> None:
    with zipfile.ZipFile(src_path) as src, zipfile.ZipFile(dst_path, "w") as dst:
        for member in src.namelist():
            dst.writestr(member, data if member == name else src.read(member))


def npy_bytes(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value)
    return buffer.getvalue()


def test_a_truncated_or_corrupted_checkpoint_is_refused_and_changes_nothing(saved: Any) -> None:
    path, _ = saved
    data = path.read_bytes()
    model, opt, scaler = mixed_run(1)
    before = everything(model, opt, scaler)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="damaged"):
        load_checkpoint(path, model, opt, scaler)
    at = data.index(b"tinyamp-checkpoint")  # inside the stored JSON: its CRC no longer matches
    path.write_bytes(data[:at] + b"X" + data[at + 1 :])
    with pytest.raises(CheckpointError, match="damaged"):
        load_checkpoint(path, model, opt, scaler)
    assert everything(model, opt, scaler) == before


# ---- errors: a checkpoint that does not fit ----------------------------------------------------------------
def other_width_run() -> tuple[Any, Any, Any]:
    ta.manual_seed(1)
    model = nn.Sequential(
        nn.Linear(4, 8, dtype="float16"), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3, dtype="float16")
    )
    return model, MasterWeights(optim.AdamW(model.named_parameters(), lr=1e-2)), LossScaler(init_scale=2.0**15)


def float32_model_run() -> tuple[Any, Any, Any]:
    ta.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    return model, optim.AdamW(model.named_parameters(), lr=1e-2), LossScaler(init_scale=2.0**15)


def plain_adamw_run() -> tuple[Any, Any, Any]:
    model, opt, scaler = mixed_run(1)
    return model, optim.AdamW(model.named_parameters(), lr=1e-2), scaler


@pytest.mark.parametrize(
    "make, match",
    [
        (other_width_run, r"shape mismatch for 0.weight: the model has shape \(8, 4\)"),
        (lambda: mixed_run(1, growth_interval=7), "does not fit this run"),  # the scaler refuses: other config
        (lambda: mixed_run(1)[:2] + (None,), "holds the state of a LossScaler loss scaler; pass scaler="),
        (plain_adamw_run, "saved with optimizer MasterWeights; this optimizer is AdamW .*wrap the optimizer"),
        (float32_model_run, "saved with optimizer MasterWeights"),
    ],
    ids=["other_shapes", "scaler_config", "no_scaler", "no_masters", "float32_model"],
)
def test_a_checkpoint_that_does_not_fit_is_refused_and_changes_nothing(saved: Any, make: Any, match: str) -> None:
    path, _ = saved
    model, opt, scaler = make()
    train(model, opt, scaler, range(1))
    before = everything(model, opt, scaler)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(path, model, opt, scaler)
    assert everything(model, opt, scaler) == before


def test_a_late_failure_rolls_back_what_was_loaded(saved: Any) -> None:
    """The model and the masters load, then the scaler refuses its state: all is undone."""
    path, _ = saved
    model, opt, scaler = mixed_run(1, growth_interval=7)
    train(model, opt, scaler, range(3))
    before = everything(model, opt, scaler)
    with pytest.raises(CheckpointError, match="nothing was changed") as info:
        load_checkpoint(path, model, opt, scaler)
    assert info.value.__cause__ is not None  # the scaler's own error, chained
    assert everything(model, opt, scaler) == before


def test_dtype_and_optimizer_mismatches_in_plain_runs(tmp_path: Path) -> None:
    model, opt, _ = fp32_run(0)
    save_checkpoint(tmp_path / "a.npz", model, opt)
    half = nn.MLP([4, 16, 3], dtype="float16")
    with pytest.raises(CheckpointError, match="dtype mismatch for 0.weight"):
        load_checkpoint(tmp_path / "a.npz", half, optim.SGD(half.named_parameters(), lr=0.1, momentum=0.9))
    model2, _, _ = fp32_run(1)
    with pytest.raises(CheckpointError, match="saved with optimizer SGD; this optimizer is Adam$"):
        load_checkpoint(tmp_path / "a.npz", model2, optim.Adam(model2.parameters()))
    with pytest.raises(CheckpointError, match="holds no loss-scaler state"):
        load_checkpoint(tmp_path / "a.npz", model2, optim.SGD(model2.parameters(), lr=0.1), LossScaler())


# ---- writing ------------------------------------------------------------------------------------------------
def test_unstorable_extra_fails_before_writing(saved: Any) -> None:
    path, (model, opt, scaler) = saved
    original = path.read_bytes()
    with pytest.raises(TypeError, match=r"cannot store extra/callback \(function\)"):
        save_checkpoint(path, model, opt, scaler, extra={"callback": lambda: None})
    with pytest.raises(TypeError, match="needs string keys"):
        save_checkpoint(path, model, opt, scaler, extra={1: "one"})
    assert path.read_bytes() == original
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.npz"]


def test_a_failed_write_leaves_the_old_checkpoint_and_no_temporary_file(
    saved: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, (model, opt, scaler) = saved
    original = path.read_bytes()
    train(model, opt, scaler, range(2, 3))

    def crash(f: Any, array: Any, **options: Any) -> None:
        f.write(b"\x93NUMPY half an array")
        raise OSError("disk full")

    monkeypatch.setattr(np.lib.format, "write_array", crash)  # what save_checkpoint writes each array with
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, opt, scaler)
    monkeypatch.undo()
    assert path.read_bytes() == original
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.npz"]
    save_checkpoint(path, model, opt, scaler, extra={"step": 3})  # and a later save replaces it
    assert read_checkpoint(path)["extra"] == {"step": 3}
    saved_weight = read_checkpoint(path)["model"]["0.weight"]
    assert saved_weight.tobytes() == model.state_dict()["0.weight"].tobytes()
    assert os.fspath(path) in describe_checkpoint(path)


def test_a_member_that_is_not_what_the_metadata_says_is_reported_as_damaged(saved: Any, tmp_path: Path) -> None:
    path, (model, opt, scaler) = saved
    bad = tmp_path / "bad.npz"
    rewrite_member(path, bad, "model/0.weight.npy", b"not an npy file")
    with pytest.raises(CheckpointError, match="damaged: its entry 'model/0.weight.npy' is not a .npy array"):
        load_checkpoint(bad, model, opt, scaler)
    weight = model.state_dict()["0.weight"]
    rewrite_member(path, bad, "model/0.weight.npy", npy_bytes(weight.astype(np.float32)))
    with pytest.raises(CheckpointError, match=r"damaged: array model/0.weight is stored as \(16, 4\) float32"):
        load_checkpoint(bad, model, opt, scaler)


def test_arrays_under_colliding_paths_stay_apart(tmp_path: Path) -> None:
    model = nn.MLP([2, 2])
    opt = optim.SGD(model.parameters(), lr=0.1)
    extra = {"a/b": np.zeros(2), "a": {"b": np.ones(3)}}
    save_checkpoint(tmp_path / "c.npz", model, opt, extra=extra)
    back = load_checkpoint(tmp_path / "c.npz", model, opt)
    assert back["a/b"].tobytes() == extra["a/b"].tobytes() and back["a"]["b"].tobytes() == extra["a"]["b"].tobytes()


def test_a_failure_after_the_model_loaded_restores_the_model(tmp_path: Path) -> None:
    """Plain optimizer: the model loads, then the optimizer refuses (it holds fewer parameters)."""
    model, opt, _ = fp32_run(0)
    train(model, opt, None, range(2))
    save_checkpoint(tmp_path / "a.npz", model, opt)
    model2, _, _ = fp32_run(1)
    opt2 = optim.SGD(model2.parameters()[:2], lr=0.1, momentum=0.9, nesterov=True)
    before = everything(model2, opt2, None)
    with pytest.raises(CheckpointError, match="holds state for 4 parameters; this optimizer has 2"):
        load_checkpoint(tmp_path / "a.npz", model2, opt2)
    assert everything(model2, opt2, None) == before


def test_a_failure_in_the_last_part_rolls_back_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint whose random state cannot be restored: model, masters, scaler and random
    state, already loaded or half set, all go back."""
    run = mixed_run(0)
    train(*run, range(3))
    good = ta_random.get_state()
    bogus = {"seed": 5, "generators": {"cpu": {"bit_generator": "MT19937", "state": {"key": [1], "pos": 0}}}}
    monkeypatch.setattr(ta_random, "get_state", lambda: bogus)
    save_checkpoint(tmp_path / "r.npz", *run)
    monkeypatch.undo()
    assert ta_random.get_state() == good
    model, opt, scaler = mixed_run(1, growth_interval=2)
    train(model, opt, scaler, range(1))
    before = everything(model, opt, scaler)
    with pytest.raises(CheckpointError, match="nothing was changed"):
        load_checkpoint(tmp_path / "r.npz", model, opt, scaler)
    assert everything(model, opt, scaler) == before


class BrokenScaler:
    """Saves fine, never loads: to see a rollback that cannot be completed reported as such."""

    def state_dict(self) -> dict[str, Any]:
        return {"scale": 1.0}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise ValueError("this scaler cannot load anything")


def test_a_rollback_that_fails_too_says_so_and_still_restores_the_rest(tmp_path: Path) -> None:
    model, opt, _ = fp32_run(0)
    train(model, opt, None, range(2))
    save_checkpoint(tmp_path / "b.npz", model, opt, BrokenScaler())
    model2, opt2, _ = fp32_run(1)
    train(model2, opt2, None, range(1))
    before = everything(model2, opt2, None)
    with pytest.raises(CheckpointError, match="(?s)failed too.*scaler: this scaler cannot load anything"):
        load_checkpoint(tmp_path / "b.npz", model2, opt2, BrokenScaler())
    assert everything(model2, opt2, None) == before
