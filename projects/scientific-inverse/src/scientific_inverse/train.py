"""The inverse problem: recover `(c, k)` of `m x'' + c x' + k x = 0` (mass known)
from noisy position observations, and keep its errors apart.

Reads top to bottom in dataflow order:
`residuals` -> `fit_batch` (Levenberg-Marquardt from optimistix, vmapped over
a batch of problems) -> `laplace` (intervals) -> `fit_and_evaluate(config,
workdir)` (the whole study behind `scientific-inverse fit`).

One compiled program serves every fit of a study. A batch row carries, as
data rather than as program structure: its observations and 0/1 weights
(missing, held-out and unmeasured values weigh 0), its RK4 step and steps per
observation interval, whether it predicts with the exact solution instead of
RK4 (the continuous limit of a grid refinement), and which parameters it holds
fixed (a profile-likelihood point). Batches are padded to one row count, so
the refined fit, the coarse fit, the refinement levels, the short window, the
coverage seeds and the profile points all reuse one executable.
"""

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from scipy import stats

from scientific_inverse import identifiability
from scientific_inverse.config import Config, ConfigError, check_output_path
from scientific_inverse.data import (
    Observations,
    fill_missing,
    fit_weights,
    pad_missing,
    stack,
    synthesize,
    synthesize_batch,
)
from scientific_inverse.model import OSCILLATOR, oscillator_exact
from scientific_inverse.numerics import in_float64
from scientific_inverse.solver import integrate_to_observations, steps_for

PARAMS = ("c", "k")
# Levenberg-Marquardt stops when a step moves theta by less than
# atol + rtol |theta|: far below the smallest solver bias measured here (~1e-9).
LM_RTOL, LM_ATOL, LM_MAX_STEPS = 1e-12, 1e-14, 400


class FitError(RuntimeError):
    """A least-squares fit that did not converge; the message names the problem."""


class Design(NamedTuple):
    """What is static in a study's fits (hashable: one compiled program per design)."""

    n_obs: int  # observation times obs_dt, ..., n_obs * obs_dt
    obs_dt: float
    max_stride: int  # most RK4 steps between two observations
    mass: float
    x0: float
    v0: float


def design_for(config: Config) -> Design:
    finest = min(config.solver_dt, config.obs_dt / 2.0**config.refinement_levels)
    return Design(
        steps_for(config.t_end, config.obs_dt),
        config.obs_dt,
        steps_for(config.obs_dt, finest),
        config.mass,
        config.x0,
        config.v0,
    )


class Row(NamedTuple):
    """One least-squares problem (traced fields; a batch stacks them on axis 0)."""

    obs: jax.Array  # shape=(2N,): position then velocity, NaN replaced by 0
    weights: jax.Array  # shape=(2N,): 0/1
    dt: jax.Array  # shape=(): RK4 step
    stride: jax.Array  # shape=(), int: RK4 steps between observations
    exact: jax.Array  # shape=(), bool: predict with the exact solution
    fixed: jax.Array  # shape=(2,), bool: parameters held at `start`
    start: jax.Array  # shape=(2,): initial (c, k), and the value of fixed ones


def predict(design: Design, theta: jax.Array, row: Row) -> jax.Array:
    """`(n_obs, 2)`: position and velocity at the observation times for `theta = (c, k)`."""
    full = jnp.concatenate([jnp.full((1,), design.mass), theta])
    y0 = jnp.array([design.x0, design.v0])
    ts = design.obs_dt * jnp.arange(1, design.n_obs + 1, dtype=jnp.float64)
    rk4 = integrate_to_observations(
        OSCILLATOR, full, y0, row.dt, row.stride, design.n_obs, design.max_stride, 0.0
    )
    return jnp.where(row.exact, oscillator_exact(full, y0, ts), rk4)


def residuals(free: jax.Array, args: tuple[Design, Row]) -> jax.Array:
    """Weighted residuals `w * (prediction - observation)`, position then velocity: `(2N,)`.

    `free` is `(c, k)`; entries that the row holds fixed are replaced by their value.
    """
    design, row = args
    theta = jnp.where(row.fixed, row.start, free)
    pred = predict(design, theta, row)
    return row.weights * (jnp.concatenate([pred[:, 0], pred[:, 1]]) - row.obs)


def rows(
    design: Design,
    obs: Observations,
    dts: np.ndarray | float,
    start: Any,
    *,
    use_velocity: bool = False,
    exact: bool = False,
    fixed: tuple[bool, bool] = (False, False),
) -> Row:
    """A batch of rows for the data sets of `obs` (`x`: `(S, N)`): NumPy arrays.

    `dts` is one RK4 step for all or one per data set; `start` is `(2,)` or `(S, 2)`.
    """
    weights = fit_weights(obs, use_velocity)
    if not use_velocity:
        weights = np.concatenate([weights, np.zeros_like(weights)], axis=-1)
    values = np.concatenate([fill_missing(obs.x), fill_missing(obs.v)], axis=-1)
    count = values.shape[0]
    dts = np.broadcast_to(np.asarray(dts, dtype=np.float64), (count,)).copy()
    strides = np.array([steps_for(design.obs_dt, float(dt)) for dt in dts])
    if strides.max() > design.max_stride:
        raise ValueError(
            f"A step `dt = {dts.min():g}` needs more than the design's "
            f"{design.max_stride} RK4 steps per observation interval."
        )
    return Row(
        values,
        weights,
        dts,
        strides,
        np.full(count, exact),
        np.broadcast_to(np.asarray(fixed), (count, 2)).copy(),
        np.broadcast_to(np.asarray(start, dtype=np.float64), (count, 2)).copy(),
    )


def concat(*batches: Row) -> Row:
    return Row(*(np.concatenate(fields) for fields in zip(*batches, strict=True)))


class FitBatch(NamedTuple):
    theta: np.ndarray  # shape=(S, 2): (c, k) estimates
    rss: np.ndarray  # shape=(S,): residual sum of squares
    n: np.ndarray  # shape=(S,): number of fitted values
    jac: np.ndarray  # shape=(S, 2N, 2): residual Jacobian at the estimate
    steps: np.ndarray  # shape=(S,): LM iterations

    def take(self, start: int, stop: int | None = None) -> "FitBatch":
        stop = start + 1 if stop is None else stop
        return FitBatch(*(field[start:stop] for field in self))


@functools.lru_cache(maxsize=8)
def _fitter(design: Design) -> Callable[..., Any]:
    """The jitted, vmapped Levenberg-Marquardt fit of a design (compiled once per
    row count)."""
    solver = optx.LevenbergMarquardt(rtol=LM_RTOL, atol=LM_ATOL)

    def fit_one(row: Row) -> tuple[jax.Array, ...]:
        sol = optx.least_squares(
            residuals, solver, row.start, (design, row), max_steps=LM_MAX_STEPS, throw=False
        )
        theta = jnp.where(row.fixed, row.start, sol.value)
        r = residuals(theta, (design, row))
        jac = jax.jacfwd(residuals)(theta, (design, row))
        ok = sol.result == optx.RESULTS.successful
        return theta, jnp.sum(r**2), jnp.sum(row.weights), jac, sol.stats["num_steps"], ok

    return jax.jit(jax.vmap(fit_one))


@in_float64
def fit_batch(design: Design, batch: Row, pad_to: int | None = None) -> FitBatch:
    """Fits every row; rows are padded (with copies of row 0, then dropped) to
    `pad_to` so that batches of different sizes share one executable.
    Raises `FitError` if any fit fails."""
    count = batch.dt.shape[0]
    if pad_to is not None and pad_to > count:
        batch = Row(*(np.concatenate([f, np.repeat(f[:1], pad_to - count, axis=0)]) for f in batch))
    out = jax.block_until_ready(_fitter(design)(Row(*(jnp.asarray(f) for f in batch))))
    theta, rss, n, jac, steps, ok = (np.asarray(a)[:count] for a in out)
    ok = ok & np.all(np.isfinite(theta), axis=-1)
    if not np.all(ok):
        bad = int(np.argmin(ok))
        raise FitError(
            f"The least-squares fit of problem {bad} did not converge in {LM_MAX_STEPS} "
            f"steps from `(c, k) = {batch.start[bad].tolist()}` (reached "
            f"`{theta[bad].tolist()}`); try an initial guess closer to the data or a "
            "longer observation window."
        )
    return FitBatch(theta, rss, n, jac, steps)


class Laplace(NamedTuple):
    se: np.ndarray  # shape=(S, 2): standard errors of (c, k)
    cov: np.ndarray  # shape=(S, 2, 2)
    lower: np.ndarray  # shape=(S, 2)
    upper: np.ndarray  # shape=(S, 2)
    sigma: np.ndarray  # shape=(S,): estimated noise standard deviation


def laplace(fits: FitBatch, confidence: float) -> Laplace:
    """Gaussian (Laplace) approximation at the estimate: `cov = s^2 (J^T J)^-1` with
    `s^2 = RSS / (n - 2)`; intervals `theta +- t_{n-2} se` (Student t, because s
    is estimated from the same residuals). [claim:laplace-covariance-and-t-intervals]

    Cases:
      a batch of S fits -> every row uses its own `n` (rows may differ) for both
        `s^2` and the degrees of freedom `n - 2` of its quantile. [claim:laplace-own-n-per-row]
      `confidence` -> two-sided: `q = t.ppf((1 + confidence) / 2, n - 2)`; the
        one-sided `t.ppf(confidence, ...)` gives too short an interval and fails.
        [claim:laplace-two-sided-quantile]
      `sigma` -> `sqrt(s^2)`, the estimated noise standard deviation. [claim:laplace-sigma]
      everything -> equal to a row-by-row `numpy.linalg.inv` and `scipy.stats.t`
        reference to 1e-12. [claim:laplace-equals-row-reference]
    """
    # --- exercise stage 3: Covariance s^2 (J^T J)^-1 and two-sided Student-t intervals. ---
    sigma2 = fits.rss / (fits.n - 2)
    jtj = np.einsum("smi,smj->sij", fits.jac, fits.jac)
    cov = sigma2[:, None, None] * np.linalg.inv(jtj)
    se = np.sqrt(np.diagonal(cov, axis1=1, axis2=2))
    q = stats.t.ppf(0.5 + confidence / 2, fits.n - 2)[:, None]
    return Laplace(se, cov, fits.theta - q * se, fits.theta + q * se, np.sqrt(sigma2))
    # --- end exercise ---


_predict = jax.jit(predict, static_argnums=0)


def batch_rows(config: Config) -> int:
    """Rows of every batch of a study: the larger of its two batches (the fits,
    the profile points); the smaller is padded so both share one executable."""
    return max(4 + config.refinement_levels + config.coverage_seeds, 4 * config.profile_points)


def _summary(fit: FitBatch, lap: Laplace, i: int = 0) -> dict[str, Any]:
    return {
        "theta": fit.theta[i].tolist(),
        "se": lap.se[i].tolist(),
        "lower": lap.lower[i].tolist(),
        "upper": lap.upper[i].tolist(),
        "correlation": float(lap.cov[i, 0, 1] / (lap.se[i, 0] * lap.se[i, 1])),
        "sigma_hat": float(lap.sigma[i]),
        "rss": float(fit.rss[i]),
        "n": int(fit.n[i]),
        "lm_steps": int(fit.steps[i]),
    }


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))


def slope(steps: np.ndarray, errors: np.ndarray) -> float:
    """Least-squares slope of log(error) against log(step): the observed order."""
    return float(np.polyfit(np.log(steps), np.log(errors), 1)[0])


@in_float64
def fit_and_evaluate(
    config: Config, workdir: str | Path | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The whole study of `scientific-inverse fit`; writes the report to `workdir` if given.

    Returns a JSON-able dict: parameter error, prediction error, solver bias,
    grid convergence, identifiability (Fisher, profiles, short window),
    coverage, and the run time. Two batched calls of one compiled fit.
    """
    say = progress or (lambda message: None)
    if not isinstance(config, Config):
        raise ConfigError(
            f"`config` must be a `Config` (e.g. `load_config(path)`), not a "
            f"`{type(config).__name__}`."
        )
    if workdir is not None:
        check_output_path(workdir, directory=True, what="Report folder")
    started = time.perf_counter()
    key_main, key_short, key_cov = jax.random.split(jax.random.key(config.seed), 3)
    truth = np.array([config.damping, config.stiffness])
    start = config.initial_guess
    design = design_for(config)
    n_rows = batch_rows(config)
    out: dict[str, Any] = {"truth": {"m": config.mass, "c": config.damping, "k": config.stiffness}}

    # FIRST BATCH: refined, coarse, refinement levels and exact model (same data),
    # the short window, and the coverage seeds.
    say(
        f"fitting {n_rows} problems (refined, coarse, {config.refinement_levels} grid levels, "
        f"exact model, short window, {config.coverage_seeds} coverage seeds)"
    )
    obs = synthesize(config, key_main)
    # The short window's data are padded with missing values (NaN) to the long
    # window's times; the fit masks them.
    short_obs = pad_missing(synthesize(config, key_short, t_end=config.short_window), design.n_obs)
    grid = config.obs_dt / 2.0 ** np.arange(1, config.refinement_levels + 1)
    same_data = stack([obs] * (2 + len(grid)))
    cov_obs = synthesize_batch(config, jax.random.split(key_cov, config.coverage_seeds))
    batch = concat(
        rows(design, same_data, np.array([config.solver_dt, config.coarse_dt, *grid]), start),
        rows(design, stack([obs]), config.solver_dt, start, exact=True),
        rows(design, stack([short_obs]), config.solver_dt, start),
        rows(design, cov_obs, config.solver_dt, start),
    )
    fits = fit_batch(design, batch, pad_to=n_rows)
    laps = laplace(fits, config.confidence)
    i_exact, i_short, i_cov = 2 + len(grid), 3 + len(grid), 4 + len(grid)
    out["fit"] = {
        "refined": {"dt": config.solver_dt, **_summary(fits, laps, 0)},
        "coarse": {"dt": config.coarse_dt, **_summary(fits, laps, 1)},
        "exact_model": _summary(fits, laps, i_exact),
    }

    # PARAMETER ERROR, PREDICTION ERROR, SOLVER BIAS: three different numbers.
    error = fits.theta[0] - truth
    out["parameter_error"] = {
        "error": error.tolist(),
        "in_se": (error / laps.se[0]).tolist(),
        "relative": (error / truth).tolist(),
    }
    held = obs.heldout
    predictions = {
        name: np.asarray(
            _predict(design, jnp.asarray(fits.theta[i]), Row(*(jnp.asarray(f[i]) for f in batch)))
        )[:, 0]
        for i, name in ((0, "refined"), (1, "coarse"), (i_short, "short"))
    }
    out["prediction_error"] = {
        name: {
            "heldout_rmse_vs_observed": _rmse(pred[held], obs.x[held]),
            "heldout_rmse_vs_truth": _rmse(pred[held], obs.x_true[held]),
            "n_heldout": int(held.sum()),
        }
        for name, pred in predictions.items()
        if name != "short"
    }
    # The short-window fit predicting the long window it never saw (extrapolation):
    # the times its data were padded to, not `ts > short_window`, whose float
    # comparison counts the last seen time (0.1 * 12 > 1.2) as unseen.
    beyond = np.isnan(short_obs.x)
    out["prediction_error"]["short_window_extrapolation_rmse_vs_truth"] = _rmse(
        predictions["short"][beyond], obs.x_true[beyond]
    )
    out["prediction_error"]["noise_std"] = config.noise_std
    bias = fits.theta[1] - fits.theta[0]
    out["solver_bias"] = {
        "coarse_minus_refined": bias.tolist(),
        "in_se": (bias / laps.se[0]).tolist(),
    }

    # CONVERGENCE under grid refinement, against the exact-model fit on the same data.
    gaps = np.abs(fits.theta[2 : 2 + len(grid)] - fits.theta[i_exact][None, :])
    out["convergence"] = {
        "dt": grid.tolist(),
        "estimates": fits.theta[2 : 2 + len(grid)].tolist(),
        "exact_model": fits.theta[i_exact].tolist(),
        "abs_gap": gaps.tolist(),
        "observed_order": [slope(grid, gaps[:, j]) for j in range(2)],
    }
    out["short_window"] = {"t_end": config.short_window, **_summary(fits, laps, i_short)}

    # COVERAGE of the Laplace intervals over many seeds.
    cover = coverage_summary(
        fits.take(i_cov, i_cov + config.coverage_seeds),
        laplace(fits.take(i_cov, i_cov + config.coverage_seeds), config.confidence),
        truth,
        config.confidence,
    )
    out["coverage"] = cover

    # SECOND BATCH: profile likelihoods of c and k, long and short window.
    say(f"profile likelihoods ({4 * config.profile_points} constrained fits)")
    out["profiles"] = {}
    profile_rows, grids = [], []
    for i, data in ((0, obs), (i_short, short_obs)):
        for index in range(2):
            values = identifiability.profile_grid(
                fits.theta[i], laps.se[i], index, config.profile_points
            )
            starts = np.repeat(fits.theta[i][None, :], values.shape[0], axis=0)
            starts[:, index] = values
            fixed = (index == 0, index == 1)
            profile_rows.append(
                rows(design, stack([data] * values.shape[0]), config.solver_dt, starts, fixed=fixed)
            )
            grids.append(values)
    prof_fits = fit_batch(design, concat(*profile_rows), pad_to=n_rows)
    g = config.profile_points
    for j, (label, i) in enumerate(
        (("long", 0), ("long", 0), ("short", i_short), ("short", i_short))
    ):
        index = j % 2
        prof = identifiability.profile_from_rss(
            grids[j],
            prof_fits.rss[j * g : (j + 1) * g],
            float(fits.rss[i]),
            float(fits.n[i]),
            config.confidence,
        )
        out["profiles"].setdefault(label, {})[PARAMS[index]] = {
            **prof,
            "laplace": [float(laps.lower[i, index]), float(laps.upper[i, index])],
        }
    out["fisher"] = identifiability.designs_report(config)
    out["seconds"] = time.perf_counter() - started
    if workdir is not None:
        from scientific_inverse import checkpoint, report

        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(config.to_json(), encoding="utf-8")
        checkpoint.save(workdir / "result.json", out)
        say("writing the report")
        sensitivities = None
        if config.check_sensitivities:
            from scientific_inverse import sensitivity

            say("sensitivity study (autodiff, finite differences, diffrax adjoints)")
            sensitivities = sensitivity.study()
        report.write(workdir, config, out, obs, short_obs, predictions, sensitivities)
        checkpoint.save(workdir / "result.json", out)
    return out


def coverage_summary(
    fits: FitBatch, lap: Laplace, truth: np.ndarray, confidence: float
) -> dict[str, Any]:
    """Fraction of seeds whose Laplace interval holds the true value, per parameter."""
    covered = (lap.lower <= truth[None, :]) & (truth[None, :] <= lap.upper)
    n = fits.theta.shape[0]
    z = (fits.theta - truth[None, :]) / lap.se
    return {
        "nominal": confidence,
        "seeds": n,
        "rate": covered.mean(axis=0).tolist(),
        "covered": covered.sum(axis=0).tolist(),
        # Binomial standard error of a coverage rate at the nominal level.
        "binomial_se": float(np.sqrt(confidence * (1 - confidence) / n)),
        "z_mean": z.mean(axis=0).tolist(),
        "z_std": z.std(axis=0).tolist(),
        "mean_se": lap.se.mean(axis=0).tolist(),
        "estimate_std": fits.theta.std(axis=0).tolist(),
    }
