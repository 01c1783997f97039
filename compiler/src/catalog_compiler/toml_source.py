"""Load a project manifest (TOML) into plain data plus approximate positions.

``tomllib`` parses but reports no positions, so a small line scanner maps
the keys this project's manifests use (top-level keys, ``[[stages]]`` tables
and the strings of one-line or multi-line arrays) to their line and column.
Lines end at ``\\n`` only, as in TOML itself: U+2028, U+2029 or U+0085 inside
a string is a character of its line.

Contract: :func:`load_toml` never raises on bad input. A syntax error is a
TML001 diagnostic at the position tomllib names; a file that is not regular
UTF-8 text is FIL004/FIL005 (see ``source_text``), one larger than the limit
LIM004, and one that nests arrays or tables deeper than the limit LIM001
(found by a scan before tomllib recurses into it).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic, Position, pointer
from catalog_compiler.limits import MAX_DEPTH
from catalog_compiler.source_text import Lines, read_text
from catalog_compiler.yaml_source import Document

_KEY = re.compile(r'\s*("(?:[^"\\]|\\.)*"|[A-Za-z0-9_-]+)\s*=\s*')
_ARRAY_TABLE = re.compile(r"\s*\[\[\s*([A-Za-z0-9_.-]+)\s*\]\]")
_TABLE = re.compile(r"\s*\[\s*([A-Za-z0-9_.-]+)\s*\]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'')
_ERROR_AT = re.compile(r"\(at line (\d+), column (\d+)\)")
_END = "(at end of document)"
_MULTILINE = ('"""', "'''")
# What the nesting scan skips (comments, strings) or counts (brackets).
_NESTING = re.compile(
    r"#[^\n]*"
    r'|"""(?:[^\\]|\\.)*?"""'
    r"|'''.*?'''"
    r'|"(?:[^"\\\n]|\\.)*"'
    r"|'[^'\n]*'"
    r"|[\[\]{}]",
    re.S,
)


def _deep_at(text: str) -> int | None:
    """Return the offset of the first bracket nested deeper than MAX_DEPTH, if any.

    The document itself is the first level, as in yaml_source.
    """
    depth = 1
    for match in _NESTING.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                return match.start()
        elif token in ("]", "}"):
            depth = max(1, depth - 1)
    return None


def _too_deep(data: object) -> bool:
    """True if parsed ``data`` nests deeper than MAX_DEPTH (dotted keys can)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return False


def _opens_multiline(rest: str) -> str | None:
    """The delimiter of a multi-line string that ``rest`` opens and does not close."""
    for quote in _MULTILINE:
        if rest.count(quote) % 2 == 1:
            return quote
    return None


def _positions(text: str, doc: Document) -> None:
    """Record positions of keys, tables and array strings (best effort)."""
    prefix = ""
    counts: dict[str, int] = {}
    array_ptr: str | None = None  # Set while inside a multi-line array.
    array_index = 0
    in_string: str | None = None  # The delimiter while inside a multi-line string.
    for number, line in enumerate(text.split("\n"), start=1):
        if in_string is not None:
            if line.count(in_string) % 2 == 1:
                in_string = None
            continue
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
            if rest.startswith(_MULTILINE):
                in_string = _opens_multiline(rest)
            elif rest.startswith("["):
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
    text, fault = read_text(file, path)
    if text is None:
        return None, [fault] if fault else []
    return parse_toml(text, path)


def parse_toml(text: str, path: str) -> tuple[Document | None, list[Diagnostic]]:
    """Parse manifest ``text`` of the file shown as ``path`` (see the module docstring)."""
    lines = Lines(text)
    deep = _deep_at(text)
    data = None
    try:
        if deep is None:
            data = tomllib.loads(text)
    except RecursionError:
        data = None
    except tomllib.TOMLDecodeError as error:
        found = _ERROR_AT.search(str(error))
        if found:
            pos = Position(int(found.group(1)), int(found.group(2)))
        elif _END in str(error):
            pos = lines.position(len(text))
        else:
            pos = START
        reason = _ERROR_AT.sub("", str(error)).replace(_END, "").strip().rstrip(".")
        message = f"`{path}` cannot be parsed as TOML: {reason}."
        return None, [rules.TOML_SYNTAX.at(path, pos, "", message)]
    if data is None or _too_deep(data):
        pos = lines.position(deep) if deep is not None else START
        message = f"`{path}` nests arrays or tables more than {MAX_DEPTH} levels deep."
        return None, [rules.NESTING_TOO_DEEP.at(path, pos, "", message)]
    doc = Document(path, data)
    doc.positions[""] = START
    _positions(text, doc)
    return doc, []
