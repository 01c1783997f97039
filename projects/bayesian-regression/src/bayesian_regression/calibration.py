"""Simulation-based calibration (Talts, Betancourt, Simpson, Vehtari and
Gelman, 2018): if a sampler draws from the right posterior, the rank of the
true parameter among `L` posterior draws, over data sets simulated from the
prior, is uniform on `{0, ..., L}`.

`simulate` draws `(theta*, y)` from the prior predictive on a fixed design;
`hmc_ranks` runs one hand-built HMC chain per simulated data set (all data
sets side by side with `jax.vmap`) and thins it to `L` draws; `exact_ranks`
does the same with exact posterior draws (the control, optionally under a
deliberately wrong prior to show the test can fail); `uniformity_test` is a
chi-square test of the rank histogram.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from bayesian_regression import hmc, model
from bayesian_regression.data import DataError, check_array, check_count
from bayesian_regression.model import Prior


class UniformityTest(NamedTuple):
    statistic: float  # Pearson chi-square of the rank histogram
    dof: int  # number of bins - 1
    p_value: float
    counts: list[int]  # simulations per rank bin


def simulate(key: jax.Array, x: jax.Array, prior: Prior) -> tuple[jax.Array, jax.Array]:
    """One draw from the prior predictive: `theta* = (w*, log sigma*^2)` of shape
    `(d + 1,)` and `y` of shape `(n,)`."""
    key_s, key_w, key_y = jax.random.split(key, 3)
    sigma2 = prior.rate / jax.random.gamma(key_s, prior.shape)
    w = prior.mean + jnp.sqrt(sigma2) * prior.scale * jax.random.normal(key_w, prior.mean.shape)
    y = x @ w + jnp.sqrt(sigma2) * jax.random.normal(key_y, (x.shape[0],))
    return jnp.concatenate([w, jnp.log(sigma2)[None]]), y


def ranks_of(truth: jax.Array, draws: jax.Array) -> jax.Array:
    """Rank of each coordinate of `truth` (shape `(k,)`) among `draws` `(L, k)`:
    how many draws fall below it, an integer in `[0, L]`."""
    return jnp.sum(draws < truth[None, :], axis=0)


def _check_design(x, prior) -> jax.Array:
    x = jnp.asarray(check_array(x, "x", ndim=2, floating=True))
    model.check_prior(prior, x.shape[1])
    return x


def hmc_ranks(
    key: jax.Array,
    x: jax.Array,
    prior: Prior,
    num_sims: int,
    num_warmup: int,
    num_ranks: int,
    thin: int,
) -> jax.Array:
    """Ranks `(num_sims, d + 1)` in `[0, num_ranks]` from one HMC chain per data set
    (`num_warmup` adaptation iterations, then `num_ranks * thin` draws thinned).
    The design, the prior and the counts are checked before anything compiles."""
    x = _check_design(x, prior)
    counts = [
        check_count(num_sims, "num_sims"),
        check_count(num_warmup, "num_warmup", minimum=0),
        check_count(num_ranks, "num_ranks"),
        check_count(thin, "thin"),
    ]
    return _hmc_ranks(key, x, prior, *counts)


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6))
def _hmc_ranks(
    key: jax.Array,
    x: jax.Array,
    prior: Prior,
    num_sims: int,
    num_warmup: int,
    num_ranks: int,
    thin: int,
) -> jax.Array:
    key_sim, key_init, key_run = jax.random.split(key, 3)
    truths, ys = jax.vmap(lambda k: simulate(k, x, prior))(jax.random.split(key_sim, num_sims))
    starts = hmc.initial_positions(key_init, num_sims, truths.shape[1])

    def one(key, start, y, truth):
        target = lambda q: model.log_joint(q, x, y, prior)  # noqa: E731
        chain = hmc.run_chain(key, start, target, num_warmup, num_ranks * thin, 8, 0.8)
        return ranks_of(truth, chain.positions[::thin])

    return jax.vmap(one)(jax.random.split(key_run, num_sims), starts, ys, truths)


def exact_ranks(
    key: jax.Array,
    x: jax.Array,
    prior: Prior,
    inference_prior: Prior,
    num_sims: int,
    num_ranks: int,
) -> jax.Array:
    """Ranks from exact posterior draws computed under `inference_prior` (equal to
    `prior` for a calibrated control; a different one to show miscalibration).
    The design, both priors and the counts are checked before anything compiles."""
    x = _check_design(x, prior)
    model.check_prior(inference_prior, x.shape[1])
    num_sims, num_ranks = check_count(num_sims, "num_sims"), check_count(num_ranks, "num_ranks")
    return _exact_ranks(key, x, prior, inference_prior, num_sims, num_ranks)


@functools.partial(jax.jit, static_argnums=(4, 5))
def _exact_ranks(
    key: jax.Array,
    x: jax.Array,
    prior: Prior,
    inference_prior: Prior,
    num_sims: int,
    num_ranks: int,
) -> jax.Array:
    key_sim, key_post = jax.random.split(key)
    truths, ys = jax.vmap(lambda k: simulate(k, x, prior))(jax.random.split(key_sim, num_sims))

    def one(key, y, truth):
        post = model.exact_posterior(x, y, inference_prior)
        return ranks_of(truth, model.sample_exact(key, post, num_ranks))

    return jax.vmap(one)(jax.random.split(key_post, num_sims), ys, truths)


def uniformity_test(ranks, num_ranks: int, num_bins: int | None = None) -> UniformityTest:
    """Pearson chi-square test that `ranks` (integers in `[0, num_ranks]`) are
    uniform. H0: every rank is equally likely; the bins group the
    `num_ranks + 1` ranks evenly (`num_bins` must divide `num_ranks + 1`)."""
    num_ranks = check_count(num_ranks, "num_ranks")
    num_bins = num_ranks + 1 if num_bins is None else check_count(num_bins, "num_bins")
    ranks = np.asarray(check_array(ranks, "ranks")).ravel()
    if ranks.size == 0:
        raise DataError("`ranks` is empty: there is nothing to test.")
    if np.any(ranks != np.round(ranks)) or ranks.min() < 0 or ranks.max() > num_ranks:
        bad = ranks[(ranks != np.round(ranks)) | (ranks < 0) | (ranks > num_ranks)][0]
        raise DataError(
            f"`ranks` must be whole numbers in `[0, {num_ranks}]`, but one of them is `{bad}`."
        )
    ranks = ranks.astype(np.int64)
    if (num_ranks + 1) % num_bins:
        raise ValueError(
            f"`num_bins` `{num_bins}` must divide `num_ranks + 1` = `{num_ranks + 1}`."
        )
    counts = np.bincount(ranks * num_bins // (num_ranks + 1), minlength=num_bins)
    expected = ranks.size / num_bins
    statistic = float(np.sum((counts - expected) ** 2) / expected)
    dof = num_bins - 1
    return UniformityTest(statistic, dof, float(stats.chi2.sf(statistic, dof)), counts.tolist())
