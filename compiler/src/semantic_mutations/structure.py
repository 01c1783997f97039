"""Semantic operators on structure: a sibling string, a collapsed iterable, two
statements swapped, a sibling name (:mod:`semantic_mutations.operators`)."""

from __future__ import annotations

from collections.abc import Iterator

from cosmic_ray.operators.operator import Example, Operator

from semantic_mutations._tree import (
    Position,
    _expression,
    _is_attribute,
    _prefix,
    _replace,
    _span,
    _walk,
)

# Display nodes whose direct string children are siblings of one collection.
DISPLAYS = ("testlist_comp", "dictorsetmaker", "exprlist", "testlist", "testlist_star_expr")


class SwapSiblingString(Operator):
    """A string of a display replaced by the display's next different string."""

    def _choices(self, node) -> list[tuple]:
        if node.type not in DISPLAYS:
            return []
        strings = [c for c in node.children if c.type == "string" and c.value[:1] not in "fFbB"]
        values = [s.value for s in strings]
        out = []
        for i, s in enumerate(strings):
            other = next(
                (
                    values[(i + k) % len(values)]
                    for k in range(1, len(values))
                    if values[(i + k) % len(values)] != s.value
                ),
                None,
            )
            if other is not None:
                out.append((s, other))
        return out

    def mutation_positions(self, node) -> Iterator[Position]:
        for leaf, _ in self._choices(node):
            yield _span(leaf)

    def mutate(self, node, index):
        leaf, other = self._choices(node)[index]
        leaf.value = other
        return node

    @classmethod
    def examples(cls):
        return (
            Example("x = ('q', 'v')", "x = ('v', 'v')"),
            Example("x = ('q', 'v')", "x = ('q', 'q')", occurrence=1),
            Example("x = {'a': 1, 'b': 2}", "x = {'b': 1, 'b': 2}"),
        )


def _iterables(node) -> list:
    """The iterable of a `for` statement or a comprehension's `for`."""
    if node.type == "for_stmt":
        return [node.children[3]]
    if node.type in ("sync_comp_for", "comp_for"):
        children = node.children[1:] if node.children[0].value == "async" else node.children
        in_at = next(i for i, c in enumerate(children) if c.type == "keyword" and c.value == "in")
        return [children[in_at + 1]]
    return []


class CollapseIterable(Operator):
    """A loop's iterable `E` made `set(E)`, `list(E)[:1]` or `list(E)[-1:]`."""

    FORMS = ("set({})", "list({})[:1]", "list({})[-1:]")

    def mutation_positions(self, node) -> Iterator[Position]:
        for it in _iterables(node):
            for _ in self.FORMS:
                yield _span(it)

    def mutate(self, node, index):
        it = _iterables(node)[0]
        form = self.FORMS[index]
        _replace(it, _expression(form.format(it.get_code().strip()), _prefix(it)))
        return node

    @classmethod
    def examples(cls):
        return (
            Example("for i in xs: pass", "for i in set(xs): pass"),
            Example("for i in xs: pass", "for i in list(xs)[:1]: pass", occurrence=1),
            Example("y = [v for v in xs]", "y = [v for v in list(xs)[-1:]]", occurrence=2),
        )


def _assigned(statement) -> set[str]:
    """Names a plain `a = ...` or `a, b = ...` statement assigns; none for any other
    statement (an annotated or augmented assignment included)."""
    expr = statement.children[0] if statement.type == "simple_stmt" else None
    if expr is None or expr.type != "expr_stmt":
        return set()
    if getattr(expr.children[1], "value", None) != "=":  # `x: int = 1` has an annassign.
        return set()
    target = expr.children[0]
    leaves = [target] if target.type == "name" else [c for c in getattr(target, "children", [])]
    return {leaf.value for leaf in leaves if leaf.type == "name"}


def _read(statement) -> set[str]:
    names, stack = set(), [statement]
    while stack:
        n = stack.pop()
        if n.type == "name":
            names.add(n.value)
        stack.extend(getattr(n, "children", []))
    return names


class SwapAdjacentStatements(Operator):
    """Two adjacent statements of a block swapped where the second reads a name the
    first assigns: a value used before the step that makes it what it must be."""

    def _pairs(self, node) -> list[int]:
        if node.type not in ("suite", "file_input"):
            return []
        body = node.children
        return [
            i
            for i in range(len(body) - 1)
            if body[i].type == "simple_stmt"
            and body[i + 1].type == "simple_stmt"
            and _assigned(body[i]) & _read(body[i + 1])
        ]

    def mutation_positions(self, node) -> Iterator[Position]:
        for i in self._pairs(node):
            yield (node.children[i].start_pos, node.children[i + 1].end_pos)

    def mutate(self, node, index):
        i = self._pairs(node)[index]
        first, second = node.children[i], node.children[i + 1]
        a, b = first.get_first_leaf(), second.get_first_leaf()
        a.prefix, b.prefix = b.prefix, a.prefix
        node.children[i], node.children[i + 1] = second, first
        return node

    @classmethod
    def examples(cls):
        return (
            Example(
                "def f(x):\n    y = clean(x)\n    z = y + 1\n    return z\n",
                "def f(x):\n    z = y + 1\n    y = clean(x)\n    return z\n",
            ),
        )


class SwapSiblingName(Operator):
    """A name `<a>_<s>` read where `<b>_<s>` also names a value in the same function
    is replaced by it (`train_x` -> `test_x`, `held_out_split` -> `train_split`)."""

    def _siblings(self, node) -> list[tuple]:
        if node.type != "funcdef":
            return []
        defined = sorted(
            {n.value for n in _walk(node) if n.type == "name" and n.is_definition()}
            | {p.name.value for p in node.get_params()}
        )
        out = []
        for leaf in _walk(node.children[-1]):
            if leaf.type != "name" or leaf.is_definition() or "_" not in leaf.value.strip("_"):
                continue
            suffix = leaf.value.split("_", 1)[1]
            other = next(
                (
                    d
                    for d in defined
                    if d != leaf.value and "_" in d and d.split("_", 1)[1] == suffix
                ),
                None,
            )
            if other is not None and not _is_attribute(leaf):
                out.append((leaf, other))
        return out

    def mutation_positions(self, node) -> Iterator[Position]:
        for leaf, _ in self._siblings(node):
            yield _span(leaf)

    def mutate(self, node, index):
        leaf, other = self._siblings(node)[index]
        leaf.value = other
        return node

    @classmethod
    def examples(cls):
        return (
            Example(
                "def f(train_x, test_x):\n    return fit(train_x)\n",
                "def f(train_x, test_x):\n    return fit(test_x)\n",
            ),
        )
