"""Stage 3: the inverse problem.

The tiny study (`Config.tiny()`) runs once per module; the tests read its
numbers and check them against references computed another way:
- the estimate against the truth, in units of its standard error, and the
  Laplace standard error against the actual spread of the estimates over the
  coverage seeds;
- the Laplace standard error against the expected Fisher information computed
  from the exact solution at the true parameters (no data, no RK4);
- the estimate's convergence under grid refinement against the fit with the
  exact solution, at the fitted order;
- profile-likelihood intervals (constrained re-fits) against Laplace intervals;
- coverage against its nominal level, with the binomial error of the count.
Repeated under changed conditions: a short observation window, another seed,
missing observations. Determinism: the same config gives the same bits.
"""

import json
import math

import jax
import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from scientific_inverse import checkpoint, identifiability, report, train
from scientific_inverse.cli import main
from scientific_inverse.config import Config, ConfigError, load_config
from scientific_inverse.data import DataError, observation_times, stack, synthesize
from scientific_inverse.report import scaling_check

CONFIG = Config.tiny()
TRUTH = np.array([CONFIG.damping, CONFIG.stiffness])


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fit")
    result = train.fit_and_evaluate(CONFIG, workdir)
    return result, workdir


def test_parameters_recovered_within_their_standard_errors(study, evidence):
    result, _ = study
    ref = result["fit"]["refined"]
    z = np.abs(np.array(result["parameter_error"]["in_se"]))
    # 4 standard errors: a false alarm has probability ~6e-5 per parameter.
    assert evidence.record(
        "estimate vs truth",
        "long window, seed 0",
        {"theta": ref["theta"], "se": ref["se"], "abs_z": z},
        {"abs_z_max": 4.0},
        bool(np.all(z <= 4.0)),
    ), z
    cover = result["coverage"]
    ratio = np.array(cover["mean_se"]) / np.array(cover["estimate_std"])
    # Over 24 seeds the sample std of the estimates has ~15% relative error.
    assert evidence.record(
        "Laplace se vs spread of estimates over seeds",
        f"{cover['seeds']} seeds",
        {"mean_se_over_std": ratio},
        {"range": [0.6, 1.6]},
        bool(np.all((ratio > 0.6) & (ratio < 1.6))),
    ), ratio


def test_laplace_se_matches_expected_fisher_information(study, evidence):
    result, _ = study
    obs = synthesize(CONFIG, jax.random.split(jax.random.key(CONFIG.seed), 3)[0])
    ts = observation_times(CONFIG.t_end, CONFIG.obs_dt)[~obs.heldout]
    info = identifiability.fisher(
        np.asarray(CONFIG.theta_true),
        ts,
        np.array([CONFIG.x0, CONFIG.v0]),
        CONFIG.noise_std,
        free=("c", "k"),
    )
    expected_se = np.sqrt(np.diag(np.linalg.inv(info))) * TRUTH  # log units -> absolute
    observed_se = np.array(result["fit"]["refined"]["se"])
    # sigma_hat / sigma over 78 degrees of freedom is within ~+-20% at 3 sigma.
    assert evidence.allclose(
        "Laplace se (data, RK4) vs expected Fisher (exact model)",
        "long window, fitted times",
        observed_se,
        expected_se,
        rtol=0.25,
        atol=0.0,
    )


def test_error_budget_is_kept_apart(study, evidence):
    result, _ = study
    bias = np.abs(result["solver_bias"]["in_se"])
    pred = result["prediction_error"]["refined"]
    noise = CONFIG.noise_std
    observed = {"solver_bias_in_se": bias, **pred}
    # The coarse solver (dt = obs_dt) is biased, but by far less than the noise's
    # standard error; the fit predicts held-out times better than the noise level
    # (vs truth) and reaches the noise floor (vs the noisy values; 20 values: the
    # RMSE / sigma ratio lies within [0.6, 1.4] with probability > 0.99).
    passed = (
        np.all(bias > 0)
        and np.all(bias < 0.1)
        and pred["heldout_rmse_vs_truth"] < noise / 2
        and 0.6 < pred["heldout_rmse_vs_observed"] / noise < 1.4
    )
    assert evidence.record(
        "parameter error, prediction error, solver bias",
        "tiny study",
        observed,
        {
            "bias_in_se_below": 0.1,
            "rmse_truth_below": noise / 2,
            "rmse_observed_over_noise": [0.6, 1.4],
        },
        passed,
    ), observed


def test_estimate_converges_under_grid_refinement(study, evidence):
    conv = study[0]["convergence"]
    gaps = np.array(conv["abs_gap"])
    orders = conv["observed_order"]
    passed = (
        all(abs(o - 4.0) <= 0.4 for o in orders)
        and np.all(gaps[1:] < gaps[:-1])
        and np.all(gaps[-1] < 1e-6)
    )
    assert evidence.record(
        "RK4 estimate -> exact-model estimate",
        f"dt {conv['dt']}",
        {"abs_gap": gaps, "observed_order": orders},
        {"order": 4.0, "abs": 0.4},
        passed,
    ), conv


def test_profiles_agree_with_laplace_in_the_long_window(study, evidence):
    profiles = study[0]["profiles"]["long"]
    for name in ("c", "k"):
        p = profiles[name]
        width = p["laplace"][1] - p["laplace"][0]
        ends = np.array([p["lower"], p["upper"]])
        assert evidence.allclose(
            f"profile vs Laplace interval of {name}",
            "long window",
            ends,
            np.array(p["laplace"]),
            rtol=0.0,
            atol=0.1 * width,
        )


def test_short_window_is_weakly_identifiable(study, evidence):
    result, _ = study
    long_se = np.array(result["fit"]["refined"]["se"])
    short_se = np.array(result["short_window"]["se"])
    fisher = result["fisher"]
    cond_long = fisher["long window, position"]["condition_number"]
    cond_short = fisher["short window, position"]["condition_number"]
    cond_velocity = fisher["short window, position + velocity"]["condition_number"]
    short_profile = result["profiles"]["short"]["c"]
    observed = {
        "se_ratio_short_over_long": short_se / long_se,
        "correlation_short": result["short_window"]["correlation"],
        "correlation_long": result["fit"]["refined"]["correlation"],
        "condition": [cond_long, cond_short, cond_velocity],
        "short_profile_c": [short_profile["lower"], short_profile["upper"]],
    }
    passed = (
        np.all(short_se > 3 * long_se)
        and cond_short > 5 * cond_long
        and cond_velocity < cond_short / 3
        and abs(result["short_window"]["correlation"]) > 0.8
        and short_profile["upper"] - short_profile["lower"]
        > 3 * (result["profiles"]["long"]["c"]["upper"] - result["profiles"]["long"]["c"]["lower"])
    )
    assert evidence.record(
        "short window widens the confidence region; velocity helps",
        f"window {CONFIG.short_window} vs {CONFIG.t_end}",
        observed,
        None,
        passed,
    ), observed


def test_mass_scaling_is_unidentifiable_without_a_known_force(study, evidence):
    fisher = study[0]["fisher"]
    free = fisher["long window, m c k all free"]
    loaded = fisher["long window, m c k, known step load F0 = 1"]
    direction = np.abs(np.array(free["weakest_direction"]))
    gap = scaling_check(CONFIG)
    passed = (
        math.isinf(free["condition_number"])
        and loaded["condition_number"] < 1e4
        and np.allclose(direction, 1 / np.sqrt(3), atol=1e-6)
        and gap < 1e-12
    )
    assert evidence.record(
        "(m, c, k) vs (2m, 2c, 2k)",
        "free response vs known load",
        {"trajectory_gap": gap, "free": free, "loaded": loaded},
        None,
        passed,
    )


def test_interval_coverage_near_nominal(study, evidence):
    cover = study[0]["coverage"]
    floor = cover["nominal"] - 3 * cover["binomial_se"]
    rate = np.array(cover["rate"])
    assert evidence.record(
        "Laplace interval coverage",
        f"{cover['seeds']} seeds",
        cover,
        {"at_least": floor},
        bool(np.all(rate >= floor)),
    ), cover


@pytest.mark.parametrize("confidence", [0.8, 0.95])
def test_laplace_interval_holds_its_nominal_probability(evidence, confidence):
    """The interval `theta +- q se` on a linear model, where it is exact: its
    probability content under Student's t (cdf, not the ppf the code uses) equals
    the level, and over 4000 simulated data sets it covers the truth at the level
    (within three binomial standard errors). A one-sided quantile fails both."""
    rng = np.random.default_rng(int(confidence * 100))
    s, n = 4000, 12
    t_grid = np.linspace(0.0, 1.0, n)
    design = np.stack([np.ones(n), t_grid], axis=1)  # (n, 2)
    truth = np.array([0.3, 4.0])
    y = design @ truth + 0.5 * rng.standard_normal((s, n))
    theta = np.linalg.lstsq(design, y.T, rcond=None)[0].T  # (s, 2)
    rss = np.sum((y - theta @ design.T) ** 2, axis=1)
    fits = train.FitBatch(
        theta=theta,
        rss=rss,
        n=np.full(s, n),
        jac=np.broadcast_to(design, (s, n, 2)),
        steps=np.zeros(s, np.int32),
    )
    lap = train.laplace(fits, confidence)
    q = (lap.upper - theta) / lap.se
    content = stats.t.cdf(q, n - 2) - stats.t.cdf(-q, n - 2)
    covered = (lap.lower <= truth) & (truth <= lap.upper)
    rate = covered.mean(axis=0)
    se = math.sqrt(confidence * (1 - confidence) / s)
    assert evidence.record(
        "Laplace interval on a linear model: t probability content and simulated coverage",
        f"level {confidence}, {s} data sets of {n} points, 2 parameters",
        {
            "content_min": float(content.min()),
            "content_max": float(content.max()),
            "coverage": rate.tolist(),
            "binomial_se": se,
        },
        {"content_abs": 1e-9, "coverage_within_se": 3},
        bool(np.all(np.abs(content - confidence) <= 1e-9))
        and bool(np.all(np.abs(rate - confidence) <= 3 * se)),
    )


def test_report_verdicts_follow_their_figures(study):
    """Each verdict of the report is computed from its figures: on the study's own
    figures it reads as the report says, and it flips when the figures do."""
    out, workdir = study
    conv, se, cov = out["convergence"], out["fit"]["refined"]["se"], out["coverage"]
    text = (workdir / "report.md").read_text()
    good = report.convergence_verdict(conv, se)
    assert good.startswith("Yes, at the order of the integrator") and good in text
    assert report.coverage_verdict(cov) in text
    low_order = dict(conv, observed_order=[2.0, 2.1])
    assert report.convergence_verdict(low_order, se).startswith("Yes, but at observed order 2")
    growing = dict(conv, abs_gap=[list(g) for g in reversed(conv["abs_gap"])])
    assert report.convergence_verdict(growing, se).startswith("No:")
    huge_gaps = dict(conv, abs_gap=[[10 * s for s in se] for _ in conv["abs_gap"]])
    assert "solver limits the inference" in report.convergence_verdict(huge_gaps, se)
    assert report.coverage_verdict(dict(cov, rate=[0.5, 0.95])).startswith("**No**")
    assert report.scaling_verdict(0.0, [1e-14, 1.0, 2.0]).startswith("**Yes, exactly")
    assert report.scaling_verdict(0.1, [1.0, 2.0, 3.0]).startswith("**Not exactly**")
    assert report.short_window_verdict(500.0, 5.0).startswith("**Nearly")
    assert report.short_window_verdict(6.0, 5.0).startswith("**Not even")


def test_missing_observations_are_masked_not_propagated(study, evidence):
    key = jax.random.key(11)
    obs = synthesize(CONFIG, key)
    gappy = obs._replace(x=obs.x.copy())
    gappy.x[5:15] = np.nan
    held = obs._replace(heldout=obs.heldout.copy())
    held.heldout[5:15] = True
    design = train.design_for(CONFIG)
    n_rows = train.batch_rows(CONFIG)  # the study's row count: reuses its executable
    fits = train.fit_batch(
        design,
        train.concat(
            train.rows(design, stack([gappy]), CONFIG.solver_dt, CONFIG.initial_guess),
            train.rows(design, stack([held]), CONFIG.solver_dt, CONFIG.initial_guess),
        ),
        pad_to=n_rows,
    )
    assert np.all(np.isfinite(fits.theta))
    assert evidence.allclose(
        "NaN observations masked == the same times left out",
        "10 NaN positions",
        fits.theta[0],
        fits.theta[1],
        rtol=1e-12,
        atol=0.0,
    )
    empty = obs._replace(x=np.full_like(obs.x, np.nan))
    with pytest.raises(DataError, match=r"at least 3 finite, non-held-out observations.*`0`"):
        train.rows(design, stack([empty]), CONFIG.solver_dt, CONFIG.initial_guess)


def test_same_config_same_bits_other_seed_other_result(study, evidence):
    first, workdir = study
    again = train.fit_and_evaluate(CONFIG)
    other = train.fit_and_evaluate(CONFIG.model_copy(update={"seed": 1}))
    saved = checkpoint.restore(workdir / "result.json")
    # The report adds the stage-1 convergence table to the saved result; the
    # wall-clock time differs by nature. Everything else must be bit for bit equal.
    skip = ("seconds", "simulation_convergence")
    same = checkpoint.digest(again, skip) == checkpoint.digest(first, skip)
    restored = checkpoint.digest(saved, skip) == checkpoint.digest(first, skip)
    differs = other["fit"]["refined"]["theta"] != first["fit"]["refined"]["theta"]
    assert evidence.record(
        "determinism",
        "same config twice; seed 1; saved result",
        {
            "bitwise_equal": same,
            "restored_equal": restored,
            "seed_1_theta": other["fit"]["refined"]["theta"],
        },
        None,
        same and restored and differs,
    )


def test_report_answers_the_review_questions(study):
    _, workdir = study
    text = (workdir / "report.md").read_text()
    for heading in (
        "Does the inferred parameter converge as the time grid refines?",
        "Do solver sensitivities agree with finite differences?",
        "Can different parameters explain the same observations?",
        "Are the intervals honest?",
    ):
        assert heading in text
    for png in ("fits.png", "profiles.png", "convergence.png"):
        assert (workdir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_fit_and_config_errors(tmp_path, study):
    runner = CliRunner()
    config_path = tmp_path / "tiny.json"
    config_path.write_text(CONFIG.to_json())
    out = tmp_path / "run"
    ok = runner.invoke(main, ["fit", "--config", str(config_path), "--workdir", str(out)])
    assert ok.exit_code == 0, ok.output
    assert "coverage" in ok.output and (out / "report.md").exists()
    again = runner.invoke(main, ["fit", "--config", str(config_path), "--workdir", str(out)])
    assert again.exit_code == 2 and "--overwrite" in again.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"solver_dt": 0.03, "mass": -1.0, "colour": "red"}))
    result = runner.invoke(main, ["fit", "--config", str(bad)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Unknown field `colour`" in result.output
    assert "Field `mass` has value `-1.0`" in result.output
    with pytest.raises(ConfigError, match=r"`solver_dt = 0.03` must divide `obs_dt = 0.1`"):
        Config.from_json(json.dumps({"solver_dt": 0.03}))
    with pytest.raises(ConfigError, match=r"must be underdamped"):
        Config.from_json(json.dumps({"damping": 5.0}))
    with pytest.raises(ConfigError, match=r"Cannot read config file"):
        load_config(tmp_path / "missing.json")
