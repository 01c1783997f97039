"""Synthetic observations of the damped oscillator, and their masking.

The noise-free trajectory comes from the EXACT solution (`model.oscillator_exact`),
never from the RK4 solver that the fit uses: a solver error then shows up as
a solver bias in the fit instead of cancelling out.

Shapes: `ts`, `x`, `v`, `weights`: `(N,)` for one data set, `(S, N)` for a
batch of `S` seeds (the coverage study). Missing values (NaN) are allowed in
`x` and `v`; `weights` is 0 where a value is missing or held out.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from scientific_inverse.config import Config
from scientific_inverse.model import oscillator_exact
from scientific_inverse.numerics import in_float64
from scientific_inverse.solver import steps_for


class DataError(ValueError):
    """Observations that cannot be fitted; the message says why."""


class Observations(NamedTuple):
    ts: np.ndarray  # shape=(N,), float64: observation times obs_dt, ..., t_end
    x: np.ndarray  # shape=(..., N), float64: noisy position (NaN = missing)
    v: np.ndarray  # shape=(..., N), float64: noisy velocity (NaN = missing)
    x_true: np.ndarray  # shape=(N,), float64: noise-free position
    v_true: np.ndarray  # shape=(N,), float64: noise-free velocity
    heldout: np.ndarray  # shape=(..., N), bool: held out of the fit


def observation_times(t_end: float, obs_dt: float) -> np.ndarray:
    """`obs_dt, 2 obs_dt, ..., t_end` as float64 `(N,)`."""
    return obs_dt * np.arange(1, steps_for(t_end, obs_dt) + 1, dtype=np.float64)


@functools.partial(jax.jit, static_argnums=(5,))
def _draw(
    theta: jax.Array, y0: jax.Array, ts: jax.Array, keys: jax.Array, noise_std: float, n_held: int
) -> tuple[jax.Array, ...]:
    """Exact trajectory `(N, 2)`, noise `(S, N)` twice, held-out mask `(S, N)`."""
    truth = oscillator_exact(theta, y0, ts)
    n = ts.shape[0]

    def one(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        key_x, key_v, key_split = jax.random.split(key, 3)
        noise_x = noise_std * jax.random.normal(key_x, (n,), dtype=jnp.float64)
        noise_v = noise_std * jax.random.normal(key_v, (n,), dtype=jnp.float64)
        order = jax.random.permutation(key_split, n)
        heldout = jnp.zeros((n,), dtype=bool).at[order[:n_held]].set(True)
        return noise_x, noise_v, heldout

    return (truth, *jax.vmap(one)(keys))


@in_float64
def synthesize(config: Config, key: jax.Array, t_end: float | None = None) -> Observations:
    """One noisy data set on `[obs_dt, t_end]` (default: `config.t_end`)."""
    batch = synthesize_batch(config, key[None], t_end)
    return batch._replace(x=batch.x[0], v=batch.v[0], heldout=batch.heldout[0])


@in_float64
def synthesize_batch(config: Config, keys: jax.Array, t_end: float | None = None) -> Observations:
    """`S` independent data sets, one per key (`keys`: `(S,)`): noise and held-out
    times both descend from each key."""
    ts = observation_times(config.t_end if t_end is None else t_end, config.obs_dt)
    n_held = max(1, round(config.heldout_fraction * ts.shape[0]))
    truth, noise_x, noise_v, heldout = _draw(
        jnp.asarray(config.theta_true),
        jnp.asarray([config.x0, config.v0]),
        jnp.asarray(ts),
        keys,
        config.noise_std,
        n_held,
    )
    truth = np.asarray(truth)
    return Observations(
        ts=ts,
        x=truth[None, :, 0] + np.asarray(noise_x),
        v=truth[None, :, 1] + np.asarray(noise_v),
        x_true=truth[:, 0],
        v_true=truth[:, 1],
        heldout=np.asarray(heldout),
    )


def fit_weights(obs: Observations, use_velocity: bool, min_points: int = 3) -> np.ndarray:
    """0/1 weights of the fitted residuals: 1 where the value is present and not held out.

    Returns `(..., N)` (position only) or `(..., 2N)` (position then velocity).
    Missing values (NaN) are masked explicitly, never propagated; fewer than
    `min_points` usable values is an error naming how many there were.
    """
    keep = ~obs.heldout
    parts = [keep & np.isfinite(obs.x)]
    if use_velocity:
        parts.append(keep & np.isfinite(obs.v))
    weights = np.concatenate(parts, axis=-1).astype(np.float64)
    usable = weights.sum(axis=-1)
    if np.any(usable < min_points):
        raise DataError(
            f"A fit needs at least {min_points} finite, non-held-out observations, but a data "
            f"set has `{int(np.min(usable))}` (the others are NaN or held out)."
        )
    return weights


def fill_missing(values: np.ndarray) -> np.ndarray:
    """NaN replaced by 0: the weight is 0 there, and 0 * NaN would still be NaN."""
    return np.where(np.isfinite(values), values, 0.0)


def pad_missing(obs: Observations, n: int) -> Observations:
    """Extends one data set (`x`: `(N,)`) to `n` times with missing (NaN) values,
    which the fit masks; the added times continue the observation grid."""
    extra = n - obs.ts.shape[0]
    if extra < 0:
        raise DataError(f"Cannot pad {obs.ts.shape[0]} observations down to `{n}`.")
    spacing = obs.ts[0]
    nan = np.full(extra, np.nan)
    return Observations(
        ts=np.concatenate([obs.ts, spacing * np.arange(obs.ts.shape[0] + 1, n + 1)]),
        x=np.concatenate([obs.x, nan]),
        v=np.concatenate([obs.v, nan]),
        x_true=np.concatenate([obs.x_true, nan]),
        v_true=np.concatenate([obs.v_true, nan]),
        heldout=np.concatenate([obs.heldout, np.zeros(extra, dtype=bool)]),
    )


def stack(sets: list[Observations]) -> Observations:
    """Single data sets on the same times stacked into a batch (`x`: `(S, N)`)."""
    return Observations(
        ts=sets[0].ts,
        x=np.stack([o.x for o in sets]),
        v=np.stack([o.v for o in sets]),
        x_true=sets[0].x_true,
        v_true=sets[0].v_true,
        heldout=np.stack([o.heldout for o in sets]),
    )
