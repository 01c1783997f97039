"""Block sizes and operand checks, run before any kernel is traced.

Every public kernel function calls `check_matmul` or `check_layer_norm` first:
they raise `KernelInputError` (a full sentence naming the value) for operands
or blocks a kernel cannot run with, including blocks the TPU would refuse
(`targets`). Concrete operands must also be finite; traced ones, inside `jit`
or `grad`, have no values to check, and NaN propagates there as in `jnp.dot`.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from kernel_audit import targets

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ACTIVATIONS = ("none", "relu", "gelu")


class KernelInputError(ValueError):
    """Operands or block sizes a kernel cannot run with; the message says why."""


@dataclasses.dataclass(frozen=True)
class MatmulBlocks:
    """Tile sizes of `matmul_bias_act`: output tile `(block_m, block_n)`, reduction
    step `block_k`. On a TPU `block_m` is a multiple of the sublane tiling (8 for
    float32, 16 for bfloat16) and `block_n`, `block_k` multiples of 128, unless a
    block spans its whole dimension."""

    block_m: int = 256
    block_n: int = 256
    block_k: int = 512


@dataclasses.dataclass(frozen=True)
class RowBlocks:
    """Tiling of `layer_norm`: `block_rows` rows per program, each row whole (a
    block is `(block_rows, C)`, so its last dimension always equals the array's)."""

    block_rows: int = 8


def _fit(dim: int, target: int) -> int:
    """The whole dimension when it fits in `target`, else `target`."""
    return dim if dim <= target else target


def fit_matmul_blocks(m: int, k: int, n: int, target: MatmulBlocks | None = None) -> MatmulBlocks:
    """`target`'s blocks (default `MatmulBlocks()`), each replaced by the whole
    dimension where that is smaller: what `matmul_bias_act` uses when `blocks=None`.
    A whole dimension always satisfies the TPU block rules."""
    target = target or MatmulBlocks()
    return MatmulBlocks(
        block_m=_fit(m, target.block_m),
        block_n=_fit(n, target.block_n),
        block_k=_fit(k, target.block_k),
    )


def fit_row_blocks(rows: int, dtype: str = "float32", target: int | None = None) -> RowBlocks:
    """`target` rows per program (default one native tile: 8 float32 rows, 16
    bfloat16), or all of them for a shorter input: the `blocks=None` default."""
    if target is None:
        target = targets.sublane_multiple(jnp.dtype(DTYPES.get(dtype, jnp.float32)).itemsize)
    return RowBlocks(block_rows=_fit(rows, target))


def dtype_name(array: jax.Array) -> str:
    return jnp.dtype(array.dtype).name


def _check_dtypes(**arrays: jax.Array) -> None:
    for name, a in arrays.items():
        if not hasattr(a, "dtype") or not hasattr(a, "ndim"):
            raise KernelInputError(
                f"`{name}` must be an array (`jax.Array` or NumPy), not a `{type(a).__name__}`."
            )
    names = {name: dtype_name(a) for name, a in arrays.items()}
    for name, dtype in names.items():
        if dtype not in DTYPES:
            raise KernelInputError(
                f"`{name}` has dtype `{dtype}`, which the kernels do not support; "
                f"use one of {', '.join(f'`{d}`' for d in DTYPES)}."
            )
    if len(set(names.values())) > 1:
        listed = ", ".join(f"`{n}`: `{d}`" for n, d in names.items())
        raise KernelInputError(f"All operands must share one dtype, but got {listed}.")


def _check_finite(**arrays: jax.Array) -> None:
    """Refuses NaN or infinite entries in concrete operands (abstract ones, a tracer or
    a `jax.ShapeDtypeStruct`, have no values to check)."""
    for name, a in arrays.items():
        concrete = isinstance(a, np.ndarray | jax.Array) and not isinstance(a, jax.core.Tracer)
        if not concrete or a.size == 0:
            continue
        host = np.asarray(a)  # On the host: no program compiled per operand shape.
        finite = np.isfinite(host)
        if not finite.all():
            index = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise KernelInputError(
                f"`{name}` has a non-finite entry at {index} (`{float(host[index])}`); the "
                f"kernels take finite operands."
            )


def _refuse(violation: str | None) -> None:
    if violation is not None:
        raise KernelInputError(violation)


def check_matmul(
    x: jax.Array,
    w: jax.Array,
    b: jax.Array,
    blocks: MatmulBlocks,
    activation: str,
    precision: str = "highest",
) -> None:
    """Raises `KernelInputError` unless `act(x @ w + b)` can run with `blocks`:
    `x` `(M, K)`, `w` `(K, N)`, `b` `(N,)`, one supported dtype, a known activation
    and precision, blocks that obey the TPU block rules (`block_m` on sublanes,
    `block_n` and `block_k` on lanes) and fit the VMEM budget, finite operands."""
    if activation not in ACTIVATIONS:
        raise KernelInputError(
            f"Unknown activation `{activation}`; use one of "
            f"{', '.join(f'`{a}`' for a in ACTIVATIONS)}."
        )
    if precision not in targets.PRECISIONS:
        raise KernelInputError(
            f"Unknown precision `{precision}`; use one of "
            f"{', '.join(f'`{p}`' for p in targets.PRECISIONS)}."
        )
    _check_dtypes(x=x, w=w, b=b)
    if x.ndim != 2 or w.ndim != 2 or b.ndim != 1:
        raise KernelInputError(
            f"Expected `x` (M, K), `w` (K, N) and `b` (N,), but got shapes "
            f"`{tuple(x.shape)}`, `{tuple(w.shape)}` and `{tuple(b.shape)}`."
        )
    (m, k), (k2, n) = x.shape, w.shape
    if k != k2:
        raise KernelInputError(
            f"`x` has {k} columns but `w` has {k2} rows (shapes `{tuple(x.shape)}` and "
            f"`{tuple(w.shape)}`); they must be equal."
        )
    if b.shape[0] != n:
        raise KernelInputError(
            f"`b` has {b.shape[0]} entries but `w` has {n} columns; they must be equal."
        )
    if min(m, k, n) < 1:
        raise KernelInputError(
            f"Every dimension must be at least 1, but (M, K, N) = `{(m, k, n)}`."
        )
    itemsize = jnp.dtype(x.dtype).itemsize
    sub = targets.sublane_multiple(itemsize)
    _refuse(targets.block_rule_violation("block_m", blocks.block_m, "M", m, sub, "sublane"))
    _refuse(targets.block_rule_violation("block_n", blocks.block_n, "N", n, targets.LANES, "lane"))
    _refuse(targets.block_rule_violation("block_k", blocks.block_k, "K", k, targets.LANES, "lane"))
    split = dtype_name(x) == "float32" and precision == "highest"
    needed = targets.matmul_vmem_bytes(
        blocks.block_m, blocks.block_n, blocks.block_k, itemsize, split_float32=split
    )
    tiles = (blocks.block_m, blocks.block_n, blocks.block_k)
    _refuse(
        targets.vmem_violation(
            f"Blocks (block_m, block_n, block_k) = `{tiles}` of `{dtype_name(x)}`", needed
        )
    )
    _check_finite(x=x, w=w, b=b)


def check_layer_norm(x: jax.Array, gamma: jax.Array, beta: jax.Array, blocks: RowBlocks) -> None:
    """Raises `KernelInputError` unless the layer norm can run: `x` `(R, C)`,
    `gamma` and `beta` `(C,)`, one supported dtype, `block_rows` on the sublane
    rule, whole-row blocks within the VMEM budget, finite operands."""
    _check_dtypes(x=x, gamma=gamma, beta=beta)
    if x.ndim != 2 or gamma.shape != (x.shape[-1],) or beta.shape != (x.shape[-1],):
        raise KernelInputError(
            f"Expected `x` (R, C) with `gamma` and `beta` of shape (C,), but got "
            f"`{tuple(x.shape)}`, `{tuple(gamma.shape)}` and `{tuple(beta.shape)}`."
        )
    rows, cols = x.shape
    if min(rows, cols) < 1:
        raise KernelInputError(
            f"Every dimension must be at least 1, but (R, C) = `{(rows, cols)}`."
        )
    itemsize = jnp.dtype(x.dtype).itemsize
    sub = targets.sublane_multiple(itemsize)
    rows_rule = targets.block_rule_violation(
        "block_rows", blocks.block_rows, "R", rows, sub, "sublane"
    )
    _refuse(rows_rule)
    needed = targets.layer_norm_vmem_bytes(blocks.block_rows, cols, itemsize)
    _refuse(
        targets.vmem_violation(
            f"`{blocks.block_rows}` whole rows of C = {cols} `{dtype_name(x)}` values", needed
        )
    )
    _check_finite(x=x, gamma=gamma, beta=beta)
