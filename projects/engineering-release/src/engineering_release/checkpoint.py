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


def parse_leaf(raw: bytes) -> tuple[str, np.ndarray]:
    end = raw.index(b"\n", len(MAGIC))
    header = __import__("json").loads(raw[len(MAGIC) : end])
    array = np.frombuffer(raw[end + 1 :], dtype=np.dtype(header["dtype"]))
    return header["path"], array.reshape(header["shape"])


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
    manifest, leaves = None, {}
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        raw = file.read_bytes()
        if raw.startswith(MAGIC):
            path, array = parse_leaf(raw)
            leaves[path] = array
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            raise ArtifactError(f"`{file.name}` is neither a leaf nor a manifest.") from None
        if not isinstance(value, dict) or value.get("format") != FORMAT:
            raise ArtifactError(f"`{file.name}` is not a `{FORMAT}` manifest.")
        manifest = value
    if manifest is None:
        raise ArtifactError(f"`{directory}` holds no `{FORMAT}` manifest.")
    if sorted(leaves) != manifest["leaves"]:
        raise ArtifactError(
            f"The manifest lists leaves {manifest['leaves']}, the files hold {sorted(leaves)}."
        )
    golden_inputs = leaves.pop(GOLDEN_INPUTS)
    golden_logits = leaves.pop(GOLDEN_LOGITS)
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
    abstract = nnx.eval_shape(lambda: MLP(int(arch["hidden"]), rngs=nnx.Rngs(0)))
    graphdef, like = nnx.split(abstract, nnx.Param)
    return LoadedModel(graphdef, unflatten(like, artifact.params), artifact)
