"""Crafted checkpoint files: each is refused with one sentence, within bounded memory, before it is trusted.

Every file here is built by hand (zipfile, and raw zip bytes for the zip bomb) from a real
checkpoint with one lie added: an array header that declares 8 TiB, an entry that inflates
to 1 GiB, metadata nested 100,000 deep or 17 MiB long, an entry the metadata does not name,
a pickled entry, a NaN master, a model weight that is not its master rounded.  Each must end
in a CheckpointError whose message is one sentence naming the file, and the ones built to
exhaust memory must be refused while tracemalloc sees only a few MiB.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import time
import tracemalloc
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.amp.master import MasterWeights
from tinyamp.amp.master_state import MasterWeightsStateError
from tinyamp.amp.scaler import LossScaler
from tinyamp.amp.training_state import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint

pytestmark = [
    pytest.mark.checkpoints,
    # the loss scaler's first steps at scale 2^15 may overflow float16 on purpose (they are skipped)
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

METADATA = "tinyamp_checkpoint.npy"
MiB = 2**20
SMALL_PEAK = 4 * MiB  # what reading the metadata and the headers of a small run may take


# ---- a small run and its checkpoint -------------------------------------------------------------------
def mixed_run(seed: int) -> tuple[nn.Module, MasterWeights, LossScaler]:
    """float16 MLP, FP32 masters under AdamW, a loss scaler: 64 + 16 + 48 + 3 weights."""
    ta.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 16, dtype="float16"), nn.ReLU(), nn.Linear(16, 3, dtype="float16"))
    return model, MasterWeights(optim.AdamW(model.named_parameters(), lr=1e-2)), LossScaler(init_scale=2.0**15)


def train(model: nn.Module, opt: MasterWeights, scaler: LossScaler, steps: int) -> None:
    for step in range(steps):
        rng = np.random.default_rng(step)
        x = ta.tensor(rng.standard_normal((8, 4)).astype(np.float16))
        loss = ta.cross_entropy(model(x), ta.tensor(rng.integers(0, 3, 8)))
        scaler.scale_loss(loss).backward()
        scaler.step(opt)
        opt.zero_grad()


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A real checkpoint after 3 steps (so the Adam moments exist)."""
    run = mixed_run(0)
    train(*run, steps=3)
    path = tmp_path / "run.npz"
    save_checkpoint(path, *run, extra={"step": 3})
    return path


# ---- building files -------------------------------------------------------------------------------------
def npy(value: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=allow_pickle)
    return buffer.getvalue()


def npy_header(shape: tuple[int, ...], dtype: Any) -> bytes:
    """A .npy header alone: it declares an array, whatever follows it."""
    buffer = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


def metadata_entry(document: Any) -> bytes:
    """The metadata as save_checkpoint stores it: JSON text as a uint8 .npy array."""
    text = document if isinstance(document, (bytes, str)) else json.dumps(document)
    data = text.encode("utf-8") if isinstance(text, str) else text
    return npy(np.frombuffer(data, dtype=np.uint8))


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def metadata(path: Path) -> dict[str, Any]:
    return json.loads(np.load(io.BytesIO(members(path)[METADATA])).tobytes())


def array_ref(key: str, shape: tuple[int, ...], dtype: str) -> dict[str, Any]:
    return {"__tinyamp__": "array", "key": key, "dtype": dtype, "shape": list(shape)}


def write_zip(path: Path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def edited(src: Path, dst: Path, document: Any = None, **replace: bytes) -> Path:
    """A copy of checkpoint `src` with its metadata replaced and entries added or replaced
    (keyword "extra__x" is the entry "extra/x.npy")."""
    entries = members(src)
    if document is not None:
        entries[METADATA] = metadata_entry(document)
    entries.update({name.replace("__", "/") + ".npy": data for name, data in replace.items()})
    write_zip(dst, entries)
    return dst


def write_raw_zip(path: Path, entries: list[tuple[str, int, int, int, bytes]]) -> None:
    """A zip written byte by byte: (name, method, crc32, uncompressed size, payload) per entry.

    zipfile would compress the payload itself; this writes a deflate stream built elsewhere,
    with whatever uncompressed size the entry is to declare.
    """
    local, central = bytearray(), bytearray()
    for name, method, crc, size, payload in entries:
        raw = name.encode()
        fields = (20, 0, method, 0, 0, crc, len(payload), size, len(raw))
        central += struct.pack("<4sH5H3L5H2L", b"PK\x01\x02", 20, *fields, 0, 0, 0, 0, 0, len(local)) + raw
        local += struct.pack("<4s5H3L2H", b"PK\x03\x04", *fields, 0) + raw + payload
    count = min(len(entries), 0xFFFF)  # (zipfile reads the directory by its size, not by this count)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(central), len(local), 0)
    path.write_bytes(bytes(local + central + end))


def deflated_zeros(header: bytes, chunks: int) -> tuple[bytes, int, int]:
    """A raw deflate stream of `header` then `chunks` MiB of zeros, its CRC-32 and inflated size.

    Each piece is compressed on its own and ends in a full flush, so the compressed MiB of
    zeros (about 1 KiB) is computed once and repeated: no GiB is ever held or deflated here.
    """

    def piece(data: bytes) -> bytes:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)

    zeros = bytes(MiB)
    crc = zlib.crc32(header)
    for _ in range(chunks):
        crc = zlib.crc32(zeros, crc)
    stream = piece(header) + piece(zeros) * chunks + zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    return stream, crc, len(header) + chunks * MiB


# ---- checking refusals ------------------------------------------------------------------------------------
def refused(call: Callable[[], Any], path: Path, match: str) -> str:
    """Run `call`; it must raise a CheckpointError whose message is one sentence naming `path`."""
    with pytest.raises(CheckpointError) as info:
        call()
    message = str(info.value)
    assert os.fspath(path) in message, message
    assert "\n" not in message, message
    assert re.search(match, message), message
    return message


def peak_bytes(call: Callable[[], Any]) -> int:
    """The most memory Python and NumPy held at once while `call` ran (exceptions are swallowed)."""
    tracemalloc.start()
    try:
        call()
    except Exception:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def load_into_fresh_run(path: Path) -> Callable[[], Any]:
    run = mixed_run(1)
    return lambda: load_checkpoint(path, *run)


# ---- files built to exhaust memory --------------------------------------------------------------------------
def test_an_array_header_declaring_8_TiB_is_refused_at_once_in_little_memory(saved: Path, tmp_path: Path) -> None:
    document = metadata(saved)
    document["extra"] = {"huge": array_ref("extra/huge", (2**40,), "float64")}  # 8 TiB of float64
    path = edited(saved, tmp_path / "huge.npz", document, extra__huge=npy_header((2**40,), np.float64))
    for call in (lambda: read_checkpoint(path), load_into_fresh_run(path)):
        start = time.perf_counter()
        refused(call, path, r"extra/huge")
        assert time.perf_counter() - start < 5.0
        assert peak_bytes(call) < SMALL_PEAK


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint whose `extra` holds a 1 GiB float64 array of zeros, deflated to about 1 MB.

    Everything else is consistent: the metadata names the array with its true shape, the zip
    declares its true size, its CRC is right.  Only its size is the problem.
    """
    run = mixed_run(0)
    train(*run, steps=3)
    src = tmp_path_factory.mktemp("bomb") / "run.npz"
    save_checkpoint(src, *run)
    document = metadata(src)
    shape = (2**27,)  # 2^27 float64 = 1 GiB
    document["extra"] = {"bomb": array_ref("extra/bomb", shape, "float64")}
    entries = members(src)
    entries[METADATA] = metadata_entry(document)
    raw = [(name, 0, zlib.crc32(data), len(data), data) for name, data in entries.items()]
    stream, crc, size = deflated_zeros(npy_header(shape, np.float64), chunks=1024)
    path = src.with_name("bomb.npz")
    write_raw_zip(path, [*raw, ("extra/bomb.npy", zipfile.ZIP_DEFLATED, crc, size, stream)])
    assert path.stat().st_size < 2 * MiB and size > 2**30
    return path


def test_a_zip_bomb_is_refused_before_it_is_inflated(zip_bomb: Path) -> None:
    for call in (load_into_fresh_run(zip_bomb), lambda: read_checkpoint(zip_bomb)):
        refused(call, zip_bomb, r"\d bytes")
        assert peak_bytes(call) < SMALL_PEAK
    message = refused(lambda: read_checkpoint(zip_bomb), zip_bomb, "max_bytes=")
    assert "read_checkpoint" in message  # it says how to read a bigger file on purpose


def test_an_entry_that_inflates_past_its_declared_size_stops_there(saved: Path, tmp_path: Path) -> None:
    """The zip declares 8 bytes of data; the stream would inflate to 1 GiB.  Reading stops at the
    declared size, and the CRC (computed over the whole GiB) no longer matches."""
    document = metadata(saved)
    document["extra"] = {"bomb": array_ref("extra/bomb", (1,), "float64")}
    entries = members(saved)
    entries[METADATA] = metadata_entry(document)
    raw = [(name, 0, zlib.crc32(data), len(data), data) for name, data in entries.items()]
    header = npy_header((1,), np.float64)
    stream, crc, _ = deflated_zeros(header, chunks=1024)
    path = tmp_path / "liar.npz"
    write_raw_zip(path, [*raw, ("extra/bomb.npy", zipfile.ZIP_DEFLATED, crc, len(header) + 8, stream)])
    call = load_into_fresh_run(path)
    refused(call, path, "damaged")
    assert peak_bytes(call) < SMALL_PEAK


def test_a_zip_directory_of_100_000_entries_is_refused_from_its_end_record(saved: Path, tmp_path: Path) -> None:
    """zipfile turns each listed entry into ~500 bytes of Python objects: 100,000 entries (6 MB
    of directory) would take 50 MB before a single check ran."""
    raw = [(name, 0, zlib.crc32(data), len(data), data) for name, data in members(saved).items()]
    empty = [(f"extra/{i}.npy", 0, 0, 0, b"") for i in range(100_000)]
    path = tmp_path / "many.npz"
    write_raw_zip(path, raw + empty)
    call = load_into_fresh_run(path)
    refused(call, path, r"zip directory declares [\d,]+ bytes")
    assert peak_bytes(call) < SMALL_PEAK


# ---- the metadata ------------------------------------------------------------------------------------------
def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [150, 100_000])
def test_deeply_nested_metadata_is_refused(saved: Path, tmp_path: Path, depth: int) -> None:
    """150 levels parse (and would be accepted); 100,000 make json.loads itself give up."""
    text = json.dumps(metadata(saved) | {"extra": None}).replace('"extra": null', f'"extra": {nested(depth)}')
    path = edited(saved, tmp_path / "deep.npz", text)
    for call in (lambda: read_checkpoint(path), load_into_fresh_run(path)):
        refused(call, path, "metadata nests deeper than 100 levels")


@pytest.mark.parametrize(
    "text",
    [b"\xff\xfe not text", b'{"format": "tinyamp-checkpoint", "version": 1'],
    ids=["not_utf8", "cut_short"],
)
def test_metadata_that_is_not_json_is_refused(saved: Path, tmp_path: Path, text: bytes) -> None:
    path = edited(saved, tmp_path / "text.npz", text)
    refused(load_into_fresh_run(path), path, "metadata is not JSON")


def test_metadata_too_large_is_refused_without_reading_it(saved: Path, tmp_path: Path) -> None:
    document = metadata(saved) | {"extra": "x" * (17 * MiB)}
    path = edited(saved, tmp_path / "long.npz", document)
    call = load_into_fresh_run(path)
    refused(call, path, r"metadata .*more than the 16,777,216 bytes")
    assert peak_bytes(call) < SMALL_PEAK


def test_metadata_that_is_not_an_array_of_bytes_is_refused(saved: Path, tmp_path: Path) -> None:
    path = edited(saved, tmp_path / "meta.npz", tinyamp_checkpoint=npy(np.zeros(3)))
    refused(load_into_fresh_run(path), path, "metadata")


@pytest.mark.parametrize(
    "extra",
    [
        {"__tinyamp__": "tuple"},
        {"__tinyamp__": "scalar", "dtype": "object", "value": 1},
        {"__tinyamp__": "scalar", "dtype": "int8", "value": 1000},
        {"__tinyamp__": "array", "key": "extra/x", "dtype": "float16", "shape": [16, -4]},
        {"__tinyamp__": "array", "key": "extra/x", "dtype": "object", "shape": [3]},
        {"__tinyamp__": "pickle"},
    ],
    ids=["tuple_without_items", "object_scalar", "int8_overflow", "negative_shape", "object_array", "unknown_tag"],
)
def test_a_tag_with_the_wrong_fields_is_refused(saved: Path, tmp_path: Path, extra: dict[str, Any]) -> None:
    path = edited(saved, tmp_path / "tag.npz", metadata(saved) | {"extra": extra})
    refused(lambda: read_checkpoint(path), path, "metadata")


def test_save_refuses_metadata_that_could_not_be_read_back(saved: Path) -> None:
    model, opt, scaler = mixed_run(0)
    deep: Any = []
    for _ in range(120):
        deep = [deep]
    with pytest.raises(ValueError, match="nests deeper than 100 levels"):
        save_checkpoint(saved, model, opt, scaler, extra=deep)
    with pytest.raises(ValueError, match="16,777,216 bytes"):
        save_checkpoint(saved, model, opt, scaler, extra="x" * (17 * MiB))
    assert read_checkpoint(saved)["extra"] == {"step": 3}  # the file is untouched


# ---- entries ---------------------------------------------------------------------------------------------------
def test_an_entry_not_named_in_the_metadata_is_refused(saved: Path, tmp_path: Path) -> None:
    path = edited(saved, tmp_path / "more.npz", extra__evil=npy(np.zeros(3)))
    refused(load_into_fresh_run(path), path, "'extra/evil.npy' .*not named in its metadata")


def test_an_entry_the_metadata_names_but_the_file_lacks_is_refused(saved: Path, tmp_path: Path) -> None:
    entries = members(saved)
    del entries["optimizer/master/0.weight.npy"]
    path = tmp_path / "less.npz"
    write_zip(path, entries)
    refused(load_into_fresh_run(path), path, "lacks the entry 'optimizer/master/0.weight.npy'")


def test_a_name_used_twice_is_refused(saved: Path, tmp_path: Path) -> None:
    path = tmp_path / "twice.npz"
    path.write_bytes(saved.read_bytes())
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(path, "a") as archive:
        archive.writestr("model/0.weight.npy", npy(np.zeros((16, 4), np.float16)))
    refused(load_into_fresh_run(path), path, "two entries named 'model/0.weight.npy'")


@pytest.mark.parametrize(
    "value, stored",
    [(np.zeros((4, 16), np.float16), r"\(4, 16\) float16"), (np.zeros((16, 4), np.float32), r"\(16, 4\) float32")],
    ids=["shape", "dtype"],
)
def test_a_header_that_disagrees_with_the_metadata_is_refused(
    saved: Path, tmp_path: Path, value: np.ndarray, stored: str
) -> None:
    path = tmp_path / "header.npz"
    write_zip(path, members(saved) | {"model/0.weight.npy": npy(value)})
    refused(load_into_fresh_run(path), path, rf"array model/0.weight is stored as {stored}; the metadata says")


def test_a_header_that_declares_more_or_fewer_bytes_than_the_entry_holds_is_refused(
    saved: Path, tmp_path: Path
) -> None:
    weight = npy(np.zeros((16, 4), np.float16))
    for data in (weight[:-2], weight + b"\x00\x00"):
        path = tmp_path / "size.npz"
        write_zip(path, members(saved) | {"model/0.weight.npy": data})
        refused(load_into_fresh_run(path), path, "model/0.weight.npy")


def test_a_pickled_object_entry_is_refused_without_unpickling(saved: Path, tmp_path: Path) -> None:
    objects = np.empty((16, 4), dtype=object)
    objects[...] = 1
    path = tmp_path / "pickle.npz"
    write_zip(path, members(saved) | {"model/0.weight.npy": npy(objects, allow_pickle=True)})
    refused(load_into_fresh_run(path), path, "'model/0.weight.npy' holds Python objects")


def test_an_entry_compressed_by_an_unknown_method_is_refused(saved: Path, tmp_path: Path) -> None:
    entries = members(saved)
    raw = [(name, 0, zlib.crc32(data), len(data), data) for name, data in entries.items()]
    name, _, crc, size, data = raw.pop()
    path = tmp_path / "method99.npz"
    write_raw_zip(path, [*raw, (name, 99, crc, size, data)])  # 99: AES encryption, which zipfile cannot read
    refused(load_into_fresh_run(path), path, "compression method 99")


# ---- the masters and the model weights -----------------------------------------------------------------------
def test_a_non_finite_master_is_refused_with_its_name_and_count(saved: Path, tmp_path: Path) -> None:
    entries = members(saved)
    master = np.load(io.BytesIO(entries["optimizer/master/2.weight.npy"])).copy()
    master[0, 0], master[1, 2] = np.nan, np.inf
    path = tmp_path / "nan.npz"
    write_zip(path, entries | {"optimizer/master/2.weight.npy": npy(master)})
    run = mixed_run(1)
    before = [m.data.copy() for m in run[1].master_params]
    refused(lambda: load_checkpoint(path, *run), path, r"master weight 2.weight holds 2 non-finite values")
    assert all(np.array_equal(a, m.data) for a, m in zip(before, run[1].master_params))


def test_a_model_weight_that_is_not_its_master_rounded_is_refused(saved: Path, tmp_path: Path) -> None:
    entries = members(saved)
    weight = np.load(io.BytesIO(entries["model/0.weight.npy"])).copy()
    weight[3, 1] = weight[3, 1] + np.float16(1)
    weight[5, 0] = -weight[5, 0] if weight[5, 0] != 0 else np.float16(1)
    path = tmp_path / "edited.npz"
    write_zip(path, entries | {"model/0.weight.npy": npy(weight)})
    model, opt, scaler = run = mixed_run(1)
    before = model.state_dict()["0.weight"].copy()
    refused(lambda: load_checkpoint(path, *run), path, r"0.weight .*differs .*in 2 of 64 elements")
    assert np.array_equal(model.state_dict()["0.weight"], before)


def test_master_weights_refuse_a_non_finite_master_in_a_state_dict_too(saved: Path) -> None:
    """Without a file: MasterWeights.load_state_dict names the master and changes nothing."""
    state = read_checkpoint(saved)["optimizer"]
    state["master"]["0.bias"] = np.full(16, np.nan, np.float32)
    model, opt, _ = mixed_run(1)
    before = [m.data.copy() for m in opt.master_params]
    with pytest.raises(MasterWeightsStateError, match="master of 0.bias holds 16 non-finite values"):
        opt.load_state_dict(state)
    assert all(np.array_equal(a, m.data) for a, m in zip(before, opt.master_params))


def test_a_saved_checkpoint_agrees_with_itself(saved: Path) -> None:
    """The control for the two tests above: the untouched file loads, masters and model agree."""
    model, opt, scaler = mixed_run(1)
    assert load_checkpoint(saved, model, opt, scaler) == {"step": 3}
    for p, m in zip(opt.model_params, opt.master_params):
        assert p.data.tobytes() == m.data.astype(p.dtype).tobytes()


# ---- the bounds a caller can raise -------------------------------------------------------------------------------
def test_read_checkpoint_takes_a_max_bytes_and_says_how_to_raise_it(saved: Path) -> None:
    total = sum(a.nbytes for a in read_checkpoint(saved)["model"].values())
    message = refused(lambda: read_checkpoint(saved, max_bytes=total), saved, "max_bytes=")
    assert "read_checkpoint" in message
    assert read_checkpoint(saved, max_bytes=10 * MiB)["extra"] == {"step": 3}


def test_load_checkpoint_bounds_the_arrays_that_are_not_shaped_like_the_run(saved: Path, tmp_path: Path) -> None:
    """`extra` may hold arrays, up to `extra_bytes`; an array shaped like the run's counts against the run."""
    run = mixed_run(0)
    path = tmp_path / "extra.npz"
    save_checkpoint(path, *run, extra={"data": np.zeros(1000)})
    refused(lambda: load_checkpoint(path, *mixed_run(1), extra_bytes=4000), path, "extra_bytes=")
    assert load_checkpoint(path, *mixed_run(1), extra_bytes=20_000)["data"].shape == (1000,)


def test_a_fortran_order_array_round_trips(tmp_path: Path) -> None:
    """np.lib.format writes a transposed (Fortran-contiguous) array as such; it comes back equal."""
    model, opt, scaler = mixed_run(0)
    value = np.arange(12.0).reshape(3, 4).T
    save_checkpoint(tmp_path / "f.npz", model, opt, scaler, extra={"t": value})
    back = read_checkpoint(tmp_path / "f.npz")["extra"]["t"]
    assert back.shape == (4, 3) and np.array_equal(back, value)


# ---- the numpy 2.0 stray entry ------------------------------------------------------------------------------
def test_a_saved_file_holds_only_the_entries_its_metadata_names(saved: Path) -> None:
    """np.savez(f, allow_pickle=False, **arrays) on numpy 2.0 stored an array named allow_pickle."""
    names = set(members(saved))
    assert "allow_pickle.npy" not in names
    document = metadata(saved)
    keys = set(re.findall(r'"key": "([^"]+)"', json.dumps(document)))
    assert names == {f"{k}.npy" for k in keys} | {METADATA}


def test_a_file_written_by_numpy_2_0_with_the_stray_entry_still_loads(saved: Path, tmp_path: Path) -> None:
    path = tmp_path / "numpy20.npz"
    write_zip(path, members(saved) | {"allow_pickle.npy": npy(np.array(False))})
    model, opt, scaler = mixed_run(1)
    assert load_checkpoint(path, model, opt, scaler) == {"step": 3}
    write_zip(path, members(saved) | {"allow_pickle.npy": npy(np.zeros(1000))})  # not what numpy 2.0 wrote
    refused(load_into_fresh_run(path), path, "allow_pickle")
