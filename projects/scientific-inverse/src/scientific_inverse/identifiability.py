"""Identifiability: profile likelihoods and the Fisher information of measurement
designs.

- A profile likelihood fixes one parameter on a grid and re-fits the other;
  with the noise variance profiled out its deviance is
  `n log(RSS(value) / RSS_min)`, and the interval is where the deviance stays
  under the chi-square(1) quantile. It does not assume the quadratic shape
  that the Laplace interval assumes, so the two disagree exactly where the
  problem is nonlinear or weakly identified.
- The expected Fisher information `J^T J / sigma^2` (J: derivatives of the
  noise-free observations, from the exact solution, with respect to the LOG
  parameters, so that it is unit-free) says, before any data are taken, how
  well a design pins the parameters: its smallest eigenvalue is the worst
  direction, its condition number how elongated the confidence region is, and a
  zero eigenvalue a combination of parameters that no data of that design can
  see.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from scientific_inverse.config import Config
from scientific_inverse.data import observation_times
from scientific_inverse.model import (
    OSCILLATOR,
    ParameterError,
    check_parameters,
    oscillator_exact,
    real_array,
)
from scientific_inverse.numerics import in_float64


def profile_grid(
    theta: np.ndarray, se: np.ndarray, index: int, points: int, span: float = 4.0
) -> np.ndarray:
    """`points` values of parameter `index` over `theta +- span * se` (Laplace se)."""
    return np.linspace(theta[index] - span * se[index], theta[index] + span * se[index], points)


def profile_from_rss(
    values: np.ndarray, rss: np.ndarray, rss_min: float, n: float, confidence: float
) -> dict[str, Any]:
    """Deviance curve and interval ends (`-inf`/`inf` where the curve never crosses)."""
    deviance = n * np.log(rss / min(rss.min(), rss_min))
    threshold = float(stats.chi2.ppf(confidence, 1))
    lower, upper = crossings(values, deviance, threshold)
    return {
        "values": values.tolist(),
        "deviance": deviance.tolist(),
        "threshold": threshold,
        "lower": lower,
        "upper": upper,
    }


def crossings(values: np.ndarray, dev: np.ndarray, level: float) -> tuple[float, float]:
    """Where `dev` crosses `level` left and right of its minimum (linear interpolation)."""
    best = int(np.argmin(dev))

    def cross(indices: range) -> float:
        prev = best
        for i in indices:
            if dev[i] >= level:
                frac = (level - dev[prev]) / (dev[i] - dev[prev])
                return float(values[prev] + frac * (values[i] - values[prev]))
            prev = i
        return float("inf") if indices.step > 0 else float("-inf")

    return cross(range(best - 1, -1, -1)), cross(range(best + 1, len(values)))


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _log_jacobian(
    theta: jax.Array,
    y0: jax.Array,
    ts: jax.Array,
    index: tuple[int, ...],
    use_velocity: bool,
    load: float,
) -> jax.Array:
    """d(observations)/d(log theta[index]): `(N or 2N, len(index))`."""
    where = jnp.asarray(index)

    def observed(log_free: jax.Array) -> jax.Array:
        full = theta.at[where].set(jnp.exp(log_free))
        ys = oscillator_exact(full, y0, ts, load)
        return jnp.concatenate([ys[:, 0], ys[:, 1]]) if use_velocity else ys[:, 0]

    return jax.jacfwd(observed)(jnp.log(theta[where]))


@in_float64
def fisher(
    theta: np.ndarray,
    ts: np.ndarray,
    y0: np.ndarray,
    noise_std: float,
    *,
    free: tuple[str, ...],
    use_velocity: bool = False,
    load: float = 0.0,
) -> np.ndarray:
    """Expected Fisher information `(F, F)` of the `free` parameters (names among m, c,
    k) in log units, for observations at `ts` (`(N,)`) with Gaussian noise.

    Raises `ParameterError` naming the input that cannot be used: `theta` `(3,)`
    physical and finite, `y0` `(2,)`, `ts` a non-empty finite `(N,)`, `noise_std`
    positive, `free` a non-empty subset of `("m", "c", "k")`."""
    theta, ts, y0 = real_array("theta", theta), real_array("ts", ts), real_array("y0", y0)
    names = OSCILLATOR.param_names
    if not free or len(set(free)) != len(free) or not set(free) <= set(names):
        raise ParameterError(f"`free` must name distinct parameters among {names}, not {free}.")
    if theta.shape != (3,) or y0.shape != (2,):
        raise ParameterError(
            f"`theta` must have shape (3,) and `y0` shape (2,), but they have shapes "
            f"`{theta.shape}` and `{y0.shape}`."
        )
    check_parameters(OSCILLATOR, theta[None], y0[None])
    if ts.ndim != 1 or ts.shape[0] == 0 or not np.all(np.isfinite(ts)):
        raise ParameterError(
            f"`ts` must be a non-empty, finite `(N,)` array, but has shape `{ts.shape}`."
        )
    if not (np.isfinite(noise_std) and noise_std > 0):
        raise ParameterError(f"`noise_std` must be positive and finite, but is `{noise_std}`.")
    index = tuple(OSCILLATOR.param_names.index(name) for name in free)
    jac = np.asarray(
        _log_jacobian(
            jnp.asarray(theta), jnp.asarray(y0), jnp.asarray(ts), index, use_velocity, load
        )
    )
    return jac.T @ jac / noise_std**2


def condition_number(info: np.ndarray) -> float:
    """Largest over smallest eigenvalue; `inf` when the smallest is zero to round-off."""
    eig = np.linalg.eigvalsh(info)
    return float(eig[-1] / eig[0]) if eig[0] > eig[-1] * 1e-12 else float("inf")


def designs_report(config: Config) -> dict[str, Any]:
    """Expected Fisher information of the measurement designs the report compares."""
    theta = np.asarray(config.theta_true)
    y0 = np.array([config.x0, config.v0])
    long_ts = observation_times(config.t_end, config.obs_dt)
    short_ts = observation_times(config.short_window, config.obs_dt)
    cases: dict[str, dict[str, Any]] = {
        "long window, position": dict(ts=long_ts, free=("c", "k")),
        "short window, position": dict(ts=short_ts, free=("c", "k")),
        "short window, position + velocity": dict(ts=short_ts, free=("c", "k"), use_velocity=True),
        "long window, m c k all free": dict(ts=long_ts, free=("m", "c", "k")),
        "long window, m c k, known step load F0 = 1": dict(
            ts=long_ts, free=("m", "c", "k"), load=1.0
        ),
    }
    report: dict[str, Any] = {}
    for name, case in cases.items():
        info = fisher(theta, case.pop("ts"), y0, config.noise_std, **case)
        eig, vec = np.linalg.eigh(info)
        cov = np.linalg.pinv(info)
        report[name] = {
            "free": list(case["free"]),
            "condition_number": condition_number(info),
            "eigenvalues": eig.tolist(),
            "weakest_direction": vec[:, 0].tolist(),
            "relative_se": np.sqrt(np.clip(np.diagonal(cov), 0, None)).tolist(),
        }
    return report
