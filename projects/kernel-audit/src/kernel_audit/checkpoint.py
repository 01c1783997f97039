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
    """A record that is missing, unreadable or does not match its sha256, or a place
    where one cannot be written."""


def check_writable(path: str | Path, *, directory: bool, what: str) -> Path:
    """Refuses an output path that cannot be written, before any work is done.

    `directory`: the path is a folder to create (else a file to create or replace).
    The path, if it exists, must be of that kind, and its nearest existing ancestor
    must be a folder; raises `RecordError` naming `what` and the path.
    """
    given = Path(path)
    path = Path(os.path.abspath(given))  # `..` taken lexically, as `mkdir` will meet it
    if path.exists() and path.is_dir() != directory:
        kind = "a folder" if directory else "a file"
        raise RecordError(f"{what} `{given}` exists and is not {kind}.")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                shown = parent if given.is_absolute() else os.path.relpath(parent)
                raise RecordError(
                    f"{what} `{given}` cannot be created: `{shown}` is a file, not a folder."
                )
            break
    return given


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
    except UnicodeDecodeError as err:
        raise RecordError(
            f"Record `{path}` or its digest is not UTF-8 text (byte {err.start}: {err.reason})."
        ) from None
    if _digest(text) != expected:
        raise RecordError(
            f"Record `{path}` does not match its sha256 `{expected[:12]}...`: it was changed "
            f"after it was written; re-run the command that produced it."
        )
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordError(f"Record `{path}` is not valid JSON: {err.msg}.") from None
    if not isinstance(payload, dict):
        raise RecordError(
            f"Record `{path}` holds a JSON {type(payload).__name__}, not a record's object."
        )
    return payload
