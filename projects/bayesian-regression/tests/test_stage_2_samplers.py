"""Stage 2: hand-built HMC and VI, judged against the exact posterior.

Independent checks:
  - leapfrog: reversibility, and second-order global error against the exact
    flow of a harmonic oscillator (slope of log error vs log step);
  - dual averaging: the step size it settles on against the closed-form one
    for an acceptance curve `exp(-eps)`;
  - HMC: sample means and covariances against the exact NIG moments, as
    z-scores with batch-means Monte-Carlo standard errors (fixed keys, so
    every z-score is a deterministic number);
  - ELBO: the Monte-Carlo estimator against the closed-form `-KL` of two
    Gaussians; VI fits against the exact posterior and the exact evidence.
Changed conditions: a second data set (uncorrelated design, other seed); a
non-unit mass matrix; a deliberately too-large step size (divergences).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bayesian_regression import hmc, train, vi
from bayesian_regression.config import Config

Z_LIMIT = 4.0
CORRELATED = Config.tiny()
UNCORRELATED = Config.tiny().replace(feature_correlation=0.0, data_seed=1)


@pytest.fixture(scope="module")
def problems():
    return {
        "correlated": train.make_problem(CORRELATED),
        "uncorrelated": train.make_problem(UNCORRELATED),
    }


@pytest.fixture(scope="module")
def hmc_runs(problems):
    return {
        name: train.sample_hmc(CORRELATED, p, jax.random.key(CORRELATED.seed))
        for name, p in problems.items()
    }


def _oscillator(a_diag):
    return lambda q, data=None: -0.5 * jnp.sum(a_diag * q**2)


@pytest.mark.parametrize("inv_mass", [(1.0, 1.0, 1.0), (0.5, 2.0, 1.5)])
def test_leapfrog_is_reversible_and_second_order(inv_mass, evidence):
    """Leapfrog's error against an oscillator's exact flow falls with slope 2 in the step, and it
    reverses to 1e-5."""
    a_diag = jnp.array([1.0, 4.0, 0.25])
    inv_m = jnp.array(inv_mass)
    target = _oscillator(a_diag)
    q0, p0 = jnp.array([1.0, -0.5, 2.0]), jnp.array([0.3, 1.0, -0.7])
    g0 = jax.grad(target)(q0)
    # Exact flow of H = q^T A q / 2 + p^T M^-1 p / 2: omega = sqrt(A M^-1).
    omega = np.sqrt(np.asarray(a_diag) * np.asarray(inv_m))
    horizon = 1.0
    exact_q = np.asarray(q0) * np.cos(omega * horizon) + np.asarray(inv_m) * np.asarray(
        p0
    ) / omega * np.sin(omega * horizon)
    errors = []
    steps_list = [10, 20, 40]
    for steps in steps_list:
        q, p, _, g = hmc.leapfrog(target, q0, p0, g0, jnp.float32(horizon / steps), inv_m, steps)
        errors.append(float(np.max(np.abs(np.asarray(q, np.float64) - exact_q))))
    slope = float(np.polyfit(np.log([horizon / s for s in steps_list]), np.log(errors), 1)[0])
    q1, p1, _, g1 = hmc.leapfrog(target, q0, p0, g0, jnp.float32(0.1), inv_m, 10)
    q2, p2, _, _ = hmc.leapfrog(target, q1, -p1, g1, jnp.float32(0.1), inv_m, 10)
    cond = f"oscillator A=diag(1,4,1/4), inv_mass={inv_mass}"
    ok = [
        evidence.record(
            "leapfrog global error order",
            cond,
            {"errors": errors, "slope": slope},
            {"slope": [1.8, 2.2]},
            1.8 <= slope <= 2.2,
        ),
        evidence.allclose("reversibility: position", cond, q2, q0, rtol=0.0, atol=1e-5),
        evidence.allclose("reversibility: momentum", cond, -p2, p0, rtol=0.0, atol=1e-5),
    ]
    assert all(ok)


@pytest.mark.parametrize("target", [0.8, 0.6])
def test_dual_averaging_finds_the_step_for_the_target(target, evidence):
    """Dual averaging settles within 2% of the closed-form step for acceptance exp(-eps).

    With acceptance `exp(-eps)`, the step giving `target` is `-log(target)`."""
    da = hmc.dual_averaging_init(jnp.float32(1.0))

    def body(da, _):
        accept = jnp.exp(-jnp.exp(da.log_step))
        return hmc.dual_averaging_update(da, accept, target), None

    da, _ = jax.lax.scan(body, da, None, length=3000)
    assert evidence.allclose(
        "dual-averaging step size",
        f"acceptance exp(-eps), target {target}",
        jnp.exp(da.log_step_avg),
        -np.log(target),
        rtol=0.02,
        atol=0.0,
    )


@pytest.mark.parametrize("step0", [1.0, 0.05])
def test_dual_averaging_update_is_hoffman_gelman_algorithm_5(step0, evidence):
    """Every iterate of `dual_averaging_update` is Algorithm 5 of Hoffman & Gelman (2014),
    written out here in float64 with the paper's constants (gamma 0.05, t0 10, kappa 0.75,
    mu = log(10 eps_0), log eps_bar_0 = 0, H_bar_0 = 0).

    The settling test above only sees the end point, which any weighting that still
    converges reaches; here the first 25 iterates are compared one by one, over an
    acceptance sequence that swings both sides of the target, for two initial steps."""
    target = 0.8
    accepts = 0.5 + 0.45 * np.sin(np.arange(25) * 1.3)
    da = hmc.dual_averaging_init(jnp.float32(step0))
    mu, h_bar, log_avg = np.log(10.0 * step0), 0.0, 0.0
    got, want = [], []
    for m, a in enumerate(accepts, start=1):
        da = hmc.dual_averaging_update(da, jnp.float32(a), target)
        h_bar = (1.0 - 1.0 / (m + 10.0)) * h_bar + (target - a) / (m + 10.0)
        log_step = mu - np.sqrt(m) / 0.05 * h_bar
        eta = m**-0.75
        log_avg = eta * log_step + (1.0 - eta) * log_avg
        got.append([float(da.log_step), float(da.log_step_avg), float(da.h_bar)])
        want.append([log_step, log_avg, h_bar])
    assert evidence.allclose(
        "dual averaging iterates vs Algorithm 5 (log step, log step avg, H bar)",
        f"initial step {step0}, target {target}, 25 swinging acceptances",
        np.array(got),
        np.array(want),
        rtol=1e-4,
        atol=1e-5,
    )


def _scale_from_raw(raw: np.ndarray) -> np.ndarray:
    """The documented parametrization (VIParams): log scales on the diagonal, the
    strict lower triangle as is (full rank), or a diagonal of log scales (mean field)."""
    if raw.ndim == 1:
        return np.diag(np.exp(raw))
    return np.tril(raw, -1) + np.diag(np.exp(np.diag(raw)))


@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
@pytest.mark.parametrize("log_scale", [-2.3, 0.0, 1.5])
@pytest.mark.parametrize("dim", [1, 4])
def test_entropy_matches_scipy_on_both_signs_of_log_det(family, log_scale, dim, evidence):
    """`vi.entropy` equals SciPy's Gaussian entropy of `N(loc, L L^T)`, with `L` built
    in NumPy from the documented parametrization.

    Scales below, at and above 1 put `log |det L|` on both sides of 0 and of the
    constant `d/2 (1 + log 2 pi)`, in one and four dimensions, with a non-zero
    lower triangle in the full-rank family: the ELBO test alone starts every
    scale at 0.1, where some wrong combinations of the two terms agree."""
    rng = np.random.default_rng(100 + dim)
    loc = rng.normal(size=dim)
    if family == "meanfield":
        raw = log_scale + 0.2 * rng.normal(size=dim)
    else:
        raw = np.tril(0.5 * rng.normal(size=(dim, dim)), -1) + np.diag(
            log_scale + 0.2 * rng.normal(size=dim)
        )
    params = vi.VIParams(jnp.asarray(loc, jnp.float32), jnp.asarray(raw, jnp.float32))
    scale = _scale_from_raw(np.asarray(params.raw_scale, np.float64))
    exact = stats.multivariate_normal(loc, scale @ scale.T).entropy()
    assert evidence.allclose(
        "q entropy vs scipy.stats.multivariate_normal",
        f"{family}, d = {dim}, log scales near {log_scale}",
        vi.entropy(params),
        exact,
        rtol=0.0,
        atol=1e-4 * dim,
    )


@pytest.mark.parametrize("offset", [0, 3])
@pytest.mark.parametrize("n", [7, 20])
def test_welford_window_matches_numpy_and_stan_shrinkage(n, offset, evidence):
    """The masked Welford update over a window of `n` draws gives NumPy's mean and `ddof=1`
    variance of exactly those draws, and the regularized variance is Stan's shrinkage.

    Stan's reference manual (windowed adaptation) shrinks the window's sample
    variance towards 1e-3 with weight `n / (n + 5)`; `_regularized_variance`'s
    docstring states the same target. Draws before and after the window are fed
    with the mask off, so the mask is tested on both sides of two offsets; a
    non-zero mean and scales 0.1, 1, 10 per dimension make a ddof or an old/new
    mean mix-up show at every dimension. Two window lengths tell `n` from `n + 5`."""
    rng = np.random.default_rng(20240 + 100 * n + offset)
    total = offset + n + 4
    draws = np.array([3.0, -2.0, 0.5]) + np.array([0.1, 1.0, 10.0]) * rng.standard_normal(
        (total, 3)
    )
    draws = draws.astype(np.float32)
    zeros = jnp.zeros((3,), jnp.float32)
    w = hmc._Welford(zeros, zeros, jnp.zeros((), jnp.float32))
    for t in range(total):
        w = hmc._welford_update(w, jnp.asarray(draws[t]), jnp.asarray(offset <= t < offset + n))
    # The reference: NumPy over exactly the window's draws, in float64.
    window = draws[offset : offset + n].astype(np.float64)
    mean = np.mean(window, axis=0)
    var = np.var(window, axis=0, ddof=1)
    stan = n / (n + 5.0) * var + 1e-3 * 5.0 / (n + 5.0)
    cond = f"window of {n} draws at offset {offset} in {total}, scales (0.1, 1, 10)"
    ok = [
        evidence.record(
            "Welford count", cond, {"count": float(w.count)}, {"exact": n}, float(w.count) == n
        ),
        evidence.allclose("Welford mean", cond, w.mean, mean, rtol=1e-5, atol=1e-6),
        evidence.allclose(
            "Welford variance vs np.var(ddof=1)",
            cond,
            w.m2 / (n - 1.0),
            var,
            rtol=1e-4,
            atol=0.0,
        ),
        evidence.allclose(
            "regularized variance vs Stan's shrinkage",
            cond,
            hmc._regularized_variance(w),
            stan,
            rtol=1e-4,
            atol=0.0,
        ),
    ]
    assert all(ok), [r for r in evidence.records[-4:] if not r["passed"]]


@pytest.mark.parametrize("name", ["correlated", "uncorrelated"])
def test_hmc_moments_match_the_exact_posterior(name, problems, hmc_runs, evidence):
    """HMC means and covariances are within 4 Monte-Carlo standard errors of the exact NIG moments,
    no divergences."""
    samples = hmc_runs[name]
    z = train.moment_zscores(samples.positions, problems[name].moments)
    cond = f"{name} design, {CORRELATED.num_chains} x {CORRELATED.num_samples} draws, 4 batches"
    ok = evidence.record(
        "HMC means and covariances vs exact (z-scores)",
        cond,
        {
            "mean_z": z["mean_z"],
            "cov_z": z["cov_z"],
            "max_abs_z": z["max_abs_z"],
            "divergent": int(jnp.sum(samples.is_divergent)),
            "mean_accept": float(jnp.mean(samples.accept_prob)),
        },
        {"max_abs_z": Z_LIMIT},
        z["max_abs_z"] < Z_LIMIT,
    )
    assert ok, z
    assert int(jnp.sum(samples.is_divergent)) == 0


@pytest.mark.parametrize("name", ["correlated", "uncorrelated"])
def test_adapted_mass_matrix_is_the_posterior_variance(name, problems, hmc_runs, evidence):
    """Every chain's adapted inverse mass (a 75-draw window) is within 3x of the exact variance."""
    ratio = (
        np.asarray(hmc_runs[name].inv_mass)
        / np.diag(np.asarray(problems[name].moments.theta_cov))[None, :]
    )
    assert evidence.record(
        "adapted inverse mass / exact variance",
        f"{name} design, every chain",
        {"min": float(ratio.min()), "max": float(ratio.max())},
        {"range": [1 / 3, 3.0]},
        bool(np.all((ratio > 1 / 3) & (ratio < 3.0))),
    ), ratio


def test_too_large_step_size_diverges(problems, hmc_runs, evidence):
    """At 3x the adapted step at least 10% of transitions diverge and are counted; none at 1x.

    Three times the adapted step leaves the leapfrog stability region of the
    stiffest direction: transitions diverge and are counted."""
    key = jax.random.key(CORRELATED.seed)
    big = train.sample_hmc(CORRELATED, problems["correlated"], key, step_size_factor=3.0)
    base = hmc_runs["correlated"]
    total = big.is_divergent.size
    observed = {
        "divergent_at_1x": int(jnp.sum(base.is_divergent)),
        "divergent_at_3x": int(jnp.sum(big.is_divergent)),
        "transitions": total,
        "accept_at_1x": float(jnp.mean(base.accept_prob)),
        "accept_at_3x": float(jnp.mean(big.accept_prob)),
    }
    ok = evidence.record(
        "divergences at 3x the adapted step size",
        "correlated design",
        observed,
        {"divergent_at_1x": 0, "divergent_fraction_at_3x_min": 0.1},
        observed["divergent_at_1x"] == 0 and observed["divergent_at_3x"] >= 0.1 * total,
    )
    assert ok, observed


def test_same_key_same_bits(problems, hmc_runs):
    """HMC with the same key gives bit-equal draws; another key gives other draws."""
    key = jax.random.key(CORRELATED.seed)
    again = train.sample_hmc(CORRELATED, problems["correlated"], key)
    other = train.sample_hmc(
        CORRELATED, problems["correlated"], jax.random.key(CORRELATED.seed + 1)
    )
    np.testing.assert_array_equal(
        np.asarray(again.positions), np.asarray(hmc_runs["correlated"].positions)
    )
    assert not np.array_equal(np.asarray(other.positions), np.asarray(again.positions))


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


@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
def test_elbo_estimator_matches_closed_form_on_a_gaussian(family, evidence):
    """The Monte-Carlo ELBO is within 4 standard errors of the exact -KL on a Gaussian target.

    Target: normalized `N(mu, Sigma)`, so `ELBO = -KL(q || p)` exactly."""
    mu = np.array([0.5, -1.0, 2.0])
    sigma = np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.3], [0.2, -0.3, 0.5]])
    log_norm = -0.5 * (3 * np.log(2 * np.pi) + np.linalg.slogdet(sigma)[1])
    inv = jnp.asarray(np.linalg.inv(sigma), jnp.float32)

    def target(theta, data):
        del data
        diff = theta - jnp.asarray(mu, jnp.float32)
        return jnp.float32(log_norm) - 0.5 * diff @ inv @ diff

    key_init, key_mc = jax.random.split(jax.random.key(7))
    params = vi.init_params(3, family)
    noise = 0.3 * jax.random.normal(key_init, params.raw_scale.shape)
    params = params._replace(loc=jnp.array([0.2, -0.5, 1.5]), raw_scale=params.raw_scale + noise)
    num_mc = 40_000
    estimate = float(
        jax.jit(vi.elbo, static_argnums=(2, 4))(
            params, jax.random.clone(key_mc), target, None, num_mc
        )
    )
    m_q, c_q = (np.asarray(a, np.float64) for a in vi.mean_and_cov(params))
    exact = -_gaussian_kl(m_q, c_q, mu, sigma)
    # Standard error of the Monte-Carlo average, from the same draws, computed here.
    eps = jax.random.normal(jax.random.clone(key_mc), (num_mc, 3))
    draws = np.asarray(m_q[None, :] + np.asarray(eps) @ np.linalg.cholesky(c_q).T)
    diff = draws - mu
    log_p = log_norm - 0.5 * np.einsum("md,de,me->m", diff, np.linalg.inv(sigma), diff)
    se = float(np.std(log_p) / np.sqrt(num_mc))
    z = (estimate - exact) / se
    assert evidence.record(
        "Monte-Carlo ELBO vs closed-form -KL",
        f"{family}, Gaussian target, {num_mc} draws",
        {"estimate": estimate, "exact": exact, "se": se, "z": z},
        {"abs_z": Z_LIMIT},
        abs(z) < Z_LIMIT,
    ), (estimate, exact, se)


@pytest.fixture(scope="module")
def vi_fits(problems):
    out = {}
    for name, problem in problems.items():
        for family in ("meanfield", "fullrank"):
            key_fit, key_eval = jax.random.split(jax.random.key(11))
            result = train.fit_vi(CORRELATED, problem, key_fit, family)
            out[name, family] = train.vi_summary(result, problem, key_eval)
    return out


@pytest.mark.parametrize("name", ["correlated", "uncorrelated"])
def test_fullrank_vi_recovers_the_exact_posterior(name, vi_fits, problems, evidence):
    """Full-rank VI's mean is within 0.1 sd and variances within 15% of the exact posterior, KL
    under 0.05."""
    s = vi_fits[name, "fullrank"]
    observed = {
        "mean_error_in_sd": s["mean_error_in_sd"],
        "var_ratio": s["var_ratio"],
        "kl": s["kl"],
        "elbo": s["elbo"],
        "log_evidence": problems[name].log_evidence,
    }
    ok = evidence.record(
        "full-rank VI vs exact",
        f"{name} design",
        observed,
        {"abs_mean_error_in_sd": 0.1, "var_ratio": [0.85, 1.15], "kl": [-0.01, 0.05]},
        bool(
            np.all(np.abs(s["mean_error_in_sd"]) < 0.1)
            and np.all((s["var_ratio"] > 0.85) & (s["var_ratio"] < 1.15))
            and -0.01 < s["kl"] < 0.05
        ),
    )
    assert ok, observed


@pytest.mark.parametrize("name", ["correlated", "uncorrelated"])
def test_meanfield_vi_loses_the_predicted_variance(name, vi_fits, problems, evidence):
    """Mean-field VI's variance ratios and KL gap match their Gaussian predictions, 2 designs.

    Mean-field variances are the conditional ones, `1 / (Sigma^-1)_ii`; the KL it
    pays is `(sum log Lambda_ii - log det Lambda) / 2` for a Gaussian target."""
    s = vi_fits[name, "meanfield"]
    moments = problems[name].moments
    exact_var = np.diag(np.asarray(moments.theta_cov, np.float64))
    predicted = train.mean_field_variance_prediction(moments) / exact_var
    prec = np.linalg.inv(np.asarray(moments.theta_cov, np.float64))
    kl_gap_predicted = 0.5 * (np.sum(np.log(np.diag(prec))) - np.linalg.slogdet(prec)[1])
    kl_gap = s["kl"] - vi_fits[name, "fullrank"]["kl"]
    observed = {
        "var_ratio": s["var_ratio"],
        "predicted_var_ratio": predicted,
        "kl_meanfield": s["kl"],
        "kl_gap_vs_fullrank": kl_gap,
        "kl_gap_predicted": kl_gap_predicted,
    }
    ok = evidence.record(
        "mean-field variance loss vs prediction",
        f"{name} design",
        observed,
        {"var_ratio_over_predicted": [0.85, 1.15], "kl_gap_abs": 0.05, "kl_gap_rel": 0.15},
        bool(
            np.all(np.abs(s["var_ratio"] / predicted - 1.0) < 0.15)
            and abs(kl_gap - kl_gap_predicted) < 0.05 + 0.15 * kl_gap_predicted
        ),
    )
    assert ok, observed
