"""The converted weights on disk, two ways, and back into a model.

- safetensors (the interchange file): one tensor per NNX path
  (`attn.query.kernel`), written by `safetensors.numpy.save_file`, read
  tensor by tensor through `safe_open`.
- Orbax: `nnx.state(model)` as a standard checkpoint, restored into the
  state of an abstract model. `save_orbax` also records the size and SHA-256
  of every file it wrote (`FILE_DIGESTS`, inside the checkpoint folder;
  `record_digests`); `load_orbax` requires that record and compares it
  before Orbax reads anything, so a damaged file is named instead of
  failing inside Orbax's concurrent reads (which, on a failed read, leave
  stray errors behind in TensorStore's threads).

`target_spec(model)` lists the paths, shapes and dtypes that the weight map
must fill; `fill(model, arrays)` writes them in place.

Both loaders check every tensor against the model before any value reaches
it: present (no tensor missing, none extra), the model's shape, the model's
dtype, every value finite. A file that fails raises `CheckpointError`, one
line naming the file and the tensor.
"""

import hashlib
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from weight_conversion.config import Arch, ConfigError
from weight_conversion.model import DigitNet, abstract_model
from weight_conversion.streaming import DTYPE_CODES, describe_damage
from weight_conversion.weight_map import first_nonfinite


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
        shape = tuple(var.get_value().shape)
        array = np.asarray(arrays[path])
        if tuple(array.shape) != shape:
            raise CheckpointError(
                f"Array `{path}` has shape {tuple(array.shape)}; the model's parameter has {shape}."
            )
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise CheckpointError(f"Array `{path}` has dtype `{array.dtype}`, not a number type.")
        bad = first_nonfinite(array)
        if bad is not None:
            raise CheckpointError(
                f"Array `{path}` holds {bad[0]} non-finite value(s) (NaN or inf), "
                f"the first at index {bad[1]}."
            )
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


def _dtype_code(dtype) -> str:
    return DTYPE_CODES.get(np.dtype(dtype), str(np.dtype(dtype)))


def load_safetensors(path: str | Path, arch: Arch, dtype=jnp.float32) -> DigitNet:
    """A fresh `DigitNet` filled from a converted safetensors file. Every
    tensor is checked against the model first (present, shape, dtype, finite);
    a mismatch raises `CheckpointError` naming the file and the tensor."""
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
            for name, (shape, want) in spec.items():
                piece = f.get_slice(name)
                found = tuple(piece.get_shape())
                if found != tuple(shape):
                    raise CheckpointError(
                        f"`{path}`: tensor `{name}` has shape {found}; the model's "
                        f"parameter has {tuple(shape)}."
                    )
                if piece.get_dtype() != _dtype_code(want):
                    raise CheckpointError(
                        f"`{path}`: tensor `{name}` has dtype {piece.get_dtype()}; the model's "
                        f"parameter has {_dtype_code(want)}."
                    )
                arrays[name] = f.get_tensor(name)
                bad = first_nonfinite(arrays[name])
                if bad is not None:
                    raise CheckpointError(
                        f"`{path}`: tensor `{name}` holds {bad[0]} non-finite value(s) "
                        f"(NaN or inf), the first at index {bad[1]}."
                    )
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"Cannot read `{path}`: {describe_damage(path) or err}") from None
    fill(model, arrays)
    return model


def read_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata stored in a safetensors header."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"Cannot read `{path}`: {describe_damage(path) or err}") from None


def read_arch(path: str | Path) -> Arch:
    """The architecture recorded in a converted file's metadata (`arch`, JSON)."""
    metadata = read_metadata(path)
    if "arch" not in metadata:
        raise CheckpointError(f"`{path}` has no `arch` in its metadata; it was not converted here.")
    try:
        raw = json.loads(metadata["arch"])
    except json.JSONDecodeError as err:
        raise CheckpointError(f"`{path}`: metadata `arch` is not JSON ({err}).") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"`{path}`: metadata `arch` must be a JSON object.")
    try:
        return Arch(**raw)
    except TypeError as err:
        raise CheckpointError(
            f"`{path}`: metadata `arch` does not describe an Arch: {err}."
        ) from None
    except ConfigError as err:
        raise CheckpointError(f"`{path}`: metadata `arch`: {err}") from None


# --- ORBAX -----------------------------------------------------------------------


FILE_DIGESTS = "files.sha256.json"


def _file_digests(directory: Path) -> dict[str, list]:
    """`{relative path: [size, sha256]}` of every file of a checkpoint folder."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != FILE_DIGESTS:
            blob = path.read_bytes()
            out[str(path.relative_to(directory))] = [len(blob), hashlib.sha256(blob).hexdigest()]
    return out


def save_orbax(model: nnx.Module, directory: str | Path) -> Path:
    """`nnx.state(model)` (Params and BatchStats) as an Orbax checkpoint, with
    the digest of each of its files."""
    directory = Path(directory).resolve()
    state = nnx.state(model, (nnx.Param, nnx.BatchStat))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(directory, state, force=True)
    return record_digests(directory)


def record_digests(directory: str | Path) -> Path:
    """Writes `FILE_DIGESTS` for a finished checkpoint folder (`save_orbax` does)."""
    directory = Path(directory)
    digests = json.dumps(_file_digests(directory), indent=1) + "\n"
    (directory / FILE_DIGESTS).write_text(digests, encoding="utf-8")
    return directory


def _check_files(directory: Path) -> None:
    """The checkpoint's files against the digests `save_orbax` recorded."""
    record = directory / FILE_DIGESTS
    if not record.is_file():
        raise CheckpointError(
            f"`{directory}` has no `{FILE_DIGESTS}` (the file digests `save_orbax` records): "
            "not a checkpoint of this project, or damaged."
        )
    try:
        expected = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"`{record}` cannot be read: {err}.") from None
    if not isinstance(expected, dict):
        raise CheckpointError(f"`{record}` must hold a JSON object of file digests.")
    found = _file_digests(directory)
    for name, digest in expected.items():
        if name not in found:
            raise CheckpointError(f"`{directory}`: file `{name}` of the checkpoint is missing.")
        if found[name] != digest:
            raise CheckpointError(
                f"`{directory}`: file `{name}` of the checkpoint has changed since it was "
                f"saved ({found[name][0]} bytes, {digest[0] if isinstance(digest, list) else '?'} "
                "recorded)."
            )


def _stored_arrays(tree, prefix: str = "") -> dict:
    """`{'.'-joined path: ArrayMetadata}` of an Orbax metadata tree; the
    `.value` level of NNX variables is dropped."""
    if not isinstance(tree, dict):
        return {prefix.removesuffix(".value"): tree}
    out = {}
    for key, node in tree.items():
        out.update(_stored_arrays(node, f"{prefix}.{key}" if prefix else str(key)))
    return out


def load_orbax(directory: str | Path, arch: Arch, dtype=jnp.float32) -> DigitNet:
    """A `DigitNet` restored from `save_orbax`'s checkpoint. The files are
    checked against their recorded digests, the stored arrays against the
    model (from the checkpoint's metadata: present, shape, dtype), the
    restored values after (finite)."""
    directory = Path(directory).resolve()
    if not directory.is_dir():
        raise CheckpointError(f"No Orbax checkpoint at `{directory}`.")
    _check_files(directory)
    model = abstract_model(arch, dtype=dtype)
    spec = target_spec(model)
    # Each array is restored onto this process's default device: without a sharding in
    # the target, Orbax places arrays as they were saved, and a checkpoint written on
    # another device topology (a TPU's, or several devices) cannot be read here.
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract_state = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=here),
        nnx.state(model, (nnx.Param, nnx.BatchStat)),
    )
    with ocp.StandardCheckpointer() as checkpointer:
        try:
            metadata = checkpointer.metadata(directory)
        except (FileNotFoundError, ValueError, UnicodeDecodeError) as err:
            raise CheckpointError(
                f"`{directory}` is not a readable Orbax checkpoint: {err}"
            ) from None
        tree = getattr(getattr(metadata, "item_metadata", None), "tree", None)
        if not isinstance(tree, dict):
            raise CheckpointError(
                f"`{directory}` is not a readable Orbax checkpoint: its metadata cannot be read."
            )
        stored = _stored_arrays(tree)
        if set(stored) != set(spec):
            raise CheckpointError(
                f"`{directory}` does not hold this model's parameters: missing "
                f"{sorted(set(spec) - set(stored))}, extra {sorted(set(stored) - set(spec))}."
            )
        for name, (shape, want) in spec.items():
            found_shape = tuple(getattr(stored[name], "shape", ()) or ())
            found_dtype = getattr(stored[name], "dtype", None)
            if found_shape != tuple(shape):
                raise CheckpointError(
                    f"`{directory}`: array `{name}` has shape {found_shape}; the model's "
                    f"parameter has {tuple(shape)}."
                )
            if found_dtype is None or np.dtype(found_dtype) != np.dtype(want):
                raise CheckpointError(
                    f"`{directory}`: array `{name}` has dtype {found_dtype}; the model's "
                    f"parameter has {np.dtype(want)}."
                )
        try:
            state = checkpointer.restore(directory, abstract_state)
        except Exception as err:
            # TensorStore reports an unreadable array (a data file missing or cut
            # short) as a bare `Exception`; anything more specific is not ours to name.
            if type(err) is not Exception and not isinstance(err, ValueError | OSError):
                raise
            first = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            raise CheckpointError(f"`{directory}`: the arrays cannot be read ({first}).") from None
    nnx.update(model, state)  # In-place update.
    jax.block_until_ready(nnx.state(model))
    for name, array in flat_arrays(model).items():
        bad = first_nonfinite(array)
        if bad is not None:
            raise CheckpointError(
                f"`{directory}`: array `{name}` holds {bad[0]} non-finite value(s) "
                f"(NaN or inf), the first at index {bad[1]}."
            )
    return model
