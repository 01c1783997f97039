"""The converted weights on disk, two ways, and back into a model.

- safetensors (the interchange file): one tensor per NNX path
  (`attn.query.kernel`), written by `safetensors.numpy.save_file`, read
  tensor by tensor through `safe_open`.
- Orbax: `nnx.state(model)` as a standard checkpoint, restored into the
  state of an abstract model.

`target_spec(model)` lists the paths, shapes and dtypes that the weight map
must fill; `fill(model, arrays)` writes them in place.
"""

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from weight_conversion.config import Arch
from weight_conversion.model import DigitNet, abstract_model
from weight_conversion.streaming import describe_damage


class CheckpointError(ValueError):
    """A file that cannot be read back; the message names the file and tensor."""


def _variables(model: nnx.Module) -> dict[str, nnx.Variable]:
    """`{'.'-joined path: variable}` for every Param and BatchStat of `model`."""
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model, (nnx.Param, nnx.BatchStat))):
        out[".".join(str(p) for p in path)] = var
    return out


def target_spec(model: nnx.Module) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """What the weight map must fill: `{path: (shape, dtype)}`."""
    return {
        path: (tuple(var.get_value().shape), np.dtype(var.get_value().dtype))
        for path, var in _variables(model).items()
    }


def fill(model: nnx.Module, arrays: dict[str, np.ndarray]) -> None:
    """Writes `arrays` into `model`'s variables (in place); every path required."""
    variables = _variables(model)
    missing = sorted(set(variables) - set(arrays))
    extra = sorted(set(arrays) - set(variables))
    if missing or extra:
        raise CheckpointError(f"Arrays do not match the model: missing {missing}, extra {extra}.")
    for path, var in variables.items():
        var.set_value(jnp.asarray(arrays[path], dtype=var.get_value().dtype))  # In-place update.


def flat_arrays(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's Params and BatchStats as `{path: NumPy array}`."""
    return {path: np.asarray(var.get_value()) for path, var in _variables(model).items()}


def save_safetensors(model: nnx.Module, path: str | Path, metadata: dict | None = None) -> Path:
    """The interchange file. `metadata` (strings) goes into the header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".partial-{os.getpid()}")
    save_file(flat_arrays(model), str(tmp), metadata=metadata)
    os.replace(tmp, path)
    return path


def load_safetensors(path: str | Path, arch: Arch, dtype=jnp.float32) -> DigitNet:
    """A fresh `DigitNet` filled from a converted safetensors file."""
    model = abstract_model(arch, dtype=dtype)
    spec = target_spec(model)
    arrays = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            keys = set(f.keys())
            if keys != set(spec):
                raise CheckpointError(
                    f"`{path}` does not hold this model's parameters: missing "
                    f"{sorted(set(spec) - keys)}, extra {sorted(keys - set(spec))}."
                )
            for name in spec:
                arrays[name] = f.get_tensor(name)
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"Cannot read `{path}`: {describe_damage(path) or err}") from None
    fill(model, arrays)
    return model


def read_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata stored in a safetensors header."""
    with safe_open(str(path), framework="numpy") as f:
        return dict(f.metadata() or {})


# --- ORBAX -----------------------------------------------------------------------


def save_orbax(model: nnx.Module, directory: str | Path) -> Path:
    """`nnx.state(model)` (Params and BatchStats) as an Orbax checkpoint."""
    directory = Path(directory).resolve()
    state = nnx.state(model, (nnx.Param, nnx.BatchStat))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(directory, state, force=True)
    return directory


def load_orbax(directory: str | Path, arch: Arch, dtype=jnp.float32) -> DigitNet:
    """A `DigitNet` restored from `save_orbax`'s checkpoint."""
    directory = Path(directory).resolve()
    if not directory.is_dir():
        raise CheckpointError(f"No Orbax checkpoint at `{directory}`.")
    model = abstract_model(arch, dtype=dtype)
    abstract_state = nnx.state(model, (nnx.Param, nnx.BatchStat))
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(directory, abstract_state)
    nnx.update(model, state)  # In-place update.
    jax.block_until_ready(nnx.state(model))
    return model
