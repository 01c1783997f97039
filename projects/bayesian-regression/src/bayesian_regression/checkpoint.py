"""Sampler output on disk with Orbax: the draws and adapted settings of a run,
so that `diagnose` and `report` read what `sample` produced instead of
sampling again.

A checkpoint is a directory holding an Orbax `StandardCheckpointer` tree
(`positions`, `accept_prob`, `is_divergent`, `step_size`, `inv_mass`) and a
`meta.json` (parameter names, target, sampler). `restore` refuses a missing
or incomplete checkpoint with a `CheckpointError` that says so.
"""

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bayesian_regression.hmc import Samples

META = "meta.json"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing or incomplete; the message says which."""


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
    meta = json.loads((path / META).read_text(encoding="utf-8"))
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            tree = checkpointer.restore(path / "draws")
    except Exception as err:  # Orbax raises many types; all mean "cannot use this".
        raise CheckpointError(
            f"Cannot restore the draws at `{path}`: {type(err).__name__}."
        ) from err
    return Samples(**{k: jax.numpy.asarray(tree[k]) for k in Samples._fields}), meta
