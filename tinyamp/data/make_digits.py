"""How ``digits.npz`` was made: a maintainer's script, never imported by tinyamp.

    pip install scikit-learn
    python -m tinyamp.data.make_digits        # writes tinyamp/data/digits.npz, prints its sha256

It copies the 1797 images of scikit-learn's ``load_digits`` (the test set of the UCI
"Optical Recognition of Handwritten Digits", integer pixels 0..16) into two uint8 arrays,
``images`` (1797, 8, 8) and ``labels`` (1797,), in the order scikit-learn gives them.
uint8 is lossless here (every pixel is a count of on-pixels in a 4x4 block, 0..16) and
takes an eighth of the float64 that scikit-learn returns.

The zip entries get a fixed timestamp, so two runs with the same zlib write the same bytes.
After a rebuild, paste the printed sha256 into ``DIGITS_SHA256`` in ``digits.py``.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import numpy as np

OUT = Path(__file__).with_name("digits.npz")


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as a compressed ``.npz`` that ``np.load`` reads, with fixed zip timestamps.

    ``np.savez_compressed`` stamps each entry with the current time, so its bytes (and the
    checksum) would change on every run; here each entry is dated 1980-01-01.
    """
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        for name, array in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue(), compresslevel=9)
    os.replace(tmp, path)  # atomic: a half-written file never replaces a good one


def main() -> None:
    from sklearn.datasets import load_digits  # the only place scikit-learn is used

    bunch = load_digits()
    images, labels = np.asarray(bunch.images), np.asarray(bunch.target)
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,), (images.shape, labels.shape)
    # The pixels are whole counts 0..16 and the labels 0..9: the uint8 cast loses nothing.
    assert np.array_equal(images, np.round(images)) and images.min() == 0 and images.max() == 16
    assert set(np.unique(labels).tolist()) == set(range(10))
    write_npz(OUT, {"images": images.astype(np.uint8), "labels": labels.astype(np.uint8)})
    digest = hashlib.sha256(OUT.read_bytes()).hexdigest()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
    print(f'DIGITS_SHA256 = "{digest}"')


if __name__ == "__main__":
    main()
