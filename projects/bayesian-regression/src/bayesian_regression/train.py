"""Inference runs judged against the exact posterior.

Dataflow: `make_problem -> sample_hmc -> moment_zscores -> fit_vi ->
vi_summary -> train_and_evaluate(config, workdir)`.

Sampler output is judged by z-scores: `(estimate - exact) / MCSE`, with the
Monte-Carlo standard error from batch means (every chain cut into
`num_batches` consecutive batches; the spread of the batch means over
`chains * num_batches` batches gives the standard error). Batch means need no
autocorrelation estimate, so this judge is independent of the ESS code in
`diagnostics.py`. A correct sampler gives z-scores that look standard normal;
the tests use a fixed key, so a z-score is a deterministic number.
"""

import json
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bayesian_regression import data, hmc, model, vi
from bayesian_regression.config import Config
from bayesian_regression.data import DataError, check_array, check_count


class Problem(NamedTuple):
    dataset: data.Dataset
    prior: model.Prior
    posterior: model.Posterior
    moments: model.Moments
    log_evidence: float  # log p(y | X), exact

    @property
    def args(self) -> tuple[jax.Array, jax.Array, model.Prior]:
        """The `data` argument of `model.regression_log_density`."""
        return (self.dataset.x, self.dataset.y, self.prior)

    @property
    def dim(self) -> int:
        return self.dataset.x.shape[1] + 1


def parameter_names(num_features: int) -> list[str]:
    return [f"w[{i}]" for i in range(num_features)] + ["log_sigma2"]


def make_problem(config: Config) -> Problem:
    """The data set, prior, exact posterior, exact moments and evidence of `config`."""
    dataset = data.from_config(config)
    prior = model.prior_from_config(config)
    post = model.exact_posterior(dataset.x, dataset.y, prior)
    log_z = float(model.log_marginal_likelihood(dataset.x, dataset.y, prior))
    return Problem(dataset, prior, post, model.moments(post), log_z)


def batch_means(values, num_batches: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Mean and its Monte-Carlo standard error by batch means.

    `values`: shape `(chains, n, ...)`. Returns `(mean, mcse)`, each of shape `(...)`."""
    num_batches = check_count(num_batches, "num_batches", minimum=2)
    check_array(values, "values")
    values = np.asarray(values, dtype=np.float64)
    if values.ndim < 2:
        raise DataError(f"`values` must have shape `(chains, n, ...)`, not `{values.shape}`.")
    chains, n = values.shape[:2]
    size = n // num_batches
    if size < 2:
        raise ValueError(
            f"Batch means need at least `{2 * num_batches}` draws per chain, got `{n}`."
        )
    trimmed = values[:, : size * num_batches]
    batches = trimmed.reshape(chains * num_batches, size, *values.shape[2:]).mean(axis=1)
    mean = trimmed.reshape(chains * size * num_batches, *values.shape[2:]).mean(axis=0)
    mcse = batches.std(axis=0, ddof=1) / np.sqrt(chains * num_batches)
    return mean, mcse


def moment_zscores(positions, moments: model.Moments, num_batches: int = 4) -> dict[str, Any]:
    """z-scores of the sample means and covariances of `positions` `(chains, n, k)`
    against the exact moments. Covariances use the exact mean, so that each is
    the plain average of `(theta_i - mu_i)(theta_j - mu_j)`."""
    mu = np.asarray(check_array(moments.theta_mean, "moments.theta_mean", ndim=1), np.float64)
    k = mu.shape[0]
    cov = np.asarray(check_array(moments.theta_cov, "moments.theta_cov", shape=(k, k)), np.float64)
    positions = np.asarray(check_array(positions, "positions", shape=(None, None, k)), np.float64)
    mean, mean_se = batch_means(positions, num_batches)
    centred = positions - mu
    products = centred[..., :, None] * centred[..., None, :]
    cov_hat, cov_se = batch_means(products, num_batches)
    upper = np.triu_indices(mu.shape[0])
    return {
        "mean": mean,
        "mean_mcse": mean_se,
        "mean_z": (mean - mu) / mean_se,
        "cov": cov_hat,
        "cov_z": ((cov_hat - cov) / cov_se)[upper],
        "max_abs_z": float(
            max(
                np.max(np.abs((mean - mu) / mean_se)),
                np.max(np.abs(((cov_hat - cov) / cov_se)[upper])),
            )
        ),
    }


def sample_hmc(
    config: Config, problem: Problem, key: jax.Array, step_size_factor: float = 1.0
) -> hmc.Samples:
    """`config.num_chains` vmapped HMC chains on the problem's posterior."""
    return hmc.run_chains(
        key,
        model.regression_log_density,
        problem.args,
        problem.dim,
        config.num_chains,
        config.num_warmup,
        config.num_samples,
        config.num_leapfrog,
        config.target_accept,
        step_size_factor,
    )


def fit_vi(config: Config, problem: Problem, key: jax.Array, family: vi.Family) -> vi.VIResult:
    return vi.fit(
        key,
        model.regression_log_density,
        problem.args,
        problem.dim,
        family,
        config.vi_steps,
        config.vi_learning_rate,
        config.vi_num_mc,
    )


def mean_field_variance_prediction(moments: model.Moments) -> np.ndarray:
    """For a Gaussian target `N(mu, Sigma)`, the best mean-field Gaussian (in
    `KL(q || p)`) has variances `1 / (Sigma^{-1})_ii`: the conditional, not the
    marginal, variances."""
    cov = np.asarray(moments.theta_cov, np.float64)
    return 1.0 / np.diag(np.linalg.inv(cov))


def vi_summary(
    result: vi.VIResult, problem: Problem, key: jax.Array, num_mc: int = 20_000
) -> dict[str, Any]:
    """What a VI fit got right and wrong, against the exact posterior: mean error in
    posterior sds, variance ratio, ELBO and `KL(q || p) = log p(y) - ELBO`."""
    mean, cov = vi.mean_and_cov(result.params)
    exact_sd = np.sqrt(np.diag(np.asarray(problem.moments.theta_cov, np.float64)))
    value, se = vi.elbo_estimate(
        result.params, key, model.regression_log_density, problem.args, num_mc
    )
    return {
        "mean": np.asarray(mean, np.float64),
        "var": np.diag(np.asarray(cov, np.float64)),
        "mean_error_in_sd": (np.asarray(mean, np.float64) - np.asarray(problem.moments.theta_mean))
        / exact_sd,
        "var_ratio": np.diag(np.asarray(cov, np.float64)) / exact_sd**2,
        "elbo": float(value),
        "elbo_se": float(se),
        "kl": problem.log_evidence - float(value),
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray | np.generic | jax.Array):
        return np.asarray(value).tolist()
    return value


def write_json(path: Path, payload: Any) -> Path:
    path.write_text(json.dumps(_jsonable(payload), indent=1) + "\n", encoding="utf-8")
    return path


def fit_and_evaluate(config: Config, workdir: Path) -> dict[str, Any]:
    """Exact posterior and both VI families: the `fit` command. Writes `fit.json`."""
    workdir.mkdir(parents=True, exist_ok=True)
    problem = make_problem(config)
    key_mf, key_fr, eval_mf, eval_fr = jax.random.split(jax.random.key(config.seed), 4)
    summaries = {}
    for family, key, key_eval in (("meanfield", key_mf, eval_mf), ("fullrank", key_fr, eval_fr)):
        summaries[family] = vi_summary(fit_vi(config, problem, key, family), problem, key_eval)
    result = {
        "exact": {
            "theta_mean": problem.moments.theta_mean,
            "theta_var": jnp.diag(problem.moments.theta_cov),
            "log_evidence": problem.log_evidence,
            "condition": model.condition_numbers(problem.dataset.x, problem.posterior),
        },
        "meanfield_variance_prediction": mean_field_variance_prediction(problem.moments),
        "vi": summaries,
    }
    write_json(workdir / "fit.json", result)
    return result
