"""Checkpoints of a model's parameters with Orbax.

The `sft` lab saves the SFT model to `runs/sft/checkpoint`; the `lora`,
`dpo` and `heldout` labs restore it from there (and train it first when it
is missing), so every adaptation lab starts from the same base bits.
"""

import json
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx


class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged or does not fit the model (one line)."""


def save(path: str | Path, model: nnx.Module) -> Path:
    """Writes the model's `nnx.Param` state to the new directory `path`."""
    path = Path(path).absolute()  # Orbax requires an absolute path.
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, nnx.state(model, nnx.Param))
        checkpointer.wait_until_finished()
    return path


def restore(path: str | Path, like: nnx.Module) -> nnx.Module:
    """Loads the parameters at `path` into a copy of `like` (same architecture).

    Raises `CheckpointError` (a `ValueError`, one line naming `path`) for a
    missing or damaged checkpoint, and for one whose parameter names or
    shapes differ from `like`'s (the first difference named). These checks
    read the checkpoint's metadata file directly, before Orbax reads any array.
    """
    path = Path(path).absolute()
    if not path.is_dir():
        raise CheckpointError(f"No checkpoint directory at `{path}`.")
    if not (path / _METADATA).is_file():
        raise CheckpointError(f"`{path}` is not an Orbax checkpoint: it has no `{_METADATA}` file.")
    graphdef, params, rest = nnx.split(like, nnx.Param, ...)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, params)
    _check_fits(path, _stored_shapes(path), _model_shapes(abstract))
    missing = [name for name in _ARRAY_DATA if not (path / name).exists()]
    if missing:
        raise CheckpointError(
            f"The checkpoint at `{path}` has no array data: `{missing[0]}` is missing."
        )
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(path, abstract)
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise CheckpointError(
            f"The checkpoint at `{path}` cannot be read into this model: {_first_line(err)}"
        ) from None
    return nnx.merge(graphdef, restored, rest)


_METADATA = "_METADATA"  # Orbax's JSON tree metadata: parameter names and shapes
_ARRAY_DATA = ("manifest.ocdbt", "d")  # the OCDBT array store of a saved checkpoint


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


def _stored_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """`{parameter name: shape}` from the checkpoint's `_METADATA` file."""
    file = path / _METADATA
    try:
        tree = json.loads(file.read_text(encoding="utf-8"))["tree_metadata"]
        out = {}
        for entry in tree.values():
            keys = [str(k["key"]) for k in entry["key_metadata"]]
            out[".".join(keys[:-1] if keys[-1:] == ["value"] else keys)] = tuple(
                int(n) for n in entry["value_metadata"]["write_shape"]
            )
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"The checkpoint metadata `{file}` is not readable JSON: {_first_line(err)}"
        ) from None
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise CheckpointError(
            f"The checkpoint metadata `{file}` lacks the parameter tree "
            f"({type(err).__name__}: {_first_line(err)})."
        ) from None
    return out


def _model_shapes(tree) -> dict[str, tuple[int, ...]]:
    """`{parameter name: shape}`, names like `blocks.0.attn.q.kernel`."""
    out = {}
    for keys, leaf in jax.tree_util.tree_leaves_with_path(tree):
        parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in keys]
        out[".".join(parts[:-1] if parts[-1:] == ["value"] else parts)] = tuple(leaf.shape)
    return out


def _check_fits(path: Path, have: dict, want: dict) -> None:
    """Refuses a checkpoint whose parameters are not the model's (first difference named)."""
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    if missing or extra:
        raise CheckpointError(
            f"The checkpoint at `{path}` does not fit this model: parameters missing "
            f"`{missing[:3]}`, unexpected `{extra[:3]}`."
        )
    for name in sorted(want):
        if have[name] != want[name]:
            raise CheckpointError(
                f"The checkpoint at `{path}` does not fit this model: parameter `{name}` has "
                f"shape `{want[name]}` in the model but `{have[name]}` in the checkpoint."
            )
