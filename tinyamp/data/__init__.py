"""Small datasets built by (or shipped with) the package: nothing is downloaded.

- ``spiral``: K interleaved arms in the plane, built from a seed (not linearly separable).
- ``load_digits``: 1797 real 8x8 handwritten digits, shipped as ``digits.npz`` (CC BY 4.0,
  see ``DIGITS_ATTRIBUTION``).
- ``char_corpus`` and friends: Python standard-library source as a character-level corpus.
"""

from tinyamp.data.chars import (
    CharDataset,
    build_vocab,
    char_batches,
    char_corpus,
    decode,
    encode,
    split_train_val,
)
from tinyamp.data.digits import DIGITS_ATTRIBUTION, ChecksumError, load_digits, stratified_split
from tinyamp.data.spiral import spiral

__all__ = [
    "spiral",
    "load_digits", "stratified_split", "DIGITS_ATTRIBUTION", "ChecksumError",
    "char_corpus", "build_vocab", "encode", "decode", "split_train_val", "char_batches", "CharDataset",
]  # fmt: skip
