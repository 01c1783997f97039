"""Saving and loading the trained parameters of all seeds as one `.npz` file."""

from pathlib import Path

import jax
import numpy as np


def save_params(path: Path, params: dict) -> None:
    leaves, _ = jax.tree.flatten(params)
    np.savez(path, *[np.asarray(x) for x in leaves])


def load_params(path: Path, like: dict) -> dict:
    """Parameters saved by `save_params`, in the structure of `like`."""
    _, treedef = jax.tree.flatten(like)
    with np.load(path) as data:
        leaves = [data[f"arr_{i}"] for i in range(len(data.files))]
    return jax.tree.unflatten(treedef, leaves)
