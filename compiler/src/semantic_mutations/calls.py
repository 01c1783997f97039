"""Semantic operators at a call: a keyword left out, `any`/`all`, a parent key reused,
a digest entry dropped, a range bound shifted, an exact comparison made approximate
(:mod:`semantic_mutations.operators` describes each)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from cosmic_ray.operators.operator import Example, Operator
from parso.python.tree import Name

from semantic_mutations._tree import (
    Position,
    _arguments,
    _call_parts,
    _expression,
    _is_comma,
    _is_keyword,
    _prefix,
    _replace,
    _span,
    _without,
)

DIGEST_CALL = re.compile(r"(hash|digest|sign|sha\d*|identity|fingerprint)", re.IGNORECASE)


EXACT = {
    "array_equal": "allclose",
    "array_equiv": "allclose",
    "assert_array_equal": "assert_allclose",
}


class RemoveKeywordArgument(Operator):
    """`f(a, b=x)` -> `f(a)`: the keyword's default takes over."""

    def _keywords(self, node) -> list:
        parts = _call_parts(node)
        return [a for a in _arguments(parts[1]) if _is_keyword(a)] if parts else []

    def mutation_positions(self, node) -> Iterator[Position]:
        for arg in self._keywords(node):
            yield _span(arg)

    def mutate(self, node, index):
        arg = self._keywords(node)[index]
        trailer = node.children[-1]
        inner = trailer.children[1]
        kept = _without(inner, [arg]) if inner.type == "arglist" else ""
        code = "".join(c.get_code() for c in node.children[:-1]).lstrip() + "(" + kept.strip() + ")"
        return _expression(code, _prefix(node))

    @classmethod
    def examples(cls):
        return (
            Example("f(a, b=1)", "f(a)"),
            Example("f(b=1, c=2)", "f(c=2)"),
            Example("f(b=1, c=2)", "f(b=1)", occurrence=1),
            Example("m.f(b=1)", "m.f()"),
        )


class SwapAnyAll(Operator):
    """`any(` <-> `all(`."""

    def _name(self, node):
        parts = _call_parts(node)
        if parts and parts[0] in ("any", "all") and node.children[0].type == "name":
            return node.children[0]
        return None

    def mutation_positions(self, node) -> Iterator[Position]:
        name = self._name(node)
        if name is not None:
            yield _span(name)

    def mutate(self, node, index):
        name = self._name(node)
        name.value = "all" if name.value == "any" else "any"
        return node

    @classmethod
    def examples(cls):
        return (Example("ok = any(xs)", "ok = all(xs)"), Example("ok = all(xs)", "ok = any(xs)"))


class ReuseParentKey(Operator):
    """`fold_in(key, d)` -> `key`; in `a, b = split(key)`, one target gets `key`."""

    def _sites(self, node) -> list[tuple[str, int]]:
        parts = _call_parts(node)
        if not parts or parts[0] not in ("split", "fold_in"):
            return []
        args = _arguments(parts[1])
        if not args or args[0].type != "name":
            return []
        if parts[0] == "fold_in":
            return [("fold_in", 0)]
        statement = node.parent
        if statement.type != "expr_stmt" or statement.children[-1] is not node:
            return []
        targets = statement.children[0]
        if targets.type not in ("testlist_star_expr", "exprlist"):
            return []
        names = [c for c in targets.children if c.type == "name"]
        return [("split", i) for i in range(len(names))]

    def mutation_positions(self, node) -> Iterator[Position]:
        for _ in self._sites(node):
            yield _span(node)

    def mutate(self, node, index):
        kind, target = self._sites(node)[index]
        parent = _arguments(node.children[-1])[0].value
        if kind == "fold_in":
            return _expression(parent, _prefix(node))
        call = node.get_code().strip()
        code = f"tuple({parent} if _i == {target} else _k for _i, _k in enumerate({call}))"
        return _expression(code, _prefix(node))

    @classmethod
    def examples(cls):
        return (
            Example("k = jax.random.fold_in(key, 3)", "k = key"),
            Example(
                "a, b = jax.random.split(key)",
                "a, b = tuple(key if _i == 1 else _k"
                " for _i, _k in enumerate(jax.random.split(key)))",
                occurrence=1,
            ),
        )


class DropDigestEntry(Operator):
    """One entry left out of a display passed to a hash, digest or signature call."""

    def _entries(self, node) -> list[tuple]:
        parts = _call_parts(node)
        if not parts or not DIGEST_CALL.search(parts[0]):
            return []
        out = []
        for arg in _arguments(parts[1]):
            if arg.type != "atom" or arg.children[0].value not in "{[(":
                continue
            inner = arg.children[1] if len(arg.children) == 3 else None
            if inner is None or inner.type not in ("dictorsetmaker", "testlist_comp"):
                continue
            items = [c for c in inner.children if not _is_comma(c)]
            if inner.type == "dictorsetmaker" and any(
                c.value == ":" for c in inner.children if c.type == "operator"
            ):
                # key, ':', value triples: one entry is three children.
                groups, i = [], 0
                children = [c for c in inner.children]
                while i < len(children):
                    if children[i].type == "operator" and children[i].value == ",":
                        i += 1
                        continue
                    groups.append(children[i : i + 3])
                    i += 3
                out += [(inner, g) for g in groups]
            elif len(items) > 1:
                out += [(inner, [item]) for item in items]
        return out

    def mutation_positions(self, node) -> Iterator[Position]:
        for _, group in self._entries(node):
            yield (group[0].start_pos, group[-1].end_pos)

    def mutate(self, node, index):
        inner, group = self._entries(node)[index]
        children = inner.children
        first, last = children.index(group[0]), children.index(group[-1])
        if last + 1 < len(children) and children[last + 1].value == ",":
            last += 1
        elif first > 0 and children[first - 1].value == ",":
            first -= 1
        prefix = _prefix(children[first])
        inner.children = children[:first] + children[last + 1 :]
        if first < len(inner.children):  # The next entry takes the removed one's place.
            inner.children[first].get_first_leaf().prefix = prefix
        return node

    @classmethod
    def examples(cls):
        return (
            Example("d = digest({'a': 1, 'b': 2})", "d = digest({'b': 2})"),
            Example("d = digest({'a': 1, 'b': 2})", "d = digest({'a': 1})", occurrence=1),
            Example("h = sha256_of([x, y])", "h = sha256_of([y])"),
        )


class ShiftRangeBound(Operator):
    """Each bound of `range(...)` (start and stop) moved by +1 and by -1."""

    def _bounds(self, node) -> list:
        parts = _call_parts(node)
        if not parts or parts[0] != "range" or node.children[0].type != "name":
            return []
        return _arguments(parts[1])[:2]

    def mutation_positions(self, node) -> Iterator[Position]:
        for bound in self._bounds(node):
            yield _span(bound)
            yield _span(bound)

    def mutate(self, node, index):
        bound = self._bounds(node)[index // 2]
        sign = "+" if index % 2 == 0 else "-"
        _replace(bound, _expression(f"({bound.get_code().strip()} {sign} 1)", _prefix(bound)))
        return node

    @classmethod
    def examples(cls):
        return (
            Example("for i in range(n): pass", "for i in range((n + 1)): pass"),
            Example("for i in range(n): pass", "for i in range((n - 1)): pass", occurrence=1),
            Example("r = range(1, n)", "r = range(1, (n - 1))", occurrence=3),
        )


class ExactToApproximate(Operator):
    """`array_equal` / `array_equiv` -> `allclose`; `assert_array_equal` -> `assert_allclose`."""

    def mutation_positions(self, node) -> Iterator[Position]:
        if isinstance(node, Name) and node.value in EXACT:
            yield _span(node)

    def mutate(self, node, index):
        node.value = EXACT[node.value]
        return node

    @classmethod
    def examples(cls):
        return (
            Example("ok = np.array_equal(a, b)", "ok = np.allclose(a, b)"),
            Example("np.testing.assert_array_equal(a, b)", "np.testing.assert_allclose(a, b)"),
        )
