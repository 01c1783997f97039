"""Checkpoints of a model's parameters with Orbax.

The `sft` lab saves the SFT model to `runs/sft/checkpoint`; the `lora`,
`dpo` and `heldout` labs restore it from there (and train it first when it
is missing), so every adaptation lab starts from the same base bits.
"""

from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx


class CheckpointError(RuntimeError):
    """A checkpoint that is missing or does not fit the model."""


def save(path: str | Path, model: nnx.Module) -> Path:
    """Writes the model's `nnx.Param` state to the new directory `path`."""
    path = Path(path).absolute()  # Orbax requires an absolute path.
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, nnx.state(model, nnx.Param))
        checkpointer.wait_until_finished()
    return path


def restore(path: str | Path, like: nnx.Module) -> nnx.Module:
    """Loads the parameters at `path` into a copy of `like` (same architecture)."""
    path = Path(path).absolute()
    if not path.is_dir():
        raise CheckpointError(f"No checkpoint directory at `{path}`.")
    graphdef, params, rest = nnx.split(like, nnx.Param, ...)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, params)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(path, abstract)
    except (ValueError, KeyError) as err:
        raise CheckpointError(
            f"The checkpoint at `{path}` does not fit this model: {err}"
        ) from None
    return nnx.merge(graphdef, restored, rest)
