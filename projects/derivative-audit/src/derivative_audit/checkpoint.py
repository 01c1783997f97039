"""Durable records: every report this project writes (audit, report, bench,
the trained implicit layer's parameters) is saved as JSON with a sha256
sidecar, written to a temporary file and renamed into place, so a
half-written or edited record is detected when it is read back.

The audit holds no long training state to resume, so there is no Orbax
checkpoint here: the durable artifact is the record, and the demo layer's
few parameters are stored in it as exact float64 lists.
"""

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np


class RecordError(ValueError):
    """A record that is missing, unreadable or does not match its sha256."""


class OutputPathError(ValueError):
    """An output path that cannot be written; the message names it."""


def check_output_path(path: str | Path, is_dir: bool = False) -> Path:
    """Refuses, before any work, an output path that cannot be created: one that
    exists as the wrong kind (a directory for a file, a file for a directory),
    or whose nearest existing ancestor is a file."""
    path = Path(path)
    if path.exists() and path.is_dir() != is_dir:
        kind = "a directory" if path.is_dir() else "a file"
        raise OutputPathError(
            f"Output path `{path}` is {kind}; expected a {('file', 'directory')[is_dir]}."
        )
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(
                    f"Output path `{path}` cannot be created: `{parent}` is a file."
                )
            break
    return path


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def save_record(path: str | Path, payload: dict[str, Any]) -> Path:
    """Writes `payload` as JSON at `path` and its sha256 at `path` + `.sha256`."""
    path = check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=1, default=_plain) + "\n"
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    partial.write_text(text, encoding="utf-8")
    path.with_name(path.name + ".sha256").write_text(_digest(text) + "\n", encoding="utf-8")
    partial.replace(path)
    return path


def load_record(path: str | Path) -> dict[str, Any]:
    """Reads a record written by `save_record`; raises `RecordError` if it was
    changed after writing or its digest is missing."""
    path = Path(path)
    sidecar = path.with_name(path.name + ".sha256")
    try:
        text = path.read_text(encoding="utf-8")
        expected = sidecar.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise RecordError(f"Cannot read record `{path}` or its digest: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise RecordError(
            f"Record `{path}` or its digest is not UTF-8 text: {err.reason}."
        ) from None
    if _digest(text) != expected:
        raise RecordError(f"Record `{path}` does not match its sha256; it changed after writing.")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordError(
            f"Record `{path}` is not valid JSON: {err.msg} (line {err.lineno})."
        ) from None
    if not isinstance(payload, dict):
        raise RecordError(
            f"Record `{path}` holds a JSON `{type(payload).__name__}`, not an object."
        )
    return payload


def _plain(value: Any) -> Any:
    """JSON for NumPy/JAX values: arrays as (nested) lists, scalars as numbers."""
    if hasattr(value, "__array__"):
        array = np.asarray(value)
        return array.tolist()
    raise TypeError(f"Cannot write a value of type `{type(value).__name__}` to a record.")
