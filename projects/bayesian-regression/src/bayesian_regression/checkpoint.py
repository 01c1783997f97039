"""Sampler output on disk with Orbax: the draws and adapted settings of a run,
so that `diagnose` and `report` read what `sample` produced instead of
sampling again.

A checkpoint is a directory holding an Orbax `StandardCheckpointer` tree
(`positions`, `accept_prob`, `is_divergent`, `step_size`, `inv_mass`) and a
`meta.json` (parameter names, target, sampler). `restore` refuses a missing,
incomplete or damaged checkpoint (a `meta.json` that is not UTF-8 JSON, lacks
a field or holds an unknown one; draws Orbax cannot read or of inconsistent
shapes) with a `CheckpointError` naming the file and the field.
"""

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bayesian_regression.hmc import Samples

META = "meta.json"
TARGETS = ("regression", "funnel-centered", "funnel-noncentered")
SAMPLERS = ("hmc", "nuts")
# meta.json: the fields `restore` needs, and those it also accepts.
REQUIRED_META = ("target", "sampler", "names")
OPTIONAL_META = ("config", "step_size_factor")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or damaged; the message says which."""


def save(path: str | Path, samples: Samples, meta: dict[str, Any]) -> Path:
    """Writes `samples` and `meta` to the new directory `path`; waits until done."""
    path = Path(path).absolute()  # Orbax requires an absolute path.
    tree = {k: np.asarray(v) for k, v in samples._asdict().items()}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / "draws", tree)
        checkpointer.wait_until_finished()
    (path / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return path


def restore(path: str | Path) -> tuple[Samples, dict[str, Any]]:
    """Reads a checkpoint written by `save`: `(samples, meta)`."""
    path = Path(path).absolute()
    if not (path / META).is_file() or not (path / "draws").is_dir():
        raise CheckpointError(
            f"No complete sampler checkpoint at `{path}` (it needs `draws/` and `{META}`); "
            f"run `bayesian-regression sample` first."
        )
    meta = read_meta(path / META)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            tree = checkpointer.restore(path / "draws")
    except (OSError, ValueError) as err:  # what Orbax raises for missing or damaged files
        detail = " ".join(str(err).split())[:160] or type(err).__name__
        raise CheckpointError(f"Cannot restore the draws at `{path / 'draws'}`: {detail}") from None
    _check_tree(tree, path / "draws", len(meta["names"]))
    return Samples(**{k: jax.numpy.asarray(tree[k]) for k in Samples._fields}), meta


def read_meta(path: Path) -> dict[str, Any]:
    """Reads and checks a `meta.json`: UTF-8 JSON, an object with exactly the known
    fields, `target` and `sampler` among the known ones, `names` unique strings."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointError(f"`{path}` is not UTF-8 text (byte {err.start}).") from None
    except OSError as err:
        raise CheckpointError(f"Cannot read `{path}`: {err.strerror}.") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(
            f"`{path}` is not JSON: {err.msg} at line {err.lineno}, column {err.colno}."
        ) from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"`{path}` must hold a JSON object, not a `{type(meta).__name__}`.")
    for field in REQUIRED_META:
        if field not in meta:
            raise CheckpointError(f"`{path}` lacks the field `{field}`.")
    for field in meta:
        if field not in REQUIRED_META + OPTIONAL_META:
            raise CheckpointError(f"`{path}` holds the unknown field `{field}`.")
    for field, allowed in (("target", TARGETS), ("sampler", SAMPLERS)):
        if meta[field] not in allowed:
            raise CheckpointError(
                f"`{path}`: field `{field}` is `{meta[field]!r}`, not one of {list(allowed)}."
            )
    names = meta["names"]
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n for n in names)
        or len(set(names)) != len(names)
    ):
        raise CheckpointError(
            f"`{path}`: field `names` must be a list of distinct non-empty strings, "
            f"not `{json.dumps(names)[:80]}`."
        )
    return meta


def _check_tree(tree: Any, path: Path, num_names: int) -> None:
    """The restored draws hold every `Samples` field, with consistent shapes."""
    if not isinstance(tree, dict) or set(tree) != set(Samples._fields):
        found = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
        raise CheckpointError(
            f"The draws at `{path}` hold `{found}`, not the fields {list(Samples._fields)}."
        )
    positions = np.asarray(tree["positions"])
    if positions.ndim != 3 or positions.shape[2] != num_names:
        raise CheckpointError(
            f"The draws at `{path}`: field `positions` has shape `{positions.shape}`, not "
            f"`(chains, draws, {num_names})` for the `{num_names}` names of `{META}`."
        )
    chains, draws, dim = positions.shape
    expected = {
        "accept_prob": (chains, draws),
        "is_divergent": (chains, draws),
        "step_size": (chains,),
        "inv_mass": (chains, dim),
    }
    for field, shape in expected.items():
        actual = np.shape(tree[field])
        if actual != shape:
            raise CheckpointError(
                f"The draws at `{path}`: field `{field}` has shape `{actual}`, not `{shape}`."
            )
