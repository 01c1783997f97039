"""Stage 2: hand-built HMC and VI, judged against the exact posterior.

Independent checks:
  - leapfrog: reversibility, and second-order global error against the exact
    flow of a harmonic oscillator (slope of log error vs log step);
  - dual averaging: the step size it settles on against the closed-form one
    for an acceptance curve `exp(-eps)`;
  - HMC: sample means and covariances against the exact NIG moments, as
    z-scores over 64 independent chains (Student-t), with the chains' mixing
    times; the accept/reject rule at u = 0 on a proposal of probability 0 and 1;
  - ELBO: the Monte-Carlo estimator against the closed-form `-KL` of two
    Gaussians; VI fits against the exact posterior and the exact evidence.
Changed conditions: a second data set (uncorrelated design, other seed); a
non-unit mass matrix; a deliberately too-large step size (divergences).
Each statistical test states its size and power; the limits are in `stat_checks`.
Another backend (a TPU's exp and log round differently from a CPU's) sends a chain
along another path after a few hundred steps, as another key or a rewrite of the
learner's arithmetic does: what bounds a statistical test's chance of failing correct
code there is its size over keys and rewrites, stated in its docstring, not the bits of
the test key. Deterministic comparisons whose figures pass through exp, log, a square root
or a power add to their float32 `atol` the backend's `elementwise_extra` (conftest; 0 on a
CPU): those functions' extra error on the running backend, propagated through the
evaluations each figure is made of (`propagation.py`); matrix products run in float32 on
every backend (conftest).
"""

import jax
import jax.numpy as jnp
import numpy as np
import propagation
import pytest
from scipy import stats
from stat_checks import (
    ELBO_NUM_MC,
    ELBO_Z_LIMIT,
    SIZE,
    VI_LIMITS,
    elbo_z,
    mixing_times,
    moment_z_vector,
    sidak_limit,
    vi_statistics,
)

from bayesian_regression import hmc, train, vi
from bayesian_regression.config import Config

# HMC runs of the stage: 64 chains x 250 draws after 300 warm-up iterations. Chains are
# independent replications (own key, own start, own adaptation), so the z-score of a
# moment over the 64 chain means is Student-t with 63 dof, without any assumption on
# the autocorrelation within a chain. (An earlier sweep, not kept, reported z-scores from
# batches cut from 16 longer chains spread up to 10% wider than t: their batches share a
# chain's adaptation.)
CORRELATED = Config.tiny().replace(num_chains=64, num_samples=250)
UNCORRELATED = CORRELATED.replace(feature_correlation=0.0, data_seed=1)
DIM = CORRELATED.num_features + 1
Z_PER_DESIGN = DIM + DIM * (DIM + 1) // 2  # 4 means and 10 covariances
Z_DOF = CORRELATED.num_chains - 1
# The moments test bounds 36 figures over both designs: 28 z-scores and 8 mixing times.
MOMENTS_FIGURES = 2 * (Z_PER_DESIGN + DIM)
Z_LIMIT = sidak_limit(MOMENTS_FIGURES, Z_DOF)  # 5.15
# Mixing: n Var(chain means) / Var_exact estimates a mean's integrated autocorrelation time
# tau, as tau chi2_63 / 63. A working HMC (8 leapfrog steps) keeps tau <= TAU_MAX = 3 (an
# ESS of at least a third of the draws; this run's are 0.8 to 1.8); the limit is that
# bound's upper quantile, Sidak as above. Chains that barely move have tau in the hundreds.
TAU_MAX = 3.0
MIX_LIMIT = TAU_MAX * float(
    stats.chi2.isf(1.0 - (1.0 - SIZE) ** (1.0 / MOMENTS_FIGURES), Z_DOF) / Z_DOF
)  # 6.08
# A divergent transition is rejected (no bias), and rare at the adapted step (none in this
# run; the recorded sweep had 1 of 3,584 runs with one and none with two).
MAX_DIVERGENT_AT_1X = 1


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


@pytest.mark.claims("leapfrog-second-order-reversible", "leapfrog-kick-by-log-density-gradient")
@pytest.mark.claims("leapfrog-returns-end-density")
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


@pytest.mark.claims("dual-averaging-step-size")
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


@pytest.mark.claims("dual-averaging-step-size")
@pytest.mark.parametrize("step0", [1.0, 0.05])
def test_dual_averaging_update_is_hoffman_gelman_algorithm_5(step0, evidence, elementwise_extra):
    """Every iterate of `dual_averaging_update` is Algorithm 5 of Hoffman & Gelman (2014),
    written out here in float64 with the paper's constants (gamma 0.05, t0 10, kappa 0.75,
    mu = log(10 eps_0), log eps_bar_0 = 0, H_bar_0 = 0).

    The settling test above only sees the end point, which any weighting that still
    converges reaches; here the first 25 iterates are compared one by one, over an
    acceptance sequence that swings both sides of the target, for two initial steps.
    The iterates pass through log (mu = log 10 + log eps_0), a square root and
    `m**-0.75`: `atol` is float32's plus the backend's `elementwise_extra` at the worst
    iterate (`propagation.dual_averaging`, weights from the float64 iterates): `log 10`
    and `log eps_0` weight 1 in every log step and its average (a TPU's float32 log 10
    is off by about 2e-5, which shifts every log step by as much); `sqrt(k)` weight
    `|H_bar_k| / gamma` in log step k and that times the averaging weight in later
    averages; `k**-0.75` weight `|log step_k - avg_(k-1)|`, decayed by the later
    `(1 - eta)` factors, in the averages; `H_bar` none."""
    target = 0.8
    accepts = 0.5 + 0.45 * np.sin(np.arange(25) * 1.3)
    extra = max(
        elementwise_extra(*terms) for terms in propagation.dual_averaging(step0, accepts, target)
    )
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
        atol=1e-5 + extra,
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
def test_entropy_matches_scipy_on_both_signs_of_log_det(
    family, log_scale, dim, evidence, elementwise_extra
):
    """`vi.entropy` equals SciPy's Gaussian entropy of `N(loc, L L^T)`, with `L` built
    in NumPy from the documented parametrization.

    Scales below, at and above 1 put `log |det L|` on both sides of 0 and of the
    constant `d/2 (1 + log 2 pi)`, in one and four dimensions, with a non-zero
    lower triangle in the full-rank family: the ELBO test alone starts every
    scale at 0.1, where some wrong combinations of the two terms agree. `log |det L|`
    passes through exp and log: `atol` adds the backend's `elementwise_extra`
    (`propagation.entropy`: each `exp(raw_ii)` relative weight 1, each `log` weight 1 at
    `|raw_ii|`, raw values as given, in float64)."""
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
    raw64 = np.asarray(params.raw_scale, np.float64)
    extra = elementwise_extra(*propagation.entropy(raw64 if raw64.ndim == 1 else np.diag(raw64)))
    assert evidence.allclose(
        "q entropy vs scipy.stats.multivariate_normal",
        f"{family}, d = {dim}, log scales near {log_scale}",
        vi.entropy(params),
        exact,
        rtol=0.0,
        atol=1e-4 * dim + extra,
    )


@pytest.mark.claims("windowed-mass-matrix")
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


@pytest.mark.claims("hmc-and-vi-match-exact-moments", "hmc-momentum-from-mass")
@pytest.mark.claims("hmc-metropolis-accept")
@pytest.mark.parametrize("name", ["correlated", "uncorrelated"])
def test_hmc_moments_match_the_exact_posterior(name, problems, hmc_runs, evidence):
    """HMC means and covariances are within Z_LIMIT = 5.15 standard errors (over 64 chains) of
    the exact NIG moments, on two designs, with at most one divergent transition.

    Size 1e-4: a Sidak bound over 36 figures, 28 z-scores (Student-t, 63 dof) and 8 mixing
    times (chi2_63 at TAU_MAX = 3), the model's figure (7.8e-5 for the z part). Recorded
    sweep (`evidence/size_sweep.json`, part `hmc`): 256 keys x 2 designs under the
    reference and the 6 rewrites of the drift and `log_joint` that compile to other bits
    (3 more compile to the reference's), 1792 runs per design, none past any limit: the
    largest |z| 4.65 (reference), 4.37 and 4.22 (drift reassociated), 4.17 (momentum as
    `z * sqrt(1 / m)`), 4.00 (`X w` as row sums), 4.44 (prior term scaled first), 3.81
    (`log_joint` terms reassociated), against 5.15; each z's sd over runs 0.89 to 1.09
    (the t model says 1.016); mixing times at most 3.19 against 6.08; at most 1 divergent
    transition in a run (1 run of 3584). Power: an MCSE is 0.007 to
    0.011 posterior sd for a mean and 1.5% to 2.6% of a variance, so a bias of 0.06 sd in
    a mean or 13% in a variance fails with chance >= 1/2 (0.08 sd and 19%: 0.99); chains
    that barely move (tau in the hundreds: a drift without M^-1, NaN momenta) fail the
    mixing bound, which the z-scores, whose errors grow with the chains' spread, cannot see."""
    samples = hmc_runs[name]
    z = moment_z_vector(samples.positions, problems[name].moments)
    tau = mixing_times(samples.positions, problems[name].moments)
    divergent = int(jnp.sum(samples.is_divergent))
    ok = evidence.record(
        "HMC means and covariances vs exact (z-scores over independent chains)",
        f"{name} design, {CORRELATED.num_chains} chains x {CORRELATED.num_samples} draws",
        {
            "mean_z": z[:DIM],
            "cov_z": z[DIM:],
            "max_abs_z": float(np.max(np.abs(z))),
            "mixing_time": tau,
            "divergent": divergent,
            "mean_accept": float(jnp.mean(samples.accept_prob)),
        },
        {
            "max_abs_z": Z_LIMIT,
            "t_dof": Z_DOF,
            "mixing_time_max": MIX_LIMIT,
            "divergent_max": MAX_DIVERGENT_AT_1X,
            "size": SIZE,
        },
        bool(np.max(np.abs(z)) < Z_LIMIT and np.max(tau) < MIX_LIMIT)
        and divergent <= MAX_DIVERGENT_AT_1X,
    )
    assert ok, z


# The adapted inverse mass of a chain is Stan's shrunk variance of a window of 75 warm-up
# draws: `(n / (n + 5)) s^2` (+ 6e-5). Its ratio to the exact variance is taken as
# log-normal, with log mean -0.125 (the shrinkage, -0.065, plus the log of a noisy
# variance) and sd 0.30: figures from an earlier sweep whose output was not kept (it
# reported 1792 runs per design, skew -0.1 to 0, log sd 0.26 to 0.30). The limits put the most
# spread pair's normal tails at the Sidak bound over every chain and parameter of both
# designs (512 ratios).
MASS_LOG_MEAN, MASS_LOG_SD = -0.125, 0.30
MASS_RATIOS_PER_TEST = 2 * CORRELATED.num_chains * DIM
MASS_RATIO_RANGE = tuple(
    float(np.exp(MASS_LOG_MEAN + sign * sidak_limit(MASS_RATIOS_PER_TEST) * MASS_LOG_SD))
    for sign in (-1.0, 1.0)
)  # (0.185, 4.20)


@pytest.mark.claims("windowed-mass-matrix")
@pytest.mark.parametrize("name", ["correlated", "uncorrelated"])
def test_adapted_mass_matrix_is_the_posterior_variance(name, problems, hmc_runs, evidence):
    """Every chain's adapted inverse mass (a 75-draw window) is within MASS_RATIO_RANGE of the
    exact variance.

    Size 1e-4 by the log-normal model of MASS_RATIO_RANGE (Sidak over 512 ratios). Recorded
    sweep (`evidence/size_sweep.json`, part `hmc`, 1792 runs per design: 256 keys under the
    reference and 6 rewrites): ratios 0.248 to 2.76 (correlated) and 0.215 to 3.46
    (uncorrelated), none outside; the log sd 0.26 to 0.30 against the model's 0.30, the
    tails at 1% and 0.1% as the fit says; the size from the fit, sd at its upper 99% bound,
    2.2e-5. This run's ratios: 0.35 to 1.88. Power: an inverse mass that is not the
    variance fails in some chain: the unit (unadapted) mass gives ratios 14 to 144, the
    standard deviation 3.8 to 12, the precision above 200."""
    low, high = MASS_RATIO_RANGE
    ratio = (
        np.asarray(hmc_runs[name].inv_mass)
        / np.diag(np.asarray(problems[name].moments.theta_cov))[None, :]
    )
    assert evidence.record(
        "adapted inverse mass / exact variance",
        f"{name} design, every chain",
        {"min": float(ratio.min()), "max": float(ratio.max())},
        {"range": [low, high], "size": SIZE},
        bool(np.all((ratio > low) & (ratio < high))),
    ), ratio


@pytest.mark.claims("hmc-info-fields")
def test_too_large_step_size_diverges(problems, hmc_runs, evidence):
    """At 3x the adapted step at least 10% of transitions diverge and are counted; at most one at
    1x.

    Three times the adapted step leaves the leapfrog stability region of the
    stiffest direction: transitions diverge and are counted. Size, from the recorded sweep
    (`evidence/size_sweep.json`, "stage 2: HMC": 256 keys x 7 formulations x 2 designs,
    3,584 runs of 16,000 transitions): one run had one divergence at 1x, none had two (the
    limit), so a Poisson bound puts the chance of two at under 8.8e-7 per design (95%
    upper); the fraction at 3x read 0.573 to 0.752, far above its 0.1 floor. This run: 73%
    at 3x, none at 1x. Power: a divergence flag that never fires, or fires at the adapted
    step, fails."""
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
        {"divergent_at_1x_max": MAX_DIVERGENT_AT_1X, "divergent_fraction_at_3x_min": 0.1},
        observed["divergent_at_1x"] <= MAX_DIVERGENT_AT_1X
        and observed["divergent_at_3x"] >= 0.1 * total,
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


def _flat_in_the_unit_box(q):
    """Log density 0 inside `|q_i| < 1`, -inf outside (gradient 0 everywhere)."""
    return jnp.where(jnp.all(jnp.abs(q) < 1.0), jnp.float32(0.0), jnp.float32(-jnp.inf))


@pytest.mark.claims("hmc-nonfinite-energy-rejected", "hmc-metropolis-accept", "hmc-info-fields")
@pytest.mark.claims("leapfrog-returns-end-density")
@pytest.mark.parametrize(
    ("z", "accepted"), [(5.0, False), (0.5, True)], ids=["leaves the box", "stays inside"]
)
def test_hmc_step_never_accepts_a_zero_probability_proposal(z, accepted, evidence):
    """At u = 0 a proposal with acceptance probability 0 (non-finite dH) is rejected; one with
    probability 1 is accepted.

    `u ~ U[0, 1)` can be exactly 0 (float32 draws lie on the grid k 2^-23), and the rule
    `accept when u < min(1, exp(-dH))` with `dH -> +inf` for a non-finite one rejects it
    always (hmc_step's docstring). One leapfrog step of size 1 from q = 0 with momentum
    `z`: 5.0 leaves the box (log density -inf, dH = +inf, accept_prob 0), 0.5 stays in it
    (dH = 0, accept_prob 1). Deterministic (no key), so its size is nil. Power: `u <=
    accept_prob` accepts the point outside the box, at a chance of 2^-23 per such
    transition that no sampling test can see; a rule that ignores `u` or the
    non-finite case fails one of the two cases."""
    state = hmc.init_state(_flat_in_the_unit_box, jnp.zeros(1, jnp.float32))
    noise = (jnp.full((1,), z, jnp.float32), jnp.float32(0.0))
    one = jnp.ones(1, jnp.float32)
    new, info = hmc.hmc_step(noise, state, _flat_in_the_unit_box, jnp.float32(1.0), one, 1)
    moved = not np.array_equal(np.asarray(new.position), np.asarray(state.position))
    observed = {
        "proposal": z,
        "accept_prob": float(info.accept_prob),
        "energy_change_is_finite": bool(np.isfinite(float(info.energy_change))),
        "is_divergent": bool(info.is_divergent),
        "moved": moved,
    }
    assert evidence.record(
        "HMC accept/reject at u = 0",
        f"one leapfrog step to q = {z} in a flat box |q| < 1",
        observed,
        {"moved": accepted, "accept_prob": float(accepted)},
        moved == accepted and float(info.accept_prob) == float(accepted),
    ), observed


@pytest.mark.claims("elbo-mc-mean-plus-entropy")
@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
def test_elbo_estimator_matches_closed_form_on_a_gaussian(family, evidence):
    """The Monte-Carlo ELBO is within ELBO_Z_LIMIT = 4.06 standard errors of the exact -KL on a
    Gaussian target, for both families.

    Target: normalized `N(mu, Sigma)`, so `ELBO = -KL(q || p)` exactly. Size 1e-4: one
    normal z per family (40,000 draws), Sidak over 2; the size sweep's `elbo` part (256
    keys, in `evidence/size_sweep.json`): z spread 1.03 (mean field) and 0.96 (full
    rank), largest |z| 3.0 and 3.5, none past the limit. Power: a bias of 4.06 + 2.33 =
    6.4 standard errors (0.003 and 0.011 nats at the test key's standard errors, 0.0004
    and 0.0016) fails with chance 0.99; an ELBO without its entropy misses by whole nats."""
    estimate, exact, se, z = elbo_z(family, jax.random.key(7))
    assert evidence.record(
        "Monte-Carlo ELBO vs closed-form -KL",
        f"{family}, Gaussian target, {ELBO_NUM_MC} draws",
        {"estimate": estimate, "exact": exact, "se": se, "z": z},
        {"abs_z": ELBO_Z_LIMIT, "size": SIZE},
        abs(z) < ELBO_Z_LIMIT,
    ), (estimate, exact, se)


# Draws of the ELBO that gives each fit's KL = log p(y) - ELBO: its Monte-Carlo standard
# error is about 0.004 nats (0.012 with 20,000), well inside the KL limits.
VI_EVAL_DRAWS = 200_000


@pytest.fixture(scope="module")
def vi_fits(problems):
    out = {}
    for name, problem in problems.items():
        for family in ("meanfield", "fullrank"):
            key_fit, key_eval = jax.random.split(jax.random.key(11))
            result = train.fit_vi(CORRELATED, problem, key_fit, family)
            out[name, family] = train.vi_summary(result, problem, key_eval, VI_EVAL_DRAWS)
    return out


@pytest.mark.claims("hmc-and-vi-match-exact-moments")
@pytest.mark.parametrize("name", ["correlated", "uncorrelated"])
def test_fullrank_vi_recovers_the_exact_posterior(name, vi_fits, problems, evidence):
    """Full-rank VI's mean is within 0.15 sd and variances within 15% of the exact posterior, KL
    under 0.05.

    Size: not backed by recorded evidence. VI_LIMITS (the mean error's limit widened from
    0.1 sd to 0.15) were set from a sweep of 768 fits per design (256 keys x 3 `log_joint`
    formulations) whose output was not kept; the `vi` part of the size sweep (`tests/size_sweep`)
    reproduces it but has not been run into `evidence/size_sweep.json`. Power: a mean off by
    0.15 sd, a variance by 15%, or a KL of 0.05 (the exact evidence against an ELBO of
    200,000 draws, MCSE 0.004) fails; a fit without reparameterization gradients misses
    by far more."""
    s = vi_fits[name, "fullrank"]
    figures = vi_statistics(s, vi_fits[name, "meanfield"], problems[name].moments)
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
        {
            "abs_mean_error_in_sd": VI_LIMITS["fullrank_abs_mean_error_in_sd"],
            "var_ratio": [0.85, 1.15],
            "kl": [-0.01, 0.05],
            "size": SIZE,
        },
        all(figures[k] < VI_LIMITS[k] for k in VI_LIMITS if k.startswith("fullrank"))
        and figures["fullrank_kl"] > -0.01,
    )
    assert ok, observed


@pytest.mark.claims("meanfield-variance-loss")
@pytest.mark.parametrize("name", ["correlated", "uncorrelated"])
def test_meanfield_vi_loses_the_predicted_variance(name, vi_fits, problems, evidence):
    """Mean-field VI's variance ratios and KL gap match their Gaussian predictions, 2 designs.

    Mean-field variances are the conditional ones, `1 / (Sigma^-1)_ii`; the KL it
    pays is `(sum log Lambda_ii - log det Lambda) / 2` for a Gaussian target. Size: not
    backed by recorded evidence (see the full-rank test: the `vi` part of the size sweep
    has not been run into `evidence/size_sweep.json`). Power: variance ratios 15% off the
    conditional ones (mean-field
    variances equal to the marginal ones are 7x too large on the correlated design) or a
    KL gap 0.05 + 15% off fail."""
    s = vi_fits[name, "meanfield"]
    moments = problems[name].moments
    figures = vi_statistics(vi_fits[name, "fullrank"], s, moments)
    exact_var = np.diag(np.asarray(moments.theta_cov, np.float64))
    observed = {
        "var_ratio": s["var_ratio"],
        "predicted_var_ratio": train.mean_field_variance_prediction(moments) / exact_var,
        "kl_meanfield": s["kl"],
        "kl_gap_vs_fullrank": s["kl"] - vi_fits[name, "fullrank"]["kl"],
        "kl_gap_error_beyond_15pct": figures["meanfield_kl_gap_error_beyond_15pct"],
    }
    ok = evidence.record(
        "mean-field variance loss vs prediction",
        f"{name} design",
        observed,
        {
            "var_ratio_over_predicted": [0.85, 1.15],
            "kl_gap_abs": 0.05,
            "kl_gap_rel": 0.15,
            "size": SIZE,
        },
        all(figures[k] < VI_LIMITS[k] for k in VI_LIMITS if k.startswith("meanfield")),
    )
    assert ok, observed
