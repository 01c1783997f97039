"""Parso tree helpers shared by the semantic operators (Cosmic Ray mutates parso trees)."""

from __future__ import annotations

from collections.abc import Iterator

import parso
from parso.python.tree import PythonNode

Position = tuple[tuple[int, int], tuple[int, int]]


def _span(node) -> Position:
    return (node.start_pos, node.end_pos)


def _prefix(node) -> str:
    """The whitespace and comments before ``node`` (held by its first leaf)."""
    return node.get_first_leaf().prefix


def _expression(code: str, prefix: str):
    """The expression node of ``code`` (one line), with ``prefix`` as its whitespace."""
    node = parso.parse(code).children[0]  # No newline: the expression itself.
    node.get_first_leaf().prefix = prefix
    return node


def _call_parts(node) -> tuple[str, PythonNode] | None:
    """(callee's last name, its call trailer) of an `f(...)` or `a.b.f(...)` node."""
    if node.type not in ("atom_expr", "power") or len(node.children) < 2:
        return None
    trailer = node.children[-1]
    if trailer.type != "trailer" or trailer.children[0].value != "(":
        return None
    before = node.children[-2]
    if before.type == "name":
        return before.value, trailer
    if before.type == "trailer" and before.children[0].value == ".":
        return before.children[1].value, trailer
    return None


def _arguments(trailer) -> list:
    """The argument nodes of a call trailer `( ... )`."""
    inner = trailer.children[1] if len(trailer.children) == 3 else None
    if inner is None:
        return []
    if inner.type == "arglist":
        return [c for c in inner.children if not (c.type == "operator" and c.value == ",")]
    return [inner]


def _is_keyword(arg) -> bool:
    return arg.type == "argument" and len(arg.children) == 3 and arg.children[1].value == "="


def _is_comma(node) -> bool:
    return node.type == "operator" and node.value == ","


def _without(node, removed: list) -> str:
    """``node``'s code with the children in ``removed`` (and one adjacent comma each) left out."""
    children = node.children
    drop = set()
    for child in removed:
        i = children.index(child)
        drop.add(i)
        if (
            i + 1 < len(children)
            and children[i + 1].type == "operator"
            and children[i + 1].value == ","
        ):
            drop.add(i + 1)
        elif i > 0 and children[i - 1].type == "operator" and children[i - 1].value == ",":
            drop.add(i - 1)
    return "".join(c.get_code() for i, c in enumerate(children) if i not in drop)


def _walk(node) -> Iterator:
    yield node
    for child in getattr(node, "children", []):
        yield from _walk(child)


def _is_attribute(leaf) -> bool:
    """Whether ``leaf`` is the `b` of `a.b` or a keyword argument's name."""
    parent = leaf.parent
    if parent.type == "trailer" and parent.children[0].value == ".":
        return True
    return parent.type == "argument" and parent.children[0] is leaf and len(parent.children) == 3


def _replace(old, new) -> None:
    """Put ``new`` in ``old``'s place in its parent."""
    parent = old.parent
    parent.children[parent.children.index(old)] = new
    new.parent = parent
