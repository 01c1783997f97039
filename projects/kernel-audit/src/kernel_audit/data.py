"""Operands for the kernels, drawn from explicit `jax.random` keys, and the
table of shapes the audit sweeps.

Scales keep every value O(1) whatever the reduction length: `w` has standard
deviation 1/sqrt(K), so `x @ w` stays near unit scale; the layer-norm input
has mean 3 and standard deviation 2, so subtracting the mean matters (a kernel
that skipped it would be far outside the error bound).
"""

import dataclasses
import functools
import zlib

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class MatmulCase:
    """One row of the matmul table: `x` `(m, k)` times `w` `(k, n)`."""

    name: str
    m: int
    k: int
    n: int


@dataclasses.dataclass(frozen=True)
class RowCase:
    """One row of the layer-norm table: `x` `(rows, cols)`."""

    name: str
    rows: int
    cols: int


# Shapes that divide TPU-shaped blocks (rows in 8s or 16s, columns and the reduction
# in 128s), shapes that do not (masked edges), tiny and degenerate shapes (a block
# then spans the whole dimension), and a long reduction. The audit crosses them
# with dtypes and block sizes.
MATMUL_CASES = (
    MatmulCase("divides", 64, 256, 256),
    MatmulCase("ragged", 50, 300, 200),
    MatmulCase("tiny", 1, 1, 1),
    MatmulCase("single_row", 1, 37, 19),
    MatmulCase("single_column", 23, 29, 1),
    MatmulCase("long_reduction", 8, 2048, 16),
)
ROW_CASES = (
    RowCase("divides", 32, 64),
    RowCase("ragged", 37, 70),
    RowCase("tiny", 1, 1),
    RowCase("single_row", 1, 300),
    RowCase("long_row", 5, 2000),
)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def matmul_operands(
    key: jax.Array, m: int, k: int, n: int, dtype: jnp.dtype
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`x` `(m, k)` ~ N(0, 1), `w` `(k, n)` ~ N(0, 1/k), `b` `(n,)` ~ N(0, 1/4), in `dtype`."""
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (m, k), jnp.float32)
    w = jax.random.normal(kw, (k, n), jnp.float32) / jnp.sqrt(jnp.float32(k))
    b = 0.5 * jax.random.normal(kb, (n,), jnp.float32)
    return x.astype(dtype), w.astype(dtype), b.astype(dtype)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def layer_norm_operands(
    key: jax.Array, rows: int, cols: int, dtype: jnp.dtype
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`x` `(rows, cols)` ~ N(3, 4), `gamma` `(cols,)` ~ 1 + N(0, 0.01),
    `beta` `(cols,)` ~ N(0, 0.01), in `dtype`."""
    kx, kg, kb = jax.random.split(key, 3)
    x = 3.0 + 2.0 * jax.random.normal(kx, (rows, cols), jnp.float32)
    gamma = 1.0 + 0.1 * jax.random.normal(kg, (cols,), jnp.float32)
    beta = 0.1 * jax.random.normal(kb, (cols,), jnp.float32)
    return x.astype(dtype), gamma.astype(dtype), beta.astype(dtype)


def case_key(seed: int, *parts: str | int) -> jax.Array:
    """A key for one table cell, derived from the seed and the cell's labels, so a
    cell's operands do not depend on which other cells ran before it."""
    key = jax.random.key(seed)
    for part in parts:
        key = jax.random.fold_in(key, zlib.crc32(str(part).encode()) & 0x7FFFFFFF)
    return key


def regression_batch(
    key: jax.Array, teacher: tuple[jax.Array, jax.Array], batch: int
) -> tuple[jax.Array, jax.Array]:
    """A float32 batch for the training demo: `x` `(batch, d_in)` ~ N(0, 1) and
    targets `tanh(x @ w) + c` from a fixed random teacher `(w, c)`."""
    w, c = teacher
    x = jax.random.normal(key, (batch, w.shape[0]), jnp.float32)
    return x, jnp.tanh(x @ w) + c[None, :]


def make_teacher(key: jax.Array, d_in: int, d_out: int) -> tuple[jax.Array, jax.Array]:
    """The teacher of `regression_batch`: `w` `(d_in, d_out)` ~ N(0, 1/d_in), `c` `(d_out,)`."""
    kw, kc = jax.random.split(key)
    w = jax.random.normal(kw, (d_in, d_out), jnp.float32) / jnp.sqrt(jnp.float32(d_in))
    return w, 0.5 * jax.random.normal(kc, (d_out,), jnp.float32)
