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


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def save_record(path: str | Path, payload: dict[str, Any]) -> Path:
    """Writes `payload` as JSON at `path` and its sha256 at `path` + `.sha256`."""
    path = Path(path)
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
    if _digest(text) != expected:
        raise RecordError(f"Record `{path}` does not match its sha256; it changed after writing.")
    return json.loads(text)


def _plain(value: Any) -> Any:
    """JSON for NumPy/JAX values: arrays as (nested) lists, scalars as numbers."""
    if hasattr(value, "__array__"):
        array = np.asarray(value)
        return array.tolist()
    raise TypeError(f"Cannot write a value of type `{type(value).__name__}` to a record.")
