"""Cosmic Ray operator provider `semantic`: the operators of :mod:`semantic_mutations.operators`.

Registered under the entry point group `cosmic_ray.operator_providers` (the
repository's pyproject), so Cosmic Ray names them `semantic/<Operator>`.
`scripts/mutants.py` uses them for a project only when its `mutation.toml`
asks for them (`semantic_operators = true`): a project's scores are rescored
with them before its reports count them.
"""

from __future__ import annotations

from semantic_mutations.operators import OPERATORS

_BY_NAME = {op.__name__: op for op in OPERATORS}


class OperatorProvider:
    """The `semantic` provider: iteration gives the names, indexing the classes."""

    def __iter__(self):
        return iter(_BY_NAME)

    def __getitem__(self, name: str):
        return _BY_NAME[name]
