"""Size sweep of the statistical stage tests: how often a CORRECT solution fails them.

    python tests/size_sweep.py [--keys 256] [--nuts-keys 32] [--out evidence/size_sweep.json]

Run on demand: pytest does not collect it; it takes about 40 minutes on a quiet 2-core
CPU (`--only PART` runs one part). A stage test with a fixed key still draws a random
figure: a learner's correct code that rounds differently (`step_size * (inv_mass * p)`
for `step_size * inv_mass * p`) parts the chains after a few hundred steps, as another
key would. So every statistical test is rerun here, computed as the test computes it
(the functions of `stat_checks` and the test modules), under `--keys` keys and under
the reference and nine rewrites equal in exact arithmetic (`REWRITES`). Each rewrite
is the reference source with one text substitution, imported as a module of its own
(nothing is patched in place); one whose draws under the test's key equal the
reference's bit for bit (XLA compiles both to one program) is noted and not swept.

For each statistic the JSON keeps its limit (read from the test modules), its largest
value over keys and formulations, its quantiles, the exceedance count, and the
figures of the model its limit was derived with (Student-t z-scores over independent
chains, ESS-based normal z-scores, a log-normal adapted inverse mass, uniform SBC
p-values, a normal spread of each VI figure), checked against the sweep's empirical
distribution. The stage-3 parts live in `size_sweep_stage3`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_stage_2_samplers as s2  # noqa: E402

from bayesian_regression import hmc, model, train, vi  # noqa: E402

# Equal in exact arithmetic, rounded differently: (name, module, find, replace).
REWRITES = [
    ("drift eps (m p)", "hmc", "step_size * inv_mass * p", "step_size * (inv_mass * p)"),
    ("drift (eps p) m", "hmc", "step_size * inv_mass * p", "step_size * p * inv_mass"),
    ("momentum z sqrt(1/m)", "hmc", "z / jnp.sqrt(inv_mass)", "z * jnp.sqrt(1.0 / inv_mass)"),
    ("X w by jnp.dot", "model", "resid = y - x @ w", "resid = y - jnp.dot(x, w)"),
    ("X w by einsum", "model", "resid = y - x @ w", 'resid = y - jnp.einsum("nd,d->n", x, w)'),
    ("X w row sums", "model", "resid = y - x @ w", "resid = y - jnp.sum(x * w[None, :], axis=1)"),
    ("squares by jnp.dot", "model", "jnp.sum(resid**2)", "jnp.dot(resid, resid)"),
    (
        "prior term scaled first",
        "model",
        "jnp.sum(dw**2) / prior_var",
        "jnp.sum((dw / prior.scale) ** 2) / sigma2",
    ),
    (
        "log_joint terms reassociated",
        "model",
        "return log_lik + log_prior_w + _log_inv_gamma_of_log(log_sigma2, prior.shape, prior.rate)",
        "return _log_inv_gamma_of_log(log_sigma2, prior.shape, prior.rate) + log_prior_w + log_lik",
    ),
]


def rewritten(module: types.ModuleType, name: str, find: str, replace: str):
    """A fresh module: `module`'s source with every `find` replaced (at least once)."""
    source = Path(module.__file__).read_text(encoding="utf-8")
    count = source.count(find)
    if count == 0:
        raise SystemExit(f"rewrite `{name}`: `{find}` is not in {module.__file__}")
    new = types.ModuleType(f"{module.__name__}_rewrite")
    new.__file__ = module.__file__
    exec(compile(source.replace(find, replace), module.__file__, "exec"), new.__dict__)
    # The module's own classes (`Prior`, ...), so that its type checks accept the data.
    for key, value in vars(module).items():
        if isinstance(value, type) and value.__module__ == module.__name__:
            new.__dict__[key] = value
    return new


def formulations() -> dict[str, tuple[types.ModuleType, types.ModuleType]]:
    """name -> (hmc module, model module) for the reference and every rewrite."""
    out = {"reference": (hmc, model)}
    for name, which, find, replace in REWRITES:
        if which == "hmc":
            out[name] = (rewritten(hmc, name, find, replace), model)
        else:
            out[name] = (hmc, rewritten(model, name, find, replace))
    return out


def stage_sampler(hmc_mod, log_density, dim: int, cfg):
    """`hmc_mod.make_sampler` with the test config's chains, warm-up, draws, leapfrog
    steps and target acceptance: the sampler a stage test runs, from one formulation."""
    return hmc_mod.make_sampler(
        log_density,
        dim,
        cfg.num_chains,
        cfg.num_warmup,
        cfg.num_samples,
        cfg.num_leapfrog,
        cfg.target_accept,
    )


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
        out["exceed"] = int(np.sum(v >= limit) if above_fails else np.sum(v <= limit))
    return out


def sweep_hmc(forms, keys) -> dict:
    """The moments, mass-matrix and divergence tests under every formulation and key.
    A formulation whose draws under the test's key equal the reference's bit for bit
    (XLA compiles both to one program) is recorded as such and not swept again."""
    cfg = s2.CORRELATED
    designs = {"correlated": s2.CORRELATED, "uncorrelated": s2.UNCORRELATED}
    problems = {n: train.make_problem(c) for n, c in designs.items()}
    z_all, z_by_form, ratios, div1, div3, accept, taus = [], {}, {}, [], [], [], []
    at_test_key, reference_bits = {}, {}
    test_key = jax.random.key(cfg.seed)
    for form, (hmc_mod, model_mod) in forms.items():
        start = time.perf_counter()
        sampler = stage_sampler(
            hmc_mod, model_mod.regression_log_density, problems["correlated"].dim, cfg
        )
        at_test_key[form] = {}
        for name, problem in problems.items():
            own = np.asarray(sampler(test_key, problem.args, jnp.float32(1.0)).positions)
            if form == "reference":
                reference_bits[name] = own
            at_test_key[form][name] = {
                "max_abs_z": float(np.abs(s2.moment_z_vector(own, problem.moments)).max()),
                "same_bits_as_reference": bool(np.array_equal(own, reference_bits[name])),
            }
        if form != "reference" and all(
            v["same_bits_as_reference"] for v in at_test_key[form].values()
        ):
            print(f"  hmc {form}: the reference's bits, not swept", flush=True)
            continue
        batched = jax.jit(jax.vmap(sampler, in_axes=(0, None, None)))
        per_key = np.zeros((len(keys), 0))
        for name, problem in problems.items():
            out = batched(keys, problem.args, jnp.float32(1.0))
            big = batched(keys, problem.args, jnp.float32(3.0))
            pos = np.asarray(out.positions, np.float64)
            z = np.array([s2.moment_z_vector(pos[k], problem.moments) for k in range(len(keys))])
            per_key = np.concatenate([per_key, z], axis=1)
            taus.append([s2.mixing_times(pos[k], problem.moments) for k in range(len(keys))])
            var = np.diag(np.asarray(problem.moments.theta_cov, np.float64))
            ratios.setdefault(name, []).append(np.asarray(out.inv_mass, np.float64) / var)
            div1.append(np.asarray(out.is_divergent).sum(axis=(1, 2)))
            div3.append(np.asarray(big.is_divergent).mean(axis=(1, 2)))
            accept.append(np.asarray(out.accept_prob).mean(axis=(1, 2)))
        z_all.append(per_key)
        z_by_form[form] = float(np.abs(per_key).max())
        print(
            f"  hmc {form}: max |z| {z_by_form[form]:.2f} over keys, at the test key "
            f"{[round(v['max_abs_z'], 2) for v in at_test_key[form].values()]} "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    z = np.concatenate(z_all)  # (runs, 2 designs x 14)
    limit, dof = s2.Z_LIMIT, s2.Z_DOF
    spread = z.std(axis=0, ddof=1)
    runs = z.shape[0]
    # Each z-score's spread, at the upper end of its 99% confidence interval: the scale
    # by which the size is recomputed from Student-t.
    scale = spread * np.sqrt((runs - 1) / stats.chi2.ppf(0.01, runs - 1))
    divergent = np.concatenate(div1)
    return {
        "runs_per_design": runs,
        "moments_max_abs_z": {
            **summary(np.abs(z).max(axis=1), limit),
            "by_formulation": z_by_form,
            "at_the_test_key": at_test_key,
            "z_scores_per_test": int(z.shape[1]),
            "t_dof": dof,
            "sd_of_each_z": [round(float(v), 4) for v in spread],
            "sd_expected_t": float(np.sqrt(dof / (dof - 2))),
            "mean_of_each_z": [round(float(v), 3) for v in z.mean(axis=0)],
            "size_sidak_t_z_part": float(1.0 - (1.0 - 2 * stats.t.sf(limit, dof)) ** z.shape[1]),
            "size_with_each_sd_at_upper_99": float(
                1.0 - np.prod(1.0 - 2 * stats.t.sf(limit / (scale / np.sqrt(dof / (dof - 2))), dof))
            ),
            "empirical_tail_vs_t": {
                f"two-sided p < {p}": {
                    "observed": float(np.mean(2 * stats.t.sf(np.abs(z), dof) < p)),
                    "expected": p,
                }
                for p in (1e-2, 1e-3, 1e-4)
            },
        },
        "mixing_time": {
            **summary(np.max(np.concatenate(taus), axis=1), s2.MIX_LIMIT),
            "mean_per_parameter": [
                [round(float(v), 3) for v in np.mean(t, axis=0)] for t in taus[:2]
            ],
            "largest_mean_over_formulations_designs_parameters": float(
                max(np.mean(t, axis=0).max() for t in taus)
            ),
            "tau_max_assumed": s2.TAU_MAX,
        },
        "mass_ratio": mass_summary({n: np.concatenate(r) for n, r in ratios.items()}),
        "divergent_at_1x": {
            **summary(divergent, s2.MAX_DIVERGENT_AT_1X + 1),
            "runs_with_any": int(np.sum(divergent > 0)),
            "transitions_per_run": int(cfg.num_chains * cfg.num_samples),
            # Poisson, rate at the upper end of its 95% interval from the runs seen:
            # the chance of more than MAX_DIVERGENT_AT_1X in one design's run.
            "size_per_design_poisson_upper_95": float(
                stats.poisson.sf(
                    s2.MAX_DIVERGENT_AT_1X,
                    stats.chi2.ppf(0.95, 2 * (divergent.sum() + 1)) / 2 / divergent.size,
                )
            ),
        },
        "divergent_fraction_at_3x": summary(np.concatenate(div3), 0.1, above_fails=False),
        "accept_at_1x": summary(np.concatenate(accept)),
    }


def mass_summary(ratios: dict[str, np.ndarray]) -> dict:
    """Adapted inverse mass / exact variance (runs, chains, d) per design, on the log
    scale: mean, spread and tails against the normal model of the test's limits."""
    low, high = s2.MASS_RATIO_RANGE
    out = {
        "limits": [low, high],
        "model_log_mean_sd": [s2.MASS_LOG_MEAN, s2.MASS_LOG_SD],
        "ratios_per_test": s2.MASS_RATIOS_PER_TEST,
    }
    size = 0.0
    for name, r in ratios.items():
        flat = np.log(r.reshape(-1, r.shape[-1]))
        mu, sd = flat.mean(axis=0), flat.std(axis=0, ddof=1)
        n = flat.shape[0]
        sd_up = sd * np.sqrt((n - 1) / stats.chi2.ppf(0.01, n - 1))
        tail = stats.norm.cdf((np.log(low) - mu) / sd_up) + stats.norm.sf(
            (np.log(high) - mu) / sd_up
        )
        size += float(np.sum(tail) * r.shape[1])
        out[name] = {
            "min": float(np.exp(flat.min())),
            "max": float(np.exp(flat.max())),
            "log_mean": [round(float(v), 4) for v in mu],
            "log_sd": [round(float(v), 4) for v in sd],
            "log_sd_upper_99": [round(float(v), 4) for v in sd_up],
            "skew": [round(float(v), 3) for v in stats.skew(flat, axis=0)],
            "tail_vs_normal_fit": {
                f"{side} {p}": {"observed": float(np.mean(obs)), "expected": p}
                for p in (1e-2, 1e-3)
                for side, obs in (
                    ("below", flat < mu + stats.norm.ppf(p) * sd),
                    ("above", flat > mu + stats.norm.isf(p) * sd),
                )
            },
            "exceed": int(np.sum((flat <= np.log(low)) | (flat >= np.log(high)))),
        }
    out["size_normal_fit_sd_upper_99"] = size
    return out


def sweep_vi(forms, keys) -> dict:
    """Full-rank and mean-field VI under every `log_joint` formulation and key (the HMC
    rewrites do not reach VI); one that fits the reference's bits is not swept again."""
    cfg = s2.CORRELATED
    designs = {"correlated": s2.CORRELATED, "uncorrelated": s2.UNCORRELATED}
    problems = {n: train.make_problem(c) for n, c in designs.items()}
    figures: dict[str, list] = {}
    raw: dict[str, list] = {}
    reference_params, skipped = {}, []
    pairs = jax.vmap(jax.random.split)(keys)
    test_key_fit = jax.random.split(jax.random.key(11))[0]
    for form, (hmc_mod, model_mod) in forms.items():
        if hmc_mod is not hmc:
            continue
        start = time.perf_counter()
        density = model_mod.regression_log_density
        fits = {}
        for name, problem in problems.items():
            for family in ("meanfield", "fullrank"):
                fit = vi.make_fit(
                    density,
                    problem.dim,
                    family,
                    cfg.vi_steps,
                    float(cfg.vi_learning_rate),
                    cfg.vi_num_mc,
                )
                own = np.asarray(fit(test_key_fit, problem.args).params.raw_scale)
                if form == "reference":
                    reference_params[name, family] = own
                fits[name, family] = (fit, np.array_equal(own, reference_params[name, family]))
        if form != "reference" and all(same for _, same in fits.values()):
            skipped.append(form)
            print(f"  vi {form}: the reference's bits, not swept", flush=True)
            continue
        for name, problem in problems.items():
            summaries = {}
            for family in ("meanfield", "fullrank"):
                batched = jax.jit(jax.vmap(fits[name, family][0], in_axes=(0, None)))
                result = batched(pairs[:, 0], problem.args)
                summaries[family] = [
                    train.vi_summary(
                        vi.VIResult(jax.tree.map(lambda a, k=k: a[k], result.params), None),
                        problem,
                        pairs[k, 1],
                        s2.VI_EVAL_DRAWS,
                    )
                    for k in range(len(keys))
                ]
            for k in range(len(keys)):
                found = s2.vi_statistics(
                    summaries["fullrank"][k], summaries["meanfield"][k], problem.moments
                )
                for key, value in found.items():
                    figures.setdefault(key, []).append(value)
                full, mean_field = summaries["fullrank"][k], summaries["meanfield"][k]
                signed = {
                    "fullrank mean_error_in_sd": full["mean_error_in_sd"],
                    "fullrank var_ratio - 1": full["var_ratio"] - 1.0,
                    "fullrank kl": [full["kl"]],
                    "meanfield var_ratio / predicted - 1": mean_field["var_ratio"]
                    / (
                        train.mean_field_variance_prediction(problem.moments)
                        / np.diag(np.asarray(problem.moments.theta_cov, np.float64))
                    )
                    - 1.0,
                    "meanfield kl gap - predicted": [found["meanfield_kl_gap_error_beyond_15pct"]],
                }
                for key, value in signed.items():
                    raw.setdefault(f"{name}: {key}", []).append(np.asarray(value, np.float64))
        print(f"  vi {form}: {time.perf_counter() - start:.0f} s", flush=True)
    out = {"not_swept_same_bits": skipped, "eval_draws": s2.VI_EVAL_DRAWS}
    for key, values in figures.items():
        out[key] = summary(values, s2.VI_LIMITS[key])
    # Per design and parameter: the signed figure's mean and spread (upper 99% bound), and
    # the limit that puts its normal tails at the Sidak bound of its test.
    per = {}
    for key, values in raw.items():
        v = np.stack(values)
        n = v.shape[0]
        sd_up = v.std(axis=0, ddof=1) * np.sqrt((n - 1) / stats.chi2.ppf(0.01, n - 1))
        per[key] = {
            "mean": [round(float(x), 5) for x in v.mean(axis=0)],
            "sd": [round(float(x), 5) for x in v.std(axis=0, ddof=1)],
            "sd_upper_99": [round(float(x), 5) for x in sd_up],
            "min": [round(float(x), 5) for x in v.min(axis=0)],
            "max": [round(float(x), 5) for x in v.max(axis=0)],
            "kurtosis": [round(float(x), 2) for x in stats.kurtosis(v, axis=0)],
        }
    out["signed_per_design_and_parameter"] = per
    return out


def sweep_elbo(keys) -> dict:
    out = {}
    for family in ("meanfield", "fullrank"):
        z = [s2.elbo_z(family, k)[3] for k in keys]
        out[family] = summary(np.abs(z), s2.ELBO_Z_LIMIT)
        out[family]["sd"] = float(np.std(z, ddof=1))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=256)
    parser.add_argument("--out", type=Path, default=ROOT / "evidence" / "size_sweep.json")
    parser.add_argument(
        "--only",
        choices=["hmc", "vi", "elbo", "sbc", "funnel", "nuts", "fixed"],
        action="append",
    )
    parser.add_argument("--rewrite-keys", type=int, default=64, help="SBC keys per rewrite")
    parser.add_argument("--nuts-keys", type=int, default=32)
    args = parser.parse_args(argv)
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    forms = formulations()
    keys = jax.random.split(jax.random.key(20_240_601), args.keys)
    old = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    report = {
        "command": "python tests/size_sweep.py " + " ".join(argv),
        "keys": args.keys,
        "formulations": ["reference"] + [r[0] for r in REWRITES],
        "rewrites": [{"name": n, "module": m, "find": f, "replace": r} for n, m, f, r in REWRITES],
        "jax": jax.__version__,
        "tests": old.get("tests", {}),
    }
    start = time.perf_counter()
    from size_sweep_stage3 import sweep_fixed_draws, sweep_funnel, sweep_nuts, sweep_sbc

    sections = {
        "hmc": ("stage 2: HMC (moments, mass matrix, divergences)", lambda: sweep_hmc(forms, keys)),
        "vi": ("stage 2: VI fits", lambda: sweep_vi(forms, keys)),
        "elbo": ("stage 2: ELBO estimator", lambda: sweep_elbo(keys)),
        "sbc": ("stage 3: SBC of HMC", lambda: sweep_sbc(forms, keys, args.rewrite_keys)),
        "funnel": ("stage 3: funnel", lambda: sweep_funnel(forms, keys)),
        "nuts": ("stage 3: NUTS second opinion", lambda: sweep_nuts(forms, keys, args.nuts_keys)),
        "fixed": ("stage 3: fixed draws, keys changed", lambda: sweep_fixed_draws(args.keys)),
    }
    todo = args.only or ["hmc", "vi", "elbo", "sbc", "funnel", "nuts", "fixed"]
    for part in todo:
        name, run = sections[part]
        began = time.perf_counter()
        report["tests"][name] = run()
        report["tests"][name]["sweep_seconds"] = round(time.perf_counter() - began, 1)
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
