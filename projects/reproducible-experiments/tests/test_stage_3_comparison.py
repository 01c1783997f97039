"""Stage 3: a frozen question and a paired comparison.

Independent checks:
  - the paired differences the analysis reports are recomputed from a direct
    SQL query of the metric values in the database behind the store;
  - the bootstrap interval is checked against the EXACT percentile bootstrap,
    enumerating all n^n resamples of the complete pairs (n = 2 here), whose
    distribution is discrete, so a Monte Carlo bootstrap lands on its quantiles;
  - the analysis reads the store, not memory: a value changed in the store
    after the runs changes the analysis.
One arm is made to fail: its pair must be reported incomplete (never dropped,
never imputed) and the verdict `undecided`. Repeated on both back-ends, and
with `require_complete: false`, where the verdict must follow the rule.
"""

import hashlib
import itertools
import json
import time

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from mlflow.entities import Metric, Param

from reproducible_experiments import comparison
from reproducible_experiments.cli import main

SPEC_YAML = """
name: lr-{suffix}
question: Does a 3x larger Adam step raise test accuracy of the tiny digits MLP?
baseline: {{hidden_size: 32, batch_size: 64, num_epochs: 5, learning_rate: 0.001}}
mechanism: {{field: learning_rate, value: 0.003}}
train_seeds: [0, 1, 2]
eval_seeds: [0]
metric: {{name: test_accuracy, higher_is_better: true}}
decision: {{min_difference: 0.0, confidence: 0.9, resamples: 4000, bootstrap_seed: 0,
           require_complete: {require_complete}}}
"""


class ArmFailure(RuntimeError):
    pass


def exact_percentile_ci(diffs: np.ndarray, confidence: float) -> tuple[float, float]:
    """The percentile bootstrap interval with every one of the n^n resamples,
    each weighted 1 / n^n, and the inverted-CDF quantile definition."""
    n = len(diffs)
    means = np.array([np.mean(diffs[list(idx)]) for idx in itertools.product(range(n), repeat=n)])
    order = np.sort(means)
    cdf = np.arange(1, len(order) + 1) / len(order)
    alpha = 1 - confidence

    def quantile(q: float) -> float:
        return float(order[np.searchsorted(cdf, q - 1e-12)])

    return quantile(alpha / 2), quantile(1 - alpha / 2)


def _spec(suffix: str, require_complete: bool) -> comparison.Spec:
    text = SPEC_YAML.format(suffix=suffix, require_complete=str(require_complete).lower())
    return comparison.parse_spec(text, "test spec")


def _exact_quantiles(diffs: np.ndarray, qs: list[float]) -> list[float]:
    """Inverted-CDF quantiles of the mean over ALL n^n equally likely resamples."""
    n = len(diffs)
    index = np.stack(np.meshgrid(*[np.arange(n)] * n, indexing="ij"), -1).reshape(-1, n)
    means = np.sort(diffs[index].mean(axis=1))
    cdf = np.arange(1, len(means) + 1) / len(means)
    return [float(means[np.searchsorted(cdf, q - 1e-12)]) for q in qs]


# FAST, DIRECT CHECKS ON A HAND-WRITTEN RECORD (no training) ----------------------


def _hand_spec(train_seeds: list[int], require_complete: bool, suffix: str) -> comparison.Spec:
    text = SPEC_YAML.format(suffix=suffix, require_complete=str(require_complete).lower())
    return comparison.parse_spec(
        text.replace("train_seeds: [0, 1, 2]", f"train_seeds: {train_seeds}").replace(
            "eval_seeds: [0]", "eval_seeds: [9]"
        ),
        "hand spec",
    )


def _hand_record(client, exp_id: str, spec, children: list[dict]) -> str:
    """A parent registered like `run_comparison` registers one, and child runs
    written directly: arm, seeds, status, an optional test_accuracy and tags."""
    tags = {
        "comparison.name": spec.name,
        "comparison.spec_sha256": spec.sha256(),
        "comparison.role": "parent",
    }
    parent = client.create_run(exp_id, run_name="parent", tags=tags, start_time=1).info.run_id
    client.log_text(parent, spec.canonical_json(), "spec.json")
    client.set_terminated(parent, "FINISHED")
    for i, child in enumerate(children):
        run_tags = {
            "mlflow.parentRunId": parent,
            "comparison.spec_sha256": child.get("sha", spec.sha256()),
            "comparison.role": "child",
            "comparison.arm": child["arm"],
            **child.get("tags", {}),
        }
        run_id = client.create_run(exp_id, run_name=f"c{i}", tags=run_tags, start_time=10 + i)
        run_id = run_id.info.run_id
        child["run_id"] = run_id
        params = [Param("train_seed", str(child["t"])), Param("eval_seed", "9")]
        metrics = []
        if child.get("value") is not None:
            metrics = [Metric("test_accuracy", child["value"], 0, 0)]
        client.log_batch(run_id, metrics=metrics, params=params)
        if child["status"] != "RUNNING":
            client.set_terminated(run_id, child["status"])
    return parent


@pytest.mark.claims("paired-analysis-from-the-store", "bootstrap-inverted-cdf")
def test_analysis_of_a_hand_written_record(sqlite_store):
    """analyze reports each incomplete pair, foreign runs and the verdict as written by hand.

    Every way a pair can be incomplete, foreign children on both sides of the
    spec's hash, and the verdict under each rule, against values written here.

    Size of the exact intervals (three analyses with two complete pairs, 4,000
    resamples, confidence 0.9): 3 x 1.9e-252, exact, as in
    `test_paired_comparison_from_the_store`; 1,000 seeds under the reference and the
    three reformulations that touch resampling gave (-0.125, 0.25) and (0.125, 0.25)
    every time. (sweep: evidence/size_sweep.json, the `size_sweep` script beside the
    tests)"""
    client = sqlite_store.client()
    _, exp_id = sqlite_store.new_experiment(client, "hand")
    spec = _hand_spec([0, 1, 2, 3, 4, 5, 6, 7], True, f"hand-{time.time_ns()}")
    F, X, K = "FINISHED", "FAILED", "KILLED"
    children = [
        {"t": 0, "arm": "baseline", "status": F, "value": 0.5},
        {"t": 0, "arm": "candidate", "status": F, "value": 0.75},
        {"t": 1, "arm": "candidate", "status": F, "value": 0.5},  # Candidate first.
        {"t": 1, "arm": "baseline", "status": F, "value": 0.625},
        {"t": 2, "arm": "baseline", "status": F, "value": 0.5},
        {"t": 2, "arm": "candidate", "status": X, "tags": {"error.type": "ArmFailure"}},
        # KILLED after logging the metric: still not a finished arm.
        {
            "t": 3,
            "arm": "baseline",
            "status": K,
            "value": 0.5,
            "tags": {"reconciled.reason": "lease expired"},
        },
        {"t": 3, "arm": "candidate", "status": F, "value": 0.5},
        {"t": 4, "arm": "baseline", "status": F, "value": 0.5},
        {"t": 5, "arm": "baseline", "status": F, "value": 0.5},
        {"t": 5, "arm": "baseline", "status": F, "value": 0.25},
        {"t": 5, "arm": "candidate", "status": F, "value": 0.5},
        {"t": 6, "arm": "baseline", "status": X},
        {"t": 6, "arm": "candidate", "status": F},  # FINISHED without the metric.
        {"t": 7, "arm": "baseline", "status": X, "tags": {"error.type": "FirstError"}},
        {"t": 7, "arm": "baseline", "status": K, "tags": {"error.type": "SIGTERM"}},
        {"t": 7, "arm": "candidate", "status": F, "value": 0.5},
        {"t": 0, "arm": "baseline", "status": F, "value": 0.0, "sha": "0" * 64},
        {"t": 0, "arm": "baseline", "status": F, "value": 0.0, "sha": "f" * 64},
    ]
    parent = _hand_record(client, exp_id, spec, children)
    got = comparison.analyze(sqlite_store.client(), parent)
    ids = [c["run_id"] for c in children]
    expected = [
        (0, 0.5, 0.75, 0.25, "complete", [ids[0]], [ids[1]]),
        (1, 0.625, 0.5, -0.125, "complete", [ids[3]], [ids[2]]),
        (2, 0.5, None, None, "incomplete: candidate FAILED (ArmFailure)", [ids[4]], [ids[5]]),
        (3, None, 0.5, None, "incomplete: baseline KILLED (lease expired)", [ids[6]], [ids[7]]),
        (4, 0.5, None, None, "incomplete: candidate never ran", [ids[8]], []),
        (5, None, 0.5, None, "incomplete: baseline has 2 finished runs", ids[9:11], [ids[11]]),
        (
            6,
            None,
            None,
            None,
            "incomplete: baseline FAILED; candidate FINISHED",
            [ids[12]],
            [ids[13]],
        ),
        (7, None, 0.5, None, "incomplete: baseline KILLED (SIGTERM)", ids[14:16], [ids[16]]),
    ]
    rows = [
        (
            p.train_seed,
            p.baseline,
            p.candidate,
            p.difference,
            p.status,
            p.run_ids["baseline"],
            p.run_ids["candidate"],
        )
        for p in got.pairs
    ]
    assert rows == expected
    assert all(p.eval_seed == 9 for p in got.pairs)
    assert sorted(got.foreign_runs) == sorted(ids[17:])
    assert got.mean == 0.0625
    # Two differences: the bootstrap means are -0.125, 0.0625 (twice) and 0.25, so
    # the 5% and 95% quantiles are the extremes.
    assert got.ci == (-0.125, 0.25)
    assert got.verdict == "undecided: 6 of 8 pairs incomplete"

    # The same record under a rule that does not require complete pairs.
    lenient = _hand_spec([0, 1, 2, 3, 4, 5, 6, 7], False, f"lenient-{time.time_ns()}")
    parent = _hand_record(client, exp_id, lenient, [dict(c) for c in children[:17]])
    assert comparison.analyze(client, parent).verdict == "does not hold"

    # Complete, and required complete: the rule decides.
    whole = _hand_spec([0, 1], True, f"whole-{time.time_ns()}")
    both = [
        {"t": 0, "arm": "baseline", "status": F, "value": 0.5},
        {"t": 0, "arm": "candidate", "status": F, "value": 0.75},
        {"t": 1, "arm": "baseline", "status": F, "value": 0.5},
        {"t": 1, "arm": "candidate", "status": F, "value": 0.625},
    ]
    done = comparison.analyze(client, _hand_record(client, exp_id, whole, both))
    assert (done.ci, done.verdict) == ((0.125, 0.25), "holds")

    # No complete pair at all.
    none = _hand_spec([0], False, f"none-{time.time_ns()}")
    lone = [{"t": 0, "arm": "baseline", "status": F, "value": 0.5}]
    empty = comparison.analyze(client, _hand_record(client, exp_id, none, lone))
    assert (empty.mean, empty.ci, empty.verdict) == (None, None, "undecided: no complete pair")


@pytest.mark.claims("registered-question-frozen")
def test_only_a_parent_registers_a_hash(sqlite_store):
    """check_frozen reads hashes from parent runs only; another parent hash freezes the name.

    `check_frozen` compares with the hashes on PARENT runs of the name: a child
    (or any other run) carrying the name and another hash does not freeze it;
    a parent with another hash does, and the error names that hash."""
    client = sqlite_store.client()
    _, exp_id = sqlite_store.new_experiment(client, "frozen-hand")
    spec = _hand_spec([0], True, f"fz-{time.time_ns()}")
    name = {"comparison.name": spec.name}
    client.create_run(
        exp_id, tags={**name, "comparison.role": "parent", "comparison.spec_sha256": spec.sha256()}
    )
    for role, sha in (("child", "1" * 64), ("child", "a" * 64), ("", "b" * 64), ("zz", "c" * 64)):
        client.create_run(
            exp_id, tags={**name, "comparison.role": role, "comparison.spec_sha256": sha}
        )
    assert comparison.registered_hashes(client, exp_id, spec.name) == {spec.sha256()}
    comparison.check_frozen(client, exp_id, spec)  # Registered with this very content.
    other = "e" * 64
    client.create_run(
        exp_id, tags={**name, "comparison.role": "parent", "comparison.spec_sha256": other}
    )
    with pytest.raises(comparison.FrozenSpecError, match=f"spec hash `{other[:16]}\\.\\.\\.`"):
        comparison.check_frozen(client, exp_id, spec)
    fresh = _hand_spec([0], True, f"fresh-{time.time_ns()}")
    comparison.check_frozen(client, exp_id, fresh)  # A new name is free.


def test_spec_hash_is_of_its_canonical_json():
    """Spec.sha256 is of its sorted, spaceless JSON: YAML order aside, any change moves it.

    sha256 of the spec's JSON with sorted keys and no spaces; the order of the
    YAML keys does not matter; any changed field changes it."""
    spec = _hand_spec([0, 1], True, "canon")
    fields = spec.model_dump(mode="json")
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert spec.canonical_json() == canonical
    assert spec.sha256() == hashlib.sha256(canonical.encode()).hexdigest()
    assert canonical != json.dumps(fields, separators=(",", ":"))  # Sorting matters here.
    reordered = comparison.parse_spec(yaml.safe_dump(dict(reversed(list(fields.items())))))
    assert reordered.sha256() == spec.sha256()
    assert spec.pairs() == [(0, 9), (1, 9)]
    changed = spec.model_copy(update={"question": spec.question + "?"})
    assert changed.sha256() != spec.sha256()


@pytest.mark.claims("bootstrap-two-sided")
@pytest.mark.parametrize("confidence", [0.9, 0.8])
def test_bootstrap_interval_against_enumeration_and_scipy(evidence, confidence):
    """bootstrap_ci sits on the exact alpha/2 bootstrap quantiles and SciPy's (1.25e-3).

    Six distinct paired differences: the interval must sit on the exact
    alpha/2 and 1 - alpha/2 quantiles of the enumerated bootstrap (6^6 resamples),
    within Monte Carlo error, and agree with `scipy.stats.bootstrap`'s percentile
    interval; the alpha and 1 - alpha quantiles (a one-sided mistake) are far
    outside that error. Repeated at two confidence levels.

    Size: 1.8e-12, computed exactly (both bounds, both comparisons, both
    confidences): the resampled means are atoms of a known discrete distribution,
    and an inverted-CDF bound of 40,000 draws leaves an atom only through a
    binomial count. Against every SciPy interval seen over 256 of its generator
    seeds (its draws would change with its release): at most 1.4e-8. Sweep: 1,000
    seeds x 2 confidences under the reference and the three reformulations that
    touch resampling: none failed; the largest distances were 3.3e-4 (low bounds)
    and 1.17e-3 (the 90% high bound, 7 atoms up, on 24 of 1,000 seeds), against
    1.25e-3. The former tolerance, 1e-3, failed those 24 seeds: exact size 0.027.
    Power: a tail level moved 0.025 toward the middle fails with probability 0.97
    to 1 (0.02: 0.13 to 1); the one-sided alpha levels (seeded bug) land 5.7e-3
    off and resampling without replacement (seeded bug) 1.9e-2 off: all 16 seeds
    tried fail. (sweep: evidence/size_sweep.json, the `size_sweep` script beside
    the tests)"""
    import scipy.stats

    diffs = np.array([0.031, -0.012, 0.058, 0.004, 0.022, -0.027])
    alpha = 1 - confidence
    low, high = comparison.bootstrap_ci(diffs, confidence, resamples=40_000, seed=3)
    exact = _exact_quantiles(diffs, [alpha / 2, 1 - alpha / 2])
    one_sided = _exact_quantiles(diffs, [alpha, 1 - alpha])
    ref = scipy.stats.bootstrap(
        (diffs,),
        np.mean,
        confidence_level=confidence,
        n_resamples=40_000,
        method="percentile",
        random_state=np.random.default_rng(5),
    ).confidence_interval
    # The resampled means are atoms 1/6000 apart (multiples of 0.001 / 6), unevenly
    # spread: near the 0.95 quantile the next atoms up lie 5e-4, 8.3e-4 and 1.17e-3
    # away, so a correct 40,000-draw bound lands 7 atoms (1.17e-3) off the exact one
    # with chance 0.027. 1.25e-3 sits halfway between 7 and 8 atom steps; the gap
    # between the alpha/2 and alpha quantiles is 3.67e-3 to 5.33e-3 (> 2 tol).
    tol = 1.25e-3
    observed = {
        "ours": [low, high],
        "exact_alpha_half": exact,
        "exact_alpha": one_sided,
        "scipy_percentile": [float(ref.low), float(ref.high)],
    }
    assert evidence.record(
        "bootstrap interval: the exact alpha/2 quantiles, and scipy's percentile interval",
        f"n = 6 distinct differences, confidence {confidence}, 40,000 resamples",
        observed,
        {"abs": tol},
        abs(low - exact[0]) <= tol
        and abs(high - exact[1]) <= tol
        and abs(low - ref.low) <= tol
        and abs(high - ref.high) <= tol
        and abs(one_sided[0] - exact[0]) > 2 * tol
        and abs(one_sided[1] - exact[1]) > 2 * tol,
    ), observed


@pytest.mark.claims("bootstrap-seeded")
def test_bootstrap_seed_fixes_the_bits_and_only_the_seed_does():
    """bootstrap_ci is a pure function of its seed: same seed, same bits; other seeds differ.

    The analysis must be reproducible from the spec's `bootstrap_seed`, so the
    same seed must give bit-identical bounds even after calls with other seeds
    in between (a generator shared across calls would drift), and the seed must
    matter: seeds 0..7 on a non-degenerate sample give 8 different intervals (a
    generator built from a constant would give one). Each interval is also
    checked to be a sane one, so the spread is not noise: it contains the
    sample mean and its width is within a factor 2 of the normal approximation
    2 * 1.96 * sd / sqrt(n) (the plug-in sd, which is the bootstrap's).

    Size: below 1e-7. Two of the 8 intervals coincide only if both bounds are the
    same resampled multisets, each drawn in both runs: at most 28 (2000 x 20! /
    20^20)^2 = 6e-8. A bound on the wrong side of the mean needs 1,950 of 2,000
    resampled means on one side: 1e-500. The width ratio over 2,048 intervals
    (256 blocks of 8 seeds, under the reference and each of the three
    reformulations that touch resampling) was 0.93 to 1.07, its log normal with sd
    0.021, so 0.5 and 2 lie 33 sd away. No repeat differed, no two of a variant's
    2,048 intervals shared a bound. Power: a generator shared across calls (the
    repeat differs) or built from a constant (one interval) fails always;
    resampling without replacement (seeded bug: width 0, one interval) fails every
    block; a width off by a factor 2 fails. The one-sided alpha levels (width about
    0.84 of the normal one) pass here: the interval test above catches them.
    (sweep: evidence/size_sweep.json, the `size_sweep` script beside the tests)"""
    # 20 continuous values: the resampled means are (almost surely) all distinct,
    # so two seeds landing on the same pair of bounds would be a coincidence.
    diffs = np.random.default_rng(2024).normal(0.01, 0.03, size=20)
    first = comparison.bootstrap_ci(diffs, 0.95, 2000, seed=0)
    intervals = {seed: comparison.bootstrap_ci(diffs, 0.95, 2000, seed=seed) for seed in range(8)}
    again = comparison.bootstrap_ci(diffs, 0.95, 2000, seed=0)
    # Exact equality: the same bits, before and after calls with other seeds.
    assert again == first == intervals[0], (first, intervals[0], again)
    assert len(set(intervals.values())) == len(intervals), intervals

    normal_width = 2 * 1.96 * diffs.std() / np.sqrt(len(diffs))
    for seed, (low, high) in intervals.items():
        assert low < diffs.mean() < high, (seed, low, high, diffs.mean())
        assert 0.5 < (high - low) / normal_width < 2.0, (seed, high - low, normal_width)


@pytest.mark.claims("decide-higher-is-better", "decide-lower-is-better")
def test_decision_rule_both_directions_and_a_minimum_difference(evidence):
    """decide matches a hand-written verdict table, boundaries and mirrored cases included.

    The verdict table, written out by hand: for higher-is-better the whole
    interval must lie above +min_difference; for lower-is-better below
    -min_difference. Each case is mirrored (interval negated, direction flipped),
    which must give the same verdict."""
    cases = [
        # interval, higher is better, min difference, expected
        ((0.02, 0.05), True, 0.0, "holds"),
        ((0.02, 0.05), True, 0.01, "holds"),
        ((0.02, 0.05), True, 0.03, "does not hold"),
        ((-0.01, 0.05), True, 0.0, "does not hold"),
        ((-0.05, -0.02), True, 0.0, "does not hold"),
        ((-0.05, -0.02), False, 0.0, "holds"),
        ((-0.05, -0.02), False, 0.01, "holds"),
        ((-0.05, -0.02), False, 0.03, "does not hold"),
        ((-0.05, 0.01), False, 0.0, "does not hold"),
        ((0.02, 0.05), False, 0.0, "does not hold"),
        # On the boundary: an interval that only touches the margin does not clear it.
        ((0.01, 0.05), True, 0.01, "does not hold"),
        ((0.0, 0.05), True, 0.0, "does not hold"),
        ((-0.05, -0.01), False, 0.01, "does not hold"),
        ((-0.05, 0.0), False, 0.0, "does not hold"),
    ]
    rows = []
    for ci, higher, margin, expected in cases:
        got = comparison.decide(ci, higher, margin)
        mirrored = comparison.decide((-ci[1], -ci[0]), not higher, margin)
        rows.append(
            {
                "ci": ci,
                "higher_is_better": higher,
                "min_difference": margin,
                "expected": expected,
                "got": got,
                "mirrored": mirrored,
            }
        )
    assert evidence.record(
        "decision rule: direction and minimum difference",
        f"{len(cases)} intervals, both directions, min_difference 0, 0.01, 0.03",
        {"cases": rows},
        None,
        all(r["got"] == r["expected"] == r["mirrored"] for r in rows),
    ), rows


@pytest.mark.claims(
    "spec-frozen-before-runs",
    "paired-analysis-from-the-store",
    "comparison-report-markdown-and-png",
    "bootstrap-inverted-cdf",
)
@pytest.mark.parametrize("require_complete", [True, False])
def test_paired_comparison_from_the_store(evidence, store, tmp_path, require_complete):
    """Paired differences equal SQL's, a failed arm's pair is incomplete, the CI is exact.

    Size of the interval check (1e-12 from the enumeration): 1.9e-252 per analysis,
    exact. With 2 complete pairs each extreme resampled mean has probability 1/4,
    and the 5% and 95% inverted-CDF bounds of 4,000 resamples are those atoms unless
    fewer than 200 (201) draws land on one: Binomial(4000, 1/4), mean 1,000, sd 27.
    Sweep: 1,000 seeds under the reference and the three reformulations that touch
    resampling, on this test's recorded differences and the hand-written record's:
    every interval exact; the fewest draws on an extreme atom, 913. Power: a bound
    that is not a resampled mean (a normal approximation) fails, as does resampling
    without replacement (both bounds the mean) and a lower tail level of 0.275 or
    more (probability 0.9998); the one-sided alpha levels fall on the same atoms
    here, and the interval test catches them. (sweep: evidence/size_sweep.json, the
    `size_sweep` script beside the tests)"""
    client = store.client()
    name, exp_id = store.new_experiment(client, "compare")
    spec = _spec(f"{store.kind}-{int(require_complete)}-{time.time_ns()}", require_complete)

    def fail_one_arm(arm: str, train_seed: int, eval_seed: int) -> None:
        if arm == "candidate" and train_seed == 2:
            raise ArmFailure("deliberate failure of one arm")

    ran = comparison.run_comparison(client, exp_id, spec, before_train=fail_one_arm)
    analysis = comparison.analyze(store.client(), ran.parent_run_id)  # A new client.

    # Frozen: one hash on the parent and every child; the parent came first.
    parent = client.get_run(ran.parent_run_id)
    children = [client.get_run(c["run_id"]) for c in ran.children]
    hashes = {r.data.tags["comparison.spec_sha256"] for r in [parent, *children]}
    frozen = hashes == {spec.sha256()} and all(
        c.info.start_time >= parent.info.start_time for c in children
    )
    assert evidence.record(
        "the spec hash is on the parent and every child; the parent is registered first",
        store.kind,
        {"hashes": sorted(hashes), "children": len(children)},
        None,
        frozen,
    )

    # Reference: the metric straight from the database, paired by the test.
    rows = store.sql(
        "SELECT r.run_uuid, m.value FROM latest_metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
        "WHERE r.experiment_id = ? AND m.key = 'test_accuracy'",
        (int(exp_id),),
    )
    value = dict(rows)
    reference = {}
    for c in children:
        key = (int(c.data.params["train_seed"]), int(c.data.params["eval_seed"]))
        if c.info.status == "FINISHED":
            reference.setdefault(key, {})[c.data.tags["comparison.arm"]] = value[c.info.run_id]
    ref_diffs = {k: v["candidate"] - v["baseline"] for k, v in reference.items() if len(v) == 2}
    got = {(p.train_seed, p.eval_seed): p.difference for p in analysis.pairs}
    incomplete = [p for p in analysis.pairs if p.status != "complete"]
    assert evidence.record(
        "paired differences equal those recomputed from SQL; the failed arm's pair is incomplete",
        f"{store.kind}, require_complete={require_complete}",
        {
            "differences": {str(k): v for k, v in got.items()},
            "incomplete": [p.status for p in incomplete],
        },
        None,
        {k: v for k, v in got.items() if v is not None} == ref_diffs
        and len(analysis.pairs) == 3
        and [(p.train_seed, p.eval_seed) for p in incomplete] == [(2, 0)]
        and incomplete[0].difference is None
        and incomplete[0].status == "incomplete: candidate FAILED (ArmFailure)",
    ), got

    diffs = np.array([ref_diffs[k] for k in sorted(ref_diffs)])
    exact = exact_percentile_ci(diffs, spec.decision.confidence)
    assert evidence.record(
        "bootstrap interval equals the exact enumerated percentile bootstrap",
        f"{store.kind}, n={len(diffs)} complete pairs, {spec.decision.resamples} resamples",
        {"ci": analysis.ci, "exact": exact, "mean": analysis.mean},
        {"abs": 1e-12},
        analysis.ci is not None
        and np.allclose(analysis.ci, exact, rtol=0, atol=1e-12)
        and abs(analysis.mean - diffs.mean()) <= 1e-12,
    ), (analysis.ci, exact)

    if require_complete:
        expected = "undecided: 1 of 3 pairs incomplete"
    else:
        expected = "holds" if exact[0] > spec.decision.min_difference else "does not hold"
    assert evidence.record(
        "the verdict follows the decision rule",
        f"{store.kind}, require_complete={require_complete}",
        {"verdict": analysis.verdict},
        {"expected": expected},
        analysis.verdict == expected,
    )

    # The analysis reads the store: change one recorded value, the analysis follows.
    first = next(p for p in analysis.pairs if p.status == "complete")
    base_id = first.run_ids["baseline"][0]
    client.log_batch(base_id, metrics=[Metric("test_accuracy", 0.0, int(time.time() * 1000), 99)])
    again = comparison.analyze(store.client(), ran.parent_run_id)
    moved = next(p for p in again.pairs if p.train_seed == first.train_seed)
    assert evidence.record(
        "a value changed in the store changes the analysis",
        f"{store.kind}: baseline test_accuracy of pair t{first.train_seed} set to 0",
        {"before": first.difference, "after": moved.difference},
        None,
        moved.difference == moved.candidate and moved.difference != first.difference,
    )

    paths = comparison.write_report(client, analysis, tmp_path / "report")
    text = paths[0].read_text()
    assert "incomplete: candidate FAILED (ArmFailure)" in text and spec.sha256() in text
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.claims("spec-frozen-before-runs", "registered-question-frozen")
def test_a_registered_question_is_frozen(store):
    """Rerunning a registered comparison name with an edited spec raises FrozenSpecError."""
    client = store.client()
    _, exp_id = store.new_experiment(client, "frozen")
    spec = _spec(f"frozen-{store.kind}-{time.time_ns()}", True)
    spec = spec.model_copy(update={"train_seeds": [0], "eval_seeds": [0]})
    comparison.run_comparison(client, exp_id, spec)
    changed = spec.model_copy(update={"question": spec.question + " (edited after the fact)"})
    with pytest.raises(comparison.FrozenSpecError, match=r"was registered with spec hash"):
        comparison.run_comparison(client, exp_id, changed)


def test_bad_specs_are_clear_errors(tmp_path):
    """Four bad specs raise SpecError naming the fault; bad YAML makes compare exit 2."""
    with pytest.raises(comparison.SpecError, match=r"`baseline` must not set `train_seed`"):
        comparison.parse_spec(
            SPEC_YAML.format(suffix="x", require_complete="true").replace(
                "num_epochs: 5,", "num_epochs: 5, train_seed: 1,"
            )
        )
    with pytest.raises(comparison.SpecError, match=r"`mechanism.field` is `depth`"):
        comparison.parse_spec(
            SPEC_YAML.format(suffix="x", require_complete="true").replace(
                "field: learning_rate", "field: depth"
            )
        )
    with pytest.raises(comparison.SpecError, match=r"equals the baseline"):
        comparison.parse_spec(
            SPEC_YAML.format(suffix="x", require_complete="true").replace(
                "value: 0.003", "value: 0.001"
            )
        )
    with pytest.raises(comparison.SpecError, match=r"`train_seeds` repeats a seed"):
        comparison.parse_spec(
            SPEC_YAML.format(suffix="x", require_complete="true").replace("[0, 1, 2]", "[0, 0]")
        )
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    result = CliRunner().invoke(
        main, ["compare", str(bad), "--tracking-uri", str(tmp_path / "s.db")]
    )
    assert result.exit_code == 2 and "not valid YAML" in result.output
    assert "Traceback" not in result.output
