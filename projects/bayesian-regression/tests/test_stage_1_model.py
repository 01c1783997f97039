"""Stage 1: the model and its exact posterior.

Independent checks, all in NumPy float64 and none through the QR closed form:
  - one-observation-at-a-time conjugate updates (a Python loop);
  - a 2-parameter case integrated on a dense grid of the unnormalized density;
  - `log_joint - log_posterior` is the same constant, `log p(y)`, everywhere;
  - the predictive variance against `E[sigma^2] + x^T Cov[w] x`.
Changed conditions: other seeds, shapes and correlations; a nearly collinear
design, where the QR solution keeps the digits that the normal equations lose.
Tolerances are float32's, set on a CPU: a figure that passes through exp, log or the
gamma-function family (log densities, the log evidence, `E[log sigma^2]`, trigamma) adds
to its `atol` the backend's `elementwise_extra` (conftest; 0 on a CPU), the extra error
of those functions on the running backend propagated through the evaluations the figure
is made of (`propagation.py`, weights from float64 reference quantities); matrix products
run in float32 on every backend (conftest).
"""

import jax
import jax.numpy as jnp
import numpy as np
import propagation
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from scipy import special, stats

from bayesian_regression import data, model
from bayesian_regression.config import Config, ConfigError


def sequential_posterior(x, y, scale, a0, b0):
    """NumPy float64 reference: fold in one observation at a time.

    Keeps the precision `P` and `eta = P m`; each observation adds `x x^T` to `P`,
    `x y` to `eta`, 1/2 to `a`, and `(y^2 + m_old^T P_old m_old - m^T P m) / 2` to `b`.
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    d = x.shape[1]
    prec = np.eye(d) / scale**2
    eta = np.zeros(d)
    a, b = a0, b0
    mean = np.zeros(d)
    for xi, yi in zip(x, y, strict=True):
        quad_old = mean @ prec @ mean
        prec = prec + np.outer(xi, xi)
        eta = eta + xi * yi
        mean = np.linalg.solve(prec, eta)
        a += 0.5
        b += 0.5 * (yi**2 + quad_old - mean @ prec @ mean)
    return mean, prec, a, b


def np_log_joint(w, log_s2, x, y, scale, a0, b0):
    """Unnormalized log density of `(w, log sigma^2)` on a grid, NumPy float64.
    `w`: `(..., d)`; `log_s2`: `(...)`."""
    n, d = x.shape
    s2 = np.exp(log_s2)
    resid = y - w @ x.T
    log_lik = -0.5 * n * np.log(2 * np.pi * s2) - 0.5 * np.sum(resid**2, axis=-1) / s2
    log_pw = -0.5 * d * np.log(2 * np.pi * s2 * scale**2) - 0.5 * np.sum(w**2, axis=-1) / (
        s2 * scale**2
    )
    log_ps2 = a0 * np.log(b0) - special.gammaln(a0) - (a0 + 1) * log_s2 - b0 / s2
    return log_lik + log_pw + log_ps2 + log_s2


# No shrinking: a failing example is reported as drawn (kept fast under mutation).
FAST = settings(
    max_examples=12,
    derandomize=True,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
)

CASES = [  # (seed, n, d, rho): the changed conditions
    (0, 60, 3, 0.9),
    (1, 25, 5, 0.3),
]


@pytest.mark.claims("exact-nig-posterior", "prior-mean-in-augmented-targets", "posterior-chol-is-r")
@pytest.mark.claims("posterior-shape", "posterior-rate")
@FAST
@given(
    n=st.sampled_from([1, 3, 8]),
    d=st.sampled_from([1, 3]),
    scale=st.sampled_from([0.3, 1.0, 2.5]),
    a0=st.sampled_from([0.7, 2.5]),
    b0=st.sampled_from([0.4, 1.5]),
    nonzero_mean=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_log_evidence_is_the_multivariate_t_density(
    n, d, scale, a0, b0, nonzero_mean, seed, elementwise_extra
):
    """log_marginal_likelihood equals SciPy's multivariate-t log density of y, for priors and n < d.

    Integrating w and sigma^2 out: y ~ t_{2 a0}(X m0, (b0/a0)(I + s^2 X X^T)),
    SciPy's multivariate t in float64, over prior scales other than 1, a prior
    mean zero and not, and fewer observations than weights. `atol` plus the backend's
    `elementwise_extra` through the log evidence's evaluations
    (`propagation.log_evidence`): `log |R_ii|` weight 1 each, `log s` weight d,
    `log b0` a0, `log b_n` a_n, `gammaln(a_n)` and `gammaln(a0)` 1 each, with `R`,
    `a_n`, `b_n` from the float64 closed form."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = rng.normal(size=n).astype(np.float32)
    m0 = rng.normal(size=d).astype(np.float32) if nonzero_mean else None
    prior = model.make_prior(d, scale, a0, b0, mean=m0)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    loc = x64 @ (np.zeros(d) if m0 is None else m0.astype(np.float64))
    shape = b0 / a0 * (np.eye(n) + scale**2 * x64 @ x64.T)
    expected = stats.multivariate_t(loc=loc, shape=shape, df=2 * a0).logpdf(y64)
    got = float(model.log_marginal_likelihood(jnp.asarray(x), jnp.asarray(y), prior))
    _, prec, a_n, b_n = propagation.nig_posterior(x, y, scale, a0, b0, m0)
    extra = elementwise_extra(*propagation.log_evidence(prec, scale, a0, b0, a_n, b_n))
    assert got == pytest.approx(expected, rel=1e-4, abs=2e-3 + extra)


MOMENT_CASES = [  # (seed, n, d, a0): a_n = a0 + n/2 below, at and above 2
    (10, 2, 1, 0.5),
    (11, 3, 3, 0.5),
    (12, 3, 2, 1.0),
    (13, 40, 4, 2.5),
]


@pytest.mark.claims("exact-nig-posterior")
@pytest.mark.parametrize("seed,n,d,a0", MOMENT_CASES)
def test_moments_and_log_posterior_match_scipy(seed, n, d, a0, evidence, elementwise_extra):
    """moments and log_posterior match a float64 sequential posterior and SciPy, a_n around 2.

    Every field of `moments` (the whole (d+1) x (d+1) covariance, zeros
    included) against the sequential float64 posterior and SciPy's inverse gamma
    (mean, variance, infinite for a_n <= 2); `log_posterior` against SciPy's
    normal and inverse-gamma log densities plus the Jacobian log sigma^2. Three figures add
    the backend's `elementwise_extra` to their `atol`, with weights from the float64
    sequential posterior: `E[log sigma^2] = log b_n - digamma(a_n)` (weight 1 each; the
    extra is added to the whole mean vector), `Var[log sigma^2] = trigamma(a_n)`
    (weight 1), and `log_posterior` at the worst of its 5 points
    (`propagation.log_posterior`: `exp(u)` relative weight `z^T z / (2 sigma^2)`, each
    `log |R_ii|` 1, `log b_n` a_n, `gammaln(a_n)` 1, `exp(-u)` b_n). The weights' block of
    the covariance (products and solves) keeps float32's."""
    scale, b0 = 1.7, 0.9
    ds = data.make_dataset(jax.random.key(seed), n, d, 0.4, 0.7)
    prior = model.make_prior(d, scale, a0, b0)
    post = model.exact_posterior(ds.x, ds.y, prior)
    mom = model.moments(post)
    mean, prec, a, b = sequential_posterior(ds.x, ds.y, scale, a0, b0)
    cov_w = b / (a - 1.0) * np.linalg.inv(prec)
    theta_cov = np.zeros((d + 1, d + 1))
    theta_cov[:d, :d] = cov_w
    theta_cov[d, d] = special.polygamma(1, a)
    ig = stats.invgamma(a, scale=b)
    var_ref = ig.var() if a > 2 else np.inf
    rng = np.random.default_rng(seed)
    thetas = np.concatenate([mean + 0.3 * rng.normal(size=(5, d)), rng.normal(size=(5, 1))], 1)
    log_post_ref = [
        stats.multivariate_normal(mean, np.exp(t[d]) * np.linalg.inv(prec)).logpdf(t[:d])
        + ig.logpdf(np.exp(t[d]))
        + t[d]
        for t in thetas
    ]
    # One compiled program per batch of points (an eager vmap dispatches every operation).
    log_post = jax.jit(jax.vmap(lambda t: model.log_posterior(t, post)))(
        jnp.asarray(thetas, jnp.float32)
    )
    extra_mean = elementwise_extra(*propagation.log_sigma2_mean(a, b))
    extra_var = elementwise_extra(*propagation.log_sigma2_var(a))
    extra_lp = max(
        elementwise_extra(*propagation.log_posterior(t, mean, prec, a, b)) for t in thetas
    )
    cond = f"seed={seed} n={n} d={d} a_n={a}"
    cov_got = np.asarray(mom.theta_cov, np.float64)
    ok = [
        evidence.record(
            "theta_cov shape",
            cond,
            {"shape": mom.theta_cov.shape},
            None,
            mom.theta_cov.shape == (d + 1, d + 1) and mom.theta_mean.shape == (d + 1,),
        ),
        evidence.allclose(
            "theta_mean",
            cond,
            mom.theta_mean,
            np.append(mean, np.log(b) - special.digamma(a)),
            rtol=1e-4,
            atol=1e-4 + extra_mean,
        ),
        evidence.allclose(
            "theta_cov but Var[log sigma^2]",
            cond,
            cov_got.ravel()[:-1] if cov_got.shape == (d + 1, d + 1) else cov_got,
            theta_cov.ravel()[:-1],
            rtol=1e-3,
            atol=1e-5,
        ),
        evidence.allclose(
            "Var[log sigma^2] = trigamma(a_n)",
            cond,
            cov_got[-1, -1] if cov_got.shape == (d + 1, d + 1) else cov_got,
            theta_cov[d, d],
            rtol=1e-3,
            atol=1e-5 + extra_var,
        ),
        evidence.allclose("E[sigma^2]", cond, mom.sigma2_mean, ig.mean(), rtol=1e-4, atol=0.0),
        evidence.record(
            "Var[sigma^2]",
            cond,
            {"got": float(mom.sigma2_var), "scipy": var_ref},
            None,
            bool(np.isinf(mom.sigma2_var))
            if np.isinf(var_ref)
            else float(mom.sigma2_var) == pytest.approx(var_ref, rel=1e-3),
        ),
        evidence.allclose(
            "log_posterior", cond, log_post, log_post_ref, rtol=1e-4, atol=1e-3 + extra_lp
        ),
    ]
    assert all(ok)


@pytest.mark.claims("exact-nig-posterior", "posterior-mean-by-qr", "posterior-chol-is-r")
@pytest.mark.claims("posterior-shape", "posterior-rate")
@pytest.mark.parametrize("seed,n,d,rho", CASES)
def test_closed_form_equals_sequential_updates(seed, n, d, rho, evidence):
    """The float32 closed-form m_n, Lambda_n, a_n and b_n match a float64 one-observation-at-a-time
    loop, 2 designs."""
    ds = data.make_dataset(jax.random.key(seed), n, d, rho, 0.7)
    prior = model.make_prior(d, 1.5, 2.0, 1.0)
    post = model.exact_posterior(ds.x, ds.y, prior)
    mean, prec, a, b = sequential_posterior(ds.x, ds.y, 1.5, 2.0, 1.0)
    cond = f"seed={seed} n={n} d={d} rho={rho}, float32 closed form vs float64 loop"
    ok = [
        evidence.allclose("posterior mean m_n", cond, post.mean, mean, rtol=5e-5, atol=5e-5),
        evidence.allclose(
            "posterior precision Lambda_n", cond, model.precision(post), prec, rtol=2e-4, atol=2e-4
        ),
        evidence.allclose("a_n", cond, post.shape, a, rtol=1e-6, atol=0.0),
        evidence.allclose("b_n", cond, post.rate, b, rtol=2e-4, atol=0.0),
    ]
    assert all(ok)


@pytest.mark.claims("exact-nig-posterior")
@pytest.mark.parametrize("seed,a0,b0", [(2, 3.0, 2.0), (3, 1.5, 0.5)])
def test_two_parameter_grid_integration(seed, a0, b0, evidence, elementwise_extra):
    """The log evidence and posterior moments match a 1500 x 1500 grid integration, for d = 1.

    d = 1: integrate the float64 density over a 1500 x 1500 grid of (w, log sigma^2). The
    log evidence and E[log sigma^2] add the backend's `elementwise_extra` to their `atol`,
    with weights from the float64 sequential posterior: the log evidence's `log |R_11|`
    (1), `log s` (d = 1), `log b0` (a0), `log b_n` (a_n), `gammaln(a_n)` and `gammaln(a0)`
    (1 each); `E[log sigma^2] = log b_n - digamma(a_n)` (1 each)."""
    n, scale = 15, 2.0
    ds = data.make_dataset(jax.random.key(seed), n, 1, 0.0, 0.8)
    x, y = np.asarray(ds.x, np.float64), np.asarray(ds.y, np.float64)
    prior = model.make_prior(1, scale, a0, b0)
    post = model.exact_posterior(ds.x, ds.y, prior)
    mom = model.moments(post)
    # Grid centred on a float64 least-squares fit, wide enough for the tails.
    w_hat = np.linalg.lstsq(x, y, rcond=None)[0][0]
    w_grid = np.linspace(w_hat - 3.0, w_hat + 3.0, 1500)
    u_grid = np.linspace(-5.0, 4.0, 1500)
    W, U = np.meshgrid(w_grid, u_grid, indexing="ij")
    log_p = np_log_joint(W[..., None], U, x, y, scale, a0, b0)
    cell = (w_grid[1] - w_grid[0]) * (u_grid[1] - u_grid[0])
    peak = log_p.max()
    dens = np.exp(log_p - peak)
    total = dens.sum() * cell
    log_z = np.log(total) + peak
    p = dens * cell / total
    e_w = np.sum(p * W)
    var_w = np.sum(p * (W - e_w) ** 2)
    e_u = np.sum(p * U)
    e_s2 = np.sum(p * np.exp(U))
    cond = f"seed={seed} n={n} a0={a0} b0={b0}"
    lml = model.log_marginal_likelihood(ds.x, ds.y, prior)
    _, prec, a_n, b_n = sequential_posterior(ds.x, ds.y, scale, a0, b0)
    extra_lml = elementwise_extra(*propagation.log_evidence(prec, scale, a0, b0, a_n, b_n))
    extra_u = elementwise_extra(*propagation.log_sigma2_mean(a_n, b_n))
    ok = [
        evidence.allclose(
            "log evidence vs grid", cond, lml, log_z, rtol=0.0, atol=1e-4 + extra_lml
        ),
        evidence.allclose("E[w] vs grid", cond, post.mean[0], e_w, rtol=0.0, atol=1e-4),
        evidence.allclose("Var[w] vs grid", cond, mom.theta_cov[0, 0], var_w, rtol=1e-3, atol=0.0),
        evidence.allclose(
            "E[log sigma^2] vs grid", cond, mom.theta_mean[1], e_u, rtol=0.0, atol=1e-4 + extra_u
        ),
        evidence.allclose("E[sigma^2] vs grid", cond, mom.sigma2_mean, e_s2, rtol=1e-3, atol=0.0),
    ]
    assert all(ok)


@pytest.mark.claims("log-joint-terms", "log-joint-normalized")
@pytest.mark.parametrize("seed,d", [(4, 3), (5, 6)])
def test_log_joint_minus_log_posterior_is_the_log_evidence(seed, d, evidence, elementwise_extra):
    """log_joint - log_posterior equals the log evidence at 16 points; log_joint matches NumPy.

    Bayes' rule at 16 random points: `log p(y, theta) - log p(theta | y) = log p(y)`,
    and `log_joint` agrees with a float64 NumPy transcription of the model. Each `atol`
    (0 on a CPU) adds the backend's `elementwise_extra` at the worst of the 16 points,
    weights from float64 (the points, the data and the sequential posterior):
    `log_joint` alone (`propagation.log_joint`: `exp(u)` relative weight
    `sum(r^2)/(2 sigma^2) + sum(dw^2)/(2 s^2 sigma^2) + d/2`, `log(s^2 sigma^2)` d/2,
    `log b0` a0, `gammaln(a0)` 1, `exp(-u)` b0); the difference adds the terms of
    `log_posterior` (`exp(u)` relative weight `z^T z/(2 sigma^2)`, each `log |R_ii|` 1,
    `log b_n` a_n, `gammaln(a_n)` 1, `exp(-u)` b_n) and of the log evidence it is compared
    with (each `log |R_ii|` 1, `log s` d, `log b0` a0, `log b_n` a_n, `gammaln(a_n)` and
    `gammaln(a0)` 1). On a simulated chip whose `log` errs as a TPU v5e's does, that bound
    stays far below the effect of a log joint without its Jacobian
    (`tests/test_elementwise_bound.py`)."""
    ds = data.make_dataset(jax.random.key(seed), 40, d, 0.5, 1.2)
    prior = model.make_prior(d, 1.0, 2.5, 1.5)
    post = model.exact_posterior(ds.x, ds.y, prior)
    thetas = jax.random.normal(jax.random.key(100 + seed), (16, d + 1)) * 0.3
    thetas = thetas.at[:, :d].add(post.mean[None, :])
    lj = jax.jit(jax.vmap(lambda t: model.log_joint(t, ds.x, ds.y, prior)))(thetas)
    lp = jax.jit(jax.vmap(lambda t: model.log_posterior(t, post)))(thetas)
    lml = float(model.log_marginal_likelihood(ds.x, ds.y, prior))
    th = np.asarray(thetas, np.float64)
    ref = np_log_joint(
        th[:, :d],
        th[:, d],
        np.asarray(ds.x, np.float64),
        np.asarray(ds.y, np.float64),
        1.0,
        2.5,
        1.5,
    )
    joint, bayes = propagation.bayes_rule(th, ds.x, ds.y, 1.0, 2.5, 1.5)
    extra_lj = max(elementwise_extra(*terms) for terms in joint)
    extra_diff = max(elementwise_extra(*terms) for terms in bayes)
    cond = f"seed={seed} d={d}, 16 points"
    ok = [
        evidence.allclose("log_joint vs float64 NumPy", cond, lj, ref, rtol=2e-5, atol=extra_lj),
        evidence.allclose(
            "log_joint - log_posterior = log p(y)",
            cond,
            lj - lp,
            np.full(16, lml),
            rtol=2e-5,
            atol=extra_diff,
        ),
    ]
    assert all(ok)


@pytest.mark.claims("log-joint-terms", "log-joint-normalized")
@pytest.mark.parametrize(
    "m0",
    [None, [0.0, 1.5, 0.0], [-1.2, 0.8, 2.0]],
    ids=["zero-mean", "one-weight-shifted", "all-shifted"],
)
def test_log_joint_centres_the_weight_prior_on_its_mean(m0, evidence, elementwise_extra):
    """log_joint matches SciPy's normal, normal and inverse-gamma log densities for a prior mean
    zero, shifted in one weight, and shifted in all.

    `log N(y | X w, sigma^2 I) + log N(w | m0, sigma^2 s^2 I) + log InvGamma(sigma^2 | a0, b0)
    + log sigma^2`, each term from `scipy.stats` in float64, at 12 points spread around
    zero and around `m0`, with every other field of the prior held fixed. `atol` (0 on a
    CPU) plus the backend's `elementwise_extra` at the worst of the 12 points, through
    `log_joint`'s evaluations (`propagation.log_joint`: `exp(u)` relative weight
    `sum(r^2)/(2 sigma^2) + sum((w - m0)^2)/(2 s^2 sigma^2) + d/2`, `log(s^2 sigma^2)` d/2,
    `log b0` a0, `gammaln(a0)` 1, `exp(-u)` b0), weights from the float64 points and data."""
    d, scale, a0, b0 = 3, 0.8, 2.5, 1.5
    ds = data.make_dataset(jax.random.key(9), 20, d, 0.4, 0.9)
    mean = np.zeros(d) if m0 is None else np.asarray(m0, np.float64)
    prior = model.make_prior(d, scale, a0, b0, mean=None if m0 is None else np.float32(m0))
    rng = np.random.default_rng(9)
    w = np.concatenate([rng.normal(size=(6, d)) * 0.5, mean + rng.normal(size=(6, d)) * 0.5])
    thetas = np.concatenate([w, rng.normal(size=(12, 1)) * 0.5], 1).astype(np.float32)
    lj = jax.jit(jax.vmap(lambda t: model.log_joint(t, ds.x, ds.y, prior)))(jnp.asarray(thetas))
    x, y = np.asarray(ds.x, np.float64), np.asarray(ds.y, np.float64)
    th = thetas.astype(np.float64)
    ref = [
        stats.norm(x @ t[:d], np.exp(0.5 * t[d])).logpdf(y).sum()
        + stats.norm(mean, scale * np.exp(0.5 * t[d])).logpdf(t[:d]).sum()
        + stats.invgamma(a0, scale=b0).logpdf(np.exp(t[d]))
        + t[d]
        for t in th
    ]
    cond = f"prior mean {mean.tolist()}, scale {scale}, 12 points"
    extra = max(elementwise_extra(*propagation.log_joint(t, x, y, scale, a0, b0, mean)) for t in th)
    ok = evidence.allclose(
        "log_joint vs SciPy with prior mean", cond, lj, ref, rtol=2e-5, atol=extra
    )
    assert ok


@pytest.mark.claims("predictive-student-t")
@pytest.mark.parametrize("seed", [6, 7])
def test_predictive_variance(seed, evidence):
    """The predictive Student-t's variance, centre and df match a float64 sequential posterior.

    Student-t variance `scale^2 df/(df-2)` equals `E[sigma^2] + x^T Cov[w] x`
    computed from the float64 sequential posterior; the centre is `x m_n`."""
    ds = data.make_dataset(jax.random.key(seed), 30, 4, 0.6, 1.0)
    prior = model.make_prior(4, 1.0, 3.0, 2.0)
    post = model.exact_posterior(ds.x, ds.y, prior)
    x_new = jax.random.normal(jax.random.key(200 + seed), (5, 4))
    df, loc, scale = model.predictive(post, x_new)
    mean, prec, a, b = sequential_posterior(ds.x, ds.y, 1.0, 3.0, 2.0)
    xn = np.asarray(x_new, np.float64)
    cov_w = b / (a - 1.0) * np.linalg.inv(prec)
    var_ref = b / (a - 1.0) + np.einsum("md,de,me->m", xn, cov_w, xn)
    var = np.asarray(scale, np.float64) ** 2 * float(df) / (float(df) - 2.0)
    cond = f"seed={seed}, 5 new rows"
    ok = [
        evidence.allclose("predictive variance", cond, var, var_ref, rtol=2e-4, atol=0.0),
        evidence.allclose("predictive centre", cond, loc, xn @ mean, rtol=0.0, atol=2e-4),
        evidence.allclose("predictive df", cond, df, 2 * a, rtol=1e-6, atol=0.0),
    ]
    assert all(ok)


def _normal_equations_f32(x, y, scale):
    """The naive route, in float32: form X^T X + I/s^2 and Cholesky-solve it."""
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.float32)
    prec = x.T @ x + np.eye(x.shape[1], dtype=np.float32) / np.float32(scale**2)
    chol = np.linalg.cholesky(prec)
    return np.linalg.solve(chol.T, np.linalg.solve(chol, x.T @ y))


@pytest.mark.claims("qr-stable-on-collinear-designs", "posterior-mean-by-qr")
@pytest.mark.parametrize("rho", [1.0 - 1e-4, 1.0 - 1e-6])
def test_nearly_collinear_design_is_solved_stably(rho, evidence):
    """On nearly collinear designs the float32 QR mean is within 20 cond(R) eps32 of float64.

    Features correlated at `rho`: the float32 QR mean stays within
    `20 * cond(R) * eps32` (relative) of the float64 answer; the float32 normal
    equations, whose error grows with `cond(R)^2`, are recorded beside it."""
    d, scale = 3, 100.0
    ds = data.make_dataset(jax.random.key(8), 200, d, rho, 0.5)
    prior = model.make_prior(d, scale, 2.0, 1.0)
    post = model.exact_posterior(ds.x, ds.y, prior)
    a = np.vstack([np.asarray(ds.x, np.float64), np.eye(d) / scale])
    b = np.concatenate([np.asarray(ds.y, np.float64), np.zeros(d)])
    ref = np.linalg.lstsq(a, b, rcond=None)[0]
    conds = model.condition_numbers(ds.x, post)
    qr_err = float(np.linalg.norm(np.asarray(post.mean, np.float64) - ref) / np.linalg.norm(ref))
    ne_err = float(
        np.linalg.norm(_normal_equations_f32(ds.x, ds.y, scale) - ref) / np.linalg.norm(ref)
    )
    bound = 20.0 * conds["posterior_factor"] * float(np.finfo(np.float32).eps)
    ok = evidence.record(
        "posterior mean on a nearly collinear design",
        f"rho={rho}, n=200, d={d}, prior scale {scale}",
        {
            "cond_design": conds["design"],
            "cond_R": conds["posterior_factor"],
            "qr_relative_error": qr_err,
            "normal_equations_relative_error": ne_err,
        },
        {"qr_bound": bound},
        qr_err <= bound and np.isfinite(conds["posterior_factor"]),
    )
    assert conds["design"] > 50.0, conds  # the condition really is ill-conditioned
    assert ok, (qr_err, bound, ne_err)


COND_CASES = [  # (seed, n, d, rho, prior scale): the changed conditions
    (0, 60, 3, 0.9, 1.5),
    (8, 200, 3, 1.0 - 1e-6, 100.0),
]


@pytest.mark.claims("condition-numbers-reported")
@pytest.mark.parametrize("seed,n,d,rho,scale", COND_CASES)
def test_condition_numbers_are_those_of_x_and_of_r_not_lambda(seed, n, d, rho, scale, evidence):
    """condition_numbers reports cond(X) and cond(R), not cond(Lambda_n) = cond(R)^2.

    Rule (`model.condition_numbers`): "Condition numbers of the design `X` and of the
    factor `R` of `Lambda_n` (ratio of extreme singular values; `cond(Lambda_n) =
    cond(R)^2`)." Reference in float64 NumPy, with no factorization of the code under
    test: `R^T R = Lambda_n = A^T A` for the stacked `A = [X; I / s]`, so the singular
    values of `R` are those of `A`, and `cond(R) = numpy.linalg.cond(A)`. Changed
    condition: a well-conditioned design (cond(R) ~ 5) and a nearly collinear one
    (rho = 1 - 1e-6, cond(R) ~ 1.5e3). Tolerance: the float32 QR factor is the exact one
    of `A + dA` with `|dA| <~ n eps32 |A|`, which moves the extreme singular values by at
    most `|dA|`: a relative error of `n cond(R) eps32` (and `n cond(X) eps32` for the
    design's float32 SVD), ample for rounding; reporting cond(R)^2 is off by a factor
    cond(R), 5 to 1.5e3."""
    ds = data.make_dataset(jax.random.key(seed), n, d, rho, 0.5)
    prior = model.make_prior(d, scale, 2.0, 1.0)
    post = model.exact_posterior(ds.x, ds.y, prior)
    x64 = np.asarray(ds.x, np.float64)
    stacked = np.vstack([x64, np.eye(d) / scale])
    cond_x, cond_r = float(np.linalg.cond(x64)), float(np.linalg.cond(stacked))
    conds = model.condition_numbers(ds.x, post)
    eps32 = float(np.finfo(np.float32).eps)
    cond = f"seed={seed} n={n} d={d} rho={rho} prior scale {scale}, vs float64 cond([X; I/s])"
    ok = [
        evidence.allclose(
            "cond(X)", cond, conds["design"], cond_x, rtol=n * cond_x * eps32, atol=0.0
        ),
        evidence.allclose(
            "cond(R), R^T R = Lambda_n",
            cond,
            conds["posterior_factor"],
            cond_r,
            rtol=n * cond_r * eps32,
            atol=0.0,
        ),
    ]
    assert all(ok), (conds, cond_x, cond_r)


def test_bad_inputs_are_clear_errors():
    """Bad prior values, non-finite or mis-shaped data and bad config fields are refused, naming the
    value."""
    with pytest.raises(model.ModelError, match=r"prior scale must be a positive.*`-1.0`"):
        model.make_prior(2, -1.0, 2.0, 1.0)
    with pytest.raises(model.ModelError, match=r"prior rate b0.*`0.0`"):
        model.make_prior(2, 1.0, 2.0, 0.0)
    with pytest.raises(model.ModelError, match=r"prior shape a0.*`nan`"):
        model.make_prior(2, 1.0, float("nan"), 1.0)
    x = np.ones((5, 2))
    x[3, 1] = np.nan
    with pytest.raises(data.DataError, match=r"`1` non-finite values.*`\(3, 1\)`"):
        data.validate(x, np.ones(5))
    with pytest.raises(data.DataError, match=r"`5` rows but there are `4` targets"):
        data.validate(np.ones((5, 2)), np.ones(4))
    with pytest.raises(data.DataError, match=r"shape `\(n, d\)`"):
        data.validate(np.ones(5), np.ones(5))
    with pytest.raises(ConfigError, match=r"`prior_scale`"):
        Config.from_json('{"prior_scale": 0.0}')
    with pytest.raises(ConfigError, match=r"`prior_shape`"):
        Config.from_json('{"prior_shape": -2.0}')
    x_ok, y_ok = data.validate(np.ones((5, 2)), np.arange(5.0))
    assert x_ok.dtype == jnp.float32 and y_ok.shape == (5,)


def _refusal_inputs():
    """Small valid inputs built in NumPy: `x` `(12, 2)` and `y` `(12,)` float32, and priors for
    2 and for 1 feature."""
    t = np.arange(12.0)
    x = np.stack([np.sin(t), np.cos(0.7 * t)], axis=1).astype(np.float32)
    y = (x @ np.array([1.0, -0.5]) + 0.1 * np.sin(3.0 * t)).astype(np.float32)
    return x, y, model.make_prior(2, 1.5, 2.0, 1.0), model.make_prior(1, 1.5, 2.0, 1.0)


def _with(a, index, value):
    out = np.array(a)
    out[index] = value
    return out


# id -> (refused arguments, accepted neighbour, error type, what the message must say), each
# from `_refusal_inputs()`. A neighbour differs from its refused input in the one respect
# checked: one axis more or less, one row more or less, the dtype, one entry finite again
# (a large one, so the check is on finiteness, not size), a `Prior` rather than a plain
# tuple of the same fields.
REFUSALS = {
    "x 1-D": lambda x, y, p, p1: (
        (x[:, 0], y, p1),
        (x[:, :1], y, p1),
        data.DataError,
        r"`x` must have 2 dimensions, but it has shape `\(12,\)`",
    ),
    "x 3-D": lambda x, y, p, p1: (
        (x[None], y, p),
        (x, y, p),
        data.DataError,
        r"`x` must have 2 dimensions, but it has shape `\(1, 12, 2\)`",
    ),
    "y 2-D": lambda x, y, p, p1: (
        (x, y[:, None], p),
        (x, y, p),
        data.DataError,
        r"`y` must have 1 dimensions, but it has shape `\(12, 1\)`",
    ),
    "y one target too many": lambda x, y, p, p1: (
        (x, np.append(y, np.float32(0.5)), p),
        (x, y, p),
        data.DataError,
        r"`y` must have shape `\(12,\)`, but it has shape `\(13,\)`",
    ),
    "y one target too few": lambda x, y, p, p1: (
        (x, y[:-1], p),
        (x[:-1], y[:-1], p),
        data.DataError,
        r"`y` must have shape `\(12,\)`, but it has shape `\(11,\)`",
    ),
    "x int32": lambda x, y, p, p1: (
        (np.round(3 * x).astype(np.int32), y, p),
        (np.round(3 * x).astype(np.float32), y, p),
        data.DataError,
        r"`x` must be a floating-point array, but its dtype is `int32`",
    ),
    "y int32": lambda x, y, p, p1: (
        (x, np.round(3 * y).astype(np.int32), p),
        (x, np.round(3 * y).astype(np.float32), p),
        data.DataError,
        r"`y` must be a floating-point array, but its dtype is `int32`",
    ),
    "y complex64": lambda x, y, p, p1: (
        (x, y.astype(np.complex64), p),
        (x, y, p),
        data.DataError,
        r"`y` must be a floating-point array, but its dtype is `complex64`",
    ),
    "x no rows": lambda x, y, p, p1: (
        (x[:0], y[:0], p),
        (x[:1], y[:1], p),
        data.DataError,
        r"`x` is empty \(shape `\(0, 2\)`\)",
    ),
    "x no columns": lambda x, y, p, p1: (
        (x[:, :0], y, p1),
        (x[:, :1], y, p1),
        data.DataError,
        r"`x` is empty \(shape `\(12, 0\)`\)",
    ),
    "x NaN": lambda x, y, p, p1: (
        (_with(x, (3, 1), np.nan), y, p),
        (_with(x, (3, 1), 0.0), y, p),
        data.DataError,
        r"`x` holds `1` non-finite values \(NaN or inf\), the first at index `\(3, 1\)`",
    ),
    "x inf": lambda x, y, p, p1: (
        (_with(x, (7, 0), np.inf), y, p),
        (_with(x, (7, 0), 1e6), y, p),
        data.DataError,
        r"`x` holds `1` non-finite values \(NaN or inf\), the first at index `\(7, 0\)`",
    ),
    "y -inf": lambda x, y, p, p1: (
        (x, _with(y, 5, -np.inf), p),
        (x, _with(y, 5, -1e6), p),
        data.DataError,
        r"`y` holds `1` non-finite values \(NaN or inf\), the first at index `\(5,\)`",
    ),
    "y NaN": lambda x, y, p, p1: (
        (x, _with(y, 0, np.nan), p),
        (x, _with(y, 0, 0.0), p),
        data.DataError,
        r"`y` holds `1` non-finite values \(NaN or inf\), the first at index `\(0,\)`",
    ),
    "prior mean for another width": lambda x, y, p, p1: (
        (x, y, p1),
        (x, y, p),
        model.ModelError,
        r"`prior.mean` must have shape `\(2,\)`, but it has shape `\(1,\)`",
    ),
    "prior scale 0 built by hand": lambda x, y, p, p1: (
        (x, y, p._replace(scale=0.0)),
        (x, y, p._replace(scale=1e-3)),
        model.ModelError,
        r"`prior.scale` must be a finite number in `\(0.0, inf\)`, but it is `0.0`",
    ),
    "prior rate NaN built by hand": lambda x, y, p, p1: (
        (x, y, p._replace(rate=float("nan"))),
        (x, y, p._replace(rate=1e-3)),
        model.ModelError,
        r"`prior.rate` must be a finite number in `\(0.0, inf\)`, but it is `nan`",
    ),
    "prior a plain tuple": lambda x, y, p, p1: (
        (x, y, tuple(p)),
        (x, y, model.Prior(*tuple(p))),
        model.ModelError,
        r"`prior` must be a `Prior` \(see `make_prior`\), not `<class 'tuple'>`",
    ),
}


@pytest.mark.claims("exact-posterior-refuses-bad-input")
@pytest.mark.parametrize("case", list(REFUSALS))
def test_exact_posterior_refuses_bad_input(case, evidence):
    """exact_posterior raises the documented error, naming the argument and the problem, for a
    wrong shape, a wrong dtype, an empty design, a NaN or inf, a prior that is not a `Prior` or
    does not fit (a mean for another width, a scale or rate out of range built by hand); the
    input just beside each is accepted.

    Rule (`model.exact_posterior`): "Raises `DataError` for a design or targets of the wrong
    shape or dtype, empty or holding NaN or inf; `ModelError` for a prior that does not fit
    them." Each refused input has a neighbour that differs only in the respect checked, and
    that neighbour must give a finite posterior of the right shapes: a check that refused
    too much (every integer array, every large value) fails there."""
    x, y, prior, prior1 = _refusal_inputs()
    refused, accepted, error, message = REFUSALS[case](x, y, prior, prior1)
    with pytest.raises(error, match=message) as info:
        model.exact_posterior(*refused)
    post = model.exact_posterior(*accepted)
    d = np.shape(accepted[0])[1]
    fields = [np.asarray(f) for f in post]
    neighbour_ok = (
        isinstance(post, model.Posterior)
        and fields[0].shape == (d,)
        and fields[1].shape == (d, d)
        and all(np.all(np.isfinite(f)) for f in fields)
    )
    assert evidence.record(
        "exact_posterior refuses bad input, accepts its neighbour",
        case,
        {"error": type(info.value).__name__, "message": str(info.value), "neighbour": neighbour_ok},
        {"error": error.__name__, "message": message},
        neighbour_ok,
    ), post
