"""The statistics the stage tests bound, shared by the tests of stages 2 and 3 and by the
size sweep (the script `tests/size_sweep`, run on demand).

Size: every statistical stage test fails a correct solution at most once in 1 / SIZE
runs (all its cases together). A fixed key does not make that chance 0: a learner's
code that rounds differently (`step_size * (inv_mass * p)` for `step_size * inv_mass *
p`) parts the chains after a few hundred steps, as another key would, and NumPyro's
NUTS rounds differently on another CPU. So each limit is a Sidak bound over the figures
its test compares, each figure's distribution taken from a model. The size sweep reruns
every such test under 256 keys for the reference and 9 rewrites equal in exact
arithmetic (a rewrite XLA compiles to the reference's program is skipped) and keeps what
it measures in evidence/size_sweep.json; so far it has been run only in part (that
file's `note` says which parts), and each test's docstring says what backs its size.
"""

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special, stats

from bayesian_regression import diagnostics, reports, train, vi

SIZE = 1e-4


def sidak_limit(num: int, dof: int | None = None, size: float = SIZE) -> float:
    """Two-sided limit on the largest of `num` |z|: each exceeds it with chance
    `1 - (1 - size)^(1/num)`; Student-t with `dof` degrees of freedom, normal without."""
    each = 1.0 - (1.0 - size) ** (1.0 / num)
    return float(stats.norm.isf(each / 2) if dof is None else stats.t.isf(each / 2, dof))


def sidak_each(num: int) -> float:
    """The chance each of `num` figures may take so that one of them fails at most SIZE."""
    return 1.0 - (1.0 - SIZE) ** (1.0 / num)


# Stage 2.


def moment_z_vector(positions, moments) -> np.ndarray:
    """The 14 z-scores of the moments test (4 means, then the upper triangle of the
    covariance, around the exact mean), plain NumPy: each chain's mean of `theta` and of
    the centred products is one replication; z = (mean of the chain means - exact) /
    (their sd / sqrt(chains))."""
    mu = np.asarray(moments.theta_mean, np.float64)
    cov = np.asarray(moments.theta_cov, np.float64)
    centred = np.asarray(positions, np.float64) - mu
    upper = np.triu_indices(mu.shape[0])
    products = (centred[..., :, None] * centred[..., None, :])[..., upper[0], upper[1]]
    per_chain = np.concatenate([centred + mu, products], axis=-1).mean(axis=1)
    exact = np.concatenate([mu, cov[upper]])
    se = per_chain.std(axis=0, ddof=1) / np.sqrt(per_chain.shape[0])
    return (per_chain.mean(axis=0) - exact) / se


def mixing_times(positions, moments) -> np.ndarray:
    """Per parameter, `n Var(chain means) / Var_exact`: the integrated autocorrelation
    time of the chain means (1 for independent draws), plain NumPy."""
    per_chain = np.asarray(positions, np.float64).mean(axis=1)
    exact_var = np.diag(np.asarray(moments.theta_cov, np.float64))
    return np.asarray(positions).shape[1] * per_chain.var(axis=0, ddof=1) / exact_var


def _gaussian_kl(m_q, c_q, m_p, c_p):
    d = m_q.shape[0]
    inv = np.linalg.inv(c_p)
    diff = m_p - m_q
    return 0.5 * (
        np.trace(inv @ c_q)
        + diff @ inv @ diff
        - d
        + np.linalg.slogdet(c_p)[1]
        - np.linalg.slogdet(c_q)[1]
    )


GAUSS_MU = np.array([0.5, -1.0, 2.0])


GAUSS_SIGMA = np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.3], [0.2, -0.3, 0.5]])


GAUSS_LOG_NORM = -0.5 * (3 * np.log(2 * np.pi) + np.linalg.slogdet(GAUSS_SIGMA)[1])


ELBO_NUM_MC = 40_000


ELBO_Z_LIMIT = sidak_limit(2)  # 4.06: one normal z per family


def _gaussian_target(theta, data):
    """Normalized `log N(theta | GAUSS_MU, GAUSS_SIGMA)`."""
    del data
    diff = theta - jnp.asarray(GAUSS_MU, jnp.float32)
    inv = jnp.asarray(np.linalg.inv(GAUSS_SIGMA), jnp.float32)
    return jnp.float32(GAUSS_LOG_NORM) - 0.5 * diff @ inv @ diff


_elbo = jax.jit(vi.elbo, static_argnums=(2, 4))


def elbo_z(family: str, key) -> tuple[float, float, float, float]:
    """`(estimate, exact, se, z)` of the Monte-Carlo ELBO against the closed-form -KL."""
    key_init, key_mc = jax.random.split(key)
    params = vi.init_params(3, family)
    noise = 0.3 * jax.random.normal(key_init, params.raw_scale.shape)
    params = params._replace(loc=jnp.array([0.2, -0.5, 1.5]), raw_scale=params.raw_scale + noise)
    estimate = float(_elbo(params, jax.random.clone(key_mc), _gaussian_target, None, ELBO_NUM_MC))
    m_q, c_q = (np.asarray(a, np.float64) for a in vi.mean_and_cov(params))
    exact = -_gaussian_kl(m_q, c_q, GAUSS_MU, GAUSS_SIGMA)
    # Standard error of the Monte-Carlo average, from the same draws, computed here.
    eps = jax.random.normal(jax.random.clone(key_mc), (ELBO_NUM_MC, 3))
    draws = np.asarray(m_q[None, :] + np.asarray(eps) @ np.linalg.cholesky(c_q).T)
    diff = draws - GAUSS_MU
    inv = np.linalg.inv(GAUSS_SIGMA)
    log_p = GAUSS_LOG_NORM - 0.5 * np.einsum("md,de,me->m", diff, inv, diff)
    se = float(np.std(log_p) / np.sqrt(ELBO_NUM_MC))
    return estimate, exact, se, (estimate - exact) / se


def vi_statistics(fullrank: dict, meanfield: dict, moments) -> dict[str, float]:
    """The figures the two VI tests bound (`vi_summary` of each family), each against
    `VI_LIMITS`: full rank against the exact posterior, mean field against its Gaussian
    prediction (conditional variances `1 / (Sigma^-1)_ii`; KL gap to full rank
    `(sum log Lambda_ii - log det Lambda) / 2`)."""
    exact_var = np.diag(np.asarray(moments.theta_cov, np.float64))
    predicted = train.mean_field_variance_prediction(moments) / exact_var
    prec = np.linalg.inv(np.asarray(moments.theta_cov, np.float64))
    gap_predicted = 0.5 * (np.sum(np.log(np.diag(prec))) - np.linalg.slogdet(prec)[1])
    gap = meanfield["kl"] - fullrank["kl"]
    return {
        "fullrank_abs_mean_error_in_sd": float(np.max(np.abs(fullrank["mean_error_in_sd"]))),
        "fullrank_abs_var_ratio_minus_1": float(np.max(np.abs(fullrank["var_ratio"] - 1.0))),
        "fullrank_kl": float(fullrank["kl"]),
        "meanfield_abs_var_over_predicted_minus_1": float(
            np.max(np.abs(meanfield["var_ratio"] / predicted - 1.0))
        ),
        "meanfield_kl_gap_error_beyond_15pct": float(
            abs(gap - gap_predicted) - 0.15 * gap_predicted
        ),
    }


# Upper limits of `vi_statistics` (the full-rank KL also has the lower limit -0.01). They
# were set from a sweep of 768 fits per design whose output was not kept (it reported
# normal tails beyond these limits of 5e-5 for full rank and 3e-5 for mean field, and 3
# of 1536 fits past the mean error's old limit 0.1). Unverified until the `vi` part of
# the size sweep is run into evidence/size_sweep.json.
VI_LIMITS = {
    "fullrank_abs_mean_error_in_sd": 0.15,
    "fullrank_abs_var_ratio_minus_1": 0.15,
    "fullrank_kl": 0.05,
    "meanfield_abs_var_over_predicted_minus_1": 0.15,
    "meanfield_kl_gap_error_beyond_15pct": 0.05,
}


# Stage 3.


# R-hat < 1.01 is the bar for a run that is kept (ESS in the thousands). The NUTS test's
# runs have 4 x 1000 draws, where R-hat of converged chains still spreads by about 0.003;
# a stuck or biased chain gives 1.05 and more (see the funnel).
SHORT_RUN_RHAT = 1.02


def ess_zscores(draws: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """z-scores of the means, then the centred second moments (upper triangle), of `draws`
    `(chains, n, k)` against the exact `mean` and `cov`, each over its ESS-based MCSE
    (`diagnostics.mcse_mean`: sd / sqrt(ESS), the ESS equal to ArviZ's, tested below)."""
    centred = draws - mean
    upper = np.triu_indices(mean.shape[0])
    products = (centred[..., :, None] * centred[..., None, :])[..., upper[0], upper[1]]
    figures = np.concatenate([draws, products], axis=-1)
    exact = np.concatenate([mean, cov[upper]])
    return np.array(
        [
            (figures[:, :, j].mean() - exact[j]) / diagnostics.mcse_mean(figures[:, :, j])
            for j in range(exact.shape[0])
        ]
    )


# NUTS vs exact: 4 means and 10 second moments; NUTS vs HMC: 4 means. 18 normal z-scores.
NUTS_Z_LIMIT = float(special.ndtri(1.0 - sidak_each(18) / 2))  # 4.54


def nuts_figures(nuts_draws: np.ndarray, hmc_draws: np.ndarray, moments) -> dict:
    """What the NUTS test bounds: z-scores of NUTS against the exact moments and against
    HMC's means (joint ESS-based MCSE), and the R-hats of both."""
    k = nuts_draws.shape[2]
    se = lambda x: np.array([diagnostics.mcse_mean(x[:, :, i]) for i in range(k)])  # noqa: E731
    return {
        "nuts_vs_exact_z": ess_zscores(
            nuts_draws, np.asarray(moments.theta_mean, np.float64), np.asarray(moments.theta_cov)
        ),
        "nuts_vs_hmc_z": (nuts_draws.mean((0, 1)) - hmc_draws.mean((0, 1)))
        / np.sqrt(se(nuts_draws) ** 2 + se(hmc_draws) ** 2),
        "rhat_nuts": [diagnostics.rhat(nuts_draws[:, :, i]) for i in range(k)],
        "rhat_hmc": [diagnostics.rhat(hmc_draws[:, :, i]) for i in range(k)],
    }


def nuts_passes(f: dict) -> bool:
    return bool(
        np.max(np.abs(np.concatenate([f["nuts_vs_exact_z"], f["nuts_vs_hmc_z"]]))) < NUTS_Z_LIMIT
        and max(f["rhat_nuts"] + f["rhat_hmc"]) < SHORT_RUN_RHAT
    )


FUNNEL_Z_LIMIT = float(special.ndtri(1.0 - sidak_each(2) / 2))  # 4.06: E[v] and E[v^2]


def funnel_figures(centered_samples, noncentered_samples) -> dict:
    """The verdicts of both forms and the z-scores of the non-centered v against N(0, 9)."""
    names = reports.funnel_names()
    centered = reports.diagnose_draws(centered_samples, names)
    noncentered = reports.diagnose_draws(noncentered_samples, names)
    v = np.asarray(noncentered_samples.positions, np.float64)[:, :, :1]
    keep = ("num_divergent", "max_rhat", "min_ess", "verdict")
    return {
        "centered": {k: centered[k] for k in keep},
        "noncentered": {k: noncentered[k] for k in keep},
        "noncentered_v_z": ess_zscores(v, np.zeros(1), np.full((1, 1), 9.0)),
    }


def funnel_passes(f: dict) -> bool:
    return bool(
        f["centered"]["num_divergent"] > 0
        and f["centered"]["verdict"] != "trustworthy"
        and f["noncentered"]["verdict"] == "trustworthy"
        and np.max(np.abs(f["noncentered_v_z"])) < FUNNEL_Z_LIMIT
    )
