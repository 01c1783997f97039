"""The run dossier: everything needed to audit and re-run one training run.

Layout of a dossier directory:

    config.json            the config as used (`train --config` reads it back)
    split.json             sample IDs of the train, validation and test splits
    metrics.json           per-epoch and test metrics; `reproduce` compares it bitwise
    run.json               wall time and library versions (not compared)
    learning_curves.png    loss and accuracy per epoch
    confusion_matrix.png   test confusion matrix
    errors.png             misclassified test images with their IDs
    checkpoint/            Orbax checkpoint of the final TrainState
    COMPLETE               manifest: sha256 of every file above; written last

The dossier is built in a sibling `*.partial` directory and renamed into place
only after `COMPLETE` is written, so a crash never leaves a directory that
looks complete; `load` also re-checks every hash in the manifest.
"""

import hashlib
import json
import math
import os
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flax
import jax

from mlp_classifier import checkpoint, data, plots
from mlp_classifier.config import Config, ConfigError, load_config

MANIFEST = "COMPLETE"
# The files `load` reads; a manifest that does not list one of them is refused.
REQUIRED = ("config.json", "split.json", "metrics.json", f"checkpoint/{checkpoint.HASHES}")
METRIC_KEYS = ("epochs", "test", "confusion_matrix", "misclassified", "state_sha256")


class DossierError(ValueError):
    """A dossier that is missing, incomplete, corrupt, or must not be overwritten."""


@dataclass(frozen=True)
class Dossier:
    """A complete, verified dossier as read back from disk."""

    path: Path
    config: Config
    split: dict[str, list[int]]
    metrics: dict[str, Any]


def check_writable(workdir: str | Path, *, overwrite: bool) -> None:
    """Refuses an existing, non-empty `workdir` unless `overwrite` is set."""
    path = Path(workdir)
    if path.exists() and not path.is_dir():
        raise DossierError(f"The workdir `{path}` exists and is not a directory.")
    # The directory is created only after training: a parent that is a file must fail now.
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise DossierError(
            f"The workdir `{path}` cannot be created: `{parent}` is not a directory."
        )
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise DossierError(
            f"The workdir `{path}` already holds files; pass `--overwrite` to replace it "
            f"or choose another `--workdir`."
        )


def write(result: Any, workdir: str | Path, *, overwrite: bool = False) -> Path:
    """Writes the dossier of `result` (a `train.RunResult`) to `workdir`."""
    final = Path(workdir)
    check_writable(final, overwrite=overwrite)
    partial = final.with_name(f"{final.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)

    (partial / "config.json").write_text(result.config.to_json(), encoding="utf-8")
    split = {
        "split_seed": result.config.split_seed,
        **{name: ids.tolist() for name, ids in result.split.items()},
    }
    _write_json(partial / "split.json", split)
    _write_json(partial / "metrics.json", result.metrics)
    _write_json(
        partial / "run.json",
        {
            "wall_s_before_dossier": result.wall_s,
            "versions": {"jax": jax.__version__, "flax": flax.__version__},
            "backend": jax.default_backend(),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
    )
    plots.learning_curves(result.metrics["epochs"], partial / "learning_curves.png")
    plots.confusion_matrix(result.metrics["confusion_matrix"], partial / "confusion_matrix.png")
    plots.error_examples(
        result.metrics["misclassified"], result.test_images, partial / "errors.png"
    )
    checkpoint.save(partial / "checkpoint", result.state)

    # The manifest comes last: its presence is what makes the dossier complete.
    _write_json(partial / MANIFEST, {"sha256": _hash_files(partial)})
    if final.exists():
        # Only reached with overwrite=True (check_writable above).
        shutil.rmtree(final)
    partial.rename(final)
    return final


def load(workdir: str | Path) -> Dossier:
    """Reads and verifies a dossier; raises `DossierError` naming what is wrong."""
    path = Path(workdir)
    if not path.is_dir():
        raise DossierError(f"No dossier at `{path}`: the directory does not exist.")
    if not (path / MANIFEST).is_file():
        raise DossierError(
            f"The dossier at `{path}` is incomplete: it has no `{MANIFEST}` manifest, so its "
            f"run did not finish. Train again with `--overwrite`."
        )
    manifest = _read_json(path / MANIFEST)
    expected = manifest.get("sha256") if isinstance(manifest, dict) else None
    if not isinstance(expected, dict) or not all(isinstance(v, str) for v in expected.values()):
        raise DossierError(
            f"The manifest `{path / MANIFEST}` is not usable: it must be a JSON object whose "
            f"field `sha256` maps file names to hashes."
        )
    actual = _hash_files(path)
    for name in sorted(set(expected) | set(actual)):
        if name == "reproduce.json":
            continue  # Added by `reproduce` after the run; not part of the manifest.
        if expected.get(name) != actual.get(name):
            state = "missing" if name not in actual else "changed since the run"
            raise DossierError(f"The dossier at `{path}` is corrupt: `{name}` is {state}.")
    for name in REQUIRED:
        if name not in actual:
            raise DossierError(f"The dossier at `{path}` is incomplete: `{name}` is missing.")
    try:
        config = load_config(path / "config.json")
    except ConfigError as err:
        raise DossierError(str(err)) from None
    split = _read_json(path / "split.json")
    _check_split(path / "split.json", split)
    metrics = _read_json(path / "metrics.json")
    _check_metrics(path / "metrics.json", metrics)
    return Dossier(path, config, split, metrics)


def _check_split(file: Path, split: Any) -> None:
    """Three disjoint lists of sample IDs that together cover the data set."""
    if not isinstance(split, dict):
        raise DossierError(f"`{file}` must hold a JSON object, not `{type(split).__name__}`.")
    seen: set[int] = set()
    for name in data.SPLITS:
        ids = split.get(name)
        if not isinstance(ids, list) or not all(
            type(i) is int and 0 <= i < data.NUM_EXAMPLES for i in ids
        ):
            raise DossierError(
                f"`{file}`: field `{name}` must be a list of sample IDs from 0 to "
                f"{data.NUM_EXAMPLES - 1}, but it is `{_short(ids)}`."
            )
        if seen & set(ids) or len(set(ids)) != len(ids):
            raise DossierError(f"`{file}`: field `{name}` repeats sample IDs of another split.")
        seen |= set(ids)
    if len(seen) != data.NUM_EXAMPLES:
        raise DossierError(
            f"`{file}`: the splits hold {len(seen)} sample IDs, not all {data.NUM_EXAMPLES}."
        )


def _check_metrics(file: Path, metrics: Any) -> None:
    """The fields `reproduce` reads, with the types and ranges a run writes."""
    if not isinstance(metrics, dict):
        raise DossierError(f"`{file}` must hold a JSON object, not `{type(metrics).__name__}`.")
    for key in METRIC_KEYS:
        if key not in metrics:
            raise DossierError(f"`{file}` has no field `{key}`.")

    def bad(field: str, value: Any, want: str) -> DossierError:
        return DossierError(
            f"`{file}`: field `{field}` must be {want}, but it is `{_short(value)}`."
        )

    if not isinstance(metrics["epochs"], list) or not all(
        isinstance(e, dict) for e in metrics["epochs"]
    ):
        raise bad("epochs", metrics["epochs"], "a list of per-epoch records")
    test = metrics["test"]
    if not isinstance(test, dict):
        raise bad("test", test, "an object with `loss`, `accuracy` and `count`")
    accuracy, loss, count = test.get("accuracy"), test.get("loss"), test.get("count")
    if not _is_number(accuracy) or not 0.0 <= accuracy <= 1.0:
        raise bad("test.accuracy", accuracy, "a number from 0 to 1")
    if not _is_number(loss) or loss < 0.0:
        raise bad("test.loss", loss, "a finite number >= 0")
    if type(count) is not int or count < 0:
        raise bad("test.count", count, "a whole number >= 0")
    matrix = metrics["confusion_matrix"]
    if not (
        isinstance(matrix, list)
        and len(matrix) == data.NUM_CLASSES
        and all(isinstance(row, list) and len(row) == data.NUM_CLASSES for row in matrix)
    ):
        raise bad("confusion_matrix", matrix, f"a {data.NUM_CLASSES} x {data.NUM_CLASSES} list")
    if not isinstance(metrics["misclassified"], list):
        raise bad("misclassified", metrics["misclassified"], "a list")
    digest = metrics["state_sha256"]
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise bad("state_sha256", digest, "a sha256 hex digest")


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DossierError(f"Cannot read `{path}` as JSON: {err}.") from None


def _hash_files(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` except the manifest, by relative path."""
    hashes = {}
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        name = file.relative_to(root).as_posix()
        if name != MANIFEST:
            hashes[name] = hashlib.sha256(file.read_bytes()).hexdigest()
    return hashes
