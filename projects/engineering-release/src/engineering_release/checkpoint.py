"""The model artifact: a canonical, self-describing directory of parameters.

Orbax is the tool for training checkpoints, but its directories carry
save-time metadata (timestamps, per-save ids), so two saves of the same
parameters differ byte for byte and cannot share a content id. A released
model needs the opposite: the same parameters give the same bytes. So the
artifact is written here in a canonical form:

- one `.leaf` file per array: the magic line `ERLEAF1`, a canonical JSON
  header line `{"dtype": "<f4", "path": "hidden/kernel", "shape": [64, 32]}`,
  then the raw little-endian bytes in C order;
- `model.json`: canonical JSON with the format, the architecture, the
  training config and the sorted list of leaf paths.

Every file says what it is in its content, not in its name: the reader finds
leaves by their header, so a renamed file means the same thing (and the
content digest of `store.tree_digest` ignores names for that reason). The
golden inputs and their logits travel as leaves `golden/inputs` and
`golden/logits`: a server's self-test is part of the model's identity.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from engineering_release.config import canonical_json

FORMAT = "engineering-release/model-v1"
MAGIC = b"ERLEAF1\n"
GOLDEN_INPUTS = "golden/inputs"
GOLDEN_LOGITS = "golden/logits"


class ArtifactError(ValueError):
    """A model artifact that is malformed or does not fit its architecture."""


def _path_str(path: tuple) -> str:
    parts = []
    for key in path:
        name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))
        parts.append(str(name))
    if parts and parts[-1] == "value":  # an nnx.Variable's array: `hidden/kernel/value`
        parts.pop()
    return "/".join(parts)


def flatten(state: Any) -> dict[str, np.ndarray]:
    """`{"hidden/kernel": array, ...}` from an `nnx.State` (or any pytree)."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(state)
    return {_path_str(path): np.asarray(leaf) for path, leaf in leaves}


def unflatten(like: Any, flat: dict[str, np.ndarray]) -> Any:
    """A pytree shaped like `like` with leaves taken from `flat` by path; shapes
    and dtypes must match exactly."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
    paths = [_path_str(p) for p, _ in leaves]
    if sorted(paths) != sorted(flat):
        raise ArtifactError(
            f"The artifact holds leaves {sorted(flat)}, but the model needs {sorted(paths)}."
        )
    out = []
    for path, (_, ref) in zip(paths, leaves, strict=True):
        value = flat[path]
        if value.shape != tuple(ref.shape) or value.dtype != ref.dtype:
            raise ArtifactError(
                f"Leaf `{path}` is {value.dtype}{list(value.shape)}, but the model needs "
                f"{ref.dtype}{list(ref.shape)}."
            )
        out.append(jax.numpy.asarray(value))
    return jax.tree_util.tree_unflatten(treedef, out)


def leaf_bytes(path: str, array: np.ndarray) -> bytes:
    """The canonical bytes of one leaf file."""
    array = np.ascontiguousarray(array)
    array = array.astype(array.dtype.newbyteorder("<"), copy=False)
    header = canonical_json({"dtype": array.dtype.str, "path": path, "shape": list(array.shape)})
    return MAGIC + header + b"\n" + array.tobytes()


LEAF_DTYPES = ("<f2", "<f4", "<f8", "<i4", "<i8", "|i1", "|u1")


def parse_leaf(raw: bytes, name: str = "leaf") -> tuple[str, np.ndarray]:
    """`(path, array)` of one leaf file's bytes; `ArtifactError` naming the file
    `name` and what is wrong when the header or the payload does not fit."""
    import json

    end = raw.find(b"\n", len(MAGIC))
    if not raw.startswith(MAGIC) or end < 0:
        raise ArtifactError(f"`{name}` is not a leaf file (magic line and header line).")
    try:
        header = json.loads(raw[len(MAGIC) : end])
    except (ValueError, RecursionError):
        raise ArtifactError(f"The header of leaf file `{name}` is not JSON.") from None
    if not isinstance(header, dict) or sorted(header) != ["dtype", "path", "shape"]:
        raise ArtifactError(f"The header of `{name}` must hold exactly `dtype`, `path`, `shape`.")
    if header["dtype"] not in LEAF_DTYPES:
        raise ArtifactError(
            f"Leaf `{name}` has dtype `{header['dtype']}`, not one of {list(LEAF_DTYPES)}."
        )
    shape = header["shape"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ArtifactError(f"Leaf `{name}` has shape `{shape}`, not a list of sizes.")
    if not isinstance(header["path"], str) or not header["path"]:
        raise ArtifactError(f"Leaf `{name}` has path `{header['path']}`, not a name.")
    dtype = np.dtype(header["dtype"])
    payload = raw[end + 1 :]
    if len(payload) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise ArtifactError(
            f"Leaf `{name}` ({header['path']}) holds {len(payload)} bytes, but "
            f"{header['dtype']}{shape} needs {int(np.prod(shape)) * dtype.itemsize}."
        )
    array = np.frombuffer(payload, dtype=dtype).reshape(shape)
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise ArtifactError(f"Leaf `{name}` ({header['path']}) holds NaN or infinite values.")
    return header["path"], array


def write_artifact(
    directory: str | Path,
    *,
    architecture: dict,
    params: dict[str, np.ndarray],
    golden_inputs: np.ndarray,
    golden_logits: np.ndarray,
    training: dict,
) -> Path:
    """Writes a new artifact directory; refuses an existing one."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=False)
    leaves = {**params, GOLDEN_INPUTS: golden_inputs, GOLDEN_LOGITS: golden_logits}
    for path, array in leaves.items():
        (directory / f"{path.replace('/', '.')}.leaf").write_bytes(leaf_bytes(path, array))
    manifest = {
        "format": FORMAT,
        "architecture": architecture,
        "training": training,
        "leaves": sorted(leaves),
    }
    (directory / "model.json").write_bytes(canonical_json(manifest) + b"\n")
    return directory


@dataclass
class Artifact:
    """A read artifact: `params` flat by path, the golden pair, and its manifest."""

    manifest: dict
    params: dict[str, np.ndarray]
    golden_inputs: np.ndarray
    golden_logits: np.ndarray


def read_artifact(directory: str | Path) -> Artifact:
    """Reads every file of `directory` by content: leaves by their header, the
    manifest by its `format`. Raises `ArtifactError` when anything is missing or extra."""
    import json

    directory = Path(directory)
    if not directory.is_dir():
        raise ArtifactError(f"`{directory}` is not a model directory.")
    manifest, leaves = None, {}
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        raw = file.read_bytes()
        if raw.startswith(MAGIC):
            path, array = parse_leaf(raw, file.name)
            if path in leaves:
                raise ArtifactError(f"Two leaf files hold `{path}`; `{file.name}` is one.")
            leaves[path] = array
            continue
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            raise ArtifactError(f"`{file.name}` is neither a leaf nor a manifest.") from None
        if not isinstance(value, dict) or value.get("format") != FORMAT:
            raise ArtifactError(f"`{file.name}` is not a `{FORMAT}` manifest.")
        if manifest is not None:
            raise ArtifactError(f"`{directory}` holds two manifests; `{file.name}` is one.")
        for name, kind in (("architecture", dict), ("training", dict), ("leaves", list)):
            if not isinstance(value.get(name), kind):
                raise ArtifactError(
                    f"The manifest `{file.name}` lacks `{name}` (a JSON {kind.__name__})."
                )
        manifest = value
    if manifest is None:
        raise ArtifactError(f"`{directory}` holds no `{FORMAT}` manifest.")
    if sorted(leaves) != manifest["leaves"]:
        raise ArtifactError(
            f"The manifest lists leaves {manifest['leaves']}, the files hold {sorted(leaves)}."
        )
    if GOLDEN_INPUTS not in leaves or GOLDEN_LOGITS not in leaves:
        golden = [GOLDEN_INPUTS, GOLDEN_LOGITS]
        raise ArtifactError(f"`{directory}` lacks the golden leaves {golden}.")
    golden_inputs = leaves.pop(GOLDEN_INPUTS)
    golden_logits = leaves.pop(GOLDEN_LOGITS)
    n = golden_inputs.shape[0] if golden_inputs.ndim == 2 else -1
    if n < 1 or golden_inputs.shape[1] != 64 or golden_logits.shape != (n, 10):
        raise ArtifactError(
            f"The golden leaves are {list(golden_inputs.shape)} inputs and "
            f"{list(golden_logits.shape)} logits; they must be [n, 64] and [n, 10], n >= 1."
        )
    return Artifact(manifest, leaves, golden_inputs, golden_logits)


@dataclass
class LoadedModel:
    """A model ready to run: `graphdef` and `params` for `train.predict`."""

    graphdef: nnx.GraphDef
    params: nnx.State
    artifact: Artifact


def load_model(directory: str | Path) -> LoadedModel:
    """Reads the artifact and rebuilds the NNX model it describes."""
    from engineering_release.model import MLP

    artifact = read_artifact(directory)
    arch = artifact.manifest["architecture"]
    if arch.get("kind") != "mlp":
        raise ArtifactError(f"Unknown architecture `{arch.get('kind')}`.")
    hidden = arch.get("hidden")
    if type(hidden) is not int or not 1 <= hidden <= 1024:
        raise ArtifactError(f"The architecture's `hidden` is `{hidden}`, not a width 1..1024.")
    abstract = nnx.eval_shape(lambda: MLP(int(arch["hidden"]), rngs=nnx.Rngs(0)))
    graphdef, like = nnx.split(abstract, nnx.Param)
    return LoadedModel(graphdef, unflatten(like, artifact.params), artifact)
