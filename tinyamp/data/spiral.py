"""The spiral dataset: K interleaved arms in the plane, one class per arm.

A classic first problem for a small MLP (it is not linearly separable, so a linear
model stays near chance while two hidden layers fit it).  Built from a seed, in memory.
"""

from __future__ import annotations

import numpy as np


def spiral(
    points_per_class: int = 300, classes: int = 3, noise: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)``: float32 points of shape (N, 2) and int64 labels of shape (N,)."""
    if points_per_class < 1 or classes < 2:
        raise ValueError(f"spiral needs points_per_class >= 1 and classes >= 2; got {points_per_class}, {classes}")
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for k in range(classes):
        radius = np.linspace(0.0, 1.0, points_per_class)
        angle = np.linspace(k * 4.0, (k + 1) * 4.0, points_per_class) + noise * rng.standard_normal(points_per_class)
        xs.append(np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1))
        ys.append(np.full(points_per_class, k))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64)
