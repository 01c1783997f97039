"""The commands' work: sample to a checkpoint, diagnose a checkpoint, and the
full report (exact vs HMC vs NUTS vs VI, diagnostics, the funnel, SBC).

Every verdict in a report is computed from the figures next to it.
"""

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from arviz_stats.base import array_stats
from scipy import special, stats

from bayesian_regression import (
    calibration,
    checkpoint,
    diagnostics,
    funnel,
    hmc,
    model,
    nuts,
    plots,
    train,
)
from bayesian_regression.config import Config

RHAT_LIMIT = 1.01  # Vehtari et al. (2021): use the sample only when R-hat < 1.01
ESS_PER_CHAIN = 100  # ... and bulk- and tail-ESS above 100 per chain
Z_LIMIT = 4.0  # |z| above 4 for any of ~20 moments: P < 0.002 for a correct sampler
FUNNEL_DIM = 10


def funnel_names() -> list[str]:
    return ["v"] + [f"x[{i}]" for i in range(FUNNEL_DIM - 1)]


def sample_target(
    config: Config, target: str, sampler: str, step_size_factor: float = 1.0
) -> tuple[hmc.Samples, list[str]]:
    """Draws of `target` (`regression`, `funnel-centered`, `funnel-noncentered`),
    always returned in the target's natural coordinates."""
    key = jax.random.key(config.seed)
    if target == "regression":
        problem = train.make_problem(config)
        names = train.parameter_names(config.num_features)
        if sampler == "nuts":
            mcmc = nuts.make_mcmc(
                config.num_chains, config.num_warmup, config.num_samples, config.target_accept
            )
            result = nuts.run_nuts(key, mcmc, *problem.args)
            chains = config.num_chains
            samples = hmc.Samples(
                result.positions,
                result.accept_prob,
                result.is_divergent,
                result.step_size,
                jnp.ones((chains, problem.dim)),
            )
            return samples, names
        return train.sample_hmc(config, problem, key, step_size_factor), names
    log_density = {
        "funnel-centered": funnel.centered_log_density,
        "funnel-noncentered": funnel.noncentered_log_density,
    }[target]
    samples = hmc.run_chains(
        key,
        log_density,
        None,
        FUNNEL_DIM,
        config.num_chains,
        config.num_warmup,
        config.num_samples,
        config.num_leapfrog,
        config.target_accept,
        step_size_factor,
    )
    if target == "funnel-noncentered":
        samples = samples._replace(positions=funnel.noncentered_to_centered(samples.positions))
    return samples, funnel_names()


def sample_to_checkpoint(
    config: Config, workdir: Path, target: str, sampler: str, step_size_factor: float
) -> Path:
    samples, names = sample_target(config, target, sampler, step_size_factor)
    out = workdir / f"{target}-{sampler}"
    if out.exists():
        shutil.rmtree(out)
    meta = {
        "target": target,
        "sampler": sampler,
        "names": names,
        "config": config.model_dump(),
        "step_size_factor": step_size_factor,
    }
    checkpoint.save(out, samples, meta)
    plots.trace_plot(
        np.asarray(samples.positions), names, out / "trace.png", f"{target} ({sampler})"
    )
    return out


def diagnose_draws(samples: hmc.Samples, names: list[str]) -> dict[str, Any]:
    """Hand-built diagnostics beside ArviZ's, divergences, and a computed verdict."""
    positions = np.asarray(samples.positions, np.float64)
    rows = diagnostics.summarize(positions, names)
    chains = positions.shape[0]
    for i, row in enumerate(rows):
        x = positions[:, :, i]
        row["arviz_rhat"] = float(array_stats.rhat(x)) if chains >= 2 else None
        row["arviz_ess_bulk"] = float(array_stats.ess(x, method="bulk"))
        row["arviz_ess_tail"] = float(array_stats.ess(x, method="tail", prob=0.05))
    num_divergent = int(np.sum(np.asarray(samples.is_divergent)))
    max_rhat = max((r["rhat"] for r in rows if r["rhat"] is not None), default=None)
    min_ess = min(min(r["ess_bulk"], r["ess_tail"]) for r in rows)
    problems = []
    if max_rhat is not None and max_rhat >= RHAT_LIMIT:
        problems.append(f"max R-hat {max_rhat:.3f} >= {RHAT_LIMIT}")
    if min_ess < ESS_PER_CHAIN * chains:
        problems.append(f"min ESS {min_ess:.0f} < {ESS_PER_CHAIN * chains}")
    if num_divergent:
        problems.append(f"{num_divergent} divergent transitions")
    return {
        "rows": rows,
        "num_divergent": num_divergent,
        "mean_accept_prob": float(np.mean(np.asarray(samples.accept_prob))),
        "max_rhat": max_rhat,
        "min_ess": min_ess,
        "chains": chains,
        "draws_per_chain": positions.shape[1],
        "verdict": "trustworthy" if not problems else "NOT trustworthy: " + "; ".join(problems),
    }


def diagnose_checkpoint(run_dir: Path) -> dict[str, Any]:
    samples, meta = checkpoint.restore(run_dir)
    result = diagnose_draws(samples, meta["names"])
    result["target"], result["sampler"] = meta["target"], meta["sampler"]
    plots.rank_plot(
        np.asarray(samples.positions),
        meta["names"],
        run_dir / "rank.png",
        f"{meta['target']} ({meta['sampler']})",
    )
    train.write_json(run_dir / "diagnostics.json", result)
    return result


def format_diagnostics(result: dict[str, Any]) -> str:
    lines = [
        f"{'name':>10} {'mean':>9} {'sd':>8} {'mcse':>8} {'R-hat':>7} {'(ArviZ)':>7} "
        f"{'bulk':>7} {'(ArviZ)':>7} {'tail':>7} {'(ArviZ)':>7}"
    ]
    for r in result["rows"]:
        rh = "-" if r["rhat"] is None else f"{r['rhat']:.4f}"
        arh = "-" if r["arviz_rhat"] is None else f"{r['arviz_rhat']:.4f}"
        lines.append(
            f"{r['name']:>10} {r['mean']:9.4f} {r['sd']:8.4f} {r['mcse']:8.4f} {rh:>7} {arh:>7} "
            f"{r['ess_bulk']:7.0f} {r['arviz_ess_bulk']:7.0f} {r['ess_tail']:7.0f} "
            f"{r['arviz_ess_tail']:7.0f}"
        )
    lines.append(
        f"divergent transitions: {result['num_divergent']}  mean acceptance: "
        f"{result['mean_accept_prob']:.3f}  verdict: {result['verdict']}"
    )
    return "\n".join(lines)


class LogInvGamma:
    """Distribution of `log sigma^2` when `sigma^2 ~ InvGamma(shape, rate)`: pdf and ppf."""

    def __init__(self, shape: float, rate: float) -> None:
        self.shape, self.rate = shape, rate

    def pdf(self, u):
        a, b = self.shape, self.rate
        return np.exp(a * np.log(b) - special.gammaln(a) - a * u - b * np.exp(-u))

    def ppf(self, q):
        return np.log(stats.invgamma.ppf(q, self.shape, scale=self.rate))


def exact_marginals(problem: train.Problem) -> list[Any]:
    post = problem.posterior
    a, b = float(post.shape), float(post.rate)
    scale = np.sqrt(b / a * np.diag(np.asarray(model.weight_scale_matrix(post), np.float64)))
    out = [
        stats.t(df=2 * a, loc=float(m), scale=float(s))
        for m, s in zip(np.asarray(post.mean), scale, strict=True)
    ]
    return out + [LogInvGamma(a, b)]


def _moment_line(label: str, z: dict[str, Any]) -> str:
    verdict = "agrees with the exact posterior" if z["max_abs_z"] < Z_LIMIT else "DISAGREES"
    return f"| {label} | {z['max_abs_z']:.2f} | {verdict} (limit {Z_LIMIT}) |"


def full_report(config: Config, workdir: Path, progress: Callable[[str], None] = print) -> Path:
    """Runs everything on `config` and writes `report.md`, `report.json` and plots."""
    workdir.mkdir(parents=True, exist_ok=True)
    problem = train.make_problem(config)
    names = train.parameter_names(config.num_features)
    keys = jax.random.split(jax.random.key(config.seed + 1), 5)
    key_vi_mf, key_vi_fr, key_eval_mf, key_eval_fr, key_sbc = keys

    progress("1/5 HMC on the regression posterior ...")
    hmc_samples, _ = sample_target(config, "regression", "hmc")
    hmc_z = train.moment_zscores(hmc_samples.positions, problem.moments)
    hmc_diag = diagnose_draws(hmc_samples, names)
    progress("2/5 NumPyro NUTS on the same posterior ...")
    nuts_samples, _ = sample_target(config, "regression", "nuts")
    nuts_z = train.moment_zscores(nuts_samples.positions, problem.moments)
    nuts_diag = diagnose_draws(nuts_samples, names)
    progress("3/5 mean-field and full-rank VI ...")
    vi = {
        fam: train.vi_summary(train.fit_vi(config, problem, k, fam), problem, k_eval)
        for fam, k, k_eval in (
            ("meanfield", key_vi_mf, key_eval_mf),
            ("fullrank", key_vi_fr, key_eval_fr),
        )
    }
    mf_prediction = train.mean_field_variance_prediction(problem.moments)
    progress("4/5 Neal's funnel, centered and non-centered ...")
    funnel_samples = {
        t: sample_target(config, t, "hmc")[0] for t in ("funnel-centered", "funnel-noncentered")
    }
    funnel_diag = {t: diagnose_draws(s, funnel_names()) for t, s in funnel_samples.items()}
    progress("5/5 simulation-based calibration of HMC ...")
    sbc_x = problem.dataset.x[:20, :2]
    sbc_prior = problem.prior._replace(mean=problem.prior.mean[:2])
    sbc_ranks = np.asarray(calibration.hmc_ranks(key_sbc, sbc_x, sbc_prior, 200, 200, 19, 10))
    sbc_tests = [calibration.uniformity_test(sbc_ranks[:, i], 19, 10) for i in range(3)]

    # PLOTS
    pos = np.asarray(hmc_samples.positions)
    plots.trace_plot(pos, names, workdir / "trace.png", "HMC trace")
    plots.rank_plot(pos, names, workdir / "rank.png", "HMC rank plot")
    plots.posterior_vs_exact(
        {
            "HMC": pos.reshape(-1, len(names)),
            "NUTS": np.asarray(nuts_samples.positions).reshape(-1, len(names)),
        },
        exact_marginals(problem),
        {f"VI {fam}": (vi[fam]["mean"], vi[fam]["var"]) for fam in vi},
        names,
        workdir / "posterior_vs_exact.png",
    )
    fpos = np.asarray(funnel_samples["funnel-centered"].positions)[:, :, :3]
    plots.trace_plot(
        fpos, funnel_names()[:3], workdir / "funnel_centered_trace.png", "centered funnel"
    )
    plots.rank_plot(
        fpos, funnel_names()[:3], workdir / "funnel_centered_rank.png", "centered funnel"
    )
    plots.sbc_histogram(sbc_ranks, ["w[0]", "w[1]", "log_sigma2"], 19, workdir / "sbc.png")

    payload = {
        "config": config.model_dump(),
        "exact": {
            "theta_mean": problem.moments.theta_mean,
            "log_evidence": problem.log_evidence,
            "condition": model.condition_numbers(problem.dataset.x, problem.posterior),
        },
        "hmc": {"z": hmc_z, "diagnostics": hmc_diag},
        "nuts": {"z": nuts_z, "diagnostics": nuts_diag},
        "vi": vi,
        "meanfield_variance_prediction": mf_prediction,
        "funnel": funnel_diag,
        "sbc": [t._asdict() for t in sbc_tests],
    }
    train.write_json(workdir / "report.json", payload)
    md = _markdown(
        config,
        problem,
        names,
        hmc_z,
        nuts_z,
        hmc_diag,
        nuts_diag,
        vi,
        mf_prediction,
        funnel_diag,
        sbc_tests,
    )
    path = workdir / "report.md"
    path.write_text(md, encoding="utf-8")
    return path


def _markdown(
    config,
    problem,
    names,
    hmc_z,
    nuts_z,
    hmc_diag,
    nuts_diag,
    vi,
    mf_prediction,
    funnel_diag,
    sbc_tests,
) -> str:
    exact_var = np.diag(np.asarray(problem.moments.theta_cov))
    lines = [
        "# Bayesian regression report",
        "",
        f"n = {config.num_obs}, d = {config.num_features}, feature correlation "
        f"{config.feature_correlation}, {config.num_chains} chains x {config.num_samples} draws.",
        "",
        "## Samplers against the exact posterior (max |z| over means and covariances)",
        "",
        "| Sampler | max abs z | Verdict |",
        "|---|---|---|",
        _moment_line("hand-built HMC", hmc_z),
        _moment_line("NumPyro NUTS", nuts_z),
        "",
        "## Diagnostics",
        "",
        "| Sampler | max R-hat | min ESS | divergences | Verdict |",
        "|---|---|---|---|---|",
    ]
    for label, d in (
        ("HMC", hmc_diag),
        ("NUTS", nuts_diag),
        ("funnel, centered", funnel_diag["funnel-centered"]),
        ("funnel, non-centered", funnel_diag["funnel-noncentered"]),
    ):
        lines.append(
            f"| {label} | {d['max_rhat']:.3f} | {d['min_ess']:.0f} | {d['num_divergent']} "
            f"| {d['verdict']} |"
        )
    lines += [
        "",
        "## Variational inference",
        "",
        "| Family | KL(q‖p) | variance ratio q / exact (per parameter) |",
        "|---|---|---|",
    ]
    for fam, s in vi.items():
        lines.append(f"| {fam} | {s['kl']:.4f} | {' '.join(f'{r:.3f}' for r in s['var_ratio'])} |")
    lines += [
        "",
        "Mean-field variance predicted for a Gaussian target (1 / precision_ii), as a ratio: "
        + " ".join(f"{p / v:.3f}" for p, v in zip(mf_prediction, exact_var, strict=True)),
        "",
    ]
    lines += [
        "## Simulation-based calibration (HMC, 200 data sets, 19 thinned draws each)",
        "",
        "H0: ranks uniform on {0..19}; chi-square over 10 bins, reject at p < 0.01.",
        "",
        "| Parameter | chi-square | p-value | Verdict |",
        "|---|---|---|---|",
    ]
    for name, t in zip(["w[0]", "w[1]", "log_sigma2"], sbc_tests, strict=True):
        lines.append(
            f"| {name} | {t.statistic:.1f} | {t.p_value:.3f} | "
            f"{'uniform (not rejected)' if t.p_value >= 0.01 else 'NOT uniform'} |"
        )
    lines += [
        "",
        "Plots: trace.png, rank.png, posterior_vs_exact.png, funnel_centered_trace.png, "
        "funnel_centered_rank.png, sbc.png.",
        "",
    ]
    return "\n".join(lines)
