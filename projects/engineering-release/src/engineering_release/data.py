"""Data: scikit-learn's digits, a stratified held-out split, and its digest.

A sample ID is the row of an example in `sklearn.datasets.load_digits()`
(0..1796). The held-out set of a `(split_seed, test_fraction)` pair is fixed
by `jax.random` (counter-based, the same on every machine). Its digest binds
an evaluation report to the exact examples it was computed on: the sha256 of
the IDs, raw pixels and labels, each written with its dtype and shape.
"""

import functools
import hashlib
from dataclasses import dataclass

import jax
import numpy as np

NUM_FEATURES = 64
NUM_CLASSES = 10
PIXEL_MAX = 16.0
DATA_NAME = "sklearn-digits"


@dataclass(frozen=True)
class Examples:
    """A subset of the digits.

    `ids`: int32 `(n,)` sample IDs, sorted. `images`: float32 `(n, 64)` raw
    pixel intensities 0..16. `labels`: int32 `(n,)` digits 0..9.
    """

    ids: np.ndarray
    images: np.ndarray
    labels: np.ndarray

    def digest(self) -> str:
        """sha256 over name, then dtype, shape and bytes of ids, images and labels."""
        h = hashlib.sha256(f"{DATA_NAME}\n".encode())
        for name, array in (("ids", self.ids), ("images", self.images), ("labels", self.labels)):
            array = np.ascontiguousarray(array)
            h.update(f"{name}:{array.dtype.str}:{array.shape}\n".encode())
            h.update(array.tobytes())
        return h.hexdigest()


@functools.cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = bunch.data.astype(np.float32)
    images.setflags(write=False)
    labels = bunch.target.astype(np.int32)
    labels.setflags(write=False)
    return images, labels


def split_ids(split_seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """`(train_ids, heldout_ids)`: each class permuted by its own key, the first
    `round(test_fraction * class size)` held out. Sorted int32, disjoint, covering
    every sample. Cached (read-only arrays): verification asks for it often.
    Raises `ValueError` naming the argument for a seed outside `0 <= seed < 2**32`
    or a fraction outside `0 < test_fraction < 0.5`."""
    if type(split_seed) is not int or not 0 <= split_seed < 2**32:
        raise ValueError(f"`split_seed` is `{split_seed!r}`, not an integer in [0, 2**32).")
    if type(test_fraction) not in (int, float) or not 0 < test_fraction < 0.5:
        raise ValueError(f"`test_fraction` is `{test_fraction!r}`, not a number in (0, 0.5).")
    return _split_ids(split_seed, float(test_fraction))


@functools.cache
def _split_ids(split_seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    _, labels = _digits()
    train, heldout = [], []
    keys = jax.random.split(jax.random.key(split_seed), NUM_CLASSES)
    for cls, key in zip(range(NUM_CLASSES), keys, strict=True):
        ids = np.flatnonzero(labels == cls)
        ids = ids[np.asarray(jax.random.permutation(key, len(ids)))]
        n = round(test_fraction * len(ids))
        heldout.append(ids[:n])
        train.append(ids[n:])
    train_ids = np.sort(np.concatenate(train)).astype(np.int32)
    heldout_ids = np.sort(np.concatenate(heldout)).astype(np.int32)
    train_ids.setflags(write=False)
    heldout_ids.setflags(write=False)
    return train_ids, heldout_ids


def subset(ids: np.ndarray) -> Examples:
    images, labels = _digits()
    return Examples(ids=np.asarray(ids, np.int32), images=images[ids], labels=labels[ids])


def train_set(split_seed: int, test_fraction: float) -> Examples:
    return subset(split_ids(split_seed, test_fraction)[0])


def heldout_set(split_seed: int, test_fraction: float) -> Examples:
    return subset(split_ids(split_seed, test_fraction)[1])
