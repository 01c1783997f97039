"""Data: scikit-learn's digits, a stratified split by sample ID, and data identity.

A sample ID is the row index of an example in `sklearn.datasets.load_digits()`
(0..1796). A split is three sorted lists of IDs, drawn from the config's
`eval_seed`; the lists are saved with every run and hashed, so a result can be
traced back to the exact bytes and the exact examples behind it.
"""

import hashlib
from dataclasses import dataclass

import jax
import numpy as np
from sklearn.datasets import load_digits

NUM_FEATURES = 64
NUM_CLASSES = 10
NUM_EXAMPLES = 1797  # Rows of `load_digits()`: sample IDs are 0..1796.
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Digits:
    """The whole data set in memory.

    `images`: float32 `(N, 64)`, pixel intensities scaled from 0..16 to [0, 1].
    `labels`: int32 `(N,)`, the digit 0..9. Row `i` is sample ID `i`.
    `raw_sha256`: hash of the bytes scikit-learn ships (features, then targets),
    before any scaling: the identity of the source data.
    """

    images: np.ndarray
    labels: np.ndarray
    raw_sha256: str


def load() -> Digits:
    """Loads the 1,797 8x8 digits that ship with scikit-learn (no download)."""
    bunch = load_digits()
    raw = hashlib.sha256()
    raw.update(np.ascontiguousarray(bunch.data, dtype="<f8").tobytes())
    raw.update(np.ascontiguousarray(bunch.target, dtype="<i8").tobytes())
    images = (bunch.data / 16.0).astype(np.float32)
    return Digits(images=images, labels=bunch.target.astype(np.int32), raw_sha256=raw.hexdigest())


def split_ids(
    labels: np.ndarray, key: jax.Array, val_fraction: float, test_fraction: float
) -> dict[str, np.ndarray]:
    """A stratified split of sample IDs into `train`, `validation` and `test`.

    Each class is permuted with its own key and cut into test, validation and
    train parts of `round(fraction * class size)` examples. Same `key`, same
    split on any machine (`jax.random` is counter-based).

    Returns sorted int32 ID arrays that are disjoint and cover `range(len(labels))`.

    Raises `ValueError` for labels that are not a non-empty 1-D integer array, or
    fractions that are not numbers in (0, 1) summing to less than 1.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"`labels` must be a non-empty 1-D integer array, but it has shape {labels.shape} "
            f"and dtype {labels.dtype}."
        )
    for name, fraction in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not (isinstance(fraction, int | float | np.floating) and 0.0 < fraction < 1.0):
            raise ValueError(f"`{name}` must be a number in (0, 1), but it is {fraction!r}.")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"`val_fraction` + `test_fraction` must stay below 1 so that training keeps some "
            f"examples, but they sum to {val_fraction + test_fraction:g}."
        )
    classes = np.unique(labels)
    class_keys = jax.random.split(key, len(classes))
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for cls, class_key in zip(classes, class_keys, strict=True):
        ids = np.flatnonzero(labels == cls)
        ids = ids[np.asarray(jax.random.permutation(class_key, len(ids)))]
        n_test = round(test_fraction * len(ids))
        n_val = round(val_fraction * len(ids))
        parts["test"].append(ids[:n_test])
        parts["validation"].append(ids[n_test : n_test + n_val])
        parts["train"].append(ids[n_test + n_val :])
    return {name: np.sort(np.concatenate(p)).astype(np.int32) for name, p in parts.items()}


def ids_sha256(ids: np.ndarray) -> str:
    """Hash of an ID list as little-endian int32 bytes, in the order given."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<i4").tobytes()).hexdigest()


def data_identity(digits: Digits, split: dict[str, np.ndarray]) -> dict[str, str]:
    """The identity of what a run trained and was scored on: the source bytes and
    each split's ID list, as flat `data.*` keys (the form they take as MLflow tags).

    Cases, for each name in `SPLITS`:
      `data.split.<name>.sha256` -> `ids_sha256(split[name])`: that split's own IDs,
        in the order given, whatever their integer dtype [claim:split-ids-hashed-on-their-own].
      `data.split.<name>.count` -> its length as a decimal string (tags are strings)
        [claim:split-counted].
    """
    identity = {"data.source": "sklearn.datasets.load_digits", "data.sha256": digits.raw_sha256}
    # --- exercise stage 1: Per split, hash its own sample-ID list and record its count. ---
    for name in SPLITS:
        identity[f"data.split.{name}.sha256"] = ids_sha256(split[name])
        identity[f"data.split.{name}.count"] = str(len(split[name]))
    # --- end exercise ---
    return identity
