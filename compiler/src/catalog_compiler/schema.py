"""The schema pass: validate a loaded document against a model, as diagnostics.

Contract: :func:`validate` returns the typed object, or ``None`` when the
data does not fit, together with one diagnostic per pydantic error, each
placed at the YAML/TOML position of the offending value (or of the key, for
an unknown key; of the enclosing mapping, for a missing one).
"""

from __future__ import annotations

import datetime
import difflib
import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from catalog_compiler import rules
from catalog_compiler.diagnostics import Diagnostic, pointer
from catalog_compiler.models import DERIVED_KEYS
from catalog_compiler.yaml_source import Document, NotText

M = TypeVar("M", bound=BaseModel)

_EXPECTED = {
    "string_type": "text",
    "list_type": "a list",
    "model_type": "a mapping",
    "dict_type": "a mapping",
    "int_type": "an integer",
}


def describe(value: Any) -> str:
    """Return what ``value`` is, for messages (``the number `1```)."""
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return f"the boolean `{str(value).lower()}`"
    if isinstance(value, datetime.date):
        return f"the date `{value.isoformat()}`"
    if isinstance(value, NotText):
        return str(value)
    if isinstance(value, int | float):
        return f"the number `{value}`"
    if isinstance(value, str):
        return f"the text `{value}`"
    if not isinstance(value, list | dict):  # A TOML time, for one.
        return f"the value `{value}`"
    kind = "a list" if isinstance(value, list) else "a mapping"
    shown = json.dumps(value, ensure_ascii=False, default=str)
    return f"{kind} `{shown[:60]}{'...' if len(shown) > 60 else ''}`"


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, datetime.date):
        return f"the date {value.isoformat()}"
    if isinstance(value, NotText):
        return str(value)
    return "null" if value is None else f"the number {value}"


def _field(loc: tuple) -> str:
    """The name of the field at ``loc`` (list indexes skipped): ``stageIds``."""
    names = [str(part) for part in loc if not isinstance(part, int)]
    return names[-1] if names else "document"


def _diagnostic(error: dict, doc: Document, prefix: str, model: type[BaseModel]) -> Diagnostic:
    loc = error["loc"]
    ptr = prefix + pointer(*loc)
    name = str(loc[-1]) if loc else (prefix.rsplit("/", 1)[-1] or "document")
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        known = list(parent.model_fields) if parent else []
        close = difflib.get_close_matches(name, known, n=1)
        message = f"Key `{name}` is not allowed here" + (
            f"; did you mean `{close[0]}`?" if close else "."
        )
        hint = DERIVED_KEYS.get(name) or (
            f"Rename it to `{close[0]}`."
            if close
            else f"Remove it; allowed keys: {', '.join(known)}."
        )
        return rules.UNKNOWN_KEY.at(doc.path, doc.key_pos(ptr), ptr, message, hint)
    if kind == "missing":
        where = ptr.rsplit("/", 1)[0]
        message = f"Required key `{name}` is missing from `{where or '/'}`."
        return rules.MISSING_KEY.at(doc.path, doc.pos(where), ptr, message, f"Add `{name}: ...`.")
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
        raw = doc.scalars.get(ptr)
        if kind == "string_type" and raw:  # A plain YAML scalar that did not stay text.
            message = (
                f"The unquoted value `{raw}` in `{_field(loc)}` is read by YAML as "
                f"{_kind(value)}, but it must be text."
            )
            hint = f"Quote it: `'{raw}'`."
            return rules.IMPLICIT_TYPE.at(doc.path, doc.pos(ptr), ptr, message, hint)
        message = f"`{name}` must be {expected}, but it is {describe(value)}."
        hint = "Quote the value to make it text." if kind == "string_type" else None
        return rules.WRONG_TYPE.at(doc.path, doc.pos(ptr), ptr, message, hint)
    if kind in ("string_too_short", "too_short"):
        message = f"`{name}` must not be empty."
        return rules.INVALID_VALUE.at(doc.path, doc.pos(ptr), ptr, message, "Give it a value.")
    if kind == "literal_error":
        allowed = error["ctx"]["expected"]
        message = f"`{name}` is {describe(value)}, which is not one of {allowed}."
        return rules.INVALID_VALUE.at(
            doc.path, doc.pos(ptr), ptr, message, f"Use one of {allowed}."
        )
    if kind in ("greater_than_equal", "less_than_equal"):
        message = f"`{name}` is {describe(value)}, which this compiler does not support."
        hint = "Use schemaVersion 1." if name == "schemaVersion" else None
        return rules.INVALID_VALUE.at(doc.path, doc.pos(ptr), ptr, message, hint)
    message = f"`{name}` is {describe(value)}: {error['msg'].rstrip('.')}."
    return rules.WRONG_TYPE.at(doc.path, doc.pos(ptr), ptr, message)


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """Return the model class that validates the mapping at ``loc`` inside ``model``."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return None
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        current = args[0] if args else annotation
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def validate(
    model: type[M], data: Any, doc: Document, prefix: str = ""
) -> tuple[M | None, list[Diagnostic]]:
    """Validate ``data`` (found at ``prefix`` in ``doc``) against ``model``."""
    try:
        return model.model_validate(data), []
    except ValidationError as error:
        errors = error.errors(include_url=False)
        return None, [_diagnostic(e, doc, prefix, model) for e in errors]


def expect_mapping(
    doc: Document, keys: tuple[str, ...], what: str
) -> tuple[dict | None, list[Diagnostic]]:
    """Check that ``doc`` is a mapping with exactly ``keys``; return it if it is one.

    Used for the list files, whose items are then validated one by one.
    """
    data = doc.data
    if not isinstance(data, dict):
        message = (
            f"{what} must be a mapping with key(s) {', '.join(keys)}, but it is {describe(data)}."
        )
        return None, [rules.WRONG_TYPE.at(doc.path, doc.pos(""), "", message)]
    found = []
    for key in data:
        if key not in keys:
            ptr = pointer(key)
            close = difflib.get_close_matches(key, keys, n=1)
            message = f"Key `{key}` is not allowed here" + (
                f"; did you mean `{close[0]}`?" if close else "."
            )
            found.append(rules.UNKNOWN_KEY.at(doc.path, doc.key_pos(ptr), ptr, message))
    for key in keys:
        if key not in data:
            message = f"Required key `{key}` is missing from `/`."
            found.append(rules.MISSING_KEY.at(doc.path, doc.pos(""), pointer(key), message))
        elif not isinstance(data[key], list):
            message = f"`{key}` must be a list, but it is {describe(data[key])}."
            found.append(
                rules.WRONG_TYPE.at(doc.path, doc.pos(pointer(key)), pointer(key), message)
            )
    return data, found
