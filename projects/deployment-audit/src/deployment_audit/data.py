"""Data: scikit-learn's digits, a stratified split by sample ID, and the
preprocessing spec that travels with every artifact.

A sample ID is the row index of an example in `sklearn.datasets.load_digits()`
(0..1796). The model's INPUT is what a client sends: raw pixel intensities,
float32 `(batch, 64)`, the 8x8 image flattened row-major, values 0..16 as
scikit-learn ships them. Normalization is part of the model (the exported
function includes it), so a client never has to reproduce it; its constants
are saved with the artifact, versioned, and checked on reload.
"""

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from sklearn.datasets import load_digits

NUM_FEATURES = 64
NUM_CLASSES = 10
# What each output index means; saved with the artifact and returned by the server.
LABELS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
PREPROCESSING_VERSION = "digits-pixels-v1"
INPUT_LAYOUT = "row-major 8x8 image flattened to 64 float32 raw intensities in [0, 16]"


@dataclass(frozen=True)
class Digits:
    """The whole data set in memory.

    `images`: float32 `(N, 64)`, raw intensities 0..16 (the model's input).
    `labels`: int32 `(N,)`, the digit 0..9. Row `i` is sample ID `i`.
    """

    images: np.ndarray
    labels: np.ndarray


def load() -> Digits:
    """Loads the 1,797 8x8 digits that ship with scikit-learn (no download)."""
    bunch = load_digits()
    return Digits(bunch.data.astype(np.float32), bunch.target.astype(np.int32))


def split_ids(labels: np.ndarray, key: jax.Array, test_fraction: float) -> dict[str, np.ndarray]:
    """A stratified split of sample IDs into sorted, disjoint `train` and `test` arrays.

    Each class is permuted with its own key; its first `round(test_fraction *
    class size)` IDs go to `test`. Same key, same split on any machine.
    """
    classes = np.unique(labels)
    parts: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for cls, class_key in zip(classes, jax.random.split(key, len(classes)), strict=True):
        ids = np.flatnonzero(labels == cls)
        ids = ids[np.asarray(jax.random.permutation(class_key, len(ids)))]
        n_test = round(test_fraction * len(ids))
        parts["test"].append(ids[:n_test])
        parts["train"].append(ids[n_test:])
    return {name: np.sort(np.concatenate(p)).astype(np.int32) for name, p in parts.items()}


def preprocessing_spec(train_images: np.ndarray) -> dict[str, Any]:
    """Per-pixel standardization constants fitted on the training images only
    [claim:spec-fitted-on-training-split].

    `x_normalized = (x - mean) * scale` with `scale = 1 / max(std, 1)`: pixels that
    barely vary (the image border) are centred but not blown up [claim:spec-scale-formula].
    Returns the JSON-ready spec saved with the artifact.

    `mean` and `std` are taken per pixel (axis 0) in float64, `std` the population
    one (`ddof=0`, NumPy's default); both are stored as float32 lists
    [claim:spec-per-pixel-population-std].
    """
    # --- exercise stage 1: Per-pixel mean and std of the training images, in float64. ---
    mean = train_images.astype(np.float64).mean(axis=0)
    std = train_images.astype(np.float64).std(axis=0)
    # --- end exercise ---
    return {
        "version": PREPROCESSING_VERSION,
        "input_layout": INPUT_LAYOUT,
        "input_dtype": "float32",
        "input_features": NUM_FEATURES,
        "mean": mean.astype(np.float32).tolist(),
        "scale": (1.0 / np.maximum(std, 1.0)).astype(np.float32).tolist(),
    }


def spec_arrays(spec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """`(mean, scale)` of a preprocessing spec as float32 `(64,)` arrays."""
    if spec.get("version") != PREPROCESSING_VERSION:
        raise ValueError(
            f"Preprocessing version `{spec.get('version')}` is not `{PREPROCESSING_VERSION}`, "
            f"the only one this code implements."
        )
    return np.asarray(spec["mean"], np.float32), np.asarray(spec["scale"], np.float32)
