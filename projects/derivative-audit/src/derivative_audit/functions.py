"""The suite: the functions whose derivatives stage 1 audits.

Every suite function maps `x`, shape `(n,)`, to a vector, and takes its
weights from a `params` dict built by `data.make_problem`:

- `elementwise`: sin(x) * exp(-x^2 / 4) + tanh(x), diagonal Jacobian;
- `matmul_chain`: W3 tanh(W2 tanh(W1 x)), a dense Jacobian;
- `softmax`: softmax(A x), a Jacobian of rank n - 1 at most;
- `logsumexp`: logsumexp(A x) as a vector of one element (its Jacobian is the gradient);
- `scan_recurrence`: h_t = tanh(W h_{t-1} + c_t), h_0 = x, for T steps in `lax.scan`;
- `fixed_point_solver`: a fixed iteration count of the implicit layer's map
  (`model.solve_unrolled`), x as the layer's input.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

from derivative_audit import model

SuiteFn = Callable[[dict, jax.Array], jax.Array]


def elementwise(params: dict, x: jax.Array) -> jax.Array:
    del params
    return jnp.sin(x) * jnp.exp(-jnp.square(x) / 4) + jnp.tanh(x)


def matmul_chain(params: dict, x: jax.Array) -> jax.Array:
    h = jnp.tanh(params["w1"] @ x)
    h = jnp.tanh(params["w2"] @ h)
    return params["w3"] @ h


def softmax(params: dict, x: jax.Array) -> jax.Array:
    return jax.nn.softmax(params["a"] @ x)


def logsumexp(params: dict, x: jax.Array) -> jax.Array:
    return jax.nn.logsumexp(params["a"] @ x, keepdims=True)


def scan_recurrence(params: dict, x: jax.Array) -> jax.Array:
    def cell(h, c):
        return jnp.tanh(params["w"] @ h + c), None

    h, _ = jax.lax.scan(cell, x, params["c"])
    return h


def fixed_point_solver(params: dict, x: jax.Array, iterations: int = 30) -> jax.Array:
    layer = model.Params(params["w"], params["u"], params["b"])
    return model.solve_unrolled(layer, x, iterations)


SUITE: dict[str, SuiteFn] = {
    "elementwise": elementwise,
    "matmul_chain": matmul_chain,
    "softmax": softmax,
    "logsumexp": logsumexp,
    "scan_recurrence": scan_recurrence,
    "fixed_point_solver": fixed_point_solver,
}


class UnknownFunction(KeyError, ValueError):
    """A suite name that does not exist; the message lists the known ones. A
    `KeyError` (a name looked up) and a `ValueError`, like every bad input here."""

    def __str__(self) -> str:
        return str(self.args[0])


def lookup(name: str) -> SuiteFn:
    """The suite function called `name`; raises `UnknownFunction` naming the choices."""
    if name not in SUITE:
        known = ", ".join(f"`{k}`" for k in SUITE)
        raise UnknownFunction(
            f"Unknown suite function `{name}`; known functions: {known} "
            f"(or give `MODULE:FUNCTION`)."
        )
    return SUITE[name]
