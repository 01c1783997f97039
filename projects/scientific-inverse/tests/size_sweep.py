"""Size sweep of the statistical stage tests: how often a CORRECT solution fails them.

    python tests/size_sweep.py [--keys 200] [--only PART] [--out evidence/size_sweep.json]

Run on demand: pytest does not collect it. All parts took 18 minutes on a shared 2-core
CPU (load about 7), 7 of them the study at 2 s a seed; `--only PART` runs one part
(repeatable) and keeps the others' records. Fewer seeds where one evaluation costs
seconds: 200 studies, 32 at held-out fraction 0.35, 4 per rewrite (whose figures
move by round-off only), 32 order-test batches. A stage test with a fixed seed
still judges a random figure: correct code that rounds differently moves its figures
as another seed would, so each statistical test is rerun here, computed as the test
computes it, under many seeds and under the correct rewrites of `reformulations.toml`
(each applied to the module's source, imported as a module of its own; nothing is
patched in place).

Parts:
- `study`: the tiny study (`Config.tiny()`) under `--keys` seeds (the test uses
  seed 0); the study tests of `test_stage_3_study.py` are called on each result
  with an in-memory `evidence` whose `record` lets a test run on past a failed
  check, so every check's figures are kept. The Fisher check is computed with the
  seed's own held-out split (`expected_fisher_se(config)`). The prediction test's
  wrong-times gaps (held-out fraction 0.2) come from the same results.
- `prediction`: those gaps at held-out fraction 0.35 (`--prediction-keys` seeds).
- `rewrites`: the study under each stage-3 rewrite, `--rewrite-keys` seeds: every
  figure against the reference's at the same seed (each rewrite recompiles the fit).
- `model`: the sizes of the limits under the noise models they are derived from,
  and those that need the problem's Jacobian (held-out RMSE): exact per split,
  averaged over random splits.
- `linear`: the linear-model interval test over `--linear-keys` generator seeds
  per level, under the rewrites and under the seeded bugs of `laplace` (power).
- `rows`: the Hypothesis row-by-row `laplace` test over drawn seeds, per rewrite.
- `rk4`, `jacobians`: the stage-1 and stage-2 Hypothesis round-off tests over
  uniform draws from their strategies' ranges plus every corner of the ranges.
- `order`: the stage-1 order-4 tests over the seeds of their random batches.

For each figure the JSON keeps its limit (read from the test modules and
`stage_3_limits`), quantiles, largest value, exceedance count and, where a noise
model gives one, the analytic size; `command` and `seconds` say how it was made.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
import tomllib
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import conftest  # noqa: E402  (the tests' strict JAX flags and their Evidence)
import stage_3_limits as s3lim  # noqa: E402
import test_stage_1_simulation as s1  # noqa: E402
import test_stage_2_sensitivities as s2  # noqa: E402
import test_stage_3_prediction as s3p  # noqa: E402
import test_stage_3_statistics as s3s  # noqa: E402
import test_stage_3_study as s3  # noqa: E402

from scientific_inverse import identifiability, solver, train  # noqa: E402
from scientific_inverse import sensitivity as sens  # noqa: E402
from scientific_inverse.config import Config  # noqa: E402
from scientific_inverse.data import synthesize  # noqa: E402


class Recorder(conftest.Evidence):
    """The tests' `evidence`, in memory; `record` returns True so that a test runs on
    past a failed check and every check's figures are kept (`passed` is stored)."""

    def __init__(self) -> None:
        super().__init__("sweep")

    def record(self, check, condition, observed, tolerance, passed) -> bool:
        super().record(check, condition, observed, tolerance, passed)
        return True

    def get(self, check: str) -> list[dict]:
        return [r for r in self.records if r["check"] == check]


def entries(kind: str, module_file: str, stage: str) -> list[dict]:
    """The project's reformulations (kind `reformulations`) or seeded bugs (`bugs`)
    of one stage that edit `module_file`."""
    name = "reformulations.toml" if kind == "reformulations" else "seeded_bugs.toml"
    with (ROOT / name).open("rb") as f:
        table = tomllib.load(f)[kind]
    return [e for e in table if e["stage"] == stage and e["file"].endswith(module_file)]


def rewritten(module: types.ModuleType, find: str, replace: str) -> types.ModuleType:
    """A fresh module: `module`'s source with `find` (present once) replaced."""
    source = Path(module.__file__).read_text(encoding="utf-8")
    if source.count(find) != 1:
        raise SystemExit(f"`{find[:60]}` is not in {module.__file__} exactly once")
    new = types.ModuleType(f"{module.__name__}_rewrite")
    new.__file__ = module.__file__
    exec(compile(source.replace(find, replace), module.__file__, "exec"), new.__dict__)
    return new


def summary(values, limit=None, above_fails=True) -> dict:
    v = np.asarray(values, np.float64).ravel()
    out = {
        "n": int(v.size),
        "min": float(v.min()),
        "q01": float(np.quantile(v, 0.01)),
        "median": float(np.median(v)),
        "q99": float(np.quantile(v, 0.99)),
        "max": float(v.max()),
    }
    if limit is not None:
        out["limit"] = float(limit)
        out["exceed"] = int(np.sum(v > limit) if above_fails else np.sum(v < limit))
    return out


def upper_99_sd(v: np.ndarray) -> float:
    """The sample sd at the upper end of its 99% confidence interval."""
    n = v.size
    return float(v.std(ddof=1) * math.sqrt((n - 1) / stats.chi2.ppf(0.01, n - 1)))


# STAGE 3: THE TINY STUDY ------------------------------------------------------------


def study_figures(module: types.ModuleType, config: Config) -> dict:
    """One study (`module.fit_and_evaluate`) and every study check's figures."""
    result = module.fit_and_evaluate(config)
    rec = Recorder()
    study = (result, None)
    s3.test_parameters_recovered_within_their_standard_errors(study, rec)
    s3.test_error_budget_is_kept_apart(study, rec)
    s3.test_estimate_converges_under_grid_refinement(study, rec)
    s3.test_profiles_agree_with_laplace_in_the_long_window(study, rec)
    s3.test_short_window_is_weakly_identifiable(study, rec)
    s3.test_interval_coverage_near_nominal(study, rec)
    refined = result["fit"]["refined"]
    expected = s3.expected_fisher_se(config)  # the seed's own split; the test reads CONFIG's
    rec.allclose(
        "Laplace se (data, RK4) vs expected Fisher (exact model)",
        "long window, fitted times",
        np.array(refined["se"]),
        expected,
        rtol=s3lim.fisher_rtol(refined["n"] - 2),
        atol=0.0,
    )
    short, long_ = result["short_window"], refined
    fisher = result["fisher"]
    budget = rec.get("parameter error, prediction error, solver bias")[0]["observed"]
    conv = result["convergence"]
    profiles = rec.get("profile vs Laplace interval of c") + rec.get(
        "profile vs Laplace interval of k"
    )
    width = {
        name: result["profiles"]["long"][name]["laplace"][1]
        - result["profiles"]["long"][name]["laplace"][0]
        for name in ("c", "k")
    }
    short_c, long_c = result["profiles"]["short"]["c"], result["profiles"]["long"]["c"]
    return {
        "passed": {r["check"] + " | " + r["condition"]: r["passed"] for r in rec.records},
        "abs_z": np.abs(result["parameter_error"]["in_se"]).tolist(),
        "z": result["parameter_error"]["in_se"],
        "se_ratio": rec.get("Laplace se vs spread of estimates over seeds")[0]["observed"][
            "mean_se_over_std"
        ],
        "fisher_ratio": (np.array(refined["se"]) / expected).tolist(),
        "sigma_hat_over_noise": refined["sigma_hat"] / config.noise_std,
        "bias_in_se": budget["solver_bias_in_se"],
        "rmse_truth_over_noise": budget["heldout_rmse_vs_truth"] / config.noise_std,
        # The seed's own limit (the test computes CONFIG's, seed 0's split).
        "rmse_truth_limit_over_noise": s3.heldout_rmse_truth_limit(config) / config.noise_std,
        "rmse_observed_over_noise": budget["heldout_rmse_vs_observed"] / config.noise_std,
        "order_error": [abs(o - 4.0) for o in conv["observed_order"]],
        "gaps_fall": bool(np.all(np.diff(np.array(conv["abs_gap"]), axis=0) < 0)),
        "last_gap": float(np.max(conv["abs_gap"][-1])),
        "profile_over_atol": [
            p["observed"]["max_abs_error"] / (0.1 * width[name])
            for p, name in zip(profiles, ("c", "k"), strict=True)
        ],
        "short_se_over_long_se": (np.array(short["se"]) / np.array(long_["se"])).tolist(),
        "short_abs_correlation": abs(short["correlation"]),
        "short_profile_width_ratio": (short_c["upper"] - short_c["lower"])
        / (long_c["upper"] - long_c["lower"]),
        "condition": [
            fisher["long window, position"]["condition_number"],
            fisher["short window, position"]["condition_number"],
            fisher["short window, position + velocity"]["condition_number"],
        ],
        "covered": result["coverage"]["covered"],
        "coverage_z": result["coverage"]["z_mean"],
        "coverage_z_std": result["coverage"]["z_std"],
        "seeds": result["coverage"]["seeds"],
        "theta": refined["theta"],
        "se": refined["se"],
        "n": refined["n"],
        "n_heldout": result["prediction_error"]["refined"]["n_heldout"],
        "prediction": prediction_gaps(result, config),
    }


def prediction_gaps(result: dict, config: Config) -> dict:
    """The prediction test's figures: reported vs recomputed held-out RMSE (relative),
    and the smallest relative gap to a wrong-times RMSE, by the test's own helpers."""
    obs = synthesize(config, jax.random.split(jax.random.key(config.seed), 3)[0])
    held = np.asarray(obs.heldout)
    rel, gap = [], []
    for name, dt in (("refined", config.solver_dt), ("coarse", config.coarse_dt)):
        c, k = result["fit"][name]["theta"]
        pred = s3p._rk4_positions(config, c, k, dt)
        for key, target in (
            ("heldout_rmse_vs_observed", obs.x),
            ("heldout_rmse_vs_truth", obs.x_true),
        ):
            expected = s3p._rmse(pred[held], target[held])
            rel.append(abs(result["prediction_error"][name][key] - expected) / expected)
            for wrong in (s3p._rmse(pred[~held], target[~held]), s3p._rmse(pred, target)):
                gap.append(abs(wrong - expected) / expected)
    c, k = result["short_window"]["theta"]
    pred = s3p._rk4_positions(config, c, k, config.solver_dt)
    seen = round(config.short_window / config.obs_dt)
    expected = s3p._rmse(pred[seen:], obs.x_true[seen:])
    short_gap = abs(s3p._rmse(pred[seen - 1 :], obs.x_true[seen - 1 :]) - expected) / expected
    return {"rel_error": max(rel), "min_gap": min(gap), "short_gap": short_gap}


def run_study(module, seeds, label: str, fraction: float | None = None) -> tuple[dict, list]:
    figures, failed = {}, []
    start = time.perf_counter()
    for i, seed in enumerate(seeds):
        update = {"seed": int(seed)}
        if fraction is not None:
            update["heldout_fraction"] = fraction
        config = Config.tiny().model_copy(update=update)
        try:
            figures[int(seed)] = study_figures(module, config)
        except train.FitError as err:
            failed.append([int(seed), str(err)[:200]])
        if (i + 1) % 50 == 0:
            print(f"  {label}: {i + 1} seeds, {time.perf_counter() - start:.0f} s", flush=True)
    return figures, failed


def sweep_study(keys: int) -> dict:
    figures, failed = run_study(train, range(keys), "study")
    f = list(figures.values())
    dof = f[0]["n"] - 2
    n_held = f[0]["n_heldout"]
    z = np.array([x["z"] for x in f])
    abs_z = np.abs(z).max(axis=1)
    z_lim = s3lim.z_limit(dof)
    ratio = np.array([x["se_ratio"] for x in f])
    r_low, r_high = s3lim.se_ratio_range(f[0]["seeds"])
    fisher_err = np.abs(np.array([x["fisher_ratio"] for x in f]) - 1.0).max(axis=1)
    sigma = np.array([x["sigma_hat_over_noise"] for x in f])
    resid_ratio = np.array([x["fisher_ratio"] for x in f]) / sigma[:, None]
    rtol = s3lim.fisher_rtol(dof)
    rmse_obs = np.array([x["rmse_observed_over_noise"] for x in f])
    o_low, o_high = s3lim.rmse_over_noise_range(n_held)
    covered = np.array([x["covered"] for x in f])
    seeds = f[0]["seeds"]
    floor = s3lim.coverage_floor(seeds, 0.95)
    misses = seeds - covered
    miss_rate = misses.sum(axis=0) / (len(f) * seeds)
    miss_upper = [stats.beta.ppf(0.99, m + 1, len(f) * seeds - m) for m in misses.sum(axis=0)]
    short_ratio = np.array([x["short_se_over_long_se"] for x in f]).min(axis=1)
    cond = np.array([x["condition"] for x in f])
    pred = [x["prediction"] for x in f]
    all_passed = [all(x["passed"].values()) for x in f]
    failing = sorted({k for x in f for k, v in x["passed"].items() if not v})
    return {
        "seeds": f"0..{keys - 1} (Config.tiny() with `seed` changed; the tests use seed 0)",
        "studies": len(f),
        "fit_errors": failed,
        "studies_failing_any_check": int(np.sum(~np.array(all_passed))),
        "checks_that_failed": failing,
        "estimate vs truth (max |z| of c, k)": {
            **summary(abs_z, z_lim),
            "limit_before": 4.0,
            "exceed_before": int(np.sum(abs_z > 4.0)),
            "t_dof": dof,
            "size_t_model": float(1 - (1 - 2 * stats.t.sf(z_lim, dof)) ** 2),
            "size_before_t_model": float(1 - (1 - 2 * stats.t.sf(4.0, dof)) ** 2),
            "z_mean": z.mean(axis=0).tolist(),
            "z_sd": z.std(axis=0, ddof=1).tolist(),
            "z_sd_upper_99": [upper_99_sd(z[:, j]) for j in range(2)],
            "sd_expected_t": math.sqrt(dof / (dof - 2)),
            "size_t_model_with_sd_upper_99": float(
                1
                - np.prod(
                    [
                        1
                        - 2
                        * stats.t.sf(
                            z_lim / (upper_99_sd(z[:, j]) / math.sqrt(dof / (dof - 2))), dof
                        )
                        for j in range(2)
                    ]
                )
            ),
        },
        "Laplace se / spread over 24 seeds": {
            "c": summary(ratio[:, 0]),
            "k": summary(ratio[:, 1]),
            "limits": [r_low, r_high],
            "limits_before": [0.6, 1.6],
            "exceed": int(np.sum((ratio <= r_low) | (ratio >= r_high))),
            "exceed_before": int(np.sum((ratio <= 0.6) | (ratio >= 1.6))),
            "size_chi2_model": float(
                2
                * (
                    stats.chi2.sf(seeds / r_low**2, seeds - 1)
                    + stats.chi2.cdf(seeds / r_high**2, seeds - 1)
                )
            ),
            "size_before_chi2_model": float(
                2
                * (stats.chi2.sf(seeds / 0.36, seeds - 1) + stats.chi2.cdf(seeds / 2.56, seeds - 1))
            ),
            "log_ratio_sd": np.log(ratio).std(axis=0, ddof=1).tolist(),
            "log_ratio_sd_chi2_model": float(
                np.std(
                    0.5 * np.log(seeds / stats.chi2.rvs(seeds - 1, size=200_000, random_state=1))
                )
            ),
        },
        "Laplace se vs expected Fisher se (max |ratio - 1|)": {
            **summary(fisher_err, rtol),
            "limit_before": 0.25,
            "exceed_before": int(np.sum(fisher_err > 0.25)),
            "size_chi2_model": float(
                stats.chi2.cdf(dof * (1 - rtol) ** 2, dof)
                + stats.chi2.sf(dof * (1 + rtol) ** 2, dof)
            ),
            "size_before_chi2_model": float(
                stats.chi2.cdf(dof * 0.75**2, dof) + stats.chi2.sf(dof * 1.25**2, dof)
            ),
            "sigma_hat_over_noise": summary(sigma),
            "ratio_over_sigma_hat_ratio": summary(resid_ratio),
        },
        "error budget": {
            "solver_bias_in_se": {
                **summary(np.abs([x["bias_in_se"] for x in f]).max(axis=1), 0.1),
                "smallest": float(np.abs([x["bias_in_se"] for x in f]).min()),
            },
            "heldout_rmse_vs_truth_over_noise": {
                **summary([x["rmse_truth_over_noise"] for x in f]),
                "over_its_limit": summary(
                    [x["rmse_truth_over_noise"] / x["rmse_truth_limit_over_noise"] for x in f],
                    1.0,
                ),
                "limit_over_noise": summary([x["rmse_truth_limit_over_noise"] for x in f]),
                "limit_before": 0.5,
                "exceed_before": int(np.sum([x["rmse_truth_over_noise"] > 0.5 for x in f])),
            },
            "heldout_rmse_vs_observed_over_noise": {
                **summary(rmse_obs),
                "limits": [o_low, o_high],
                "limits_before": [0.6, 1.4],
                "exceed": int(np.sum((rmse_obs <= o_low) | (rmse_obs >= o_high))),
                "exceed_before": int(np.sum((rmse_obs <= 0.6) | (rmse_obs >= 1.4))),
            },
        },
        "grid convergence": {
            "max |order - 4|": summary(np.max([x["order_error"] for x in f], axis=1), 0.4),
            "gaps_fall_every_seed": bool(all(x["gaps_fall"] for x in f)),
            "finest_gap": summary([x["last_gap"] for x in f], 1e-6),
        },
        "profile vs Laplace ends (max error / (0.1 width))": summary(
            np.max([x["profile_over_atol"] for x in f], axis=1), 1.0
        ),
        "short window": {
            "short se / long se (min of c, k)": summary(short_ratio, 3.0, above_fails=False),
            "|correlation|": summary(
                [x["short_abs_correlation"] for x in f], 0.8, above_fails=False
            ),
            "profile width ratio": summary(
                [x["short_profile_width_ratio"] for x in f], 3.0, above_fails=False
            ),
            "condition numbers (config only)": cond[0].tolist(),
            "condition identical on every seed": bool(np.all(cond == cond[0])),
        },
        "coverage over 24 seeds": {
            "covered_min_of_c_k": summary(covered.min(axis=1), floor - 0.5, above_fails=False),
            "floor_count": floor,
            "floor_count_before": int(math.ceil(24 * (0.95 - 3 * math.sqrt(0.95 * 0.05 / 24)))),
            "exceed_before": int(
                np.sum(
                    covered.min(axis=1) < math.ceil(24 * (0.95 - 3 * math.sqrt(0.95 * 0.05 / 24)))
                )
            ),
            "miss_rate_over_all_intervals": miss_rate.tolist(),
            "miss_rate_upper_99": [float(v) for v in miss_upper],
            "size_binomial_nominal": float(2 * stats.binom.cdf(floor - 1, seeds, 0.95)),
            "size_binomial_at_miss_rate_upper_99": float(
                sum(stats.binom.cdf(floor - 1, seeds, 1 - m) for m in miss_upper)
            ),
            "size_before_binomial_nominal": float(2 * stats.binom.cdf(19, seeds, 0.95)),
            "z_sd_pooled_over_seeds": np.std(z, axis=0, ddof=1).tolist(),
        },
        "prediction test at held-out fraction 0.2": prediction_summary(pred),
        "passed_at_seed_0": figures.get(0, {}).get("passed"),
    }


def prediction_summary(pred: list[dict]) -> dict:
    gaps = np.array([p["min_gap"] for p in pred])
    short = np.array([p["short_gap"] for p in pred])
    return {
        "reported_vs_recomputed_rel": summary([p["rel_error"] for p in pred], s3p.RTOL),
        "min_gap_to_wrong_times": summary(gaps, s3p.MIN_GAP, above_fails=False),
        "short_gap_to_last_seen": summary(short, s3p.SHORT_GAP, above_fails=False),
    }


def sweep_prediction(keys: int) -> dict:
    figures, failed = run_study(train, range(keys), "prediction 0.35", fraction=0.35)
    return {
        "seeds": f"0..{keys - 1}, held-out fraction 0.35",
        "fit_errors": failed,
        **prediction_summary([x["prediction"] for x in figures.values()]),
    }


def sweep_rewrites(keys: int) -> dict:
    """Each stage-3 rewrite's study figures against the reference's, same seeds."""
    reference, _ = run_study(train, range(keys), "reference")
    out = {}
    scalar_keys = (
        "abs_z",
        "se_ratio",
        "fisher_ratio",
        "rmse_truth_over_noise",
        "rmse_observed_over_noise",
        "order_error",
        "profile_over_atol",
        "short_se_over_long_se",
        "short_abs_correlation",
        "short_profile_width_ratio",
        "covered",
    )
    for entry in entries("reformulations", "train.py", "3"):
        start = time.perf_counter()
        module = rewritten(train, entry["find"], entry["replace"])
        figures, failed = run_study(module, range(keys), entry["id"])
        diffs = {}
        for name in scalar_keys:
            d = [
                np.max(
                    np.abs(
                        np.asarray(figures[s][name], float) - np.asarray(reference[s][name], float)
                    )
                )
                for s in figures
            ]
            diffs[name] = float(max(d))
        flips = sum(figures[s]["passed"] != reference[s]["passed"] for s in figures)
        out[entry["id"]] = {
            "largest_abs_change_of_each_figure": diffs,
            "seeds_whose_verdicts_changed": int(flips),
            "fit_errors": failed,
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(f"  rewrite {entry['id']}: {diffs}", flush=True)
    return {"seeds": f"0..{keys - 1}", "rewrites": out}


# NOISE MODELS OF THE LIMITS -----------------------------------------------------------


def sweep_model(splits: int = 20_000, draws: int = 200_000) -> dict:
    """Sizes of the study's limits under their noise models; the held-out RMSEs need
    the Jacobian of the positions at the truth and a random split of the times."""
    config = Config.tiny()
    n_times = round(config.t_end / config.obs_dt)
    n_held = round(config.heldout_fraction * n_times)
    dof = n_times - n_held - 2
    ts = config.obs_dt * np.arange(1, n_times + 1)
    with jax.enable_x64(True):
        jac = np.asarray(
            identifiability._log_jacobian(
                jnp.asarray(config.theta_true),
                jnp.asarray([config.x0, config.v0]),
                jnp.asarray(ts),
                (1, 2),
                False,
                0.0,
            )
        )
    rng = np.random.default_rng(0)
    outer = jac[:, :, None] * jac[:, None, :]  # (N, 2, 2)
    total = outer.sum(axis=0)
    # Eigenvalues of (J_f^T J_f)^-1 J_h^T J_h per random split: held-out mean square
    # prediction error = sigma^2 / n_h (mu1 chi2_1 + mu2 chi2_1) under the linear model.
    held = np.argsort(rng.random((splits, n_times)), axis=1)[:, :n_held]
    info_h = outer[held].sum(axis=1)
    info_f = total[None] - info_h
    mu = np.sort(np.real(np.linalg.eigvals(np.linalg.solve(info_f, info_h))), axis=1)[:, ::-1]
    # The test's limit, per split: n_h limit^2 / sigma^2 = 2 mu_max ln(1 / SIZE).
    tail = _quadratic_form_tail(mu, 2 * mu[:, 0] * math.log(1 / s3lim.SIZE))
    tail_before = _quadratic_form_tail(mu, np.full(splits, n_held * 0.5**2))  # noise / 2
    limit_over_noise = np.sqrt(2 * mu[:, 0] * math.log(1 / s3lim.SIZE) / n_held)
    # Held-out RMSE vs the noisy values: noncentral chi2(n_h) given the prediction error.
    pick = rng.integers(0, splits, draws)
    xi = rng.standard_normal((draws, 2))
    lam = mu[pick, 0] * xi[:, 0] ** 2 + mu[pick, 1] * xi[:, 1] ** 2
    low, high = s3lim.rmse_over_noise_range(n_held)
    obs_low = stats.ncx2.cdf(n_held * low**2, n_held, lam)
    obs_high = stats.ncx2.sf(n_held * high**2, n_held, lam)
    seeds = config.coverage_seeds
    r_low, r_high = s3lim.se_ratio_range(seeds)
    rtol = s3lim.fisher_rtol(dof)
    z_lim = s3lim.z_limit(dof)
    floor = s3lim.coverage_floor(seeds, config.confidence)
    sizes = {
        "estimate vs truth: Student t(dof), 2 parameters": float(
            1 - (1 - 2 * stats.t.sf(z_lim, dof)) ** 2
        ),
        "se / spread: chi2(seeds - 1), 2 parameters": float(
            2
            * (
                stats.chi2.sf(seeds / r_low**2, seeds - 1)
                + stats.chi2.cdf(seeds / r_high**2, seeds - 1)
            )
        ),
        "Laplace vs Fisher se: chi2(dof), shared sigma_hat": float(
            stats.chi2.cdf(dof * (1 - rtol) ** 2, dof) + stats.chi2.sf(dof * (1 + rtol) ** 2, dof)
        ),
        "held-out RMSE vs truth: linear model, exact per split": float(tail.mean()),
        "held-out RMSE vs observed in range: noncentral chi2(n_h)": float(
            obs_low.mean() + obs_high.mean()
        ),
        "coverage over seeds: Binomial(seeds, nominal), 2 parameters": float(
            2 * stats.binom.cdf(floor - 1, seeds, config.confidence)
        ),
    }
    for conf in (0.8, 0.95):
        lo, hi = s3lim.coverage_band(s3s.LINEAR_DATA_SETS, conf)
        sizes[f"linear model coverage, level {conf}: Binomial, 2 parameters, 2 sides"] = float(
            2
            * (
                stats.binom.cdf(lo - 1, s3s.LINEAR_DATA_SETS, conf)
                + stats.binom.sf(hi, s3s.LINEAR_DATA_SETS, conf)
            )
        )
    before = {
        "estimate vs truth |z| <= 4": float(1 - (1 - 2 * stats.t.sf(4.0, dof)) ** 2),
        "se / spread in (0.6, 1.6)": float(
            2 * (stats.chi2.sf(seeds / 0.36, seeds - 1) + stats.chi2.cdf(seeds / 2.56, seeds - 1))
        ),
        "Laplace vs Fisher se rtol 0.25": float(
            stats.chi2.cdf(dof * 0.75**2, dof) + stats.chi2.sf(dof * 1.25**2, dof)
        ),
        "held-out RMSE vs truth < noise / 2": float(tail_before.mean()),
        "held-out RMSE vs observed in (0.6, 1.4)": float(
            stats.ncx2.cdf(n_held * 0.36, n_held, lam).mean()
            + stats.ncx2.sf(n_held * 1.96, n_held, lam).mean()
        ),
        "coverage >= nominal - 3 binomial se (>= 20 of 24)": float(
            2 * stats.binom.cdf(19, seeds, config.confidence)
        ),
        "linear model coverage within 3 binomial se, per level": float(
            1 - (1 - 2 * stats.norm.sf(3.0)) ** 2
        ),
    }
    # Power: the smallest error each check catches with probability 1/2 (and 0.9).
    median_chi = stats.chi2.median(seeds - 1)
    power = {
        "estimate vs truth: bias in se": [z_lim, z_lim + stats.norm.isf(0.1)],
        "se / spread: se off by a factor": [
            r_high / math.sqrt(seeds / median_chi),
            r_low / math.sqrt(seeds / median_chi),
        ],
        "Laplace vs Fisher se: se off by a factor": [1 + rtol, 1 - rtol],
        "coverage over seeds: true coverage failing half the time": float(
            _coverage_at_half(seeds, floor)
        ),
        "held-out RMSE vs truth: its limit over the noise std, over splits": summary(
            limit_over_noise
        ),
        "held-out RMSE vs observed: the range over the noise std": [low, high],
    }
    return {
        "fit_dof": dof,
        "held_out": n_held,
        "splits": splits,
        "rmse_draws": draws,
        "size_per_check_SIZE": s3lim.SIZE,
        "sizes": sizes,
        "stage_3_total_union_bound": float(sum(sizes.values())),
        "sizes_of_the_limits_before": before,
        "limits": {
            "z_limit": z_lim,
            "se_ratio_range": [r_low, r_high],
            "fisher_rtol": rtol,
            "rmse_over_noise_range": [low, high],
            "coverage_floor_of_24": floor,
            "linear_coverage_band_0.8": list(s3lim.coverage_band(s3s.LINEAR_DATA_SETS, 0.8)),
            "linear_coverage_band_0.95": list(s3lim.coverage_band(s3s.LINEAR_DATA_SETS, 0.95)),
        },
        "power_at_half_and_0.9_or_factor_up_down": power,
        "held_out_mse_eigenvalue_sum_mean": float(mu.sum(axis=1).mean()),
        "held_out_mse_largest_eigenvalue_max": float(mu[:, 0].max()),
    }


def _quadratic_form_tail(mu: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(mu_1 xi_1^2 + mu_2 xi_2^2 > x) per row (xi standard normal): exact, by
    integrating over xi_1."""
    u_end = np.sqrt(x / mu[:, 0])
    grid = np.linspace(0.0, 1.0, 4001)[None, :] * u_end[:, None]
    inner = np.clip((x[:, None] - mu[:, :1] * grid**2) / mu[:, 1:], 0.0, None)
    integrand = 2 * stats.norm.pdf(grid) * 2 * stats.norm.sf(np.sqrt(inner))
    return 2 * stats.norm.sf(u_end) + np.trapezoid(integrand, grid, axis=1)


def _coverage_at_half(seeds: int, floor: int) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if stats.binom.cdf(floor - 1, seeds, mid) > 0.5:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# STAGE 3: LINEAR MODEL, ROW-BY-ROW LAPLACE -------------------------------------------


def linear_verdict(module, conf: float, seed: int) -> tuple[bool, list[float], float]:
    content, covered = s3s.linear_model_intervals(module.laplace, conf, seed)
    s = s3s.LINEAR_DATA_SETS
    low, high = s3lim.coverage_band(s, conf)
    count = covered.sum(axis=0)
    z = (count - s * conf) / math.sqrt(s * conf * (1 - conf))
    ok = bool(np.all(np.abs(content - conf) <= 1e-9)) and bool(
        np.all((count >= low) & (count <= high))
    )
    return ok, z.tolist(), float(np.abs(content - conf).max())


def sweep_linear(keys: int, rewrite_keys: int, bug_keys: int) -> dict:
    out = {"data_sets": s3s.LINEAR_DATA_SETS, "test_seeds": {"0.8": 80, "0.95": 95}}
    seeds = np.random.default_rng(7).integers(0, 2**31, keys)
    for conf in (0.8, 0.95):
        s = s3s.LINEAR_DATA_SETS
        low, high = s3lim.coverage_band(s, conf)
        sd = math.sqrt(s * conf * (1 - conf))
        res = [linear_verdict(train, conf, int(k)) for k in seeds]
        z = np.array([r[1] for r in res])
        out[str(conf)] = {
            "generator_seeds": keys,
            "band_counts": [low, high],
            "band_in_binomial_se": [(low - s * conf) / sd, (high - s * conf) / sd],
            "max_abs_z": summary(
                np.abs(z).max(axis=1), min((s * conf - low) / sd, (high - s * conf) / sd)
            ),
            "failed": int(sum(not r[0] for r in res)),
            "failed_before_3_se": int(np.sum(np.abs(z).max(axis=1) > 3.0)),
            "z_sd": z.std(axis=0, ddof=1).tolist(),
            "content_max_abs_error": float(max(r[2] for r in res)),
        }
        rewrites = {}
        for entry in entries("reformulations", "train.py", "3"):
            module = rewritten(train, entry["find"], entry["replace"])
            rz = [linear_verdict(module, conf, int(k)) for k in seeds[:rewrite_keys]]
            rewrites[entry["id"]] = {
                "same_counts_as_reference": int(
                    sum(np.allclose(a[1], b[1], atol=0) for a, b in zip(rz, res, strict=False))
                ),
                "of": rewrite_keys,
                "failed": int(sum(not r[0] for r in rz)),
                "content_max_abs_error": float(max(r[2] for r in rz)),
            }
        out[str(conf)]["rewrites"] = rewrites
        bugs = {}
        for entry in entries("bugs", "train.py", "3"):
            module = rewritten(train, entry["find"], entry["replace"])
            at_test = linear_verdict(module, conf, int(conf * 100))
            bz = [linear_verdict(module, conf, int(k)) for k in seeds[:bug_keys]]
            bugs[entry["id"]] = {
                "fails_at_the_test_seed": not at_test[0],
                "z_at_the_test_seed": at_test[1],
                "content_error_at_the_test_seed": at_test[2],
                "power_over_seeds": float(np.mean([not r[0] for r in bz])),
                "of": bug_keys,
                "mean_z": np.mean([r[1] for r in bz], axis=0).tolist(),
            }
        out[str(conf)]["seeded_bugs"] = bugs
        print(f"  linear {conf}: {out[str(conf)]['max_abs_z']}", flush=True)
    return out


def row_ratio(module, seed: int, confidence: float, scaled: bool = True) -> float:
    """The row-by-row test's largest |actual - reference| / (atol + rtol |reference|);
    `scaled=False`: with atol 0 (the test's tolerance before its atol was added)."""
    fits = s3s._fits(seed)
    lap = module.laplace(fits, confidence)
    worst = 0.0
    for _, got, want, atol in s3s.laplace_against_rows(lap, fits, confidence):
        err = np.abs(np.asarray(got) - np.asarray(want))
        bound = (atol if scaled else 0.0) + s3s.ROW_RTOL * np.abs(np.asarray(want))
        with np.errstate(divide="ignore", invalid="ignore"):
            worst = max(worst, float(np.max(np.where(err == 0, 0.0, err / bound))))
    return worst


def sweep_rows(keys: int) -> dict:
    rng = np.random.default_rng(11)
    seeds = np.concatenate([np.arange(keys // 2), rng.integers(0, 2**31, keys - keys // 2)])
    confs = rng.choice([0.5, 0.8, 0.95, 0.99], keys)
    forms = {"reference": train} | {
        e["id"]: rewritten(train, e["find"], e["replace"])
        for e in entries("reformulations", "train.py", "3")
    }
    out = {
        "draws": keys,
        "seeds": f"0..{keys // 2 - 1} and {keys - keys // 2} uniform in [0, 2^31]",
    }
    for name, module in forms.items():
        pairs = list(zip(seeds, confs, strict=True))
        r = np.array([row_ratio(module, int(s), float(c)) for s, c in pairs])
        before = np.array([row_ratio(module, int(s), float(c), scaled=False) for s, c in pairs])
        worst = int(np.argmax(before))
        jac = s3s._fits(int(seeds[worst])).jac
        out[name] = {
            **summary(r, 1.0),
            "before_atol_0": {
                **summary(before, 1.0),
                "above_0.1": int(np.sum(before > 0.1)),
                "above_0.01": int(np.sum(before > 0.01)),
                "worst_seed": int(seeds[worst]),
                "worst_cond_JtJ": float(max(np.linalg.cond(j.T @ j) for j in jac)),
            },
        }
        print(f"  rows {name}: max {r.max():.3g}, before {before.max():.3g}", flush=True)
    return out


# STAGES 1 AND 2: HYPOTHESIS ROUND-OFF TESTS, ORDER TESTS --------------------------------


def _draws(ranges: list[tuple[float, float]], keys: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lo = np.array([r[0] for r in ranges])
    hi = np.array([r[1] for r in ranges])
    corners = np.array(list(itertools.product(*ranges)))
    return np.concatenate([corners, lo + (hi - lo) * rng.random((keys, len(ranges)))])


def sweep_rk4(keys: int) -> dict:
    """rk4_step vs the NumPy RK4 (rtol = atol = 1e-13): largest error / tolerance."""
    ranges = [(-3.0, 3.0), (1e-3, 0.5), (-2.0, 2.0), (-2.0, 2.0), (0.1, 3.0), (0.0, 2.0)]
    draws = _draws(ranges, keys, 3)
    forms = {"reference": solver} | {
        e["id"]: rewritten(solver, e["find"], e["replace"])
        for e in entries("reformulations", "solver.py", "1")
    }
    out = {"draws": len(draws), "corners": 2 ** len(ranges), "loads": [0.0, 0.7]}
    for name, module in forms.items():
        ratios = []
        with jax.enable_x64(True):
            step = jax.jit(module.rk4_step, static_argnums=0)
            for i, (t, dt, y1, y2, a, b) in enumerate(draws):
                load = 0.7 if i % 2 else 0.0
                got = np.asarray(
                    step(
                        s1.TIMED,
                        jnp.float64(t),
                        jnp.array([y1, y2]),
                        jnp.array([a, b]),
                        jnp.float64(dt),
                        load,
                    )
                )
                want = s1._numpy_rk4(s1._np_tdep((a, b), load), t, np.array([y1, y2]), dt)
                ratios.append(float(np.max(np.abs(got - want) / (1e-13 + 1e-13 * np.abs(want)))))
        out[name] = summary(ratios, 1.0)
        print(f"  rk4 {name}: max {max(ratios):.3g}", flush=True)
    return out


def sweep_jacobians(keys: int) -> dict:
    """Hand-written Jacobians and rhs vs autodiff (rtol = atol = 1e-13), both systems."""
    ranges = [(-3.0, 3.0), (-3.0, 3.0), (0.2, 4.0), (0.0, 2.0), (0.2, 9.0)]
    draws = _draws(ranges, keys, 5)
    out = {"draws": len(draws), "corners": 2 ** len(ranges)}
    for name, system in s2._SYSTEMS.items():
        ratios = []
        for y1, y2, p1, p2, p3 in draws:
            theta = np.array([p1, p2, p3][: len(system.param_names)])
            y = (y1, y2)
            dfdy, dfdth = sens._jacobians(system, np.array(y), theta)
            ref_dy, ref_dth, ref_f = s2._autodiff_jacobians(system, y, theta)
            got = [dfdy, dfdth, sens._numpy_rhs(system, np.array(y), theta)]
            want = [ref_dy, ref_dth, ref_f]
            ratios.append(
                max(
                    float(np.max(np.abs(g - w) / (1e-13 + 1e-13 * np.abs(w))))
                    for g, w in zip(got, want, strict=True)
                )
            )
        out[name] = summary(ratios, 1.0)
        print(f"  jacobians {name}: max {max(ratios):.3g}", flush=True)
    return out


def sweep_order(keys: int, rewrite_keys: int) -> dict:
    """The order-4 tests' fitted orders over the seeds of their random batches."""
    out = {"seeds": f"0..{keys - 1}", "tolerance": s1.ORDER_TOLERANCE}
    cases = [(3, 10.0), (5, 4.0)]
    forms = {"reference": solver} | {
        e["id"]: rewritten(solver, e["find"], e["replace"])
        for e in entries("reformulations", "solver.py", "1")
    }
    reference = {}
    for name, module in forms.items():
        n = keys if name == "reference" else min(keys, rewrite_keys)
        dev, finest, orders = [], [], {}
        for batch, t_end in cases:
            for seed in range(n):
                theta, y0 = s1.oscillator_batch(batch, seed)
                study = module.rk4_error_study((0.1, 0.05, 0.025, 0.0125), theta, y0, t_end)
                orders[batch, seed] = study["observed_order"]
                dev.append(abs(study["observed_order"] - 4.0))
                finest.append(study["max_abs_error"][-1])
        if name == "reference":
            reference = orders
            scipy_case = []
            for seed in range(n):
                theta, y0 = s1.oscillator_batch(2, seed)
                study = module.rk4_error_study((0.1, 0.05, 0.025), theta, y0, 4.0)
                scipy_case.append(abs(study["observed_order"] - 4.0))
            out["reference"] = {
                "max |order - 4|": summary(dev, s1.ORDER_TOLERANCE),
                "finest_error": summary(finest, 1e-6),
                "error-study test (batch 2, t_end 4, 3 steps): max |order - 4|": summary(
                    scipy_case, 0.5
                ),
            }
        else:
            out[name] = {
                "seeds_per_case": n,
                "max |order - 4|": summary(dev, s1.ORDER_TOLERANCE),
                "largest_change_of_order_vs_reference": float(
                    max(abs(orders[k] - reference[k]) for k in orders)
                ),
            }
        print(f"  order {name}: max dev {max(dev):.3g}", flush=True)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=200, help="seeds of the study")
    parser.add_argument("--prediction-keys", type=int, default=32)
    parser.add_argument("--rewrite-keys", type=int, default=4, help="study seeds per rewrite")
    parser.add_argument("--linear-keys", type=int, default=400)
    parser.add_argument("--linear-rewrite-keys", type=int, default=50)
    parser.add_argument("--bug-keys", type=int, default=100, help="seeds per seeded bug")
    parser.add_argument("--row-keys", type=int, default=4000)
    parser.add_argument("--draw-keys", type=int, default=1000, help="rk4_step draws")
    parser.add_argument("--jacobian-keys", type=int, default=200)
    parser.add_argument("--order-keys", type=int, default=32)
    parser.add_argument("--order-rewrite-keys", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "evidence" / "size_sweep.json")
    parts = [
        "study",
        "prediction",
        "rewrites",
        "model",
        "linear",
        "rows",
        "rk4",
        "jacobians",
        "order",
    ]
    parser.add_argument("--only", choices=parts, action="append")
    args = parser.parse_args(argv)
    old = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    report = {
        "note": "Made by tests/size_sweep.py; see its docstring. Each part records "
        "the command that made it and its seconds.",
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "SIZE_per_stage_3_check": s3lim.SIZE,
        "parts": old.get("parts", {}),
    }
    sections = {
        "study": ("stage 3: tiny study over seeds", lambda: sweep_study(args.keys)),
        "prediction": (
            "stage 3: prediction test, held-out fraction 0.35",
            lambda: sweep_prediction(args.prediction_keys),
        ),
        "rewrites": (
            "stage 3: study under the laplace rewrites",
            lambda: sweep_rewrites(args.rewrite_keys),
        ),
        "model": ("stage 3: sizes and power under the noise models", sweep_model),
        "linear": (
            "stage 3: linear-model interval test",
            lambda: sweep_linear(args.linear_keys, args.linear_rewrite_keys, args.bug_keys),
        ),
        "rows": ("stage 3: row-by-row laplace (Hypothesis)", lambda: sweep_rows(args.row_keys)),
        "rk4": ("stage 1: rk4_step vs NumPy (Hypothesis)", lambda: sweep_rk4(args.draw_keys)),
        "jacobians": (
            "stage 2: hand Jacobians vs autodiff (Hypothesis)",
            lambda: sweep_jacobians(args.jacobian_keys),
        ),
        "order": (
            "stage 1: order-4 tests over batch seeds",
            lambda: sweep_order(args.order_keys, args.order_rewrite_keys),
        ),
    }
    for part in args.only or parts:
        name, run = sections[part]
        began = time.perf_counter()
        print(f"{part} ...", flush=True)
        record = run()
        record["command"] = "python tests/size_sweep.py " + " ".join(argv)
        record["seconds"] = round(time.perf_counter() - began, 1)
        report["parts"][name] = record
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"  {part}: {record['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
