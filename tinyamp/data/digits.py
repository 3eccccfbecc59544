"""The 8x8 handwritten digits: 1797 real images of 0..9, shipped inside the package.

Each image is a 32x32 bitmap of a digit written by one of 13 people, cut into 4x4 blocks;
a pixel is the number of "on" bits in its block, an integer from 0 to 16.  ``digits.npz``
(45 KB) holds them as uint8 ``images`` (1797, 8, 8) and ``labels`` (1797,); nothing is
downloaded and scikit-learn is not needed (``make_digits.py`` shows how the file was made).

A linear softmax classifier reaches about 95% test accuracy and a small MLP about 96-97%,
in seconds on a CPU: a real dataset on which the effects of FP16 show up quickly.

Source and licence: UCI Machine Learning Repository, "Optical Recognition of Handwritten
Digits", E. Alpaydin and C. Kaynak (1998), licensed under
CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/).  These are the 1797 images of
its test set (optdigits.tes), the same ones scikit-learn ships as ``load_digits``; stored
here unchanged, as uint8.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

DIGITS_ATTRIBUTION = (
    'The digits are the test set of "Optical Recognition of Handwritten Digits" by E. Alpaydin and '
    "C. Kaynak (1998), UCI Machine Learning Repository, licensed "
    "under CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/); 1797 8x8 images with pixels "
    "0..16, the same set scikit-learn ships as load_digits, stored unchanged as uint8 in "
    "tinyamp/data/digits.npz."
)

DIGITS_FILE = Path(__file__).with_name("digits.npz")
# sha256 of digits.npz as written by make_digits.py; a mismatch means a damaged or replaced file.
DIGITS_SHA256 = "b3b9c8cc11d765ce4264d8748bf3edbafa5038d91c93cf713ddbd6ae8652b410"

SPLITS = (None, "train", "test")


class ChecksumError(OSError):
    """A shipped data file does not have the bytes it was released with."""


def _read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The raw arrays, uint8 images (1797, 8, 8) and uint8 labels (1797,), after the checksum check."""
    path = DIGITS_FILE  # looked up at call time, so a test can point it at a damaged copy
    if not path.is_file():
        raise FileNotFoundError(
            f"the digits file {path} is missing: tinyamp was installed without its package data. "
            "Reinstall it (pip install --force-reinstall tinyamp, or pip install -e . in a checkout)."
        )
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != DIGITS_SHA256:
        raise ChecksumError(
            f"the digits file {path} is damaged: its sha256 is {digest}, expected {DIGITS_SHA256} "
            f"({len(raw)} bytes read). Reinstall tinyamp, or restore the file with git checkout."
        )
    with np.load(path, allow_pickle=False) as f:
        return f["images"], f["labels"]


def stratified_split(labels: np.ndarray, test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, test)`` that split ``labels`` class by class, each sorted ascending.

    For each class $c$ with $n_c$ examples, a seeded permutation puts
    $\\mathrm{round}(f\\,n_c)$ of them (at least 1, at most $n_c - 1$) in the test set, so both
    sets keep the class proportions.  The two index sets are disjoint and together cover
    ``range(len(labels))``; the same seed gives the same split.
    """
    _check_fraction(test_fraction)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    test: list[np.ndarray] = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) < 2:
            raise ValueError(f"class {c} has {len(members)} example(s); a stratified split needs at least 2 per class")
        n_test = min(max(int(np.floor(test_fraction * len(members) + 0.5)), 1), len(members) - 1)
        test.append(rng.permutation(members)[:n_test])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(labels)), test_idx)  # sorted, and disjoint by construction
    return train_idx, test_idx


def load_digits(
    split: str | None = None, seed: int = 0, test_fraction: float = 0.2, dtype: Any = "float32"
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)``: pixels scaled to [0, 1] of shape (N, 64) and int64 labels 0..9 of shape (N,).

    ``split=None`` gives all 1797 images in file order; ``"train"`` or ``"test"`` gives one side
    of :func:`stratified_split` (``test_fraction`` of each class in the test set, chosen by
    ``seed``; the default gives 1438 train and 359 test images, disjoint and together all 1797).

    $x = \\mathrm{pixel}/16$: every value $k/16$, $k = 0..16$, is exact in FP16, BF16 and FP32,
    so the inputs themselves carry no rounding error in any of the formats compared here.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS} (None means all 1797 images)")
    _check_fraction(test_fraction)
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"load_digits returns pixels in [0, 1] and needs a float dtype; got dtype={dt}")
    images, labels = _read_digits()
    x = images.reshape(len(images), 64).astype(dt) / dt.type(16)
    y = labels.astype(np.int64)
    if split is None:
        return x, y
    train_idx, test_idx = stratified_split(y, test_fraction, seed)
    idx = train_idx if split == "train" else test_idx
    return x[idx], y[idx]


def _check_fraction(test_fraction: float) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be strictly between 0 and 1; got {test_fraction}")
