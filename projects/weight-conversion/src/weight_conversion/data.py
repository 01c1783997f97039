"""scikit-learn's digits (1,797 8x8 images, shipped with the package: no
download), split once into a training part and a held-out part.

The images are kept as float32 in [0, 1], shape `(n, 8, 8)`; each framework
adds its own channel axis: PyTorch wants NCHW `(n, 1, 8, 8)`, Keras and Flax
want NHWC `(n, 8, 8, 1)`. That difference is the reason fc1's weights need a
permutation when they are converted (see `weight_map.py`).
"""

from typing import NamedTuple

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


class Split(NamedTuple):
    train_images: np.ndarray  # shape=(n_train, 8, 8), float32 in [0, 1]
    train_labels: np.ndarray  # shape=(n_train,), int64 in [0, 10)
    test_images: np.ndarray  # shape=(n_test, 8, 8), float32 in [0, 1]
    test_labels: np.ndarray  # shape=(n_test,), int64 in [0, 10)


def load_split(split_seed: int = 0, test_fraction: float = 0.2) -> Split:
    """A stratified split: every class keeps `test_fraction` of its images held out."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    tr_x, te_x, tr_y, te_y = train_test_split(
        images, labels, test_size=test_fraction, stratify=labels, random_state=split_seed
    )
    return Split(tr_x, tr_y, te_x, te_y)


def nchw(images: np.ndarray) -> np.ndarray:
    """`(n, 8, 8)` -> `(n, 1, 8, 8)`: the PyTorch layout."""
    return images[:, None, :, :]


def nhwc(images: np.ndarray) -> np.ndarray:
    """`(n, 8, 8)` -> `(n, 8, 8, 1)`: the Keras and Flax layout."""
    return images[:, :, :, None]
