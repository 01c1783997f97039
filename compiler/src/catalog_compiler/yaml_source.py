"""Load one YAML file into plain data plus the source position of every node.

Contract: :func:`load_yaml` never raises on bad input. It returns a
:class:`Document` (or ``None`` when the file cannot be parsed at all) and the
diagnostics found while reading: syntax errors (YML001), duplicate keys
(YML002, the first value is kept), tabs in indentation (YML003), explicit
tags and directives (YML005), files that are not regular UTF-8 text (FIL004, FIL005) and
files beyond the loading limits (LIM001-LIM004, see ``limits.py``). The
limits are enforced while composing (a depth and an alias count) and on the
composed node graph before any alias is expanded, so a hostile file is
refused early and cheaply.

PyYAML reads the text: libyaml's C parser turns it into events and PyYAML's
composer, limited here, builds the node graph; a file libyaml finds fault
with is read again by PyYAML's pure-Python parser, which reports the first
problem where it is (see `_compose`). Scalars are resolved with YAML 1.1 rules
on purpose, by PyYAML's resolver and safe constructor: a plain ``NO``,
``yes``, ``1.10`` or ``2001-12-14`` is then a boolean, number or date, as
many readers make of it, so the schema pass can flag it (YML004) instead of
the catalog meaning one thing here and another elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.error import MarkedYAMLError, YAMLError
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    ScalarEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic, Position, pointer
from catalog_compiler.limits import MAX_ALIASES, MAX_DEPTH, MAX_VALUES
from catalog_compiler.rules import Rule
from catalog_compiler.source_text import Lines, read_text

_DIRECTIVE = re.compile(r"^%", re.M)


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


class _Refused(Exception):
    """A file breaks a loading rule; carries the diagnostic's rule, place and text."""

    def __init__(self, rule: Rule, index: int, message: str) -> None:
        super().__init__(message)
        self.rule, self.index, self.message = rule, index, message


try:
    from yaml._yaml import CParser as _EventParser  # libyaml's parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml.
    _EventParser = None


def _tag_text(tag: str) -> str:
    """A tag as its author wrote the common shorthand: `!!int`, not its full URI."""
    return tag.replace("tag:yaml.org,2002:", "!!", 1)


class _LimitedComposer(Composer):
    """PyYAML's composer, refusing tags and directives, too much depth and too
    many aliases as it goes."""

    depth = 0
    aliases = 0

    def compose_document(self: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, DocumentStartEvent) and (event.version or event.tags):
            directive = "%YAML" if event.version else "%TAG"
            raise _Refused(rules.YAML_TAG, -1, f"has a `{directive}` directive")
        return super().compose_document()

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise _Refused(
                    rules.TOO_MANY_ALIASES,
                    event.start_mark.index,
                    f"uses more than {MAX_ALIASES} aliases (`*{event.anchor}` is one too many)",
                )
            return super().compose_node(parent, index)
        if isinstance(event, ScalarEvent | CollectionStartEvent) and event.tag is not None:
            raise _Refused(
                rules.YAML_TAG,
                event.start_mark.index,
                f"has the explicit tag `{_tag_text(event.tag)}`",
            )
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(
                rules.NESTING_TOO_DEEP,
                event.start_mark.index,
                f"nests lists or mappings more than {MAX_DEPTH} levels deep",
            )
        node = super().compose_node(parent, index)
        self.depth -= 1
        return node


class _Loader(Reader, Scanner, Parser, _LimitedComposer, Resolver):
    """PyYAML's pure-Python reader, scanner and parser, composed under the limits:
    it meets every problem in source order, limits included."""

    def __init__(self, text: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        _LimitedComposer.__init__(self)
        Resolver.__init__(self)


if _EventParser is not None:

    class _FastLoader(_LimitedComposer, _EventParser, Resolver):
        """libyaml's events, composed in Python under the same limits."""

        def __init__(self, text: str) -> None:
            _EventParser.__init__(self, text)
            _LimitedComposer.__init__(self)
            Resolver.__init__(self)


def _compose(text: str) -> Node | None:
    """The root node of ``text`` (``None`` for an empty document).

    libyaml reads ahead and keeps limits of its own (a flow nesting of 1000),
    so when it finds any problem the pure-Python parser reads the text again
    and reports the first problem where it is. A sound file, the common
    case, is read once, by libyaml. Raises `_Refused` or `YAMLError`.
    """
    if _EventParser is not None:
        try:
            return _FastLoader(text).get_single_node()
        except YAMLError:
            pass
    return _Loader(text).get_single_node()


def _measure(root: Node) -> None:
    """Refuse a node graph that is cyclic, too deep or too large once expanded.

    Iterative and memoised per node, so it costs one visit of each composed
    node however often aliases repeat it.
    """
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth)
    active: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        children: list[Node] = []
        if isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, SequenceNode):
            children = node.value
        if finished:
            values = 1 + sum(done[id(c)][0] for c in children)
            depth = 1 + max((done[id(c)][1] for c in children), default=0)
            done[key] = (values, depth)
            active.discard(key)
            if depth > MAX_DEPTH:
                raise _Refused(
                    rules.NESTING_TOO_DEEP,
                    node.start_mark.index,
                    f"nests more than {MAX_DEPTH} levels deep once its aliases are expanded",
                )
            if values > MAX_VALUES:
                raise _Refused(
                    rules.EXPANSION_TOO_LARGE,
                    node.start_mark.index,
                    f"expands to more than {MAX_VALUES} values through its aliases",
                )
            continue
        if key in done:
            continue
        if key in active:
            raise _Refused(
                rules.TOO_MANY_ALIASES,
                node.start_mark.index,
                "has an alias inside the value it names (a recursive alias)",
            )
        active.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(children))


_CONSTRUCTED = {
    "tag:yaml.org,2002:" + kind: word
    for kind, word in [
        ("bool", "boolean"),
        ("int", "number"),
        ("float", "number"),
        ("null", "null"),
        ("timestamp", "date"),
    ]
}


class NotText:
    """A plain scalar that YAML 1.1 reads as a non-text ``kind`` PyYAML cannot build.

    (``2001-13-45`` matches the timestamp pattern but is no date.) It stands
    in for the value so the schema pass still says "quote it".
    """

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __str__(self) -> str:
        return f"a {self.kind}"


class _Builder:
    """Turns a composed node tree into plain data, recording positions."""

    def __init__(self, doc: Document, lines: Lines) -> None:
        self.doc = doc
        self.lines = lines
        self.constructor = SafeConstructor()
        self.diagnostics: list[Diagnostic] = []

    def mark(self, node: Node) -> Position:
        return self.lines.position(node.start_mark.index)

    def scalar(self, node: ScalarNode) -> Any:
        """Return a scalar's value as PyYAML's safe constructor resolves it (YAML 1.1)."""
        kind = _CONSTRUCTED.get(str(node.tag)) if not node.style else None
        if kind is None:
            return node.value
        try:
            return self.constructor.construct_object(node)
        except (YAMLError, ValueError, OverflowError):
            return NotText(kind)

    def build(self, node: Node, ptr: str) -> Any:
        self.doc.positions[ptr] = self.mark(node)
        if isinstance(node, MappingNode):
            result: dict[str, Any] = {}
            first_line: dict[str, int] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, ScalarNode):
                    kind = "a list" if isinstance(key_node, SequenceNode) else "a mapping"
                    self.diagnostics.append(
                        rules.WRONG_TYPE.at(
                            self.doc.path,
                            self.mark(key_node),
                            ptr,
                            f"A mapping key must be text, but this one is {kind}.",
                            "Write the key as plain text.",
                        )
                    )
                    continue
                key = str(key_node.value)
                child = ptr + pointer(key)
                if key in result:
                    self.diagnostics.append(
                        rules.DUPLICATE_KEY.at(
                            self.doc.path,
                            self.mark(key_node),
                            child,
                            f"Key `{key}` appears twice in this mapping "
                            f"(first on line {first_line[key]}).",
                        )
                    )
                    continue
                first_line[key] = self.mark(key_node).line
                self.doc.key_positions[child] = self.mark(key_node)
                result[key] = self.build(value_node, child)
            return result
        if isinstance(node, SequenceNode):
            return [self.build(item, f"{ptr}/{i}") for i, item in enumerate(node.value)]
        value = self.scalar(node)
        if not isinstance(value, str):
            self.doc.scalars[ptr] = node.value
        return value


def _tab_diagnostics(path: str, text: str) -> list[Diagnostic]:
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        stripped = line.lstrip(" \t")
        indent = line[: len(line) - len(stripped)]
        if stripped.strip() and "\t" in indent:
            found.append(
                rules.TAB_INDENT.at(
                    path,
                    Position(number, indent.index("\t") + 1),
                    "",
                    f"Line {number} of `{path}` is indented with a tab.",
                )
            )
    return found


def _syntax(path: str, lines: Lines, error: MarkedYAMLError) -> Diagnostic:
    mark = error.problem_mark or error.context_mark
    pos = lines.position(mark.index) if mark else START
    problem = error.problem or error.context or "unreadable YAML"
    if error.context and error.context_mark and error.problem:
        where = lines.position(error.context_mark.index)
        problem = f"{error.context} (from line {where.line}, column {where.column}), {problem}"
    return rules.YAML_SYNTAX.at(path, pos, "", f"`{path}` cannot be parsed as YAML: {problem}.")


def load_yaml(file: Path, path: str) -> tuple[Document | None, list[Diagnostic]]:
    """Read ``file`` (shown as repo-relative ``path``); see the module docstring."""
    text, fault = read_text(file, path, Reader.NON_PRINTABLE)
    if text is None:
        return None, [fault] if fault else []
    return parse_yaml(text, path)


def parse_yaml(text: str, path: str) -> tuple[Document | None, list[Diagnostic]]:
    """Parse YAML ``text`` of the file shown as ``path`` (see the module docstring)."""
    lines = Lines(text)
    diagnostics = _tab_diagnostics(path, text)
    try:
        root = _compose(text)
        if root is not None:
            _measure(root)
    except _Refused as refused:
        message = f"`{path}` {refused.message}."
        index = refused.index
        if index < 0:  # A directive: the first line that starts with `%`.
            found = _DIRECTIVE.search(text)
            index = found.start() if found else 0
        return None, [refused.rule.at(path, lines.position(index), "", message)]
    except MarkedYAMLError as error:
        found = _syntax(path, lines, error)
        if not any(d.line == found.line for d in diagnostics):  # A tab already explains it.
            diagnostics.append(found)
        return None, diagnostics
    except YAMLError as error:
        message = (
            f"`{path}` cannot be parsed as YAML: {str(error).strip() or type(error).__name__}."
        )
        diagnostics.append(rules.YAML_SYNTAX.at(path, START, "", message))
        return None, diagnostics
    doc = Document(path, None)
    if root is not None:
        builder = _Builder(doc, lines)
        doc.data = builder.build(root, "")
        diagnostics += builder.diagnostics
    return doc, diagnostics
