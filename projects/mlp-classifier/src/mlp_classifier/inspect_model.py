"""A readable listing of an NNX model's graph and state, read from NNX itself.

Nothing here is listed by hand: node types come from `nnx.iter_graph`,
variables from `nnx.split`, so the listing follows any change to the model.
"""

from dataclasses import dataclass

import jax
from flax import nnx


@dataclass(frozen=True)
class VariableInfo:
    """One leaf of the model state: `path` like `hidden/0/kernel`, `kind` like `Param`."""

    path: str
    kind: str
    family: str
    shape: tuple[int, ...]
    dtype: str
    size: int


def graph_nodes(model: nnx.Module) -> list[tuple[str, str]]:
    """`(path, type name)` of every graph node (modules, lists, RNG streams), root first."""
    nodes = [
        ("/".join(map(str, path)) or "(root)", type(node).__name__)
        for path, node in nnx.iter_graph(model)
        if isinstance(node, nnx.Pytree)
    ]
    return sorted(nodes, key=lambda item: (item[0] != "(root)", item[0]))


def variables(model: nnx.Module) -> list[VariableInfo]:
    """Every variable of `model`, from `nnx.split`, sorted by path."""
    _, state = nnx.split(model)
    infos = []
    for path, variable in nnx.to_flat_state(state):
        value = variable.get_value()
        infos.append(
            VariableInfo(
                path="/".join(map(str, path)),
                kind=type(variable).__name__,
                family=_family(type(variable)),
                shape=tuple(value.shape),
                dtype=str(value.dtype),
                size=int(value.size),
            )
        )
    return infos


def _family(kind: type) -> str:
    """The direct `nnx.Variable` subclass that `kind` descends from: `RngKey` -> `RngState`."""
    return next(c.__name__ for c in kind.__mro__ if nnx.Variable in c.__bases__)


def param_count(model: nnx.Module) -> int:
    """Number of scalars in the model's `nnx.Param` variables."""
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def render(model: nnx.Module) -> str:
    """The text that `mlp-classifier inspect` prints."""
    lines = ["Graph (nnx.iter_graph): node path and type"]
    lines += [f"  {path:<24} {kind}" for path, kind in graph_nodes(model)]
    infos = variables(model)
    lines += ["", "State (nnx.split): variable path, kind (family), shape, dtype"]
    lines += [
        f"  {v.path:<24} {f'{v.kind} ({v.family})':<22} {str(v.shape):<10} {v.dtype}" for v in infos
    ]
    params = [v for v in infos if v.kind == "Param"]
    lines += [
        "",
        f"Parameters: {param_count(model)} scalars in {len(params)} nnx.Param arrays.",
        f"Other state: {len(infos) - len(params)} arrays "
        f"({', '.join(sorted({v.kind for v in infos if v.kind != 'Param'})) or 'none'}).",
    ]
    return "\n".join(lines)
