"""A small network built from the two kernels: the place a user meets them.

`forward` is dense (fused matmul + bias + gelu) -> layer norm -> dense
(matmul + bias). With `use_kernels=True` every layer is a Pallas kernel
(differentiable through their `custom_vjp`); with `use_kernels=False` the same
layers are the plain `jax.numpy` references, so the two paths can be trained
side by side and compared.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from kernel_audit import kernels, reference


class Params(NamedTuple):
    """Parameters of the network, float32."""

    w1: jax.Array  # shape=(d_in, hidden)
    b1: jax.Array  # shape=(hidden,)
    gamma: jax.Array  # shape=(hidden,)
    beta: jax.Array  # shape=(hidden,)
    w2: jax.Array  # shape=(hidden, d_out)
    b2: jax.Array  # shape=(d_out,)


def init(key: jax.Array, d_in: int, hidden: int, d_out: int) -> Params:
    """Fan-in scaled normal weights, zero biases, unit layer-norm scale."""
    k1, k2 = jax.random.split(key)
    return Params(
        w1=jax.random.normal(k1, (d_in, hidden), jnp.float32) / jnp.sqrt(jnp.float32(d_in)),
        b1=jnp.zeros((hidden,), jnp.float32),
        gamma=jnp.ones((hidden,), jnp.float32),
        beta=jnp.zeros((hidden,), jnp.float32),
        w2=jax.random.normal(k2, (hidden, d_out), jnp.float32) / jnp.sqrt(jnp.float32(hidden)),
        b2=jnp.zeros((d_out,), jnp.float32),
    )


def forward(
    params: Params, x: jax.Array, *, use_kernels: bool, interpret: bool | None = None
) -> jax.Array:
    """`x` `(batch, d_in)` -> `(batch, d_out)`."""
    if use_kernels:
        h = kernels.matmul_bias_act(x, params.w1, params.b1, activation="gelu", interpret=interpret)
        h = kernels.layer_norm(h, params.gamma, params.beta, interpret=interpret)
        return kernels.matmul_bias_act(h, params.w2, params.b2, interpret=interpret)
    h = reference.matmul_bias_act_jnp(x, params.w1, params.b1, "gelu")
    h = reference.layer_norm_jnp(h, params.gamma, params.beta)
    return reference.matmul_bias_act_jnp(h, params.w2, params.b2, "none")
