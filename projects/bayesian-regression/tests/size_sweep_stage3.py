"""The stage-3 part of the size sweep (`size_sweep`, which runs it): SBC of the learner's
HMC, Neal's funnel, the NUTS second opinion, and the checks on fixed AR(1) draws."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import test_stage_3_diagnostics as s3
from scipy import stats
from size_sweep import rewritten, stage_sampler, summary

from bayesian_regression import calibration, diagnostics, funnel, hmc, model, nuts, train


def _distinct(forms, modules=("hmc", "model")) -> dict:
    """The reference and the formulations that rewrite one of `modules` and do not run
    the reference's bits (stage 3's HMC at its test key tells)."""
    cfg, out, reference = s3.CONFIG, {}, None
    problem = train.make_problem(cfg)
    for form, (hmc_mod, model_mod) in forms.items():
        touched = {"hmc": hmc_mod is not hmc, "model": model_mod is not model}
        if form != "reference" and not any(touched[m] for m in modules):
            continue
        sampler = stage_sampler(hmc_mod, model_mod.regression_log_density, problem.dim, cfg)
        bits = np.asarray(
            sampler(jax.random.key(cfg.seed), problem.args, jnp.float32(1.0)).positions
        )
        if reference is not None and np.array_equal(bits, reference):
            continue
        reference = bits if reference is None else reference
        out[form] = (hmc_mod, model_mod)
    return out


def sweep_sbc(forms, keys, rewrite_keys: int) -> dict:
    """The SBC test (200 data sets, one HMC chain each): min p-value over its 3
    parameters, under `keys` for the reference and the first `rewrite_keys` of them for
    each rewrite that changes the ranks at the test's key."""
    cfg = s3.CONFIG
    problem = train.make_problem(cfg)
    x = problem.dataset.x[:20, :2]
    prior = problem.prior._replace(mean=problem.prior.mean[:2])
    pmins, by_form, reference_ranks = [], {}, None
    for form, (hmc_mod, model_mod) in forms.items():
        cal = rewritten(calibration, form, "", "")
        cal.hmc, cal.model = hmc_mod, model_mod
        run = jax.jit(
            jax.vmap(lambda k, cal=cal: cal._hmc_ranks.__wrapped__(k, x, prior, 200, 200, 19, 10))
        )
        own = np.asarray(cal._hmc_ranks(jax.random.key(21), x, prior, 200, 200, 19, 10))
        if form == "reference":
            reference_ranks = own
        elif np.array_equal(own, reference_ranks):
            by_form[form] = "the reference's ranks at the test key, not swept"
            continue
        start = time.perf_counter()
        use = keys if form == "reference" else keys[:rewrite_keys]
        ranks = np.asarray(run(use))
        p = [
            min(calibration.uniformity_test(r[:, i], 19, 10).p_value for i in range(3))
            for r in ranks
        ]
        pmins += p
        by_form[form] = {"keys": len(use), "smallest_min_p": float(min(p))}
        print(f"  sbc {form}: {time.perf_counter() - start:.0f} s, min p {min(p):.2g}", flush=True)
    v = np.asarray(pmins)
    return {
        **summary(v, s3.SBC_P_MIN, above_fails=False),
        "by_formulation": by_form,
        # Under H0 each p is uniform, so the min of 3 falls below p0 with 1 - (1 - p0)^3.
        "fraction_min_p_below": {
            str(p0): {"observed": float(np.mean(v < p0)), "expected": 1 - (1 - p0) ** 3}
            for p0 in (0.1, 0.01, 0.001)
        },
    }


def sweep_funnel(forms, keys) -> dict:
    """The funnel test under every HMC rewrite and key (the model rewrites do not reach it)."""
    cfg = s3.FUNNEL_CONFIG
    figures, by_form = [], {}
    for form, (hmc_mod, _) in _distinct(forms, ("hmc",)).items():
        start = time.perf_counter()
        runs = {}
        for target, density in (
            ("centered", funnel.centered_log_density),
            ("noncentered", funnel.noncentered_log_density),
        ):
            sampler = stage_sampler(hmc_mod, density, 10, cfg)
            runs[target] = jax.jit(jax.vmap(sampler, in_axes=(0, None, None)))(
                keys, None, jnp.float32(1.0)
            )
        found = []
        for k in range(len(keys)):
            one = {t: jax.tree.map(lambda a, k=k: a[k], r) for t, r in runs.items()}
            one["noncentered"] = one["noncentered"]._replace(
                positions=funnel.noncentered_to_centered(one["noncentered"].positions)
            )
            found.append(s3.funnel_figures(one["centered"], one["noncentered"]))
        figures += found
        by_form[form] = int(sum(not s3.funnel_passes(f) for f in found))
        print(f"  funnel {form}: {time.perf_counter() - start:.0f} s", flush=True)
    z = np.array([f["noncentered_v_z"] for f in figures])
    return {
        "runs": len(figures),
        "failures": int(sum(not s3.funnel_passes(f) for f in figures)),
        "failures_by_formulation": by_form,
        "noncentered_max_rhat": summary([f["noncentered"]["max_rhat"] for f in figures], 1.01),
        "noncentered_min_ess": summary([f["noncentered"]["min_ess"] for f in figures], 400, False),
        "noncentered_divergent": summary([f["noncentered"]["num_divergent"] for f in figures], 1),
        "noncentered_v_abs_z": {
            **summary(np.abs(z).max(axis=1), s3.FUNNEL_Z_LIMIT),
            "sd_of_each_z": [float(v) for v in z.std(axis=0, ddof=1)],
            "skew_of_each_z": [float(v) for v in stats.skew(z, axis=0)],
            "kurtosis_of_each_z": [float(v) for v in stats.kurtosis(z, axis=0)],
            "fraction_abs_z_above_3": [float(v) for v in np.mean(np.abs(z) > 3, axis=0)],
            "normal_abs_z_above_3": float(2 * stats.norm.sf(3)),
            "size_normal": float(1 - (1 - 2 * stats.norm.sf(s3.FUNNEL_Z_LIMIT)) ** 2),
        },
        "centered_divergent": summary([f["centered"]["num_divergent"] for f in figures], 0, False),
        "centered_trustworthy": int(
            sum(f["centered"]["verdict"] == "trustworthy" for f in figures)
        ),
    }


def sweep_nuts(forms, keys, nuts_keys: int) -> dict:
    """The NUTS test: NumPyro NUTS (not the learner's code) under `nuts_keys` keys, each
    paired with the learner's HMC draws (4 x 1000) of one key and formulation."""
    cfg = s3.CONFIG
    problem = train.make_problem(cfg)
    mcmc = nuts.make_mcmc(*s3.NUTS_RUN, cfg.target_accept)
    start = time.perf_counter()
    nuts_draws = [
        np.asarray(nuts.run_nuts(k, mcmc, *problem.args).positions, np.float64)
        for k in keys[:nuts_keys]
    ]
    print(f"  nuts: {time.perf_counter() - start:.0f} s", flush=True)
    figures = []
    for hmc_mod, model_mod in _distinct(forms).values():
        sampler = stage_sampler(hmc_mod, model_mod.regression_log_density, problem.dim, cfg)
        draws = np.asarray(
            jax.jit(jax.vmap(sampler, in_axes=(0, None, None)))(
                keys, problem.args, jnp.float32(1.0)
            ).positions,
            np.float64,
        )
        for k in range(len(keys)):
            figures.append(s3.nuts_figures(nuts_draws[k % nuts_keys], draws[k], problem.moments))
    z_exact = np.array([f["nuts_vs_exact_z"] for f in figures[:nuts_keys]])
    z_between = np.array([f["nuts_vs_hmc_z"] for f in figures])
    return {
        "nuts_runs": nuts_keys,
        "hmc_runs": len(figures),
        "failures": int(sum(not s3.nuts_passes(f) for f in figures)),
        "nuts_vs_exact_abs_z": {
            **summary(np.abs(z_exact).max(axis=1), s3.NUTS_Z_LIMIT),
            "sd_of_each_z": [round(float(v), 3) for v in z_exact.std(axis=0, ddof=1)],
        },
        "nuts_vs_hmc_abs_z": {
            **summary(np.abs(z_between).max(axis=1), s3.NUTS_Z_LIMIT),
            "sd_of_each_z": [round(float(v), 3) for v in z_between.std(axis=0, ddof=1)],
        },
        "rhat_nuts_max": summary([max(f["rhat_nuts"]) for f in figures[:nuts_keys]], 1.02),
        "rhat_hmc_max": summary([max(f["rhat_hmc"]) for f in figures], 1.02),
    }


def sweep_fixed_draws(num_keys: int) -> dict:
    """The AR(1) ESS and R-hat flag tests run on fixed NumPy draws (no learner code draws
    them: a correct solution reproduces their figures to rounding, size 0). Here their
    keys change, to show how far each figure sits from its bar."""
    ess_err = {0.5: [], 0.9: []}
    rhats: dict[str, list] = {}
    for k in range(num_keys):
        for phi in ess_err:
            chains, n = s3.AR1_ESS_DRAWS
            x = s3._ar1(jax.random.key(10_000 + k), chains, n, phi)
            exact = chains * n * (1 - phi) / (1 + phi)
            ess_err[phi].append(abs(diagnostics.ess_mean(x) / exact - 1.0))
        base = jax.random.split(jax.random.key(20_000 + k), 3)
        chains, n = s3.RHAT_FLAG_DRAWS
        agree = s3._ar1(base[0], chains, n, 0.5)
        cases = {
            "agree": agree,
            "one chain shifted": s3._ar1(base[1], chains, n, 0.5, [0.0, 0.0, 0.0, 1.0]),
            "one chain 3x wider": s3._ar1(base[2], chains, n, 0.5)
            * np.array([1, 1, 1, 3.0])[:, None],
            "trend within chains": agree + np.linspace(0.0, 2.0, n)[None, :],
        }
        for name, x in cases.items():
            rhats.setdefault(name, []).append(diagnostics.rhat(x))
    out = {
        f"AR(1) phi={phi}: |ESS / S(1-phi)/(1+phi) - 1|": summary(v, 0.15)
        for phi, v in ess_err.items()
    }
    for name, v in rhats.items():
        out[f"R-hat, {name}"] = summary(v, 1.01, above_fails=name == "agree")
    return out
