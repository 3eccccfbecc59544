"""The shipped datasets: the 8x8 digits (checksummed, split by class) and the stdlib character corpus."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.data import (
    DIGITS_ATTRIBUTION,
    CharDataset,
    ChecksumError,
    build_vocab,
    char_batches,
    char_corpus,
    decode,
    encode,
    load_digits,
    split_train_val,
    stratified_split,
)
from tinyamp.data import chars as chars_module
from tinyamp.data import digits as digits_module

pytestmark = pytest.mark.cli

# ---------------------------------------------------------------- digits


def test_digits_shape_dtype_and_range() -> None:
    x, y = load_digits()
    assert x.shape == (1797, 64) and x.dtype == np.float32
    assert y.shape == (1797,) and y.dtype == np.int64
    assert x.min() == 0.0 and x.max() == 1.0
    # pixels are counts 0..16 divided by 16: every value is an exact multiple of 1/16
    assert np.array_equal(x * 16, np.round(x * 16))


def test_digits_has_all_ten_classes_about_180_each() -> None:
    _, y = load_digits()
    counts = np.bincount(y, minlength=10)
    assert len(counts) == 10
    assert counts.tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", np.float16])
def test_digits_dtype_is_honoured_and_exact(dtype: object) -> None:
    x, _ = load_digits(dtype=dtype)
    assert x.dtype == np.dtype(dtype)
    # k/16 is exact in every float format, so all dtypes hold the same values
    np.testing.assert_array_equal(x.astype(np.float64), load_digits(dtype="float64")[0])


def test_digits_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown split 'validation'"):
        load_digits("validation")
    for fraction in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="test_fraction must be strictly between 0 and 1"):
            load_digits("test", test_fraction=fraction)
    with pytest.raises(TypeError, match="needs a float dtype"):
        load_digits(dtype="int32")


def test_digits_attribution_names_source_authors_and_licence() -> None:
    for needle in ("Alpaydin", "Kaynak", "1998", "UCI Machine Learning Repository", "CC BY 4.0"):
        assert needle in DIGITS_ATTRIBUTION
    assert "CC BY 4.0" in (digits_module.__doc__ or "")


def test_digits_file_matches_its_recorded_checksum() -> None:
    import hashlib

    assert hashlib.sha256(digits_module.DIGITS_FILE.read_bytes()).hexdigest() == digits_module.DIGITS_SHA256


def test_a_damaged_digits_file_gives_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    damaged = tmp_path / "digits.npz"
    shutil.copy(digits_module.DIGITS_FILE, damaged)
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte in the middle of the compressed pixels
    damaged.write_bytes(bytes(raw))
    monkeypatch.setattr(digits_module, "DIGITS_FILE", damaged)
    with pytest.raises(ChecksumError, match=r"digits file .* is damaged: its sha256 is [0-9a-f]{64}, expected"):
        load_digits()


def test_a_missing_digits_file_says_to_reinstall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digits_module, "DIGITS_FILE", tmp_path / "nowhere.npz")
    with pytest.raises(FileNotFoundError, match="installed without its package data"):
        load_digits()


def test_an_intact_copy_loads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "digits.npz"
    shutil.copy(digits_module.DIGITS_FILE, copy)
    expected = load_digits()
    monkeypatch.setattr(digits_module, "DIGITS_FILE", copy)
    for a, b in zip(load_digits(), expected):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("seed", "fraction"), [(0, 0.2), (1, 0.2), (0, 0.5), (7, 0.1)])
def test_split_is_disjoint_covering_stratified_and_deterministic(seed: int, fraction: float) -> None:
    x, y = load_digits()
    train_idx, test_idx = stratified_split(y, fraction, seed)
    assert np.intersect1d(train_idx, test_idx).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train_idx, test_idx])), np.arange(len(y)))
    # each class keeps its share of the test set, to within one example
    counts, test_counts = np.bincount(y), np.bincount(y[test_idx], minlength=10)
    assert np.all(np.abs(test_counts - fraction * counts) <= 1)

    x_tr, y_tr = load_digits("train", seed=seed, test_fraction=fraction)
    x_te, y_te = load_digits("test", seed=seed, test_fraction=fraction)
    np.testing.assert_array_equal(x_tr, x[train_idx])
    np.testing.assert_array_equal(y_te, y[test_idx])
    assert len(y_tr) + len(y_te) == 1797
    again = load_digits("test", seed=seed, test_fraction=fraction)
    np.testing.assert_array_equal(again[0], x_te)
    np.testing.assert_array_equal(again[1], y_te)


def test_default_split_sizes_and_seed_dependence() -> None:
    assert len(load_digits("train")[1]) == 1438 and len(load_digits("test")[1]) == 359
    _, a = stratified_split(load_digits()[1], seed=0)
    _, b = stratified_split(load_digits()[1], seed=1)
    assert not np.array_equal(a, b)


def test_a_linear_softmax_classifier_exceeds_90_percent_on_digits() -> None:
    """A known property of this dataset: it is nearly linearly separable."""
    x_tr, y_tr = load_digits("train")
    x_te, y_te = load_digits("test")
    ta.manual_seed(0)
    model = nn.Linear(64, 10)
    opt = optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    xs, ys = ta.tensor(x_tr), ta.tensor(y_tr)
    for _ in range(100):  # full-batch steps (about 94% after 100, 95% after 200)
        loss = ta.cross_entropy(model(xs), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with ta.no_grad():
        accuracy = float((model(ta.tensor(x_te)).data.argmax(axis=1) == y_te).mean())
    assert accuracy > 0.90, f"test accuracy {accuracy:.3f}"


# ---------------------------------------------------------------- character corpus


def test_corpus_is_deterministic_and_capped() -> None:
    text = char_corpus()
    assert text == char_corpus()
    assert len(text) == 200_000
    assert char_corpus(1000) == text[:1000]
    assert len(char_corpus(1)) == 1


def test_corpus_without_cap_is_all_modules_and_stays_in_its_alphabet() -> None:
    full = char_corpus(10**9)
    assert 300_000 < len(full) < 10**9
    assert set(full) <= set(chars_module.ALPHABET)
    assert full.startswith(chars_module.stdlib_dir().joinpath("abc.py").read_text(encoding="utf-8"))


def test_corpus_modules_are_sorted_and_read_from_the_stdlib() -> None:
    assert list(chars_module.CORPUS_MODULES) == sorted(chars_module.CORPUS_MODULES)
    for name in chars_module.CORPUS_MODULES:
        assert (chars_module.stdlib_dir() / f"{name}.py").is_file(), name
        assert name not in sys.builtin_module_names


def test_corpus_names_a_missing_source_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chars_module, "stdlib_dir", lambda: tmp_path)
    with pytest.raises(FileNotFoundError, match=r"abc\.py, which is missing"):
        char_corpus()


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_corpus_rejects_a_bad_cap(bad: object) -> None:
    with pytest.raises(ValueError, match="max_chars must be a positive integer"):
        char_corpus(bad)  # type: ignore[arg-type]


def test_vocab_round_trip_on_the_corpus() -> None:
    text = char_corpus(20_000)
    stoi, itos = build_vocab(text)
    assert itos == sorted(itos) and all(stoi[c] == i for i, c in enumerate(itos))
    ids = encode(text, stoi)
    assert ids.dtype == np.int64 and ids.shape == (len(text),)
    assert decode(ids, itos) == text
    assert decode(ids.tolist(), itos) == text


@given(st.text(min_size=1, max_size=50))
def test_decode_inverts_encode(text: str) -> None:
    stoi, itos = build_vocab(text)
    assert decode(encode(text, stoi), itos) == text


def test_encode_and_decode_name_what_is_outside_the_vocabulary() -> None:
    stoi, itos = build_vocab("abc")
    with pytest.raises(ValueError, match=r"character 'z' \(position 2\) is not in the vocabulary of 3"):
        encode("abz", stoi)
    with pytest.raises(ValueError, match=r"integers in \[0, 3\); got \[3, -1\]"):
        decode([0, 3, -1], itos)
    with pytest.raises(ValueError, match="non-empty"):
        build_vocab("")


def test_split_train_val_is_first_90_and_last_10_percent() -> None:
    data = np.arange(1000)
    train, val = split_train_val(data)
    np.testing.assert_array_equal(train, np.arange(900))
    np.testing.assert_array_equal(val, np.arange(900, 1000))
    assert split_train_val("abcdefghij") == ("abcdefghi", "j")
    with pytest.raises(ValueError, match="val_fraction"):
        split_train_val(data, 1.0)
    with pytest.raises(ValueError, match="one side would be empty"):
        split_train_val(np.arange(3), 0.1)


@given(
    n=st.integers(2, 200), block_size=st.integers(1, 20), batch_size=st.integers(1, 8), seed=st.integers(0, 2**32 - 1)
)
def test_batches_are_windows_shifted_by_one(n: int, block_size: int, batch_size: int, seed: int) -> None:
    block_size = min(block_size, n - 1)
    data = np.arange(n, dtype=np.int64) * 3  # distinct values: a window's position is its first value / 3
    x, y = char_batches(data, block_size, batch_size, np.random.default_rng(seed))
    assert x.shape == y.shape == (batch_size, block_size)
    assert x.dtype == y.dtype == np.int64
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    starts = x[:, 0] // 3
    np.testing.assert_array_equal(x, data[starts[:, None] + np.arange(block_size)])
    np.testing.assert_array_equal(y, data[starts[:, None] + np.arange(block_size) + 1])


def test_batches_are_reproducible_from_the_rng_and_checked() -> None:
    data = encode("hello world", build_vocab("hello world")[0])
    a = char_batches(data, 4, 3, np.random.default_rng(5))
    b = char_batches(data, 4, 3, np.random.default_rng(5))
    np.testing.assert_array_equal(a[0], b[0])
    with pytest.raises(ValueError, match="needs 12 ids; data has 11"):
        char_batches(data, 11, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="1-D"):
        char_batches(data.reshape(1, -1), 2, 1, np.random.default_rng(0))


def test_char_dataset_bundles_vocab_split_and_batches() -> None:
    ds = CharDataset.from_stdlib(max_chars=10_000)
    assert len(ds.train) == 9_000 and len(ds.val) == 1_000
    assert decode(np.concatenate([ds.train, ds.val]), ds.itos) == ds.text == char_corpus(10_000)
    x, y = ds.batch("val", 16, 4, np.random.default_rng(0))
    assert x.shape == (4, 16) and x.max() < ds.vocab_size
    assert "vocab" in repr(ds)
    with pytest.raises(ValueError, match="choose 'train' or 'val'"):
        ds.batch("test", 16, 4, np.random.default_rng(0))
