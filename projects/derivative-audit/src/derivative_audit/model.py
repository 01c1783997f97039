"""The implicit layer: a fixed point z* = tanh(W z* + U x + b), the model whose
derivatives stage 2 and the bench take two ways.

`step` is one fixed-point iteration; `solve_unrolled` runs a fixed number of
them in `lax.scan` (reverse mode then differentiates through every iteration
and stores each one); `rules.fixed_point_implicit` solves the same equation
with a `custom_vjp` whose backward pass uses the implicit function theorem.

`init` scales `W` so that its spectral norm is `contraction` < 1; since
|tanh'| <= 1, the map z -> step(z) is then a contraction and the fixed point
exists, is unique, and iteration converges geometrically at that rate.
"""

import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Params(NamedTuple):
    """Parameters of the implicit layer (one dtype for all)."""

    w: jax.Array  # shape=(n, n), spectral norm = contraction
    u: jax.Array  # shape=(n, d_in)
    b: jax.Array  # shape=(n,)


def init(key: jax.Array, n: int, d_in: int, contraction: float, dtype=jnp.float64) -> Params:
    """Random weights; `W` rescaled to spectral norm `contraction`."""
    for name, size in (("n", n), ("d_in", d_in)):
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"`{name}` must be a positive integer, but got `{size!r}`.")
    if not 0.0 < contraction < 1.0:
        raise ValueError(f"`contraction` must lie in (0, 1), but got `{contraction}`.")
    kw, ku, kb = jax.random.split(key, 3)
    w = jax.random.normal(kw, (n, n), jnp.float64)
    w = w * (contraction / jnp.linalg.norm(w, ord=2))
    u = jax.random.normal(ku, (n, d_in), jnp.float64) / jnp.sqrt(jnp.float64(d_in))
    b = 0.1 * jax.random.normal(kb, (n,), jnp.float64)
    return Params(w.astype(dtype), u.astype(dtype), b.astype(dtype))


def cast(params: Params, dtype) -> Params:
    """The same parameters in another floating dtype."""
    return Params(*(p.astype(dtype) for p in params))


def step(params: Params, z: jax.Array, x: jax.Array) -> jax.Array:
    """One iteration. `z`: `(..., n)`, `x`: `(..., d_in)`; returns `(..., n)`."""
    pre = z @ params.w.T + x @ params.u.T
    return jnp.tanh(pre + jnp.broadcast_to(params.b, pre.shape))


def solve_unrolled(params: Params, x: jax.Array, iterations: int) -> jax.Array:
    """`iterations` fixed-point iterations from z = 0, in `lax.scan`.

    Differentiable in every mode; reverse mode keeps all `iterations` states.
    """

    def body(z, _):
        return step(params, z, x), None

    z0 = jnp.zeros(x.shape[:-1] + params.b.shape, params.b.dtype)
    z, _ = jax.lax.scan(body, z0, None, length=iterations)
    return z
