"""Load a project manifest (TOML) into plain data plus approximate positions.

``tomllib`` parses but reports no positions, so a small line scanner maps
the keys this project's manifests use (top-level keys, ``[[stages]]`` tables
and the strings of one-line or multi-line arrays) to their line and column.
Contract: :func:`load_toml` never raises on bad input; a syntax error is a
TML001 diagnostic at the position tomllib names.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic, Position, pointer
from catalog_compiler.yaml_source import Document

_KEY = re.compile(r'\s*("(?:[^"\\]|\\.)*"|[A-Za-z0-9_-]+)\s*=\s*')
_ARRAY_TABLE = re.compile(r"\s*\[\[\s*([A-Za-z0-9_.-]+)\s*\]\]")
_TABLE = re.compile(r"\s*\[\s*([A-Za-z0-9_.-]+)\s*\]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'')
_ERROR_AT = re.compile(r"\(at line (\d+), column (\d+)\)")


def _positions(text: str, doc: Document) -> None:
    """Record positions of keys, tables and array strings (best effort)."""
    prefix = ""
    counts: dict[str, int] = {}
    array_ptr: str | None = None  # Set while inside a multi-line array.
    array_index = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if array_ptr is not None:
            for match in _STRING.finditer(line):
                doc.positions[f"{array_ptr}/{array_index}"] = Position(number, match.start() + 1)
                array_index += 1
            if "]" in _STRING.sub("", line):
                array_ptr = None
            continue
        if match := _ARRAY_TABLE.match(line):
            name = match.group(1)
            index = counts[name] = counts.get(name, -1) + 1
            prefix = pointer(name, index)
            doc.positions[prefix] = Position(number, match.start(1) - 1)
            continue
        if match := _TABLE.match(line):
            prefix = pointer(match.group(1))
            doc.positions[prefix] = Position(number, match.start(1))
            continue
        if match := _KEY.match(line):
            key = match.group(1).strip('"')
            ptr = prefix + pointer(key)
            doc.key_positions[ptr] = Position(number, match.start(1) + 1)
            doc.positions[ptr] = Position(number, match.end() + 1)
            rest = line[match.end() :]
            if rest.startswith("["):
                array_ptr, array_index = ptr, 0
                for item in _STRING.finditer(rest):
                    doc.positions[f"{ptr}/{array_index}"] = Position(
                        number, match.end() + item.start() + 1
                    )
                    array_index += 1
                if "]" in _STRING.sub("", rest):
                    array_ptr = None


def load_toml(file: Path, path: str) -> tuple[Document | None, list[Diagnostic]]:
    """Read manifest ``file`` (shown as repo-relative ``path``)."""
    try:
        text = file.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError as error:
        message = f"`{path}` is not UTF-8 text (byte {error.start} cannot be decoded)."
        return None, [rules.TOML_SYNTAX.at(path, START, "", message)]
    except tomllib.TOMLDecodeError as error:
        found = _ERROR_AT.search(str(error))
        pos = Position(int(found.group(1)), int(found.group(2))) if found else START
        reason = _ERROR_AT.sub("", str(error)).strip().rstrip(".")
        message = f"`{path}` cannot be parsed as TOML: {reason}."
        return None, [rules.TOML_SYNTAX.at(path, pos, "", message)]
    doc = Document(path, data)
    doc.positions[""] = START
    _positions(text, doc)
    return doc, []
