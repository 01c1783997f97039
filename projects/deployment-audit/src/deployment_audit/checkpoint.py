"""The trained artifact on disk: Orbax holds the weights and, next to them, the
JSON spec (preprocessing constants, input layout, label map, config).

Layout of `<workdir>/checkpoint/` (one Orbax composite checkpoint):
  `params/`  the `model.Params` tree (Orbax StandardSave)
  `spec/`    JSON (Orbax JsonSave): `preprocessing`, `labels`, `config`
plus `sha256.json`, the hash of every file Orbax wrote, written after Orbax
finished and checked before Orbax reads anything, so a damaged checkpoint is
one clear error instead of failures inside Orbax's asynchronous reads.
"""

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

HASHES = "sha256.json"


class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged or does not fit the model."""


def digest(tree: Any) -> str:
    """sha256 over the path, dtype, shape and bytes of every leaf: equal digests
    mean bitwise-equal trees."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        array = np.asarray(leaf)
        h.update(jax.tree_util.keystr(path).encode())
        h.update(f"{array.dtype}{array.shape}".encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def save(path: str | Path, params: Any, spec: dict[str, Any]) -> None:
    """Writes `params` and the JSON `spec` to the new directory `path`, then its hashes."""
    path = Path(path).absolute()  # Orbax requires an absolute path.
    jax.block_until_ready(params)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        checkpointer.save(
            path,
            ocp.args.Composite(params=ocp.args.StandardSave(params), spec=ocp.args.JsonSave(spec)),
        )
    (path / HASHES).write_text(json.dumps(_hash_files(path), indent=1) + "\n")


def restore(path: str | Path, like: Any) -> tuple[Any, dict[str, Any]]:
    """Reads `(params, spec)` from `path`; `like` gives the tree, shapes and dtypes.

    Raises `CheckpointError` if the checkpoint is missing, damaged or was written
    for a model of another shape.
    """
    path = Path(path).absolute()
    if not path.is_dir():
        raise CheckpointError(f"No checkpoint directory at `{path}`.")
    _verify_hashes(path)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    # Shapes and dtypes are compared with Orbax's metadata BEFORE any array is
    # read: a failed restore leaves asynchronous reads whose callbacks then
    # report errors on a closed event loop.
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    # Reading a composite's item on its own makes Orbax log that the step-level
    # metadata file is missing (it sits one level up); that is expected here.
    absl_logger.setLevel(logging.ERROR)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            saved = checkpointer.metadata(path / "params").item_metadata.tree
    finally:
        absl_logger.setLevel(level)
    saved_sig = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), saved, is_leaf=_is_array)
    like_sig = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), abstract)
    if saved_sig != like_sig:
        raise CheckpointError(
            f"Cannot restore the checkpoint at `{path}`: it was written for another model "
            f"(saved {saved_sig}, expected {like_sig})."
        )
    try:
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
            out = checkpointer.restore(
                path,
                ocp.args.Composite(
                    params=ocp.args.StandardRestore(abstract), spec=ocp.args.JsonRestore()
                ),
            )
    except Exception as err:  # Orbax raises many types; all mean "cannot use this".
        first = (str(err).strip().splitlines() or ["no details"])[0][:200]
        raise CheckpointError(
            f"Cannot restore the checkpoint at `{path}`: it was written for another model "
            f"or is incomplete ({type(err).__name__}: {first})."
        ) from err
    return out["params"], out["spec"]


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def read_spec(path: str | Path) -> dict[str, Any]:
    """The JSON spec alone (to build a `like` tree of the right shapes before `restore`)."""
    path = Path(path).absolute()
    _verify_hashes(path)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        return checkpointer.restore(path, ocp.args.Composite(spec=ocp.args.JsonRestore()))["spec"]


def _hash_files(root: Path) -> dict[str, str]:
    return {
        file.relative_to(root).as_posix(): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in sorted(root.rglob("*"))
        if file.is_file() and file.name != HASHES
    }


def _verify_hashes(path: Path) -> None:
    try:
        expected = json.loads((path / HASHES).read_text())
    except (OSError, ValueError):
        raise CheckpointError(
            f"The checkpoint at `{path}` is incomplete: its `{HASHES}` is missing or "
            f"unreadable, so the save did not finish."
        ) from None
    actual = _hash_files(path)
    for name in sorted(set(expected) | set(actual)):
        if expected.get(name) != actual.get(name):
            state = "missing" if name not in actual else "changed since the save"
            if name not in expected:
                state = "not part of the save"
            raise CheckpointError(f"The checkpoint at `{path}` is corrupt: `{name}` is {state}.")
