"""Load one YAML file into plain data plus the source position of every node.

Contract: :func:`load_yaml` never raises on bad input. It returns a
:class:`Document` (or ``None`` when the file cannot be parsed at all) and the
diagnostics found while reading: syntax errors (YML001), duplicate keys
(YML002, the first value is kept), tabs in indentation (YML003).

Scalars are resolved with YAML 1.1 rules on purpose: a plain ``NO``, ``yes``
or ``1.10`` is then a boolean or number, exactly what PyYAML and many other
readers make of it, so the schema pass can flag it (YML004) instead of the
catalog meaning one thing here and another elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic, Position, pointer

_TAG = "tag:yaml.org,2002:"
_TRUE = {"yes", "true", "on", "y"}


@dataclass(slots=True)
class Document:
    """A parsed source file: its data and where each part of it came from.

    ``positions`` maps a JSON pointer to the position of that value;
    ``key_positions`` maps the pointer of a mapping entry to its key;
    ``scalars`` keeps the source text of every plain scalar that did not
    resolve to a string, so messages can quote what the author wrote.
    """

    path: str
    data: Any
    positions: dict[str, Position] = field(default_factory=dict)
    key_positions: dict[str, Position] = field(default_factory=dict)
    scalars: dict[str, str] = field(default_factory=dict)

    def pos(self, ptr: str) -> Position:
        """Return the position of ``ptr``, or of its nearest ancestor that has one."""
        while ptr not in self.positions and ptr:
            ptr = ptr.rsplit("/", 1)[0]
        return self.positions.get(ptr, START)

    def key_pos(self, ptr: str) -> Position:
        """Return the position of the key of entry ``ptr`` (its value's if none)."""
        return self.key_positions.get(ptr) or self.pos(ptr)


def _mark(node: Node) -> Position:
    return Position(node.start_mark.line + 1, node.start_mark.column + 1)


def _scalar(node: ScalarNode) -> Any:
    """Return a scalar's value as resolved (YAML 1.1 rules, see module docstring)."""
    kind = node.tag.removeprefix(_TAG) if node.style is None else "str"
    text = node.value
    if kind == "bool":
        return text.lower() in _TRUE
    if kind == "null":
        return None
    if kind in ("int", "float"):
        cleaned = text.replace("_", "")
        for convert in (int, float):
            try:
                return convert(cleaned)
            except ValueError:
                pass
        return float("nan")  # Sexagesimal or octal 1.1 forms: still "a number".
    return text


class _Builder:
    """Turns a composed node tree into plain data, recording positions."""

    def __init__(self, doc: Document, diagnostics: list[Diagnostic]) -> None:
        self.doc = doc
        self.diagnostics = diagnostics

    def build(self, node: Node, ptr: str) -> Any:
        self.doc.positions[ptr] = _mark(node)
        if isinstance(node, MappingNode):
            result: dict[str, Any] = {}
            first_line: dict[str, int] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value) if isinstance(key_node, ScalarNode) else str(key_node)
                child = ptr + pointer(key)
                if key in result:
                    self.diagnostics.append(
                        rules.DUPLICATE_KEY.at(
                            self.doc.path,
                            _mark(key_node),
                            child,
                            f"Key `{key}` appears twice in this mapping "
                            f"(first on line {first_line[key]}).",
                        )
                    )
                    continue
                first_line[key] = _mark(key_node).line
                self.doc.key_positions[child] = _mark(key_node)
                result[key] = self.build(value_node, child)
            return result
        if isinstance(node, SequenceNode):
            return [self.build(item, f"{ptr}/{i}") for i, item in enumerate(node.value)]
        value = _scalar(node)
        if not isinstance(value, str):
            self.doc.scalars[ptr] = node.value
        return value


def _tab_diagnostics(path: str, text: str) -> list[Diagnostic]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.lstrip(" \t")
        indent = line[: len(line) - len(stripped)]
        if stripped and "\t" in indent:
            found.append(
                rules.TAB_INDENT.at(
                    path,
                    Position(number, indent.index("\t") + 1),
                    "",
                    f"Line {number} of `{path}` is indented with a tab.",
                )
            )
    return found


def load_yaml(file: Path, path: str) -> tuple[Document | None, list[Diagnostic]]:
    """Read ``file`` (shown as repo-relative ``path``); see the module docstring."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        message = f"`{path}` is not UTF-8 text (byte {error.start} cannot be decoded)."
        return None, [rules.YAML_SYNTAX.at(path, START, "", message)]
    diagnostics = _tab_diagnostics(path, text)
    yaml = YAML(typ="rt", pure=True)
    yaml.version = (1, 1)
    try:
        root = yaml.compose(text)
    except MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        pos = Position(mark.line + 1, mark.column + 1) if mark else START
        if not any(d.line == pos.line for d in diagnostics):  # A tab already explains it.
            problem = error.problem or error.context or "unreadable YAML"
            if error.context and error.context_mark and error.problem:
                where = (
                    f"line {error.context_mark.line + 1}, column {error.context_mark.column + 1}"
                )
                problem = f"{error.context} (from {where}), {problem}"
            diagnostics.append(
                rules.YAML_SYNTAX.at(
                    path, pos, "", f"`{path}` cannot be parsed as YAML: {problem}."
                )
            )
        return None, diagnostics
    except YAMLError as error:
        message = (
            f"`{path}` cannot be parsed as YAML: {str(error).strip() or type(error).__name__}."
        )
        diagnostics.append(rules.YAML_SYNTAX.at(path, START, "", message))
        return None, diagnostics
    doc = Document(path, None)
    if root is not None:
        doc.data = _Builder(doc, diagnostics).build(root, "")
    return doc, diagnostics
