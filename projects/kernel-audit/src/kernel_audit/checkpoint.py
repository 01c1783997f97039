"""Durable records: every report this project writes (audit, bench, training
metrics) is saved as JSON with a sha256 sidecar, written to a temporary file
and renamed into place, so a half-written or edited record is detected when it
is read back.

The kernels hold no trained state to resume, so there is no model checkpoint
here (no Orbax): the audit's durable artifact is its record.
"""

import hashlib
import json
import os
from pathlib import Path
from typing import Any


class RecordError(ValueError):
    """A record that is missing, unreadable or does not match its sha256."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def save_record(path: str | Path, payload: dict[str, Any]) -> Path:
    """Writes `payload` as JSON at `path` and its sha256 at `path` + `.sha256`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=1, allow_nan=True) + "\n"
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    partial.write_text(text, encoding="utf-8")
    path.with_name(path.name + ".sha256").write_text(_digest(text) + "\n", encoding="utf-8")
    partial.replace(path)
    return path


def load_record(path: str | Path) -> dict[str, Any]:
    """Reads a record written by `save_record`; raises `RecordError` if it was
    changed after writing or its digest is missing."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        expected = path.with_name(path.name + ".sha256").read_text(encoding="utf-8").strip()
    except OSError as err:
        raise RecordError(f"Cannot read record `{path}` or its digest: {err.strerror}.") from None
    if _digest(text) != expected:
        raise RecordError(
            f"Record `{path}` does not match its sha256 `{expected[:12]}...`: it was changed "
            f"after it was written; re-run the command that produced it."
        )
    return json.loads(text)
