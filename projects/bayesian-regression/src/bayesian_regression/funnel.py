"""Neal's funnel, a target that defeats a fixed-step sampler in one form and
not the other.

    v ~ N(0, 3^2),   x_i | v ~ N(0, exp(v / 2)^2),   i = 1..dim-1

Centered: the sampler moves in `(v, x)`, where the curvature in `x` grows like
`exp(-v)`; no single step size fits both the neck and the mouth, so HMC
diverges in the neck and cannot enter it. Non-centered: the sampler moves in
`(v_raw, z) ~ N(0, I)` and `v = 3 v_raw`, `x = exp(v / 2) z`: a standard
normal, easy for any step size that fits it. Neal (2003), "Slice sampling",
section 8; Betancourt & Girolami (2015) on reparameterizing hierarchies.
"""

import jax
import jax.numpy as jnp

LOG_2PI = 1.8378770664093453
V_SCALE = 3.0


def _log_normal(x, scale_log, scale):
    return -0.5 * (LOG_2PI + (x / scale) ** 2) - scale_log


def centered_log_density(theta: jax.Array, data=None) -> jax.Array:
    """`log p(v, x)`, `theta = (v, x_1..x_{dim-1})`."""
    del data
    v, x = theta[0], theta[1:]
    log_v = _log_normal(v, jnp.log(V_SCALE), V_SCALE)
    return log_v + jnp.sum(_log_normal(x, 0.5 * v, jnp.exp(0.5 * v)))


def noncentered_log_density(theta: jax.Array, data=None) -> jax.Array:
    """`log p(v_raw, z)`, all standard normal: `theta = (v_raw, z_1..z_{dim-1})`."""
    del data
    return -0.5 * jnp.sum(theta**2) - 0.5 * theta.shape[0] * LOG_2PI


def noncentered_to_centered(draws: jax.Array) -> jax.Array:
    """`(..., dim)` draws of `(v_raw, z)` -> the same draws as `(v, x)`."""
    v = V_SCALE * draws[..., :1]
    return jnp.concatenate([v, jnp.exp(0.5 * v) * draws[..., 1:]], axis=-1)
