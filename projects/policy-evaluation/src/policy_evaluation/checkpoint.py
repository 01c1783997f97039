"""Saving and loading the trained parameters of all seeds as one `.npz` file."""

import zipfile
from pathlib import Path

import jax
import numpy as np


def save_params(path: Path, params: dict) -> None:
    leaves, _ = jax.tree.flatten(params)
    np.savez(path, *[np.asarray(x) for x in leaves])


def load_params(path: Path, like: dict) -> dict:
    """Parameters saved by `save_params`, in the structure of `like`.

    Raises `ValueError` naming the file when it is missing or not an `.npz` file,
    or when its arrays differ from `like`'s leaves in number, shape or dtype."""
    path = Path(path)
    like_leaves, treedef = jax.tree.flatten(like)
    try:
        # Our own handle, closed whatever `np.load` makes of the bytes.
        with path.open("rb") as f, np.load(f, allow_pickle=False) as data:
            leaves = [data[f"arr_{i}"] for i in range(len(data.files))]
    except FileNotFoundError:
        raise ValueError(f"The parameter file `{path}` does not exist.") from None
    except OSError as err:
        raise ValueError(f"Cannot read the parameter file `{path}`: {err.strerror}.") from None
    # TypeError: an `.npy` file, whose array is no context manager.
    except (ValueError, EOFError, KeyError, TypeError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"The parameter file `{path}` is not an `.npz` file written by `save_params` "
            f"({type(err).__name__}: {err})."
        ) from None
    if len(leaves) != len(like_leaves):
        raise ValueError(
            f"The parameter file `{path}` holds {len(leaves)} arrays, but the model has "
            f"{len(like_leaves)}."
        )
    for i, (got, want) in enumerate(zip(leaves, like_leaves, strict=True)):
        want = np.asarray(want)
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ValueError(
                f"The parameter file `{path}`: array {i} is {got.dtype}{list(got.shape)}, "
                f"but the model's is {want.dtype}{list(want.shape)}."
            )
    return jax.tree.unflatten(treedef, leaves)
