"""Semantic mutation operators: specification mistakes no operator-level mutation makes.

Cosmic Ray's core operators change one operator, number or keyword at a time.
The mistakes that survive them are of another kind: a documented choice swapped
for a sibling, a key reused, a collection collapsed, an identity that leaves
out a field, a range off by one, a bitwise claim checked with a tolerance, a
value used before the step that makes it safe, a value taken from the wrong
source. Each operator here makes one such mistake, at every place the code
offers it (parso trees, as Cosmic Ray's own operators):

- `RemoveKeywordArgument`: `f(a, b=x)` -> `f(a)` (the default takes over).
  (A flipped boolean argument is core's `ReplaceTrueWithFalse` / `...FalseWithTrue`.)
- `SwapSiblingString`: a string in a tuple, list, set or dict display replaced
  by the next different string of the same display (`("q", "v")` -> `("v", "v")`).
- `CollapseIterable`: a loop's or comprehension's iterable `E` made `set(E)`,
  `list(E)[:1]` or `list(E)[-1:]`; `SwapAnyAll`: `any(` <-> `all(`.
- `ReuseParentKey`: `fold_in(key, d)` -> `key`; in `k1, k2 = split(key)`, one
  target given the parent key instead of its subkey.
- `DropDigestEntry`: one entry removed from a dict, list or tuple display passed
  to a call whose name speaks of a hash, digest, signature or identity.
- `ShiftRangeBound`: each bound of `range(...)` moved by +1 and by -1.
- `ExactToApproximate`: `array_equal` / `array_equiv` -> `allclose`,
  `assert_array_equal` -> `assert_allclose`.
- `SwapAdjacentStatements`: two adjacent statements swapped where the second
  reads a name the first assigns.
- `SwapSiblingName`: a name `<a>_<s>` read where `<b>_<s>` is also a name of the
  same function (`train_x` -> `test_x`): the right kind of value, the wrong source.
"""

from __future__ import annotations

from semantic_mutations.calls import (
    DropDigestEntry,
    ExactToApproximate,
    RemoveKeywordArgument,
    ReuseParentKey,
    ShiftRangeBound,
    SwapAnyAll,
)
from semantic_mutations.structure import (
    CollapseIterable,
    SwapAdjacentStatements,
    SwapSiblingName,
    SwapSiblingString,
)

OPERATORS = (
    RemoveKeywordArgument,
    SwapSiblingString,
    CollapseIterable,
    SwapAnyAll,
    ReuseParentKey,
    DropDigestEntry,
    ShiftRangeBound,
    ExactToApproximate,
    SwapAdjacentStatements,
    SwapSiblingName,
)
