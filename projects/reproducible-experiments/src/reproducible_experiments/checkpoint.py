"""The trained parameters: a digest of their exact bits, and Orbax checkpoints.

Every tracked run records `result.params_sha256`, the digest of its trained
parameters, so a reproduction can compare weights as well as metrics. With
`train --checkpoint` (the CLI default) the parameters are also saved with
Orbax and attached to the run as the artifact folder `checkpoint/`;
`reproduce` then restores them and compares them with the re-run's, bit for
bit. Orbax is imported only when a checkpoint is written or read.
"""

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np


class CheckpointError(RuntimeError):
    """A checkpoint that is missing or does not fit the model."""


def digest(params: Any) -> str:
    """sha256 over every leaf's path, dtype, shape and bytes, in path order
    [claim:params-digest-by-path]."""
    h = hashlib.sha256()
    leaves = jax.tree_util.tree_leaves_with_path(params)
    for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
        array = np.asarray(leaf)
        h.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}|".encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def save(path: str | Path, params: Any) -> None:
    """Writes `params` to the new directory `path` and waits until it is on disk."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()  # Orbax requires an absolute path.
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, params)
        checkpointer.wait_until_finished()


def restore(path: str | Path, like: Any) -> Any:
    """Reads the checkpoint at `path` into the structure, shapes and dtypes of `like`."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    if not path.is_dir():
        raise CheckpointError(f"There is no checkpoint at `{path}`.")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    with ocp.StandardCheckpointer() as checkpointer:
        try:
            return checkpointer.restore(path, abstract)
        except (ValueError, KeyError, FileNotFoundError) as err:
            raise CheckpointError(f"The checkpoint at `{path}` does not fit: {err}") from None


def log_to_run(client: Any, run_id: str, params: Any) -> None:
    """Saves `params` with Orbax and attaches the folder to `run_id` as `checkpoint/`."""
    with tempfile.TemporaryDirectory(prefix="re-ckpt-") as tmp:
        save(Path(tmp) / "checkpoint", params)
        client.log_artifacts(run_id, str(Path(tmp) / "checkpoint"), "checkpoint")


def load_from_run(client: Any, run_id: str, like: Any) -> Any:
    """Downloads the `checkpoint/` artifact of `run_id` and restores it like `like`."""
    with tempfile.TemporaryDirectory(prefix="re-ckpt-") as tmp:
        local = client.download_artifacts(run_id, "checkpoint", tmp)
        return restore(local, like)
