"""A character corpus made of the Python standard library's own source, and the tools to batch it.

Every Python installation carries its standard library as ``.py`` files, so this corpus
needs no download and no licence beyond Python's own (PSF licence).  The text is a fixed,
alphabetical list of pure-Python modules, read from ``sysconfig.get_paths()["stdlib"]``
(never from ``sys.path``, where a local ``bisect.py`` could take a module's place) and
concatenated in that order, so it is the same on every machine with the same Python
version; another Python version gives slightly different text (the modules change).

Characters: every character outside printable ASCII and ``"\\n"`` (a few accented letters
and symbols in comments) becomes ``"?"``, so the vocabulary is at most 96 symbols whatever
the Python version.  Line endings are ``"\\n"`` on every platform (text-mode reading).

    text = char_corpus()                       # 200,000 characters of Python source
    stoi, itos = build_vocab(text)
    data = encode(text, stoi)                  # int64 array
    train, val = split_train_val(data)         # first 90% / last 10%
    x, y = char_batches(train, block_size=64, batch_size=32, rng=np.random.default_rng(0))
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

# Single-file, pure-Python modules present (and still single files) from Python 3.10 on;
# sorted, so the corpus reads them in a fixed order.  About 600,000 characters in all.
CORPUS_MODULES: tuple[str, ...] = (
    "abc", "bisect", "calendar", "colorsys", "contextlib", "copy", "dataclasses", "difflib", "enum",
    "fnmatch", "fractions", "functools", "glob", "graphlib", "heapq", "numbers", "operator", "pprint",
    "queue", "random", "reprlib", "sched", "shlex", "statistics", "textwrap", "tokenize", "weakref",
)  # fmt: skip

# The characters the corpus may contain: newline and the 95 printable ASCII characters.
ALPHABET = "\n" + "".join(chr(i) for i in range(32, 127))
REPLACEMENT = "?"

T = TypeVar("T", str, np.ndarray)


def stdlib_dir() -> Path:
    """The folder holding this interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _to_alphabet(text: str) -> str:
    outside = {ord(c): REPLACEMENT for c in set(text) if c not in ALPHABET}
    return text.translate(outside) if outside else text


def char_corpus(max_chars: int = 200_000) -> str:
    """The first ``max_chars`` characters of the standard-library modules in ``CORPUS_MODULES``.

    Files are concatenated whole, in the order of ``CORPUS_MODULES``, and the result is cut at
    ``max_chars``; if the modules hold fewer characters (about 600,000), all of them are
    returned.  Characters outside ``ALPHABET`` are replaced by ``"?"``.  Deterministic for a
    given Python version.
    """
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars must be a positive integer; got {max_chars!r}")
    root = stdlib_dir()
    parts: list[str] = []
    total = 0
    for name in CORPUS_MODULES:
        if total >= max_chars:
            break
        path = root / f"{name}.py"
        if not path.is_file():
            raise FileNotFoundError(
                f"the character corpus needs the standard-library source {path}, which is missing: "
                f"this Python ({sysconfig.get_python_version()}) was installed without its .py files. "
                "Install them (e.g. the python3 package with its full library) or use another interpreter."
            )
        text = _to_alphabet(path.read_text(encoding="utf-8"))
        parts.append(text)
        total += len(text)
    return "".join(parts)[:max_chars]


def build_vocab(text: str) -> tuple[dict[str, int], list[str]]:
    """``(stoi, itos)`` for the distinct characters of ``text``, in code-point order.

    ``itos[i]`` is the character with id ``i`` and ``stoi[c]`` its inverse.
    """
    if not text:
        raise ValueError("build_vocab needs a non-empty text")
    itos = sorted(set(text))
    return {c: i for i, c in enumerate(itos)}, itos


def encode(text: str, stoi: dict[str, int]) -> np.ndarray:
    """The ids of the characters of ``text``: an int64 array of shape (len(text),)."""
    try:
        return np.fromiter((stoi[c] for c in text), dtype=np.int64, count=len(text))
    except KeyError as e:
        pos = text.index(e.args[0])
        raise ValueError(
            f"character {e.args[0]!r} (position {pos}) is not in the vocabulary of {len(stoi)} characters; "
            "build the vocabulary from a text that contains it"
        ) from None


def decode(ids: Iterable[int] | Any, itos: Sequence[str]) -> str:
    """The text whose character ids are ``ids``: a list, or a NumPy/CuPy array of any shape (read row by row)."""
    flat = ids.ravel().tolist() if hasattr(ids, "ravel") else list(ids)
    bad = [i for i in flat if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(itos)]
    if bad:
        raise ValueError(f"character ids must be integers in [0, {len(itos)}); got {bad[:5]}")
    return "".join(itos[i] for i in flat)


def split_train_val(data: T, val_fraction: float = 0.1) -> tuple[T, T]:
    """``(train, val)``: the first ``1 - val_fraction`` of ``data`` and the rest (no shuffling).

    Contiguous, so no validation window overlaps a training window except at the one seam.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be strictly between 0 and 1; got {val_fraction}")
    n_val = int(np.floor(len(data) * val_fraction + 0.5))
    if n_val < 1 or n_val >= len(data):
        raise ValueError(f"cannot split {len(data)} items with val_fraction={val_fraction}: one side would be empty")
    return data[: len(data) - n_val], data[len(data) - n_val :]


def char_batches(
    data: np.ndarray, block_size: int, batch_size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random windows for next-character prediction: ``x`` and ``y``, int64 of shape (batch_size, block_size).

    Row $b$ is $x_b = \\mathrm{data}[s_b : s_b + T]$ and $y_b = \\mathrm{data}[s_b + 1 : s_b + T + 1]$
    (the next character at every position), with starts $s_b$ drawn uniformly by ``rng``.
    """
    data = np.asarray(data)
    if data.ndim != 1:
        raise ValueError(f"char_batches needs a 1-D array of character ids; got shape {data.shape}")
    if block_size < 1 or batch_size < 1:
        raise ValueError(f"block_size and batch_size must be >= 1; got {block_size}, {batch_size}")
    if len(data) < block_size + 1:
        raise ValueError(
            f"a window of block_size={block_size} plus its next character needs {block_size + 1} ids; "
            f"data has {len(data)}. Use a smaller block_size or more text."
        )
    starts = rng.integers(0, len(data) - block_size, size=batch_size)  # the last start is len - T - 1
    idx = starts[:, None] + np.arange(block_size)
    return data[idx].astype(np.int64), data[idx + 1].astype(np.int64)


@dataclass
class CharDataset:
    """A corpus with its vocabulary and its train/validation ids, ready to batch.

    ``CharDataset.from_stdlib()`` is ``char_corpus``, ``build_vocab``, ``encode`` and
    ``split_train_val`` in one call; ``batch("train", T, B, rng)`` calls ``char_batches``.
    """

    text: str
    stoi: dict[str, int]
    itos: list[str]
    train: np.ndarray
    val: np.ndarray

    @classmethod
    def from_text(cls, text: str, val_fraction: float = 0.1) -> CharDataset:
        """Build the vocabulary from all of ``text`` (so validation has no unknown characters), then split."""
        stoi, itos = build_vocab(text)
        train, val = split_train_val(encode(text, stoi), val_fraction)
        return cls(text, stoi, itos, train, val)

    @classmethod
    def from_stdlib(cls, max_chars: int = 200_000, val_fraction: float = 0.1) -> CharDataset:
        """The standard-library corpus of :func:`char_corpus`."""
        return cls.from_text(char_corpus(max_chars), val_fraction)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def batch(
        self, split: str, block_size: int, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``char_batches`` on the ``"train"`` or ``"val"`` ids."""
        if split not in ("train", "val"):
            raise ValueError(f"unknown split {split!r}; choose 'train' or 'val'")
        return char_batches(self.train if split == "train" else self.val, block_size, batch_size, rng)

    def __repr__(self) -> str:
        return (
            f"CharDataset({len(self.text):,} chars, vocab {self.vocab_size}, "
            f"train {len(self.train):,}, val {len(self.val):,})"
        )
