"""Saving and restoring a study's result (estimates, intervals, diagnostics).

The state of this project is a small tree of float64 numbers, so the
checkpoint is JSON: Python writes floats with `repr`, which round-trips
float64 exactly, so a restored result is bitwise equal to the saved one
(`digest` proves it). Infinite interval ends (an unbounded profile) are kept
as JSON's `Infinity`.
"""

import hashlib
import json
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A result file that cannot be read back; the message says why."""


def save(path: str | Path, result: dict[str, Any]) -> Path:
    path = Path(path)
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def restore(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CheckpointError(f"Cannot read result file `{path}`: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise CheckpointError(
            f"Result file `{path}` is not UTF-8 text (byte {err.start}: {err.reason})."
        ) from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"Result file `{path}` is not valid JSON: {err.msg}.") from None
    if not isinstance(result, dict):
        raise CheckpointError(
            f"Result file `{path}` holds a JSON {type(result).__name__}, not the object "
            "of a study's result."
        )
    return result


def digest(result: dict[str, Any], exclude: tuple[str, ...] = ("seconds",)) -> str:
    """SHA-256 of the canonical JSON of `result` without the wall-clock fields."""
    kept = {k: v for k, v in result.items() if k not in exclude}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()
