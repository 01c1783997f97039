"""Data: scikit-learn's digits, a stratified split by sample ID, Grain pipelines.

A sample ID is the row index of an example in `sklearn.datasets.load_digits()`
(0..1796). Splits are lists of IDs, saved with every run, so any result can be
traced back to the exact examples behind it.

Every batch is a dict of NumPy arrays:
  `id` int32 `(B,)` (-1 for padding), `image` float32 `(B, 64)` in [0, 1],
  `label` int32 `(B,)`, `mask` bool `(B,)` (False for padding).
Batches always have exactly `batch_size` rows, so the jitted step compiles
once; the last batch of a pass is padded and the padding is masked out.
"""

from dataclasses import dataclass

import grain
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
    """

    images: np.ndarray
    labels: np.ndarray


def load() -> Digits:
    """Loads the 1,797 8x8 digits that ship with scikit-learn (no download)."""
    bunch = load_digits()
    images = (bunch.data / 16.0).astype(np.float32)
    return Digits(images=images, labels=bunch.target.astype(np.int32))


def split_ids(
    labels: np.ndarray, key: jax.Array, val_fraction: float, test_fraction: float
) -> dict[str, np.ndarray]:
    """A stratified split of sample IDs into `train`, `validation` and `test`.

    Each class is permuted with its own key and cut into test, validation and
    train parts of `round(fraction * class size)` examples, so every split keeps
    the class proportions of the whole set. Same `key`, same split, on any
    machine (`jax.random` is counter-based and platform-independent).
    [claim:split-stratified]

    Returns sorted int32 ID arrays that are disjoint and together cover
    `range(len(labels))`. [claim:split-disjoint-covering]

    Raises `ValueError` for labels that are not a non-empty 1-D integer array, or
    fractions that are not finite, in (0, 1), and together below 1.
    [claim:split-refuses-bad-input]

    Cases:
      class `classes[i]` (ascending, as `np.unique` gives them) -> permuted with
        `jax.random.permutation(class_keys[i], size)`, its own key.
        [claim:split-class-keys]
      a class of c examples -> its first `round(test_fraction * c)` permuted IDs are
        test, the next `round(val_fraction * c)` validation, the rest train.
        [claim:split-part-sizes]
      a half (0.5 * 177 = 88.5) -> Python's `round` goes to the even integer (88);
        the tests count part sizes that way, so `int(x + 0.5)` fails them.
        [claim:split-round-half-even]
      same key -> the same split; another key -> other test IDs. [claim:split-key-decides]
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
    # --- exercise stage 3: Permute each class by its key; cut test, val, train. ---
    for cls, class_key in zip(classes, class_keys, strict=True):
        ids = np.flatnonzero(labels == cls)
        ids = ids[np.asarray(jax.random.permutation(class_key, len(ids)))]
        n_test = round(test_fraction * len(ids))
        n_val = round(val_fraction * len(ids))
        parts["test"].append(ids[:n_test])
        parts["validation"].append(ids[n_test : n_test + n_val])
        parts["train"].append(ids[n_test + n_val :])
    # --- end exercise ---
    return {name: np.sort(np.concatenate(p)).astype(np.int32) for name, p in parts.items()}


def shuffle_seed(key: jax.Array) -> int:
    """An integer seed for Grain's shuffle, drawn from a `jax.random` key so that
    all randomness of a run descends from its config's `seed`."""
    return int(jax.random.bits(key, dtype=np.uint32))


def dataset(
    digits: Digits, ids: np.ndarray, batch_size: int, seed: int | None = None
) -> grain.IterDataset:
    """A Grain pipeline over the examples `ids`: one pass, in batches.

    Args:
      digits: the data set.
      ids: int32 `(n,)` sample IDs to read.
      batch_size: rows per batch; the last batch is padded to this size.
      seed: shuffle seed for this pass, or None to keep the order of `ids`.

    Returns:
      An iterable of batches (dicts, see the module docstring).

    Raises `ValueError` for `ids` that are not a non-empty 1-D integer array of
    rows of `digits`, a `batch_size` that is not a positive integer, or a `seed`
    outside `[0, 2**32)`.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"`ids` must be a non-empty 1-D integer array of sample IDs, but it has shape "
            f"{ids.shape} and dtype {ids.dtype}."
        )
    n = len(digits.labels)
    if ids.min() < 0 or ids.max() >= n:
        raise ValueError(
            f"`ids` must be sample IDs from 0 to {n - 1}, but they range from {ids.min()} "
            f"to {ids.max()}."
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise ValueError(f"`batch_size` must be a positive integer, but it is {batch_size!r}.")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, but it is {batch_size}.")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < 2**32
    ):
        raise ValueError(f"`seed` must be None or an integer in [0, 2**32), but it is {seed!r}.")
    examples = grain.MapDataset.source(ids.astype(np.int32))
    if seed is not None:
        examples = examples.shuffle(seed=seed)
    examples = examples.map(lambda i: _example(digits, int(i)))
    # Padding goes after the shuffle, so real examples fill every batch but the last.
    num_padding = -len(ids) % batch_size
    padding = grain.MapDataset.range(num_padding).map(lambda _: _PADDING)
    batches = grain.MapDataset.concatenate([examples, padding]).batch(batch_size)
    # The data sit in memory: Grain's docs recommend 0 reader threads then, and
    # its default of 16 threads would oversubscribe a 2-core machine.
    return batches.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))


def _example(digits: Digits, i: int) -> dict[str, np.ndarray]:
    return {
        "id": np.int32(i),
        "image": digits.images[i],
        "label": digits.labels[i],
        "mask": np.True_,
    }


_PADDING = {
    "id": np.int32(-1),
    "image": np.zeros(NUM_FEATURES, np.float32),
    "label": np.int32(0),
    "mask": np.False_,
}
