"""Synthetic regression data from a key, and the checks every design passes.

`make_dataset` draws a design whose features share one correlation `rho`
(equicorrelated Gaussian rows), true weights, and noisy targets. `validate`
turns a NaN, an infinite value or a shape mismatch into a `DataError` that
names it, before any of it reaches a posterior.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class DataError(ValueError):
    """A design or target that cannot be used; the message says why."""


class Dataset(NamedTuple):
    x: jax.Array  # shape=(n, d), float32: the design
    y: jax.Array  # shape=(n,), float32: the targets
    true_weights: jax.Array  # shape=(d,), float32
    true_noise_scale: float


def correlated_design(key: jax.Array, num_obs: int, num_features: int, rho: float) -> jax.Array:
    """`(num_obs, num_features)` Gaussian rows with unit variances and pairwise
    correlation `rho`: `x = z L^T` with `L` the Cholesky factor of
    `(1 - rho) I + rho 1 1^T`."""
    cov = (1.0 - rho) * jnp.eye(num_features) + rho * jnp.ones((num_features, num_features))
    chol = jnp.linalg.cholesky(cov)
    z = jax.random.normal(key, (num_obs, num_features))
    return z @ chol.T


def make_dataset(
    key: jax.Array, num_obs: int, num_features: int, rho: float, noise_scale: float
) -> Dataset:
    """A synthetic data set: correlated design, weights `~ N(0, 1)`, Gaussian noise."""
    key_x, key_w, key_e = jax.random.split(key, 3)
    x = correlated_design(key_x, num_obs, num_features, rho)
    weights = jax.random.normal(key_w, (num_features,))
    y = x @ weights + noise_scale * jax.random.normal(key_e, (num_obs,))
    return Dataset(x, y, weights, float(noise_scale))


def from_config(config) -> Dataset:
    """The data set a `Config` describes (its `data_seed`)."""
    return make_dataset(
        jax.random.key(config.data_seed),
        config.num_obs,
        config.num_features,
        config.feature_correlation,
        config.noise_scale,
    )


def validate(x, y) -> tuple[jax.Array, jax.Array]:
    """Returns `(x, y)` as float32 arrays after checking shapes and values.

    `x`: shape `(n, d)`; `y`: shape `(n,)`; both finite. Raises `DataError`.
    """
    x_np = np.asarray(x)
    y_np = np.asarray(y)
    if x_np.ndim != 2:
        raise DataError(f"The design must have shape `(n, d)`, but it has shape `{x_np.shape}`.")
    if y_np.ndim != 1:
        raise DataError(f"The targets must have shape `(n,)`, but they have shape `{y_np.shape}`.")
    if x_np.shape[0] != y_np.shape[0]:
        raise DataError(
            f"The design has `{x_np.shape[0]}` rows but there are `{y_np.shape[0]}` targets; "
            f"they must match."
        )
    if x_np.shape[0] < 1 or x_np.shape[1] < 1:
        raise DataError(f"The design is empty (shape `{x_np.shape}`).")
    for name, arr in (("design", x_np), ("targets", y_np)):
        bad = ~np.isfinite(arr)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise DataError(
                f"The {name} hold `{int(bad.sum())}` non-finite values (NaN or inf), the first "
                f"at index `{where}`; remove or impute them first."
            )
    return jnp.asarray(x_np, jnp.float32), jnp.asarray(y_np, jnp.float32)
