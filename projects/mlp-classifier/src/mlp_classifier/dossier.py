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
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flax
import jax

from mlp_classifier import checkpoint, plots
from mlp_classifier.config import Config, ConfigError

MANIFEST = "COMPLETE"


class DossierError(RuntimeError):
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
    expected = _read_json(path / MANIFEST)["sha256"]
    actual = _hash_files(path)
    for name in sorted(set(expected) | set(actual)):
        if name == "reproduce.json":
            continue  # Added by `reproduce` after the run; not part of the manifest.
        if expected.get(name) != actual.get(name):
            state = "missing" if name not in actual else "changed since the run"
            raise DossierError(f"The dossier at `{path}` is corrupt: `{name}` is {state}.")
    try:
        config = Config.from_json(
            (path / "config.json").read_text(encoding="utf-8"), str(path / "config.json")
        )
    except ConfigError as err:
        raise DossierError(str(err)) from None
    return Dossier(path, config, _read_json(path / "split.json"), _read_json(path / "metrics.json"))


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
