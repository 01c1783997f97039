"""Size sweep of stage 1's error-vs-step test: how often a CORRECT solution fails it.

    python tests/size_sweep.py [--keys 256] [--tail-draws 1536] [--realizations 128]
                               [--seeds 64] [--power-keys 64] [--sim-keys 64]
                               [--only PART] [--refresh] [--out evidence/size_sweep.json]

Run on demand: pytest does not collect it. `test_error_vs_step_sweep_shows_
truncation_and_roundoff` judges figures of a noisy curve: the relative error of
a central difference against a float64 JVP, over 37 steps from 1e-13 to 1e-1,
along random directions (`_directions(p64, seed)`, seeds `SWEEP_SEEDS`). Left of
the best step the error is round-off, as random as the direction, and every
figure depends on how well conditioned the direction is (|J u| against |J|). So
the figures are recomputed here under many directions, by the test module's own
helpers (`_directions`, `_float64_jvp_on_the_cpu`, `_sweep_in_bands`, the problems
of `CONFIG`, `SWEEP_SEEDS`, `SWEEP_PASSES_NEEDED`) and the stage's code
(`checks.central_difference`, `checks.analyse_sweep`). Each band's limits are
looked up in the source of `_sweep_in_bands` (its verdict is the test's), and
the figures at the test's own directions are checked against those the test
function itself records. Nothing is patched: a reformulation or a seeded bug is
applied to a copy of `checks.py` loaded as a module of its own.

Parts (`--only`):
- `keys`: 256 direction keys x {matmul_chain, scan_recurrence} x {float64,
  float32}, under the reference and the two rewrites of reformulations.toml that
  touch the difference or the step (`central-difference-halved-then-divided`,
  `theory-step-by-cube-root`; the other two stage-1 rewrites touch neither):
  each band's figure over keys, its exceedances, and the size of a normal fitted
  to it; one direction's failure rate, and the test's rule (two of three
  directions) over disjoint triples of keys.
- `tails`: where one direction fails, and how often: 1536 directions per problem
  drawn from an even mixture of the uniform distribution on the sphere (the
  test's) and an angular central Gaussian concentrated where
  |J u| is small, each weighted by uniform / mixture density (at most 2), so the
  weighted failure rate estimates one uniform direction's (a direction fails where
  |J u| is small, or where noise puts the least error a decade left of the true
  minimum); its upper bound (estimate + 2 standard errors, or 6 / draws where
  none failed, + the normal models of the continuous bands over `keys`) gives the
  size of the two-of-three rule (`--refresh` re-reads it from the stored record).
- `rounding`: the test's own three directions with the rounding redrawn: x moved
  by up to 4 float32 ulps per entry (the float64 reference moved with it), 128
  times: what a correct solution that rounds otherwise (or another CPU) meets.
- `points`: the problem itself redrawn (`Config.seed` 1..64) x 4 directions (the
  test fixes `Config.tiny()`; other points show the bands are not tuned to it).
- `power`: the stage-1 seeded bugs that reach the sweep (`fd-forgets-the-two`,
  `theory-step-square-root`, `divides-by-the-asked-step`), a forward difference
  in place of the central one, and the smallest relative bias c ((1 + c) times
  the difference) the test detects, each under 64 keys and the test's rule.
- `smooth-error`: the float32 `scan_recurrence` with its `tanh` given a smooth
  relative error t (1 + A sin(w z)), or a coarser rounding, as a backend's
  function might have: does a smooth elementwise error flatten the round-off
  slope? (A TPU v5e failed this test's float32 half on `scan_recurrence`.)

About 8 minutes in all on a shared 2-core CPU. Each part's record goes into the
JSON under its name (other parts kept), with its command.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import sys
import time
import tomllib
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import conftest  # noqa: E402  (the suite's JAX modes: strict promotion, key reuse, highest)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import test_stage_1_jvp_vjp as s1  # noqa: E402
from scipy import stats  # noqa: E402

from derivative_audit import checks, data  # noqa: E402

TEST = s1.test_error_vs_step_sweep_shows_truncation_and_roundoff
NAMES = ("matmul_chain", "scan_recurrence")
DTYPES = ("float64", "float32")
SWEEP_SEED = 20_261_208  # direction seeds of the sweep: SWEEP_SEED + part * 10_000 + i
REWRITES = ("central-difference-halved-then-divided", "theory-step-by-cube-root")
BUGS = ("fd-forgets-the-two", "theory-step-square-root", "divides-by-the-asked-step")

# The test's grid and bands, as its source writes them (checked below).
STEPS = checks.sweep_steps(-13, -1, 3)
SOURCE_TEXTS = {
    TEST: (
        "steps = checks.sweep_steps(-13, -1, 3)",
        "(u, _), _ = _directions(p64, seed)",
        "references.append(_float64_jvp_on_the_cpu(p64.fn, p64.x, u))",
        "errors = checks.fd_sweep(p.fn, p.x, u.astype(p.x.dtype), steps, reference)",
        "a = checks.analyse_sweep(steps, errors, p.x.dtype, p.x)",
        "_sweep_in_bands(a, dtype, float32_excess, judge_roundoff)",
        "sum(passed) >= SWEEP_PASSES_NEEDED",
    ),
    s1._sweep_in_bands: (
        'decades = np.log10(float32_excess["tanh"]) if dtype == "float32" else 0.0',
        'abs(np.log10(a["best_step"] / a["theory_step"])) <= 1.0 + decades / 3',
        'a["best_rel_error"] <= 100 * a["expected_best_rel_error"] * 10 ** (2 * decades / 3)',
        '-1.4 <= a["roundoff_slope"] <= -0.6',
        '1.7 <= a["truncation_slope"] <= 2.3',
        '3.0 - 2 * decades / 3 <= a["trusted_digits"] <= 6.5',
    ),
}


def check_test_source() -> None:
    for function, texts in SOURCE_TEXTS.items():
        source = inspect.getsource(function)
        missing = [t for t in texts if t not in source]
        if missing:
            raise SystemExit(f"`{function.__name__}` no longer reads as assumed: {missing}")


def bands(a: dict, dtype: str, decades: float) -> dict:
    """Each banded figure of the test as (value, low, high, passed); a missing slope
    (None) fails. Figures on log scales where the band is one: the best step in
    decades from h*, the best error in decades over eps^(2/3)."""
    step = float(np.log10(a["best_step"] / a["theory_step"]))
    best = float(np.log10(a["best_rel_error"] / a["expected_best_rel_error"]))
    out = {
        "best_step_decades_from_theory": (
            step,
            -(1.0 + decades / 3),
            1.0 + decades / 3,
            abs(step) <= 1.0 + decades / 3,
        ),
        "best_error_decades_over_expected": (
            best,
            -np.inf,
            float(np.log10(100 * 10 ** (2 * decades / 3))),
            a["best_rel_error"] <= 100 * a["expected_best_rel_error"] * 10 ** (2 * decades / 3),
        ),
    }
    slopes = [("roundoff_slope", -1.4, -0.6)]
    if dtype == "float64":
        slopes.append(("truncation_slope", 1.7, 2.3))
    for key, low, high in slopes:
        v = a[key]
        out[key] = (v, low, high, v is not None and low <= v <= high)
    if dtype == "float32":
        v, low = a["trusted_digits"], 3.0 - 2 * decades / 3
        out["trusted_digits"] = (v, low, 6.5, low <= v <= 6.5)
    return out


# --------------------------------------------------------------------------- the figures


def rewritten_checks(kind: str, entry_id: str) -> types.ModuleType:
    """checks.py with one entry of reformulations.toml or seeded_bugs.toml applied, as a
    module of its own (nothing patched in place)."""
    table = {"reformulations": "reformulations.toml", "bugs": "seeded_bugs.toml"}[kind]
    with (ROOT / table).open("rb") as f:
        entry = next(r for r in tomllib.load(f)[kind] if r["id"] == entry_id)
    return checks_with(entry["find"], entry["replace"], entry_id)


def checks_with(find: str, replace: str, label: str) -> types.ModuleType:
    source = Path(checks.__file__).read_text(encoding="utf-8")
    if source.count(find) != 1:
        raise SystemExit(f"`{label}`: its text is not once in {checks.__file__}")
    module = types.ModuleType(f"derivative_audit.checks_{label.replace('-', '_')}")
    module.__file__ = checks.__file__
    exec(compile(source.replace(find, replace), checks.__file__, "exec"), module.__dict__)
    return module


class Problems(s1._Problems):
    """The test module's problem cache, for any config."""

    def __init__(self, config=s1.CONFIG):
        super().__init__()
        self.config = config

    def __missing__(self, key):
        self[key] = data.make_problem(key[0], self.config, key[1])
        return self[key]


def differences(mod, p, u, steps=STEPS) -> np.ndarray:
    """[step, m] central differences of `mod` (a checks module) at every step."""
    return np.stack([mod.central_difference(p.fn, p.x, u, h) for h in steps])


def errors_of(fd: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """`fd_sweep`'s relative errors from the table of differences (the same bits)."""
    scale = checks._norm(reference)
    return np.array([checks._rel(checks._norm(row - reference), scale) for row in fd])


def judge(mod, p, p64, u, reference, excess: dict, keep=False) -> dict:
    """The test's figures and verdicts along one tangent `u` (float64), in p's dtype."""
    dtype = p.dtype
    fd = differences(mod, p, jnp.asarray(u).astype(p.x.dtype))
    errors = errors_of(fd, reference)
    a = mod.analyse_sweep(STEPS, errors, p.x.dtype, p.x)
    decades = float(np.log10(excess["tanh"])) if dtype == "float32" else 0.0
    b = bands(a, dtype, decades)
    verdict = s1._sweep_in_bands(a, dtype, excess)
    if verdict != all(v[3] for v in b.values()):
        raise SystemExit(f"the bands here disagree with `_sweep_in_bands` on {a}")
    out = {"analysis": a, "bands": b, "passed": verdict}
    if keep:
        out.update(errors=errors, fd=fd, reference=reference)
    return out


def figures(mod, problems, name: str, u, excess: dict, keep=False) -> dict:
    """Both dtypes' figures along the float64 tangent `u`, by `mod`."""
    p64 = problems[(name, "float64")]
    reference = s1._float64_jvp_on_the_cpu(p64.fn, p64.x, u)
    out = {d: judge(mod, problems[(name, d)], p64, u, reference, excess, keep) for d in DTYPES}
    out["jvp_norm"] = checks._norm(reference)
    return out


def tangent(problems, name: str, seed: int):
    return s1._directions(problems[(name, "float64")], seed)[0][0]


def check_against_the_test(problems, excess: dict) -> dict:
    """The test function itself, its records against this sweep's figures at its
    own directions."""
    check_test_source()
    out = {"directions": list(s1.SWEEP_SEEDS), "passes_needed": s1.SWEEP_PASSES_NEEDED}
    for name in NAMES:
        log = conftest.Evidence("1")
        try:
            TEST(problems, log, excess, name)
            verdict = True
        except AssertionError:
            verdict = False
        mine = {
            s: figures(checks, problems, name, tangent(problems, name, s), excess, True)
            for s in s1.SWEEP_SEEDS
        }
        records = iter(log.records)
        for dtype in DTYPES:
            for seed in s1.SWEEP_SEEDS:
                record = next(records)
                if record["observed"] != mine[seed][dtype]["analysis"] or (
                    record["passed"] != mine[seed][dtype]["passed"]
                ):
                    raise SystemExit(f"{name} {dtype} {seed}: figures differ from the test's")
            next(records)  # the two-of-three record
        p64 = problems[(name, "float64")]
        for seed in s1.SWEEP_SEEDS:
            for dtype in DTYPES:
                p, m = problems[(name, dtype)], mine[seed][dtype]
                u = tangent(problems, name, seed).astype(p.x.dtype)
                if not np.array_equal(
                    checks.fd_sweep(p.fn, p.x, u, STEPS, m["reference"]), m["errors"]
                ):
                    raise SystemExit(f"{name} {dtype}: errors differ from checks.fd_sweep's")
        rule = all(
            sum(mine[s][d]["passed"] for s in s1.SWEEP_SEEDS) >= s1.SWEEP_PASSES_NEEDED
            for d in DTYPES
        )
        if verdict != rule:
            raise SystemExit(f"{name}: the sweep's verdict differs from the test's")
        J = np.asarray(jax.jacfwd(p64.fn)(p64.x))
        out[name] = {
            "test_passed": verdict,
            "jacobian_singular_values": np.linalg.svd(J, compute_uv=False).tolist(),
            "by_direction": {
                str(s): {
                    "jvp_over_jacobian_norm": mine[s]["jvp_norm"] / float(np.linalg.norm(J, 2)),
                    **{
                        d: {
                            "analysis": mine[s][d]["analysis"],
                            "passed": mine[s][d]["passed"],
                            "errors": mine[s][d]["errors"].tolist(),
                        }
                        for d in DTYPES
                    },
                }
                for s in s1.SWEEP_SEEDS
            },
        }
    out["steps"] = STEPS.tolist()
    return out


# --------------------------------------------------------------------------- statistics


def summary(values) -> dict:
    v = np.asarray([np.nan if x is None else x for x in values], np.float64)
    finite = v[np.isfinite(v)]
    out = {"n": int(v.size), "missing": int(np.sum(~np.isfinite(v)))}
    if finite.size:
        out.update(
            {
                "min": float(finite.min()),
                "q01": float(np.quantile(finite, 0.01)),
                "median": float(np.median(finite)),
                "q99": float(np.quantile(finite, 0.99)),
                "max": float(finite.max()),
                "mean": float(finite.mean()),
                "sd": float(finite.std(ddof=1)) if finite.size > 1 else 0.0,
            }
        )
    return out


def band_record(rows: list[tuple]) -> dict:
    """One band over directions: the values' summary, the limits, exceedances, and the
    size of a normal fitted to the values (P(below low) + P(above high)), with the
    limits' distance from the mean in sds. The best step lies on a grid of 1/3
    decade: there the normal is a smoothed stand-in (`distinct_values` says how
    coarse)."""
    values = [r[0] for r in rows]
    low, high = rows[0][1], rows[0][2]
    finite = np.asarray([x for x in values if x is not None and np.isfinite(x)], np.float64)
    record = {**summary(values), "low": low if np.isfinite(low) else None, "high": high}
    record["exceed"] = int(sum(not r[3] for r in rows))
    record["distinct_values"] = int(np.unique(finite).size)
    if finite.size > 2 and finite.std() > 0:
        mu, sd = float(finite.mean()), float(finite.std(ddof=1))
        record["normal_size"] = float(stats.norm.cdf(low, mu, sd) + stats.norm.sf(high, mu, sd))
        record["sds_to_nearest_limit"] = float(
            min((mu - low) / sd if np.isfinite(low) else np.inf, (high - mu) / sd)
        )
    else:
        record["normal_size"] = float(record["exceed"] > 0)
    return record


def two_of_three(p: float) -> float:
    """P(at least two of three independent directions fail), one failing with p."""
    return 3 * p**2 * (1 - p) + p**3


CONTINUOUS = (
    "best_error_decades_over_expected",
    "roundoff_slope",
    "truncation_slope",
    "trusted_digits",
)


def collect(rows: list[dict]) -> dict:
    """Per dtype: each band over directions, one direction's failures, and the normal
    models' sum over the continuous bands (the best step is a grid value: its tail is
    counted in `tails`); the test's rule over disjoint triples of directions."""
    out = {}
    for dtype in DTYPES:
        names = rows[0][dtype]["bands"].keys()
        per = {k: band_record([r[dtype]["bands"][k] for r in rows]) for k in names}
        per["directions_failed"] = int(sum(not r[dtype]["passed"] for r in rows))
        per["normal_model_continuous_bands"] = float(
            sum(per[k]["normal_size"] for k in names if k in CONTINUOUS)
        )
        triples = len(rows) // 3
        per["triples_failing_two_of_three"] = int(
            sum(
                sum(not rows[3 * t + i][dtype]["passed"] for i in range(3)) >= 2
                for t in range(triples)
            )
        )
        per["triples"] = triples
        out[dtype] = per
    out["jvp_norm"] = summary([r["jvp_norm"] for r in rows])
    return out


def excess_on_this_backend() -> dict:
    return {k: max(1.0, v) for k, v in conftest.measure_float32_excess().items()}


# --------------------------------------------------------------------------- parts


def part_keys(args) -> dict:
    problems = Problems()
    excess = excess_on_this_backend()
    out = {
        "float32_excess": excess,
        "at_the_tests_directions": check_against_the_test(problems, excess),
        "direction_seeds": f"{SWEEP_SEED + 10_000} + 0..{args.keys - 1}",
    }
    seeds = [SWEEP_SEED + 10_000 + i for i in range(args.keys)]
    modules = {"reference": checks} | {r: rewritten_checks("reformulations", r) for r in REWRITES}
    reference_rows = {}
    for label, mod in modules.items():
        rec = {}
        for name in NAMES:
            rows = [figures(mod, problems, name, tangent(problems, name, s), excess) for s in seeds]
            rec[name] = collect(rows)
            if label == "reference":
                reference_rows[name] = rows
                continue
            pairs = list(zip(rows, reference_rows[name], strict=True))
            rec[name]["versus_reference"] = {
                "directions_with_another_verdict": int(
                    sum(r[d]["passed"] != q[d]["passed"] for r, q in pairs for d in DTYPES)
                ),
                "largest_change_of_a_banded_figure": float(
                    max(
                        abs(r[d]["bands"][k][0] - q[d]["bands"][k][0])
                        for r, q in pairs
                        for d in DTYPES
                        for k in r[d]["bands"]
                        if r[d]["bands"][k][0] is not None and q[d]["bands"][k][0] is not None
                    )
                ),
                "directions_with_any_figure_changed": int(
                    sum(
                        any(r[d]["bands"][k][0] != q[d]["bands"][k][0] for k in r[d]["bands"])
                        for r, q in pairs
                        for d in DTYPES
                    )
                ),
            }
        out[label] = rec
    return out


def acg_mixture(J: np.ndarray, gamma: float, count: int, rng) -> tuple[np.ndarray, ...]:
    """`count` unit directions from 1/2 uniform + 1/2 angular central Gaussian with
    Sigma^-1 = I + gamma J^T J / |J|^2 (concentrated where |J u| is small), and each
    one's weight uniform density / mixture density (at most 2), and which half drew it."""
    n = J.shape[1]
    jh = J / np.linalg.norm(J, 2)
    sigma_inv = np.eye(n) + gamma * jh.T @ jh
    chol = np.linalg.cholesky(np.linalg.inv(sigma_inv))
    z = rng.standard_normal((count, n))
    from_acg = rng.random(count) < 0.5
    z = np.where(from_acg[:, None], z @ chol.T, z)
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    # ACG density on the sphere against the uniform one: det(Sigma)^-1/2 (u' Sigma^-1 u)^-n/2.
    log_det_sigma = -np.linalg.slogdet(sigma_inv)[1]
    quad = np.einsum("ij,jk,ik->i", u, sigma_inv, u)
    acg = np.exp(-0.5 * log_det_sigma - 0.5 * n * np.log(quad))
    return u, 1.0 / (0.5 + 0.5 * acg), from_acg


def part_tails(args) -> dict:
    problems = Problems()
    excess = excess_on_this_backend()
    rng = np.random.default_rng(SWEEP_SEED + 2)
    out = {
        "draws_per_problem": args.tail_draws,
        "proposal": "1/2 uniform + 1/2 ACG, Sigma^-1 = I + 400 J^T J / |J|^2",
    }
    bulk = {}
    keys_record = (
        json.loads(args.out.read_text(encoding="utf-8"))["parts"].get("keys")
        if (args.out.exists())
        else None
    )
    for name in NAMES:
        p64 = problems[(name, "float64")]
        J = np.asarray(jax.jacfwd(p64.fn)(p64.x))
        u, w, from_acg = acg_mixture(J, 400.0, args.tail_draws, rng)
        rows = [figures(checks, problems, name, jnp.asarray(v), excess) for v in u]
        rel = np.linalg.norm(u @ J.T, axis=1) / np.linalg.norm(J, 2)
        rec = {"weights": summary(w), "mean_weight": float(w.mean())}
        for dtype in DTYPES:
            fail = np.array([not r[dtype]["passed"] for r in rows], np.float64)
            p_hat = float(np.mean(w * fail))
            se = float(np.std(w * fail, ddof=1) / np.sqrt(fail.size))
            by_band = {
                k: float(np.mean(w * np.array([not r[dtype]["bands"][k][3] for r in rows])))
                for k in rows[0][dtype]["bands"]
            }
            p_bulk = None
            if keys_record is not None:
                bands_over_keys = keys_record["reference"][name][dtype]
                p_bulk = float(
                    sum(
                        bands_over_keys[k]["normal_size"]
                        for k in CONTINUOUS
                        if k in bands_over_keys
                    )
                )
            rec[dtype] = {
                "failed_draws": int(fail.sum()),
                "one_direction_failure_rate": p_hat,
                "standard_error": se,
                "by_band": by_band,
                "failing_draws": [
                    {
                        "weight": float(w[i]),
                        "jvp_over_jacobian_norm": float(rel[i]),
                        "bands": sorted(k for k, v in rows[i][dtype]["bands"].items() if not v[3]),
                        "drawn_from": "ACG" if from_acg[i] else "uniform",
                    }
                    for i in np.flatnonzero(fail)
                ][:40],
                "bulk_normal_model_from_keys": p_bulk,
            }
        rec["jvp_over_jacobian_norm"] = summary(rel)
        bulk[name] = rec
    out.update(bulk)
    return out


def bound_tails(parts: dict) -> None:
    """One direction's failure rate bounded above, and the two-of-three rule's size, from
    a `tails` record: the estimate + 2 standard errors where draws failed; where none
    did, 6 / draws (no failure in N draws bounds the rate at 3 / N with 95% confidence
    under a sampler whose density is at least 1/2 the uniform one); plus the normal
    models of the continuous bands over `keys`. `--refresh` re-reads them."""
    if "tails" not in parts:
        return
    rec = parts["tails"]
    count = rec["draws_per_problem"]
    for name in NAMES:
        for dtype in DTYPES:
            r = rec[name][dtype]
            if r["failed_draws"]:
                p = r["one_direction_failure_rate"] + 2 * r["standard_error"]
            else:
                p = 6.0 / count
            p += r["bulk_normal_model_from_keys"] or 0.0
            r["one_direction_upper"] = float(p)
            r["size_two_of_three"] = float(two_of_three(p))
            r["size_two_of_three_at_the_estimate"] = float(
                two_of_three(r["one_direction_failure_rate"])
            )
        rec[name]["size_case"] = float(
            1 - np.prod([1 - rec[name][d]["size_two_of_three"] for d in DTYPES])
        )
        rec[name]["size_case_at_the_estimates"] = float(
            1 - np.prod([1 - rec[name][d]["size_two_of_three_at_the_estimate"] for d in DTYPES])
        )


def part_rounding(args) -> dict:
    """The test's three directions with the point moved by up to 4 float32 ulps per
    entry: each realization rounds every evaluation otherwise; the float64 reference
    is taken at the moved point (the float32 point is it rounded, as in the test)."""
    problems = Problems()
    excess = excess_on_this_backend()
    rng = np.random.default_rng(SWEEP_SEED + 3)
    out = {"realizations": args.realizations, "ulps": 4}
    for name in NAMES:
        p64, p32 = problems[(name, "float64")], problems[(name, "float32")]
        x64 = np.asarray(p64.x, np.float64)
        ulp = np.spacing(np.abs(x64).astype(np.float32)).astype(np.float64)
        moved = []
        for _ in range(args.realizations):
            x = x64 + rng.integers(-4, 5, x64.shape) * ulp
            moved.append(
                {
                    "float64": data.Problem(name, p64.fn, jnp.asarray(x, jnp.float64), "float64"),
                    "float32": data.Problem(name, p32.fn, jnp.asarray(x, jnp.float32), "float32"),
                }
            )
        rec = {}
        p_dir = {d: [] for d in DTYPES}
        for seed in s1.SWEEP_SEEDS:
            u = tangent(problems, name, seed)
            rows = []
            for m in moved:
                reference = s1._float64_jvp_on_the_cpu(m["float64"].fn, m["float64"].x, u)
                rows.append(
                    {d: judge(checks, m[d], m["float64"], u, reference, excess) for d in DTYPES}
                )
            per = {}
            for dtype in DTYPES:
                names = rows[0][dtype]["bands"].keys()
                per[dtype] = {k: band_record([r[dtype]["bands"][k] for r in rows]) for k in names}
                per[dtype]["realizations_failed"] = int(sum(not r[dtype]["passed"] for r in rows))
                model = float(sum(per[dtype][k]["normal_size"] for k in names))  # all bands
                per[dtype]["normal_model_one_direction"] = model
                p_dir[dtype].append(model)
            rec[str(seed)] = per
        for dtype in DTYPES:
            p = p_dir[dtype]
            # P(at least two of the three fail), the three failing independently with p_i.
            rec[f"size_two_of_three_{dtype}"] = float(
                p[0] * p[1] + p[0] * p[2] + p[1] * p[2] - 2 * p[0] * p[1] * p[2]
            )
        out[name] = rec
    return out


def part_points(args) -> dict:
    excess = excess_on_this_backend()
    rows = {name: [] for name in NAMES}
    for seed in range(1, args.seeds + 1):
        problems = Problems(s1.CONFIG.model_copy(update={"seed": seed}))
        for j in range(4):
            for name in NAMES:
                u = tangent(problems, name, SWEEP_SEED + 20_000 + 4 * seed + j)
                rows[name].append(figures(checks, problems, name, u, excess))
    return {
        "config_seeds": f"1..{args.seeds}",
        "directions_per_point": 4,
        **{name: collect(r) for name, r in rows.items()},
    }


def rule_over_triples(rows: list[dict]) -> dict:
    """Per dtype: directions failing, and disjoint triples failing the test's rule."""
    out = {}
    for dtype in DTYPES:
        t = len(rows) // 3
        out[dtype] = {
            "directions_failed": int(sum(not r[dtype]["passed"] for r in rows)),
            "triples_failing_two_of_three": int(
                sum(
                    sum(not rows[3 * i + j][dtype]["passed"] for j in range(3)) >= 2
                    for i in range(t)
                )
            ),
            "triples": t,
            "failing_bands": {
                k: int(sum(not r[dtype]["bands"][k][3] for r in rows))
                for k in rows[0][dtype]["bands"]
            },
        }
    return out


def part_power(args) -> dict:
    problems = Problems()
    excess = excess_on_this_backend()
    seeds = [SWEEP_SEED + 30_000 + i for i in range(args.power_keys)]
    out = {"keys": args.power_keys}

    def run(mod, label):
        rec = {}
        for name in NAMES:
            at_test = [
                figures(mod, problems, name, tangent(problems, name, s), excess)
                for s in s1.SWEEP_SEEDS
            ]
            rows = [figures(mod, problems, name, tangent(problems, name, s), excess) for s in seeds]
            rec[name] = {
                "at_the_tests_directions": {
                    d: {
                        "passing": int(sum(r[d]["passed"] for r in at_test)),
                        "test_passes": sum(r[d]["passed"] for r in at_test)
                        >= s1.SWEEP_PASSES_NEEDED,
                        "analysis_first": at_test[0][d]["analysis"],
                    }
                    for d in DTYPES
                },
                **rule_over_triples(rows),
            }
        out[label] = rec

    for bug in BUGS:
        run(rewritten_checks("bugs", bug), bug)
    run(
        checks_with(
            "    return (forward - backward) / (2.0 * float(np.asarray(h_, np.float64)))",
            "    return (forward - np.asarray(f(x), np.float64))"
            " / float(np.asarray(h_, np.float64))",
            "forward-difference",
        ),
        "forward-difference (not a seeded bug)",
    )

    # A biased difference: (1 + c) times the central difference, c on a grid; the
    # smallest c for which the test (two of three) fails at every triple of keys.
    grid = [float(c) for c in 10.0 ** np.arange(-11.0, -0.99, 0.25)]
    rec = {"c_grid": "10^-11 .. 10^-1 by 10^0.25"}
    for name in NAMES:
        tables = [
            figures(checks, problems, name, tangent(problems, name, s), excess, keep=True)
            for s in list(s1.SWEEP_SEEDS) + seeds
        ]
        per = {}
        for dtype in DTYPES:
            p = problems[(name, dtype)]
            verdicts = []
            for c in grid:
                row = []
                for f in tables:
                    errors = errors_of((1.0 + c) * f[dtype]["fd"], f[dtype]["reference"])
                    a = checks.analyse_sweep(STEPS, errors, p.x.dtype, p.x)
                    row.append(s1._sweep_in_bands(a, dtype, excess))
                verdicts.append(row)
            v = np.asarray(verdicts)  # [c, direction]
            at_test = v[:, :3].sum(axis=1) >= s1.SWEEP_PASSES_NEEDED
            triples = v[:, 3 : 3 + 3 * (len(seeds) // 3)].reshape(len(grid), -1, 3)
            rule = triples.sum(axis=2) >= s1.SWEEP_PASSES_NEEDED  # [c, triple] passes
            per[dtype] = {
                "test_fails_at_its_directions_from_c": next(
                    (grid[i] for i in range(len(grid)) if not at_test[i:].any()), None
                ),
                "fraction_of_triples_failing_by_c": {
                    f"{c:.3g}": float(1 - r.mean()) for c, r in zip(grid, rule, strict=True)
                },
                "smallest_c_failing_every_triple": next(
                    (grid[i] for i in range(len(grid)) if not rule[i:].any()), None
                ),
            }
        rec[name] = per
    out["biased-difference (1 + c)"] = rec
    return out


def scan_with(tanh):
    """`functions.scan_recurrence` with its tanh replaced (the same code otherwise)."""

    def fn(params, x):
        def cell(h, c):
            return tanh(params["w"] @ h + c), None

        h, _ = jax.lax.scan(cell, x, params["c"])
        return h

    return fn


def smooth_tanh(amplitude_eps: float, omega: float):
    """tanh(z) (1 + A sin(w z)), A in float32 eps: a smooth relative error."""
    a = float(amplitude_eps * np.finfo(np.float32).eps)

    def f(z):
        t = jnp.tanh(z)
        return t + t * (jnp.asarray(a, z.dtype) * jnp.sin(jnp.asarray(omega, z.dtype) * z))

    return f


def coarse_tanh(ulps_of_one: float):
    """tanh rounded to a grid of `ulps_of_one` units of 2^-24: an absolute error of up
    to half that, noise-like (a staircase, as rounding is)."""
    q = float(ulps_of_one * 2.0**-24)

    def f(z):
        t = jnp.tanh(z)
        return jnp.round(t / jnp.asarray(q, z.dtype)) * jnp.asarray(q, z.dtype)

    return f


def part_smooth_error(args) -> dict:
    """The float32 scan_recurrence with a perturbed tanh, judged as the test judges it:
    decades from the perturbed tanh's own excess (`conftest._excess` on the samples of
    `measure_float32_excess`); the first directions are the test's."""
    problems = Problems()
    p64, p32 = problems[("scan_recurrence", "float64")], problems[("scan_recurrence", "float32")]
    base = jax.jit(lambda x: scan_with(jnp.tanh)(p32.weights, x))
    if not np.array_equal(np.asarray(base(p32.x)), np.asarray(p32.fn(p32.x))):
        raise SystemExit("scan_with(jnp.tanh) is not the suite's scan_recurrence")
    sample = (np.random.default_rng(0).standard_normal(1 << 16) * 2).astype(np.float32)
    models = {"reference tanh": jnp.tanh}
    for amp in (10, 100, 1000):
        for omega in (1.0, 30.0, 300.0, 3000.0):
            models[f"smooth A={amp} eps, w={omega:g}"] = smooth_tanh(amp, omega)
    for ulps in (16, 256, 4096):
        models[f"coarse rounding {ulps} ulps of 1 (2^-24)"] = coarse_tanh(ulps)
    seeds = list(s1.SWEEP_SEEDS) + [SWEEP_SEED + 40_000 + i for i in range(args.sim_keys - 3)]
    directions = [tangent(problems, "scan_recurrence", s) for s in seeds]
    references = [s1._float64_jvp_on_the_cpu(p64.fn, p64.x, u) for u in directions]
    out = {"directions": len(seeds), "first_three_are_the_tests": True}
    for label, tanh in models.items():
        fn = jax.jit(lambda x, t=tanh: scan_with(t)(p32.weights, x))
        e = max(1.0, conftest._excess(tanh, np.tanh, sample))
        excess = {"tanh": e}
        problem = data.Problem("scan_recurrence", fn, p32.x, "float32", p32.weights)
        rows = [
            judge(checks, problem, p64, u, r, excess, keep=True)
            for u, r in zip(directions, references, strict=True)
        ]
        slopes = [r["analysis"]["roundoff_slope"] for r in rows]
        window = [
            int(
                np.sum(
                    (STEPS <= r["analysis"]["theory_step"] / 3)
                    & (r["errors"] < 0.1)
                    & (r["errors"] > 0)
                )
            )
            for r in rows
        ]
        out[label] = {
            "tanh_excess": e,
            "roundoff_slope": band_record([r["bands"]["roundoff_slope"] for r in rows]),
            "best_step_decades_from_theory": summary(
                [r["bands"]["best_step_decades_from_theory"][0] for r in rows]
            ),
            "trusted_digits": summary([r["analysis"]["trusted_digits"] for r in rows]),
            "roundoff_fit_points": summary(window),
            "directions_failed": int(sum(not r["passed"] for r in rows)),
            "failing_bands": {
                k: int(sum(not r["bands"][k][3] for r in rows)) for k in rows[0]["bands"]
            },
            "test_float32_half_passes": sum(r["passed"] for r in rows[:3])
            >= s1.SWEEP_PASSES_NEEDED,
            "at_the_tests_first_direction": {
                "analysis": rows[0]["analysis"],
                "errors": rows[0]["errors"].tolist(),
            },
            "median_roundoff_slope": float(np.median([s for s in slopes if s is not None]))
            if any(s is not None for s in slopes)
            else None,
        }
    return out


PARTS = {
    "keys": part_keys,
    "tails": part_tails,
    "rounding": part_rounding,
    "points": part_points,
    "power": part_power,
    "smooth-error": part_smooth_error,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=256, help="keys: direction keys")
    parser.add_argument("--tail-draws", type=int, default=1536, help="tails: draws per problem")
    parser.add_argument("--realizations", type=int, default=128, help="rounding: per direction")
    parser.add_argument("--seeds", type=int, default=64, help="points: problem seeds")
    parser.add_argument("--power-keys", type=int, default=64, help="power: direction keys")
    parser.add_argument("--sim-keys", type=int, default=64, help="smooth-error: directions")
    parser.add_argument("--only", choices=list(PARTS), action="append")
    parser.add_argument(
        "--refresh", action="store_true", help="run no part; re-read the bounds of `tails`"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "evidence" / "size_sweep.json")
    args = parser.parse_args()
    check_test_source()
    record = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    record.setdefault("parts", {})
    for name in [] if args.refresh else args.only or list(PARTS):
        start = time.perf_counter()
        print(f"{name} ...", flush=True)
        result = PARTS[name](args)
        result["wall_s"] = round(time.perf_counter() - start, 1)
        result["command"] = (
            f"python tests/size_sweep.py --only {name} --keys {args.keys} "
            f"--tail-draws {args.tail_draws} --realizations {args.realizations} "
            f"--seeds {args.seeds} --power-keys {args.power_keys} --sim-keys {args.sim_keys}"
        )
        result["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        result["jax"] = jax.__version__
        result["machine"] = f"{platform.machine()}, {jax.default_backend()}"
        record["parts"][name] = result
        print(f"{name}: {result['wall_s']} s", flush=True)
        write(record, args.out)
    if args.refresh:
        write(record, args.out)


def write(record: dict, out: Path) -> None:
    bound_tails(record["parts"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=_json) + "\n", encoding="utf-8")


def _json(value):
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(type(value))


if __name__ == "__main__":
    main()
