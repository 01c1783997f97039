"""Size sweep of the stage-3 bootstrap tests: how often a CORRECT solution fails them,
and how large an error they detect.

    python tests/size_sweep.py [--keys 1000] [--blocks 256] [--scipy-keys 256]
                               [--only PART] [--out evidence/size_sweep.json]

Run on demand: pytest does not collect it. `comparison.bootstrap_ci` draws its
resamples from `np.random.default_rng(seed)`; a learner's correct code that draws
them another way (`rng.choice`, another order of the index array, one call per
resample) lands on other resamples, as another seed does, and the reformulations of
reformulations.toml that touch resampling (`bootstrap-means-as-matrix-product`,
`bootstrap-means-with-einsum`, `bootstrap-quantiles-one-at-a-time`) round the means
differently. So each test's figures are recomputed here under many seeds, for the
reference and under each of those three reformulations (the module's source with
the entry's find/replace, imported as a module of its own; nothing is patched in
place), with the test module's own helpers (`_exact_quantiles`,
`exact_percentile_ci`) and the tests' own data and limits (checked against the test
source, so a moved limit stops this script).

The bootstrap distribution of these tests is discrete and known exactly (all n^n
resamples enumerated), so each size is also computed EXACTLY: an inverted-CDF
quantile of N draws is at or below an atom x when at least m + 1 of the N draws are
(m: numpy's 0-based index of the quantile, N q - 1 here), a binomial event.

Parts (`--only`):
  interval  test_bootstrap_interval_against_enumeration_and_scipy: the four distances
            (each bound vs the enumeration and vs SciPy's fixed interval) under
            `--keys` seeds x 2 confidences x (reference + 3 reformulations); SciPy's
            percentile interval itself under `--scipy-keys` generator seeds (its
            draws would change with SciPy's version); the exact size of each
            comparison and the power against a tail level moved by delta.
  seeded    test_bootstrap_seed_fixes_the_bits_and_only_the_seed_does: `--blocks`
            blocks of 8 seeds (the test's 8 intervals), per variant: repeatability,
            intervals that coincide, width / normal width, intervals missing the
            mean; an analytic bound on a coincidence and a normal fit of the log
            width ratio.
  paired    test_paired_comparison_from_the_store and
            test_analysis_of_a_hand_written_record: 2 complete pairs, 4000 resamples,
            confidence 0.9: the interval must be exactly the extreme atoms (each of
            probability 1/4). `--keys` seeds per variant and data set; the exact size.
  bugs      the seeded bugs of stage 3 on the resampling (`bootstrap-quantiles-at-
            alpha`, `bootstrap-without-replacement`) under 16 seeds: each test's verdict.

Each part's record goes into the JSON under its name (other parts kept), with the
command that wrote it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import tomllib
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import conftest  # noqa: E402,F401  (the suite's settings)
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.stats  # noqa: E402
import test_stage_3_comparison as s3  # noqa: E402
from scipy import stats  # noqa: E402
from scipy.special import logsumexp  # noqa: E402

from reproducible_experiments import comparison  # noqa: E402

# The tests' own data and limits; `check_test_source` stops the sweep if they moved.
INTERVAL_DIFFS = np.array([0.031, -0.012, 0.058, 0.004, 0.022, -0.027])
INTERVAL_RESAMPLES, INTERVAL_SEED, INTERVAL_SCIPY_SEED, INTERVAL_TOL = 40_000, 3, 5, 1.25e-3
FORMER_TOL = 1e-3  # the interval test's tolerance before this sweep: its size was 0.027
INTERVAL_CONFIDENCES = (0.9, 0.8)
SEEDED_RESAMPLES, SEEDED_CONFIDENCE, SEEDED_SEEDS = 2000, 0.95, 8
SEEDED_RATIO = (0.5, 2.0)
PAIRED_RESAMPLES, PAIRED_CONFIDENCE, PAIRED_ATOL = 4000, 0.9, 1e-12
TEST_SOURCE_LINES = [
    "diffs = np.array([0.031, -0.012, 0.058, 0.004, 0.022, -0.027])",
    "comparison.bootstrap_ci(diffs, confidence, resamples=40_000, seed=3)",
    "random_state=np.random.default_rng(5)",
    "tol = 1.25e-3",
    '@pytest.mark.parametrize("confidence", [0.9, 0.8])',
    "diffs = np.random.default_rng(2024).normal(0.01, 0.03, size=20)",
    "comparison.bootstrap_ci(diffs, 0.95, 2000, seed=seed) for seed in range(8)",
    "assert 0.5 < (high - low) / normal_width < 2.0",
    "decision: {{min_difference: 0.0, confidence: 0.9, resamples: 4000, bootstrap_seed: 0,",
    "np.allclose(analysis.ci, exact, rtol=0, atol=1e-12)",
    "assert got.ci == (-0.125, 0.25)",
    'assert (done.ci, done.verdict) == ((0.125, 0.25), "holds")',
]
# The paired test's two complete differences, as its evidence recorded them (the
# extreme atoms of `exact`); the hand-written record's (-0.125, 0.25) and (0.25, 0.125).
PAIRED_DATA = {
    "paired test (evidence/stage_3.json)": [0.10584956407546997, 0.11420613527297974],
    "hand-written record, 8 seeds": [0.25, -0.125],
    "hand-written record, complete": [0.25, 0.125],
}
REFORMULATIONS = [
    "bootstrap-means-as-matrix-product",
    "bootstrap-means-with-einsum",
    "bootstrap-quantiles-one-at-a-time",
]
BUGS = ["bootstrap-quantiles-at-alpha", "bootstrap-without-replacement"]
SWEEP_SEED = 20_261_207  # seeds of the sweep: SWEEP_SEED + i


def check_test_source() -> None:
    source = (ROOT / "tests" / "test_stage_3_comparison.py").read_text(encoding="utf-8")
    missing = [line for line in TEST_SOURCE_LINES if line not in source]
    if missing:
        raise SystemExit(f"The stage-3 tests changed; update the sweep's constants: {missing}")


def rewritten(table: str, entry_id: str) -> types.ModuleType:
    """comparison.py with one entry of `table` (reformulations.toml or seeded_bugs.toml)
    applied, as a module of its own."""
    with (ROOT / table).open("rb") as f:
        data = tomllib.load(f)
    entry = next(e for e in data[next(iter(data))] if e["id"] == entry_id)
    source = Path(comparison.__file__).read_text(encoding="utf-8")
    if source.count(entry["find"]) != 1:
        raise SystemExit(f"`{entry_id}`: its text is not once in {comparison.__file__}")
    module = types.ModuleType(f"reproducible_experiments.comparison_{entry_id.replace('-', '_')}")
    module.__file__ = comparison.__file__
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(
        compile(source.replace(entry["find"], entry["replace"]), module.__file__, "exec"),
        module.__dict__,
    )
    return module


def variants() -> dict[str, object]:
    out = {"reference": comparison.bootstrap_ci}
    for entry_id in REFORMULATIONS:
        out[entry_id] = rewritten("reformulations.toml", entry_id).bootstrap_ci
    return out


def summary(values, limit=None, former=None) -> dict:
    v = np.asarray(values, np.float64).ravel()
    out = {
        "n": int(v.size),
        "min": float(v.min()),
        "median": float(np.median(v)),
        "q99": float(np.quantile(v, 0.99)),
        "max": float(v.max()),
    }
    if limit is not None:
        out["limit"] = float(limit)
        out["exceed"] = int(np.sum(v > limit))
    if former is not None:
        out[f"exceed_{former:g}"] = int(np.sum(v > former))
    return out


# --------------------------------------------------------------------------- exact sizes


def atoms(diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact bootstrap distribution of the mean: (values, CDF) over all n^n
    resamples, means that differ by rounding only (< 1e-12) merged."""
    n = len(diffs)
    index = np.stack(np.meshgrid(*[np.arange(n)] * n, indexing="ij"), -1).reshape(-1, n)
    means = np.sort(diffs[index].mean(axis=1))
    starts = np.concatenate([[True], np.diff(means) > 1e-12])
    values = means[starts]
    counts = np.diff(np.concatenate([np.flatnonzero(starts), [means.size]]))
    return values, np.cumsum(counts) / means.size


def quantile_index(resamples: int, q: float) -> int:
    """numpy's 0-based index of the inverted-CDF q-quantile of `resamples` values."""
    return int(np.quantile(np.arange(resamples), q, method="inverted_cdf"))


def p_at_most(values, cdf, resamples: int, q: float, x: float, strict: bool = False) -> float:
    """P(the inverted-CDF q-quantile of `resamples` draws <= x), or < x when `strict`."""
    k = np.searchsorted(values, x, side="left" if strict else "right") - 1  # that atom
    if k < 0:
        return 0.0
    m = quantile_index(resamples, q)
    return float(stats.binom.sf(m, resamples, min(cdf[k], 1.0)))  # P(count >= m + 1)


def p_outside(values, cdf, resamples: int, q: float, center: float, tol: float) -> float:
    """P(|the q-quantile of `resamples` draws - center| > tol), exactly; an atom within
    1e-12 of a boundary counts as outside (the test's float comparison may go either way)."""
    below = p_at_most(values, cdf, resamples, q, center - tol + 1e-12)
    above = 1.0 - p_at_most(values, cdf, resamples, q, center + tol - 1e-12, strict=True)
    return below + max(above, 0.0)


# --------------------------------------------------------------------------- interval


def exact_interval(confidence: float) -> list[float]:
    alpha = 1 - confidence
    return s3._exact_quantiles(INTERVAL_DIFFS, [alpha / 2, 1 - alpha / 2])


def interval_figures(ci, confidence: float, seed: int, scipy_ci, exact) -> dict:
    """The test's four distances for one seed of `ci`."""
    low, high = ci(INTERVAL_DIFFS, confidence, resamples=INTERVAL_RESAMPLES, seed=seed)
    return {
        "low_vs_exact": abs(low - exact[0]),
        "high_vs_exact": abs(high - exact[1]),
        "low_vs_scipy": abs(low - scipy_ci[0]),
        "high_vs_scipy": abs(high - scipy_ci[1]),
    }


def scipy_interval(confidence: float, seed: int) -> tuple[float, float]:
    ref = scipy.stats.bootstrap(
        (INTERVAL_DIFFS,),
        np.mean,
        confidence_level=confidence,
        n_resamples=INTERVAL_RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(seed),
    ).confidence_interval
    return float(ref.low), float(ref.high)


def part_interval(args) -> dict:
    values, cdf = atoms(INTERVAL_DIFFS)
    out = {
        "data": INTERVAL_DIFFS.tolist(),
        "resamples": INTERVAL_RESAMPLES,
        "limit": INTERVAL_TOL,
        "atoms": int(values.size),
        "keys": args.keys,
    }
    former = f"_at_{FORMER_TOL:g}"
    totals, totals_any = {"": 0.0, former: 0.0}, {"": 0.0, former: 0.0}
    for confidence in INTERVAL_CONFIDENCES:
        alpha = 1 - confidence
        qs = (alpha / 2, 1 - alpha / 2)
        exact = s3._exact_quantiles(INTERVAL_DIFFS, list(qs))
        one_sided = s3._exact_quantiles(INTERVAL_DIFFS, [alpha, 1 - alpha])
        fixed = scipy_interval(confidence, INTERVAL_SCIPY_SEED)
        record = {
            "exact": exact,
            "exact_one_sided_alpha": one_sided,
            "one_sided_gaps": [abs(a - b) for a, b in zip(one_sided, exact, strict=True)],
            "scipy_at_the_tests_seed": list(fixed),
        }
        # SciPy's interval under other generator seeds: its own distance to the enumeration.
        sc = np.asarray(
            [scipy_interval(confidence, SWEEP_SEED + i) for i in range(args.scipy_keys)]
        )
        sc_err = np.abs(sc - np.asarray(exact)[None, :])
        record["scipy_vs_exact_over_its_seeds"] = {
            "low": summary(sc_err[:, 0], INTERVAL_TOL, FORMER_TOL),
            "high": summary(sc_err[:, 1], INTERVAL_TOL, FORMER_TOL),
            "values_seen": [np.unique(np.round(sc[:, j], 12)).tolist() for j in range(2)],
        }
        # Our interval under many seeds, for each variant.
        for name, ci in variants().items():
            rows = [
                interval_figures(ci, confidence, SWEEP_SEED + i, fixed, exact)
                for i in range(args.keys)
            ]
            at_test_seed = interval_figures(ci, confidence, INTERVAL_SEED, fixed, exact)
            record[name] = {
                **{k: summary([r[k] for r in rows], INTERVAL_TOL, FORMER_TOL) for k in rows[0]},
                "keys_failed": int(sum(max(r.values()) > INTERVAL_TOL for r in rows)),
                f"keys_failed_at_{FORMER_TOL:g}": int(
                    sum(max(r.values()) > FORMER_TOL for r in rows)
                ),
                "at_the_tests_seed": at_test_seed,
            }
        # Exact sizes: each bound vs the enumeration and vs SciPy's fixed value; and the
        # largest over every SciPy value seen over its seeds (another SciPy release).
        for tol, key in ((INTERVAL_TOL, ""), (FORMER_TOL, f"_at_{FORMER_TOL:g}")):
            sizes, any_scipy = {}, {}
            for j, (q, label) in enumerate(zip(qs, ("low", "high"), strict=True)):
                sizes[f"{label}_vs_exact"] = p_outside(
                    values, cdf, INTERVAL_RESAMPLES, q, exact[j], tol
                )
                sizes[f"{label}_vs_scipy"] = p_outside(
                    values, cdf, INTERVAL_RESAMPLES, q, fixed[j], tol
                )
                any_scipy[f"{label}_vs_scipy"] = max(
                    p_outside(values, cdf, INTERVAL_RESAMPLES, q, seen, tol)
                    for seen in np.unique(np.round(sc[:, j], 12))
                )
                any_scipy[f"{label}_vs_exact"] = sizes[f"{label}_vs_exact"]
            record[f"exact_size{key}"] = {**sizes, "union": sum(sizes.values())}
            record[f"exact_size_largest_over_the_scipy_values_seen{key}"] = {
                **any_scipy,
                "union": sum(any_scipy.values()),
            }
            totals[key] += sum(sizes.values())
            totals_any[key] += sum(any_scipy.values())
        # Power: a tail level moved by delta (the interval's own quantile level wrong):
        # the exact chance that the bound lands more than tol from the enumeration.
        power = {}
        for delta in (0.002, 0.005, 0.01, 0.015, 0.02, 0.025, alpha / 2):
            moved = (qs[0] + delta, qs[1] - delta)  # narrower, as the one-sided bug
            wider = (qs[0] - delta, qs[1] + delta)
            power[f"{delta:.4g}"] = {
                "narrower": [
                    p_outside(values, cdf, INTERVAL_RESAMPLES, q2, exact[j], INTERVAL_TOL)
                    for j, q2 in enumerate(moved)
                ],
                "wider": [
                    p_outside(values, cdf, INTERVAL_RESAMPLES, q2, exact[j], INTERVAL_TOL)
                    if 0 < q2 < 1
                    else None
                    for j, q2 in enumerate(wider)
                ],
            }
        record["power_tail_level_moved_by_delta"] = power
        out[f"confidence {confidence}"] = record
    for key in totals:
        out[f"exact_size_both_confidences{key}"] = totals[key]
        out[f"exact_size_both_confidences_largest_over_scipy_values{key}"] = totals_any[key]
    return out


# --------------------------------------------------------------------------- seeded


def seeded_data() -> np.ndarray:
    return np.random.default_rng(2024).normal(0.01, 0.03, size=20)


def coincidence_bound(diffs: np.ndarray, resamples: int, intervals: int) -> float:
    """An upper bound on the chance that two of `intervals` intervals coincide: equal
    intervals need the same two resamples (multisets) as bounds, each drawn at least
    once in both runs; a multiset of n values has probability at most n! / n^n, so
    P(drawn at least once) <= resamples * n! / n^n, and the two events are negatively
    associated: P(two given intervals equal) <= (resamples n! / n^n)^2."""
    n = len(diffs)
    p_max = float(np.exp(np.sum(np.log(np.arange(1, n + 1))) - n * np.log(n)))
    pairs = intervals * (intervals - 1) // 2
    return pairs * (resamples * p_max) ** 2


def part_seeded(args) -> dict:
    diffs = seeded_data()
    normal_width = 2 * 1.96 * diffs.std() / np.sqrt(len(diffs))
    # P(one resampled mean < the sample mean), for the bound on missing the mean.
    rng = np.random.default_rng(SWEEP_SEED)
    draws = diffs[rng.integers(0, len(diffs), size=(1_000_000, len(diffs)))].mean(axis=1)
    p_below = float(np.mean(draws < diffs.mean()))
    lo_index = quantile_index(SEEDED_RESAMPLES, (1 - SEEDED_CONFIDENCE) / 2)
    hi_index = quantile_index(SEEDED_RESAMPLES, (1 + SEEDED_CONFIDENCE) / 2)
    out = {
        "data": "np.random.default_rng(2024).normal(0.01, 0.03, size=20)",
        "blocks": args.blocks,
        "normal_width": float(normal_width),
        "limits": {"ratio": list(SEEDED_RATIO), "distinct_intervals": SEEDED_SEEDS},
        "coincidence_bound_8_intervals": coincidence_bound(diffs, SEEDED_RESAMPLES, SEEDED_SEEDS),
        "p_resampled_mean_below_the_mean": p_below,
        # The low bound is at or above the mean only if at most lo_index of the draws
        # are below it; the high bound at or below it only if at least hi_index + 1 are.
        "log10_size_missing_the_mean": float(
            logsumexp(
                stats.binom.logpmf(
                    np.r_[0 : lo_index + 1, hi_index + 1 : SEEDED_RESAMPLES + 1],
                    SEEDED_RESAMPLES,
                    p_below,
                )
            )
            / np.log(10)
        ),
    }
    for name, ci in variants().items():
        intervals, repeat_fail, block_coincide, missing = [], 0, 0, 0
        for b in range(args.blocks):
            seeds = [SWEEP_SEED + SEEDED_SEEDS * b + i for i in range(SEEDED_SEEDS)]
            block = [ci(diffs, SEEDED_CONFIDENCE, SEEDED_RESAMPLES, seed=s) for s in seeds]
            again = ci(diffs, SEEDED_CONFIDENCE, SEEDED_RESAMPLES, seed=seeds[0])
            repeat_fail += again != block[0]
            block_coincide += len(set(block)) != len(block)
            missing += sum(not lo < diffs.mean() < hi for lo, hi in block)
            intervals.extend(block)
        iv = np.asarray(intervals)
        ratio = (iv[:, 1] - iv[:, 0]) / normal_width
        log_ratio = np.log(ratio)
        mu, sd = float(log_ratio.mean()), float(log_ratio.std(ddof=1))
        z_low = (mu - np.log(SEEDED_RATIO[0])) / sd
        z_high = (np.log(SEEDED_RATIO[1]) - mu) / sd
        out[name] = {
            "intervals": int(iv.shape[0]),
            "repeat_with_the_same_seed_differed": int(repeat_fail),
            "blocks_with_coinciding_intervals": int(block_coincide),
            "equal_low_bounds_over_all_pairs": int(iv.shape[0] - np.unique(iv[:, 0]).size),
            "equal_high_bounds_over_all_pairs": int(iv.shape[0] - np.unique(iv[:, 1]).size),
            "equal_intervals_over_all_pairs": int(iv.shape[0] - np.unique(iv, axis=0).shape[0]),
            "intervals_missing_the_mean": int(missing),
            "width_over_normal_width": {
                **summary(ratio),
                "outside_limits": int(
                    np.sum((ratio <= SEEDED_RATIO[0]) | (ratio >= SEEDED_RATIO[1]))
                ),
            },
            "log_ratio_normal_fit": {
                "mean": mu,
                "sd": sd,
                "margin_in_sd_to_0.5": float(z_low),
                "margin_in_sd_to_2": float(z_high),
                "size_per_interval": float(stats.norm.sf(z_low) + stats.norm.sf(z_high)),
            },
        }
    return out


# --------------------------------------------------------------------------- paired


def part_paired(args) -> dict:
    resamples, confidence = PAIRED_RESAMPLES, PAIRED_CONFIDENCE
    alpha = 1 - confidence
    lo, hi = quantile_index(resamples, alpha / 2), quantile_index(resamples, 1 - alpha / 2)
    # Each extreme atom has probability 1/4: the low bound is that atom iff it was drawn
    # at least lo + 1 times; the high bound iff the top atom was drawn resamples - hi times.
    p_low = float(stats.binom.cdf(lo, resamples, 0.25))
    p_high = float(stats.binom.cdf(resamples - hi - 1, resamples, 0.25))
    out = {
        "resamples": resamples,
        "confidence": confidence,
        "keys": args.keys,
        "quantile_indices": [lo, hi],
        "draws_needed_on_each_extreme_atom": [lo + 1, resamples - hi],
        "draws_expected_on_each_extreme_atom": resamples / 4,
        "sd_of_the_draws_on_an_atom": float(np.sqrt(resamples * 0.25 * 0.75)),
        "exact_size_per_analysis": p_low + p_high,
        "analyses_in_the_tests": {
            "test_paired_comparison_from_the_store": "2 back-ends x require_complete 2 = 4",
            "test_analysis_of_a_hand_written_record": "3 with complete pairs",
        },
        "exact_size_all_analyses": 7 * (p_low + p_high),
    }
    power = {}
    for q in (0.2, 0.225, 0.24, 0.25, 0.26, 0.275, 0.3):
        # A lower tail level q: the bound leaves the low atom when fewer than
        # ceil(q N) draws sit on it.
        m = quantile_index(resamples, q)
        power[str(q)] = float(stats.binom.cdf(m, resamples, 0.25))
    out["power_lower_tail_level_q"] = power
    for label, pair in PAIRED_DATA.items():
        diffs = np.asarray(pair, np.float64)
        exact = s3.exact_percentile_ci(diffs, confidence)
        rec = {"data": pair, "exact": list(exact)}
        for name, ci in variants().items():
            counts, failed = [], 0
            for i in range(args.keys):
                seed = SWEEP_SEED + i
                got = ci(diffs, confidence, resamples, seed=seed)
                failed += not (
                    np.allclose(got, exact, rtol=0, atol=PAIRED_ATOL) and got == tuple(exact)
                )
                # the draws on each extreme atom (this seed's resamples)
                draw = np.random.default_rng(seed).integers(0, 2, size=(resamples, 2)).sum(axis=1)
                counts.append(min(np.sum(draw == 0), np.sum(draw == 2)))
            rec[name] = {
                "keys_failed": int(failed),
                "fewest_draws_on_an_extreme_atom": summary(counts),
            }
        out[label] = rec
    return out


# --------------------------------------------------------------------------- bugs


def part_bugs(args) -> dict:
    out = {}
    keys = 16
    fixed = {c: scipy_interval(c, INTERVAL_SCIPY_SEED) for c in INTERVAL_CONFIDENCES}
    exact = {c: exact_interval(c) for c in INTERVAL_CONFIDENCES}
    for bug_id in BUGS:
        ci = rewritten("seeded_bugs.toml", bug_id).bootstrap_ci
        diffs = seeded_data()
        normal_width = 2 * 1.96 * diffs.std() / np.sqrt(len(diffs))
        interval_fail, seeded_fail = 0, 0
        worst = []
        for i in range(keys):
            f = [
                interval_figures(ci, c, SWEEP_SEED + i, fixed[c], exact[c])
                for c in INTERVAL_CONFIDENCES
            ]
            err = max(max(r.values()) for r in f)
            worst.append(err)
            interval_fail += err > INTERVAL_TOL
            block = [
                ci(diffs, SEEDED_CONFIDENCE, SEEDED_RESAMPLES, seed=SWEEP_SEED + 8 * i + s)
                for s in range(SEEDED_SEEDS)
            ]
            ratios = [(h - lo) / normal_width for lo, h in block]
            seeded_fail += len(set(block)) != len(block) or not all(
                SEEDED_RATIO[0] < r < SEEDED_RATIO[1] for r in ratios
            )
        out[bug_id] = {
            "keys": keys,
            "interval_test_failed": int(interval_fail),
            "largest_distance_in_the_interval_test": summary(worst, INTERVAL_TOL),
            "seed_test_failed": int(seeded_fail),
        }
    return out


PARTS = {
    "interval": part_interval,
    "seeded": part_seeded,
    "paired": part_paired,
    "bugs": part_bugs,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=256, help="seeded: blocks of 8 seeds")
    parser.add_argument("--scipy-keys", type=int, default=256)
    parser.add_argument("--only", choices=sorted(PARTS), action="append")
    parser.add_argument("--out", type=Path, default=ROOT / "evidence" / "size_sweep.json")
    args = parser.parse_args()
    check_test_source()
    record = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    record.setdefault("parts", {})
    for name in args.only or list(PARTS):
        start = time.perf_counter()
        print(f"{name} ...", flush=True)
        result = PARTS[name](args)
        result["wall_s"] = round(time.perf_counter() - start, 1)
        result["command"] = (
            f"python tests/size_sweep.py --only {name} --keys {args.keys} "
            f"--blocks {args.blocks} --scipy-keys {args.scipy_keys}"
        )
        result["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        result["numpy"], result["scipy"] = np.__version__, scipy.__version__
        result["machine"] = platform.machine()
        record["parts"][name] = result
        print(f"{name}: {result['wall_s']} s", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
