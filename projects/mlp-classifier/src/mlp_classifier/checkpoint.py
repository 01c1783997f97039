"""Checkpoints of a `TrainState` with Orbax, and a digest of its exact bits.

Orbax stores arrays, not typed PRNG keys, so the dropout key is saved as its
raw `uint32` key data and wrapped back into a key on restore.

After Orbax has finished, `save` adds `sha256.json` (the hash of every file
Orbax wrote) and `restore` checks it first. Orbax itself checks the tree
structure, shapes and dtypes, but reads array bytes asynchronously: a damaged
file fails there only after some reads are in flight, and their callbacks then
report errors on a closed event loop. Checking the hashes first turns damage
into one clear error before Orbax reads anything.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or does not fit the model."""


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_arrays(state: Any) -> Any:
    """The same pytree with every typed PRNG key replaced by its `uint32` key data."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, state)


def from_arrays(tree: Any, like: Any) -> Any:
    """Inverse of `to_arrays`: re-wraps key data wherever `like` holds a typed key."""
    return jax.tree.map(
        lambda x, ref: (
            jax.random.wrap_key_data(x, impl=jax.random.key_impl(ref)) if _is_key(ref) else x
        ),
        tree,
        like,
    )


def digest(state: Any) -> str:
    """sha256 over the path, dtype, shape and bytes of every leaf of `state`.

    Equal digests mean bitwise-equal state: params, optimizer state, RNG state
    and step counter alike.
    """
    h = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(to_arrays(state))
    for path, leaf in leaves:
        array = np.asarray(leaf)
        h.update(jax.tree_util.keystr(path).encode())
        h.update(f"{array.dtype}{array.shape}".encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def save(path: str | Path, state: Any) -> None:
    """Writes `state` to the new directory `path` and waits until it is on disk."""
    path = Path(path).absolute()  # Orbax requires an absolute path.
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, to_arrays(state))
        checkpointer.wait_until_finished()
    (path / HASHES).write_text(json.dumps(_hash_files(path), indent=1) + "\n")


def restore(path: str | Path, like: Any) -> Any:
    """Reads the checkpoint at `path` into the structure, shapes and dtypes of `like`.

    `like` is a state of the same model (e.g. freshly initialised; its values are
    not used). Raises `CheckpointError` if the checkpoint is missing, incomplete
    or was written for another model.
    """
    path = Path(path).absolute()
    if not path.is_dir():
        raise CheckpointError(f"No checkpoint directory at `{path}`.")
    _verify_hashes(path)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, to_arrays(like))
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            tree = checkpointer.restore(path, abstract)
    except Exception as err:  # Orbax raises many types; all mean "cannot use this".
        raise CheckpointError(
            f"Cannot restore the checkpoint at `{path}`: it is incomplete, corrupt or was "
            f"written for another model ({type(err).__name__}: {_first_line(err)})."
        ) from err
    return from_arrays(tree, like)


HASHES = "sha256.json"


def _hash_files(root: Path) -> dict[str, str]:
    return {
        file.relative_to(root).as_posix(): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in sorted(root.rglob("*"))
        if file.is_file() and file.name != HASHES
    }


def _verify_hashes(path: Path) -> None:
    try:
        expected = json.loads((path / HASHES).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: not UTF-8 or not JSON.
        raise CheckpointError(
            f"The checkpoint at `{path}` is incomplete: its `{HASHES}` is missing or "
            f"unreadable, so the save did not finish."
        ) from None
    if not isinstance(expected, dict) or not all(isinstance(v, str) for v in expected.values()):
        raise CheckpointError(
            f"The checkpoint at `{path}` is corrupt: its `{HASHES}` must map file names to "
            f"sha256 hashes, but it holds `{type(expected).__name__}` data."
        )
    actual = _hash_files(path)
    for name in sorted(set(expected) | set(actual)):
        if expected.get(name) != actual.get(name):
            state = "missing" if name not in actual else "changed since the save"
            raise CheckpointError(f"The checkpoint at `{path}` is corrupt: `{name}` is {state}.")


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else "no details"
