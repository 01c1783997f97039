"""Size sweep of the statistical stage tests: how often a CORRECT solution fails them.

    python tests/size_sweep.py [--keys 400] [--schedule-keys 10000] [--md1-keys 48]
                               [--only PART] [--out evidence/size_sweep.json]

Run on demand: pytest does not collect it (the recorded parts took 22 minutes on a busy
shared 2-core CPU, with the keys in each part's `command`; `--only PART` runs one part
and keeps the other parts' records). A stage test with a fixed seed or key still judges
a random figure: a learner's correct code that rounds differently (a cross-entropy from
`log_softmax`, `x * s - m * s` for `(x - m) * s`) trains along another path, as another
seed would, and a schedule drawn another way is another draw. So each statistical test
is rerun here under many seeds or keys, its figures computed as the test computes them:
the stage-1 and stage-2 test functions are called as they are, with a recording
`Evidence` and a model trained with another seed; the stage-3 tests' figures come from
the helpers those tests call (`schedule_figures`, `md1_figures`, `queue_model_verdict`).
The training parts also run under rewrites of the code equal in exact arithmetic
(`REWRITES`: each is the module's source with one substitution, imported as a module of
its own; nothing is patched in place).

Parts:
  training  stage 1 test accuracy; stage 2 int8 effects, policies vs NumPy, and the
            golden rows' top-2 margins (a premise of the drift test): per seed
  schedule  stage 3 arrival schedule (mean gap, CV, size fractions): per key
  md1       stage 3 queue simulator vs M/D/1: per key, rho 0.5 and 0.8
  served    stage 3 served vs single-row logits: every batch composition of the
            test's 20 rows, per seed
  load      stage 3 queue model vs measured server: repeated runs, one server
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import types
from pathlib import Path

import jax
import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import conftest  # noqa: E402  (the suite's JAX settings and its `Evidence`)
import test_stage_1_artifact as s1  # noqa: E402
import test_stage_2_export_verify as s2v  # noqa: E402
import test_stage_2_precision as s2p  # noqa: E402
import test_stage_3_capacity as s3c  # noqa: E402
import test_stage_3_server as s3s  # noqa: E402

from deployment_audit import data, export, loadgen, model, serve, train  # noqa: E402
from deployment_audit.config import Config, LoadConfig  # noqa: E402

SECOND = {"hidden_sizes": (48, 24), "num_epochs": 4}  # stage 2's second model (seed 3 there)

# Equal in exact arithmetic, rounded differently: (name, module, find, replace).
REWRITES = [
    (
        "cross-entropy from log_softmax",
        "train",
        "return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()",
        "return -jnp.take_along_axis(jax.nn.log_softmax(model(x)), y[:, None], axis=1).mean()",
    ),
    (
        "normalize as x * scale - mean * scale",
        "model",
        "return (x - mean[None, :]) * scale[None, :]",
        "return x * scale[None, :] - (mean * scale)[None, :]",
    ),
    (
        "loss mean as sum / batch",
        "train",
        "return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()",
        "return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(model(x), y)) / y.shape[0]",
    ),
    (
        "hidden affine by einsum (reformulations.toml)",
        "model",
        'x = jax.nn.relu(x @ layer["kernel"] + layer["bias"][None, :])',
        'x = jax.nn.relu(jnp.einsum("bi,io->bo", x, layer["kernel"]) + layer["bias"][None, :])',
    ),
]


def rewritten(module: types.ModuleType, name: str, find: str, replace: str) -> types.ModuleType:
    """A fresh module: `module`'s source with `find` replaced (it must occur)."""
    source = Path(module.__file__).read_text(encoding="utf-8")
    if find not in source:
        raise SystemExit(f"rewrite `{name}`: `{find}` is not in {module.__file__}")
    new = types.ModuleType(f"{module.__name__}_rewrite")
    new.__file__ = module.__file__
    exec(compile(source.replace(find, replace), module.__file__, "exec"), new.__dict__)
    return new


def train_module(which: str, find: str, replace: str, name: str) -> types.ModuleType:
    """`train` run under one rewrite: of train.py itself, or of model.py (then the
    new train module's names from `model` are the rewritten module's)."""
    if which == "train":
        return rewritten(train, name, find, replace)
    new_model = rewritten(model, name, find, replace)
    new_train = rewritten(train, name, "", "")
    for key in ("logits_from_raw", "normalize", "params_of"):
        new_train.__dict__[key] = getattr(new_model, key)
    return new_train


def summary(values, limit=None, above_fails=True) -> dict:
    v = np.asarray(values, np.float64).ravel()
    out = {
        "n": int(v.size),
        "min": float(v.min()),
        "q01": float(np.quantile(v, 0.01)),
        "median": float(np.median(v)),
        "mean": float(v.mean()),
        "sd": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "q99": float(np.quantile(v, 0.99)),
        "max": float(v.max()),
    }
    if limit is not None:
        out["limit"] = float(limit)
        out["exceed"] = int(np.sum(v > limit) if above_fails else np.sum(v < limit))
    return out


def sd_upper_99(sd: float, n: int) -> float:
    """The upper end of the 99% confidence interval of a normal spread from n values."""
    return float(sd * np.sqrt((n - 1) / stats.chi2.ppf(0.01, n - 1)))


def normal_tail(values, limit: float, above_fails: bool) -> dict:
    """Normal fit of `values` (spread at its upper 99% bound): the chance of a value
    past `limit`, and the margin in fitted spreads."""
    v = np.asarray(values, np.float64)
    mu, sd = float(v.mean()), float(v.std(ddof=1))
    sd_up = max(sd_upper_99(sd, v.size), 1e-12)
    z = (limit - mu) / sd_up if above_fails else (mu - limit) / sd_up
    return {"mean": mu, "sd": sd, "sd_upper_99": sd_up, "margin_in_sd": z, "size": stats.norm.sf(z)}


def call_test(test, *args, **kwargs) -> tuple[bool, list[dict]]:
    """Runs a stage test function with a recording `Evidence`: (passed, its records)."""
    log = conftest.Evidence("sweep")
    try:
        test(log, *args, **kwargs)
        passed = True
    except AssertionError:
        passed = False
    return passed, log.records


def training_figures(train_mod, seed: int) -> dict:
    """Every figure of the training-based tests for one seed (both models)."""
    first = train_mod.train_and_evaluate(Config.tiny().model_copy(update={"seed": seed}))
    second = train_mod.train_and_evaluate(Config.tiny().model_copy(update={**SECOND, "seed": seed}))
    models = {"hidden (32,)": first, "hidden (48, 24)": second}
    out: dict = {"failed": []}
    ok, records = call_test(s1.test_accuracy_recomputed_in_numpy, first)
    out["accuracy"] = records[0]["observed"]
    if not ok:
        out["failed"].append("stage 1 accuracy")
    for which in models:
        ok, records = call_test(
            s2p.test_int8_is_per_channel_and_its_error_is_bounded, models, which
        )
        out[f"int8 {which}"] = records[0]["observed"]["effects"]
        if not ok:
            out["failed"].append(f"stage 2 int8 {which}")
        ok, records = call_test(s2p.test_precision_policies_against_numpy, models, which)
        out[f"policies {which}"] = {
            r["check"].split(" ")[0]: r["observed"]["max_abs_error"] / r["tolerance"]["atol"]
            for r in records
            if "forward vs NumPy" in r["check"]
        }
        out[f"policies {which}"]["near_ties"] = max(
            r["observed"].get("near_ties", 0) for r in records
        )
        out[f"flips {which}"] = {
            r["check"].split(" ")[0]: len(r["observed"]["table"])
            for r in records
            if "flipped examples" in r["check"]
        }
        if not ok:
            out["failed"].append(f"stage 2 policies {which}")
    golden = np.asarray(first["_golden"]["logits"], np.float64)
    top2 = np.sort(golden, axis=1)[:, -2:]
    out["golden_margins"] = (top2[:, 1] - top2[:, 0]).tolist()
    # The drift test's premise threshold (4 windows of 4 ulps of the largest logit),
    # and how far the float32 golden logits lie from a float64 forward pass.
    ulp = float(np.spacing(np.float32(np.abs(golden).max())))
    out["premise_threshold"] = 4 * 4 * ulp
    mean, scale = data.spec_arrays(first["_spec"]["preprocessing"])
    inputs = (np.asarray(first["_golden"]["inputs"], np.float64) - mean) * scale
    f64 = s2v._numpy_forward(first["_params"], inputs)
    out["golden_f32_vs_f64_in_ulps"] = float(np.abs(golden - f64).max() / ulp)
    out["bits"] = first["params_sha256"]
    return out


def sweep_training(keys: int, rewrite_keys: int) -> dict:
    forms = {"reference": train}
    for name, which, find, replace in REWRITES:
        forms[name] = train_module(which, find, replace, name)
    per_form, skipped = {}, []
    reference_at_test_seed = None
    for form, train_mod in forms.items():
        start = time.perf_counter()
        at_test = training_figures(train_mod, 0)
        same = {
            "params": at_test["bits"],
            "accuracy": at_test["accuracy"],
            "golden_margins": at_test["golden_margins"],
        }
        if form == "reference":
            reference_at_test_seed = same
        elif same == reference_at_test_seed:
            skipped.append(form)
            print(f"  training {form}: the reference's figures at seed 0, not swept", flush=True)
            continue
        n = keys if form == "reference" else rewrite_keys
        rows = [at_test] + [training_figures(train_mod, seed) for seed in range(1, n)]
        per_form[form] = rows
        failed = sum(bool(r["failed"]) for r in rows)
        print(
            f"  training {form}: {n} seeds, {failed} with a failed test "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    rows = [r for form_rows in per_form.values() for r in form_rows]
    out: dict = {
        "seeds_per_formulation": {f: len(r) for f, r in per_form.items()},
        "not_swept_same_figures": skipped,
        "failed_runs": [
            {"formulation": f, "seed": i, "tests": r["failed"]}
            for f, form_rows in per_form.items()
            for i, r in enumerate(form_rows)
            if r["failed"]
        ],
        "at_the_test_seed": {
            f: {k: r[0][k] for k in ("accuracy", "int8 hidden (32,)", "int8 hidden (48, 24)")}
            for f, r in per_form.items()
        },
    }
    # Stage 1: the accuracy (>= 0.9) and its NumPy recount (within 0.01 of it).
    acc = np.array([r["accuracy"]["numpy_accuracy"] for r in rows])
    diff = np.array(
        [abs(r["accuracy"]["numpy_accuracy"] - r["accuracy"]["reported_accuracy"]) for r in rows]
    )
    out["stage 1: test accuracy"] = {
        **summary(acc, 0.9, above_fails=False),
        "normal_fit": normal_tail(acc, 0.9, above_fails=False),
        "by_formulation_mean": {
            f: float(np.mean([r["accuracy"]["numpy_accuracy"] for r in form_rows]))
            for f, form_rows in per_form.items()
        },
    }
    out["stage 1: |numpy - reported accuracy|"] = summary(diff, 0.01)
    # Stage 2: int8 effects against their bounds, per model and policy.
    effects = {}
    for which in ("hidden (32,)", "hidden (48, 24)"):
        for policy, (acc_bound, fraction) in s2p.EFFECT_BOUNDS.items():
            change = np.array([abs(r[f"int8 {which}"][policy]["accuracy_change"]) for r in rows])
            flips = np.array([r[f"flips {which}"][policy] for r in rows])
            signed = np.array(
                [round(450 * r[f"int8 {which}"][policy]["accuracy_change"]) for r in rows]
            )
            # The change in examples is gains - losses, each at most (flips +- change) / 2:
            # two Poisson counts (Skellam), each rate at the upper end of its 99% interval.
            gains, losses = (flips + signed) / 2, (flips - signed) / 2
            mu_g, mu_l = (
                stats.chi2.ppf(0.99, 2 * (c.sum() + 1)) / 2 / c.size for c in (gains, losses)
            )
            # Most examples the change may reach: 9 of 450 is 0.02 up to float rounding.
            allowed = int(np.ceil(acc_bound * 450 - 1e-9)) - 1
            logit = np.array(
                [r[f"int8 {which}"][policy]["logit_error_fraction_of_range"] for r in rows]
            )
            effects[f"{which} {policy}"] = {
                "abs_accuracy_change": {
                    **summary(change, acc_bound),
                    "normal_fit": normal_tail(change, acc_bound, True),
                    "in_test_examples": [round(float(v) * 450) for v in np.unique(change)],
                },
                "flipped_examples": {
                    **summary(flips),
                    "variance_over_mean": float(flips.var(ddof=1) / max(flips.mean(), 1e-12)),
                    "signed_change_in_examples": summary(signed),
                    "allowed_change_in_examples": allowed,
                    "gain_loss_rates_upper_99": [float(mu_g), float(mu_l)],
                    "size_skellam": float(
                        stats.skellam.sf(allowed, mu_g, mu_l)
                        + stats.skellam.cdf(-allowed - 1, mu_g, mu_l)
                    ),
                },
                "logit_error_fraction": {
                    **summary(logit, fraction),
                    "normal_fit": normal_tail(logit, fraction, True),
                    "lognormal_fit": normal_tail(np.log(logit), np.log(fraction), True),
                },
            }
    out["stage 2: int8 effects bounded"] = effects
    policies = {}
    for which in ("hidden (32,)", "hidden (48, 24)"):
        for policy in ("f32", "bf16", "int8_w", "int8_w8a8"):
            ratio = np.array([r[f"policies {which}"][policy] for r in rows])
            policies[f"{which} {policy}"] = summary(ratio, 1.0)
        policies[f"{which} near ties"] = summary(
            [r[f"policies {which}"]["near_ties"] for r in rows]
        )
    out["stage 2: policies vs NumPy (max error / atol)"] = policies
    # The drift test's premise: every golden row's top-2 margin, after a drift that may
    # shrink it by 2 x the 2x drift, above the premise threshold (4 rounding windows).
    margins = np.concatenate([r["golden_margins"] for r in rows])
    need = np.array([r["premise_threshold"] for r in rows]) + 2 * 2 * s2v.SELF_TEST_ATOL
    density = {str(m): float(np.mean(margins < m) / m) for m in (0.05, 0.1, 0.2, 0.5)}
    f0 = max(density.values())
    rows_per_run = len(rows[0]["golden_margins"])
    out["stage 2: golden top-2 margins (drift test premise)"] = {
        **summary(np.min([r["golden_margins"] for r in rows], axis=1)),
        "fails_below": summary(need),
        "exceed": int(np.sum(np.min([r["golden_margins"] for r in rows], axis=1) <= need)),
        "rows_per_run": rows_per_run,
        "density_near_zero_per_unit": density,
        "size_linear_density": float(rows_per_run * f0 * need.mean()),
        "size_linear_density_former_10x_drift": float(
            rows_per_run * f0 * (10 + 2) * 2 * s2v.SELF_TEST_ATOL
        ),
        "golden_f32_vs_f64_in_ulps": summary([r["golden_f32_vs_f64_in_ulps"] for r in rows]),
    }
    return out


def sweep_schedule(keys: int) -> dict:
    """The schedule test's figures under `keys` keys (key(11) is the test's)."""
    rate = s3c.SCHEDULE_WORKLOAD[0]
    figures = []
    for i in range(keys):
        figures.append(s3c.schedule_figures(jax.random.key(i))[1])
        if i % 2000 == 1999:
            print(f"  schedule: {i + 1} keys", flush=True)
    rel = np.array([f["mean_gap_s"] * rate - 1 for f in figures])
    cv = np.array([f["gap_cv"] for f in figures])
    frac = np.array([f["size_fractions"][1] for f in figures])
    n = s3c.SCHEDULE_WORKLOAD[1] - 1  # gaps
    gamma = stats.gamma(n, scale=1 / n)  # the mean of n unit exponentials
    limits = s3c.SCHEDULE_LIMITS
    lim = limits["mean_gap_relative"]
    within = [s3c.schedule_within_limits(f) for f in figures]
    size_mean = float(gamma.cdf(1 - lim) + gamma.sf(1 + lim))
    cv_sd = 1 / np.sqrt(n)
    return {
        "keys": keys,
        "failed": int(len(within) - sum(within)),
        "mean_gap_relative_error": {
            **summary(np.abs(rel), lim),
            "exceed_at": {str(v): int(np.sum(np.abs(rel) > v)) for v in (0.05, 0.06, 0.07)},
            "sd": float(rel.std(ddof=1)),
            "sd_expected": float(1 / np.sqrt(n)),
            "size_gamma_exact": size_mean,
            "size_gamma_exact_at": {
                str(v): float(gamma.cdf(1 - v) + gamma.sf(1 + v)) for v in (0.06, 0.065, 0.07)
            },
            "power_rate_off_by": {
                str(e): float(
                    stats.gamma(n, scale=1 / (n * (1 + e))).cdf(1 - lim)
                    + stats.gamma(n, scale=1 / (n * (1 + e))).sf(1 + lim)
                )
                for e in (0.07, 0.1, 0.12)
            },
        },
        "gap_cv": {
            **summary(cv),
            "limits": limits["cv"],
            "sd_expected": float(cv_sd),
            "size_normal": float(
                stats.norm.cdf((limits["cv"][0] - 1) / cv_sd)
                + stats.norm.sf((limits["cv"][1] - 1) / cv_sd)
            ),
        },
        "size_fraction_1_row": {
            **summary(frac),
            "limits": limits["size_fraction"],
            "size_binomial": float(
                stats.binom.cdf(round(limits["size_fraction"][0] * (n + 1)) - 1, n + 1, 0.5)
                + stats.binom.sf(round(limits["size_fraction"][1] * (n + 1)), n + 1, 0.5)
            ),
        },
    }


def sweep_md1(keys: int) -> dict:
    out = {"keys": keys, "limit": s3c.MD1_LIMIT}
    for rho in (0.5, 0.8):
        signed = []
        for i in range(keys):
            f = s3c.md1_figures(jax.random.key(100_000 + i), rho)
            signed.append(f["simulated_mean_s"] / f["theory_s"] - 1)
        signed = np.array(signed)
        fit = normal_tail(np.abs(signed), s3c.MD1_LIMIT, True)
        mu, sd_up = float(signed.mean()), sd_upper_99(float(signed.std(ddof=1)), len(signed))
        out[f"rho {rho}"] = {
            **summary(np.abs(signed), s3c.MD1_LIMIT),
            "signed_mean": mu,
            "signed_sd": float(signed.std(ddof=1)),
            "signed_skew": float(stats.skew(signed)),
            "size_normal_two_sided_sd_upper_99": float(
                stats.norm.sf((s3c.MD1_LIMIT - mu) / sd_up)
                + stats.norm.cdf((-s3c.MD1_LIMIT - mu) / sd_up)
            ),
            "margin_in_sd_upper_99": float((s3c.MD1_LIMIT - abs(mu)) / sd_up),
            "abs_normal_fit": fit,
        }
        print(f"  md1 rho {rho}: sd {signed.std(ddof=1):.4f}, max |e| {np.abs(signed).max():.4f}")
    return out


def sweep_served(seeds: int) -> dict:
    """Served vs single-row logits: the 20 rows of the test, alone and in every
    contiguous batch of them (padded to its bucket, as the batcher does)."""
    images = data.load().images[200:220]
    worst, per_seed = [], []
    for seed in range(seeds):
        run = train.train_and_evaluate(Config.tiny().model_copy(update={"seed": seed}))
        with tempfile.TemporaryDirectory() as tmp:
            exported = export.export_model(run["_params"], run["_spec"]["preprocessing"])
            export.write_artifact(Path(tmp) / "a", exported, run["_spec"], run["_golden"])
            loaded = export.load_artifact(Path(tmp) / "a")
            single = np.concatenate([loaded.predict(images[i : i + 1]) for i in range(20)])
            largest = 0.0
            for n in range(1, 21):
                for start in range(0, 21 - n):
                    x = np.zeros((serve.bucket(n, 64), data.NUM_FEATURES), np.float32)
                    x[:n] = images[start : start + n]
                    got = loaded.predict(x)[:n]
                    largest = max(largest, float(np.abs(got - single[start : start + n]).max()))
        worst.append(largest)
        per_seed.append(float(np.abs(single).max()))
    return {
        "seeds": seeds,
        "batches_per_seed": 210,
        "max_abs_diff": summary(worst, 1e-5),
        "largest_logit": summary(per_seed),
        "ulp_of_largest_logit": float(np.spacing(np.float32(max(per_seed)))),
    }


def sweep_load(runs: int) -> dict:
    """The load test's queue-model verdict over `runs` schedule seeds, one server."""
    first = train.train_and_evaluate(Config.tiny())
    out: dict = {"runs": runs, "records": []}
    with tempfile.TemporaryDirectory() as tmp:
        artifact = Path(tmp) / "artifact"
        exported = export.export_model(first["_params"], first["_spec"]["preprocessing"])
        export.write_artifact(artifact, exported, first["_spec"], first["_golden"])
        with loadgen.ServerProcess(artifact, s3s.SERVE) as server:
            ready = server.wait_ready()
            for seed in range(runs):
                config = LoadConfig.tiny().model_copy(
                    update={"seed": seed, "request_timeout_s": 60.0, "max_seconds_per_rate": 300.0}
                )
                result = loadgen.measure(server.url, config, s3s.SERVE, ready)
                checks = result["simulated_queue"]["checks"]
                verdict = s3s.queue_model_verdict(checks, s3s._metrics(server)["batches"])
                out["records"].append(
                    {
                        "seed": seed,
                        "all_ok": all(
                            r["ok"] == r["requests"] for r in result["observed_cpu"]["runs"]
                        ),
                        "server_p50_ratio": [c["server_p50_ratio"] for c in checks],
                        **verdict,
                    }
                )
                print(f"  load seed {seed}: {out['records'][-1]}", flush=True)
    ratios = [v for r in out["records"] for v in r["server_p50_ratio"]]
    cpu = [v for r in out["records"] for v in r["cpu_ratios"]]
    out["server_p50_ratio"] = summary(ratios)
    out["cpu_ratio"] = summary(cpu)
    out["log_ratio_margin_in_sd"] = {
        "p50": float(
            (np.log(3) - np.abs(np.log(ratios)).max()) / max(np.std(np.log(ratios), ddof=1), 1e-12)
        ),
        "cpu": float(
            (np.log(3) - np.abs(np.log(cpu)).max()) / max(np.std(np.log(cpu), ddof=1), 1e-12)
        )
        if len(cpu) > 1
        else None,
    }
    out["failed"] = int(
        sum(not (r["p50_ok"] and r["cpu_ok"] and r["all_ok"]) for r in out["records"])
    )
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=400, help="training seeds (reference)")
    parser.add_argument("--rewrite-keys", type=int, default=48, help="training seeds per rewrite")
    parser.add_argument("--schedule-keys", type=int, default=10_000)
    parser.add_argument("--md1-keys", type=int, default=48)
    parser.add_argument("--served-seeds", type=int, default=6)
    parser.add_argument("--load-runs", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "evidence" / "size_sweep.json")
    parts = ["training", "schedule", "md1", "served", "load"]
    parser.add_argument("--only", choices=parts, action="append")
    args = parser.parse_args(argv)
    old = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    report = {
        "command": "python tests/size_sweep.py " + " ".join(argv),
        "rewrites": [{"name": n, "module": m, "find": f, "replace": r} for n, m, f, r in REWRITES],
        "jax": jax.__version__,
        "notes": old.get("notes", []),
        "tests": old.get("tests", {}),
    }
    sections = {
        "training": (
            "stages 1-2: trained models (accuracy, int8 effects, policies, golden margins)",
            lambda: sweep_training(args.keys, args.rewrite_keys),
        ),
        "schedule": ("stage 3: arrival schedule", lambda: sweep_schedule(args.schedule_keys)),
        "md1": ("stage 3: queue simulator vs M/D/1", lambda: sweep_md1(args.md1_keys)),
        "served": ("stage 3: served vs single-row logits", lambda: sweep_served(args.served_seeds)),
        "load": ("stage 3: queue model vs measured load", lambda: sweep_load(args.load_runs)),
    }
    start = time.perf_counter()
    for part in args.only or parts:
        name, run = sections[part]
        began = time.perf_counter()
        print(f"{part} ...", flush=True)
        report["tests"][name] = run()
        report["tests"][name]["sweep_seconds"] = round(time.perf_counter() - began, 1)
        report["tests"][name]["command"] = report["command"]
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
