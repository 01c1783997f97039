"""The model and its exact posterior.

Bayesian linear regression with a conjugate Normal-Inverse-Gamma prior:

    sigma^2       ~ InvGamma(a0, b0)
    w | sigma^2   ~ N(m0, sigma^2 s^2 I)
    y | w, sigma^2 ~ N(X w, sigma^2 I)

The posterior is again Normal-Inverse-Gamma, `NIG(m_n, Lambda_n, a_n, b_n)`:

    Lambda_n = X^T X + I / s^2
    m_n      = Lambda_n^{-1} (X^T y + m0 / s^2)
    a_n      = a0 + n / 2
    b_n      = b0 + (|y - X m_n|^2 + |m_n - m0|^2 / s^2) / 2

`exact_posterior` never forms `X^T X`: it takes a QR factorization of the
stacked system `[X; I/s] w = [y; m0/s]`, whose `R` is the Cholesky factor of
`Lambda_n` (up to signs), so a nearly collinear design loses digits in
proportion to its condition number, not its square.

Samplers and VI work on the unconstrained vector `theta = (w, log sigma^2)`,
shape `(d + 1,)`; `log_joint` is its unnormalized log density (Jacobian of
`log` included) and `log_posterior` its exact normalized one.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import digamma, gammaln, polygamma

from bayesian_regression.data import DataError, check_array, check_count, check_number

LOG_2PI = 1.8378770664093453


class ModelError(ValueError):
    """A prior or query the model cannot use; the message says why."""


class Prior(NamedTuple):
    mean: jax.Array  # shape=(d,): m0
    scale: float  # s > 0: prior sd of each weight, in units of sigma
    shape: float  # a0 > 0
    rate: float  # b0 > 0


class Posterior(NamedTuple):
    mean: jax.Array  # shape=(d,): m_n
    chol: jax.Array  # shape=(d, d), upper triangular: Lambda_n = chol^T chol
    shape: jax.Array  # shape=(): a_n
    rate: jax.Array  # shape=(): b_n


class Moments(NamedTuple):
    """Exact posterior moments of `theta = (w, log sigma^2)` and of `sigma^2`."""

    theta_mean: jax.Array  # shape=(d + 1,)
    theta_cov: jax.Array  # shape=(d + 1, d + 1); w and log sigma^2 are uncorrelated
    sigma2_mean: jax.Array  # shape=()
    sigma2_var: jax.Array  # shape=(); infinite when a_n <= 2


def make_prior(num_features: int, scale: float, shape: float, rate: float, mean=None) -> Prior:
    """A validated prior; raises `ModelError` for a non-positive scale, shape or rate."""
    check_count(num_features, "num_features")
    if mean is not None:
        check_array(mean, "mean", shape=(num_features,))
    for name, value in (("prior scale", scale), ("prior shape a0", shape), ("prior rate b0", rate)):
        try:
            check_number(value, name, low=0.0, low_open=True)
        except DataError:
            raise ModelError(
                f"The {name} must be a positive finite number, but it is `{value}`."
            ) from None
    m0 = jnp.zeros((num_features,)) if mean is None else jnp.asarray(mean, jnp.float32)
    if m0.shape != (num_features,):
        raise ModelError(f"The prior mean must have shape `({num_features},)`, not `{m0.shape}`.")
    return Prior(m0, float(scale), float(shape), float(rate))


def check_data(x, y) -> tuple[jax.Array, jax.Array]:
    """Checks a design `x` `(n, d)` and targets `y` `(n,)` (floating point, non-empty,
    finite); returns them as JAX arrays. Raises `DataError` naming the argument."""
    x = jnp.asarray(check_array(x, "x", ndim=2, floating=True))
    y = jnp.asarray(check_array(y, "y", shape=(x.shape[0],), floating=True))
    return x, y


def check_prior(prior, num_features: int) -> None:
    """Checks a `Prior` against `num_features` weights (also one built by hand); raises
    `ModelError` naming the field, as `make_prior` does for the same values."""
    if not isinstance(prior, Prior):
        raise ModelError(f"`prior` must be a `Prior` (see `make_prior`), not `{type(prior)}`.")
    try:
        check_array(prior.mean, "prior.mean", shape=(num_features,), floating=True)
        for name in ("scale", "shape", "rate"):
            check_number(getattr(prior, name), f"prior.{name}", low=0.0, low_open=True)
    except DataError as err:
        raise ModelError(str(err)) from None


def check_posterior(post, num_features: int | None = None, query: str = "x_new") -> int:
    """Checks a `Posterior` (as `exact_posterior` returns one), against `num_features`
    columns of the argument `query` when given; returns its `d`."""
    if not isinstance(post, Posterior):
        raise ModelError(
            f"`post` must be a `Posterior` (see `exact_posterior`), not `{type(post)}`."
        )
    d = check_array(post.mean, "post.mean", ndim=1, floating=True).shape[0]
    if num_features is not None and d != num_features:
        raise ModelError(
            f"`{query}` has `{num_features}` columns, but `post` has `{d}` weights; "
            f"the shapes must agree."
        )
    check_array(post.chol, "post.chol", shape=(d, d), floating=True)
    check_number(post.shape, "post.shape", low=0.0, low_open=True)
    check_number(post.rate, "post.rate", low=0.0, low_open=True)
    return d


def prior_from_config(config) -> Prior:
    return make_prior(
        config.num_features, config.prior_scale, config.prior_shape, config.prior_rate
    )


def exact_posterior(x: jax.Array, y: jax.Array, prior: Prior) -> Posterior:
    """The closed-form NIG posterior. `x`: shape `(n, d)`; `y`: shape `(n,)`.

    Raises `DataError` for a design or targets of the wrong shape or dtype, empty
    or holding NaN or inf; `ModelError` for a prior that does not fit them.
    [claim:exact-posterior-refuses-bad-input]

    With `A = [X; I/s]` and `b = [y; m0/s]` (the prior MEAN enters the augmented
    targets; a nonzero `prior.mean` shifts m_n) [claim:prior-mean-in-augmented-targets]
    and `A = Q R` (reduced QR):
        mean  m_n = R^{-1} Q^T b (a triangular solve, never the normal equations)
            [claim:posterior-mean-by-qr]
        chol  R itself (Lambda_n = R^T R; its diagonal may be negative)
            [claim:posterior-chol-is-r]
        shape a_n = a0 + n/2, in x's dtype [claim:posterior-shape]
        rate  b_n = b0 + |b - A m_n|^2 / 2 (the residual of the augmented system)
            [claim:posterior-rate]
    """
    x, y = check_data(x, y)
    check_prior(prior, x.shape[1])
    # --- exercise stage 1: QR of [X; I/s], solve for m_n, then a_n and b_n. ---
    num_obs, num_features = x.shape
    inv_scale = 1.0 / prior.scale
    a = jnp.concatenate([x, inv_scale * jnp.eye(num_features, dtype=x.dtype)], axis=0)
    b = jnp.concatenate([y, inv_scale * prior.mean.astype(y.dtype)], axis=0)
    q, r = jnp.linalg.qr(a, mode="reduced")
    mean = solve_triangular(r, q.T @ b, lower=False)
    residual = b - a @ mean
    shape = jnp.asarray(prior.shape + 0.5 * num_obs, x.dtype)
    rate = prior.rate + 0.5 * jnp.sum(residual**2)
    return Posterior(mean, r, shape, rate)
    # --- end exercise ---


def precision(post: Posterior) -> jax.Array:
    """`Lambda_n`, shape `(d, d)`."""
    return post.chol.T @ post.chol


def weight_scale_matrix(post: Posterior) -> jax.Array:
    """`Lambda_n^{-1}`, shape `(d, d)`, from two triangular solves."""
    eye = jnp.eye(post.chol.shape[0], dtype=post.chol.dtype)
    inv_r = solve_triangular(post.chol, eye, lower=False)
    return inv_r @ inv_r.T


def moments(post: Posterior) -> Moments:
    """Exact means and covariances: `w ~ t_{2 a_n}(m_n, (b_n/a_n) Lambda_n^{-1})` marginally,
    so `Cov[w] = b_n / (a_n - 1) Lambda_n^{-1}`; `sigma^2 ~ InvGamma(a_n, b_n)`, so
    `E[log sigma^2] = log b_n - digamma(a_n)` and `Var[log sigma^2] = trigamma(a_n)`."""
    d = post.mean.shape[0]
    cov_w = post.rate / (post.shape - 1.0) * weight_scale_matrix(post)
    mean = jnp.concatenate([post.mean, (jnp.log(post.rate) - digamma(post.shape))[None]])
    cov = jnp.zeros((d + 1, d + 1), cov_w.dtype)
    cov = cov.at[:d, :d].set(cov_w).at[d, d].set(polygamma(1, post.shape))
    sigma2_mean = post.rate / (post.shape - 1.0)
    sigma2_var = jnp.where(post.shape > 2.0, sigma2_mean**2 / (post.shape - 2.0), jnp.inf)
    return Moments(mean, cov, sigma2_mean, sigma2_var)


def predictive(post: Posterior, x_new: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Posterior predictive of `y` at rows `x_new` (shape `(m, d)`): Student-t with
    `(df, loc, scale)`, `scale^2 = (b_n / a_n) (1 + x Lambda_n^{-1} x^T)`.
    [claim:predictive-student-t]"""
    x_new = jnp.asarray(check_array(x_new, "x_new", ndim=2, floating=True))
    check_posterior(post, x_new.shape[1])
    # --- exercise stage 1: Student-t: df 2 a_n, loc x m_n, scale from x Lambda_n^-1 x^T. ---
    z = solve_triangular(post.chol, x_new.T, lower=False, trans="T")  # R^{-T} x^T, shape (d, m)
    scale = jnp.sqrt(post.rate / post.shape * (1.0 + jnp.sum(z**2, axis=0)))
    return 2.0 * post.shape, x_new @ post.mean, scale
    # --- end exercise ---


def log_marginal_likelihood(x: jax.Array, y: jax.Array, prior: Prior) -> jax.Array:
    """`log p(y | X)`, the normalizing constant of `log_joint`."""
    x, y = check_data(x, y)
    num_obs, num_features = x.shape
    post = exact_posterior(x, y, prior)
    log_det_precision = 2.0 * jnp.sum(jnp.log(jnp.abs(jnp.diag(post.chol))))
    log_det_prior_precision = -2.0 * num_features * jnp.log(prior.scale)
    return (
        -0.5 * num_obs * LOG_2PI
        + 0.5 * (log_det_prior_precision - log_det_precision)
        + prior.shape * jnp.log(prior.rate)
        - post.shape * jnp.log(post.rate)
        + gammaln(post.shape)
        - gammaln(prior.shape)
    )


def _log_inv_gamma_of_log(log_sigma2: jax.Array, shape, rate) -> jax.Array:
    """`log InvGamma(sigma^2 | shape, rate) + log sigma^2`: the density of `log sigma^2`."""
    return shape * jnp.log(rate) - gammaln(shape) - shape * log_sigma2 - rate * jnp.exp(-log_sigma2)


def log_joint(theta: jax.Array, x: jax.Array, y: jax.Array, prior: Prior) -> jax.Array:
    """`log p(y, w, log sigma^2)` at `theta = (w, log sigma^2)`, shape `(d + 1,)`.

    The sum of: `log N(y | X w, sigma^2 I)`; `log N(w | m0, sigma^2 s^2 I)` (the
    prior variance scales with sigma^2); `log InvGamma(sigma^2 | a0, b0)`; and
    `log sigma^2`, the Jacobian of sampling `log sigma^2` instead of sigma^2
    (`_log_inv_gamma_of_log` holds the last two). [claim:log-joint-terms]
    Normalized: every constant kept. [claim:log-joint-normalized]
    """
    x, y = check_data(x, y)
    theta = jnp.asarray(check_array(theta, "theta", shape=(x.shape[1] + 1,), floating=True))
    check_prior(prior, x.shape[1])
    # --- exercise stage 1: Likelihood + prior on w + prior on log sigma^2 (Jacobian). ---
    w, log_sigma2 = theta[:-1], theta[-1]
    num_obs, num_features = x.shape
    sigma2 = jnp.exp(log_sigma2)
    resid = y - x @ w
    log_lik = -0.5 * (num_obs * (LOG_2PI + log_sigma2) + jnp.sum(resid**2) / sigma2)
    prior_var = sigma2 * prior.scale**2
    dw = w - prior.mean
    log_prior_w = -0.5 * (
        num_features * (LOG_2PI + jnp.log(prior_var)) + jnp.sum(dw**2) / prior_var
    )
    return log_lik + log_prior_w + _log_inv_gamma_of_log(log_sigma2, prior.shape, prior.rate)
    # --- end exercise ---


def log_posterior(theta: jax.Array, post: Posterior) -> jax.Array:
    """Exact normalized log density of `theta = (w, log sigma^2)` under the posterior."""
    w, log_sigma2 = theta[:-1], theta[-1]
    num_features = w.shape[0]
    z = post.chol @ (w - post.mean)
    log_det_precision = 2.0 * jnp.sum(jnp.log(jnp.abs(jnp.diag(post.chol))))
    log_w = -0.5 * (
        num_features * (LOG_2PI + log_sigma2)
        - log_det_precision
        + jnp.sum(z**2) / jnp.exp(log_sigma2)
    )
    return log_w + _log_inv_gamma_of_log(log_sigma2, post.shape, post.rate)


def condition_numbers(x: jax.Array, post: Posterior) -> dict[str, float]:
    """Condition numbers of the design `X` and of the factor `R` of `Lambda_n`
    (ratio of extreme singular values; `cond(Lambda_n) = cond(R)^2`)."""
    sx = jnp.linalg.svd(x, compute_uv=False)
    sr = jnp.linalg.svd(post.chol, compute_uv=False)
    return {"design": float(sx[0] / sx[-1]), "posterior_factor": float(sr[0] / sr[-1])}


def sample_exact(key: jax.Array, post: Posterior, num: int) -> jax.Array:
    """`num` independent exact posterior draws of `theta`, shape `(num, d + 1)`."""
    check_count(num, "num")
    check_posterior(post)
    key_s, key_w = jax.random.split(key)
    sigma2 = post.rate / jax.random.gamma(key_s, post.shape, (num,))
    z = jax.random.normal(key_w, (num, post.mean.shape[0]))
    w = (
        post.mean[None, :]
        + jnp.sqrt(sigma2)[:, None] * solve_triangular(post.chol, z.T, lower=False).T
    )
    return jnp.concatenate([w, jnp.log(sigma2)[:, None]], axis=1)


def regression_log_density(theta: jax.Array, data: tuple[jax.Array, jax.Array, Prior]) -> jax.Array:
    """`log_joint` with the data as one argument `(x, y, prior)`, the form the
    samplers take (`hmc.run_chains`, `vi.fit`)."""
    x, y, prior = data
    return log_joint(theta, x, y, prior)


def check_regression_data(data) -> None:
    """The `data` of `regression_log_density`: `(x, y, prior)`, each checked."""
    if not isinstance(data, tuple) or len(data) != 3:
        raise ModelError(f"`data` must be the tuple `(x, y, prior)`, not `{type(data).__name__}`.")
    x, y, prior = data
    x, y = check_data(x, y)
    check_prior(prior, x.shape[1])


# The samplers and VI call this before they compile anything (`hmc.check_target`).
regression_log_density.validate_data = check_regression_data
