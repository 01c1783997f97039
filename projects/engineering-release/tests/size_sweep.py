"""Size sweep of the tests that judge a trained model's held-out figures: how often a
CORRECT solution fails them, and what a wrong one does to the figures.

    python tests/size_sweep.py [--seeds 10000] [--rewrite-seeds 1000] [--bug-seeds 8]
                               [--only PART] [--out evidence/size_sweep.json]

Run on demand: pytest does not collect it. The stage tests train the tiny model
(`TrainConfig.tiny()`) with seeds 0, 1 and 2 and read its held-out figures:

  - stage 2, `test_report_metrics_agree_with_sklearn_and_numpy`: accuracy > 0.85 for
    seeds 0 and 1;
  - the premise of `released_template` (tests/conftest.py: every stage-3 and stage-4
    test that releases, approves or serves) and of the final release of B in
    `test_gates_refuse_and_change_nothing`: seeds 0 and 1 pass the default `Policy`
    (accuracy >= 0.9 and min class recall >= 0.75, on 35 to 37 held-out digits a class);
  - `test_gates_refuse_and_change_nothing`: seed 2 is below the strict policy's 0.999
    (at least one of the 359 held-out digits wrong).

A correct solution that trains under another key, or rounds differently (a
cross-entropy written by hand, the batch mean as a sum over the batch size), trains
along another path, as another seed does. So the tiny model is trained here under many
seeds, and under rewrites of train.py equal in exact arithmetic (`REWRITES`: the
module's source with one substitution, imported as a module of its own; nothing is
patched in place), and evaluated as `evaluation.evaluate` evaluates it (the artifact
written and loaded back, `evaluation.predict_heldout`, `metrics_from_predictions`,
`gates.thresholds` under `Policy()`).

Parts (`--only`):
  training   the reference under `--seeds` seeds (0, 1, ...; about 0.05 s a seed after
             a 20 s compile): accuracy, errors, min class recall, the policy's verdict;
             each threshold's size from a normal fit of logit(figure) (its spread at
             the upper end of its 99% interval) and, for min class recall, from a
             per-class binomial model as well.
  rewrites   the same figures under each rewrite of `REWRITES` (`--rewrite-seeds`
             seeds each; one compile each), and whether the bits differ from the
             reference's at the same seed.
  reformulations  the reformulations of reformulations.toml that touch evaluation
             (stage 2, evaluation.py) and the threshold verdict (stage 4,
             `misses-from-a-table` in gates.py), applied to a module of their own:
             the metrics and verdicts of the `training` part's predictions recomputed
             by each and compared with the reference's, exactly. No reformulation
             touches training (stages 1 and 3 rewrite the store, ledger and signing).
  power      what wrong code does to the figures: the seeded bugs of stage 2 on the
             sweep's predictions, and training mistakes (labels not aligned with their
             images, one epoch run of twelve, the step size divided by the batch size)
             under `--bug-seeds` seeds.

Each part's record goes into the JSON under its name (other parts kept), with the
command that wrote it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import tempfile
import time
import tomllib
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import conftest  # noqa: E402,F401  (the suite's JAX modes: strict promotion, key reuse)
import jax  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from engineering_release import data, evaluation, gates, train  # noqa: E402
from engineering_release.config import Policy, TrainConfig  # noqa: E402

S2_TEST = ROOT / "tests" / "test_stage_2_evaluation.py"
S2_CHECK = 'assert m["accuracy"] > 0.85'  # the stage-2 test's line; its limit below
S2_ACCURACY = 0.85
STRICT_ACCURACY = 0.999  # test_gates_refuse_and_change_nothing's strict policy

# Equal in exact arithmetic, rounded differently: (name, find, replace) in train.py.
REWRITES = [
    (
        "cross-entropy from log_softmax",
        "return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()",
        "return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1).mean()",
    ),
    (
        "cross-entropy against one-hot labels",
        "return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()",
        "return optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, 10)).mean()",
    ),
    (
        "loss mean as sum / batch",
        "return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()",
        "return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, labels))"
        " / labels.shape[0]",
    ),
    (
        "init and shuffle keys split the other way",
        "    key, init_key = jax.random.split(key)",
        "    init_key, key = jax.random.split(key)",
    ),
]

# Training mistakes (power): (name, find, replace) in train.py.
TRAINING_BUGS = [
    (
        "labels not aligned with their images (labels taken in the unshuffled order)",
        "graphdef, tx, params, opt_state, images[idx], labels[idx]",
        "graphdef, tx, params, opt_state, images[idx], labels[jnp.sort(idx)]",
    ),
    (
        "one epoch run of twelve (the first epoch's batches only)",
        "    return jax.lax.scan(step, state, batches)",
        "    n = batches.shape[0] // 12\n"
        "    state, losses = jax.lax.scan(step, state, batches[:n])\n"
        "    return state, jnp.tile(losses, 12)",
    ),
    (
        "step size divided by the batch size (a summed loss's habit)",
        "    tx = _optimizer(config.learning_rate)",
        "    tx = _optimizer(config.learning_rate / config.batch_size)",
    ),
]


def rewritten(module: types.ModuleType, find: str, replace: str, name: str) -> types.ModuleType:
    """A fresh module: `module`'s source with `find` replaced (it must occur once)."""
    source = Path(module.__file__).read_text(encoding="utf-8")
    if source.count(find) != 1:
        raise SystemExit(f"`{name}`: its text is not once in {module.__file__}")
    new = types.ModuleType(f"{module.__name__}_rewrite")
    new.__file__ = module.__file__
    sys.modules[new.__name__] = new  # dataclasses look their module up there
    exec(compile(source.replace(find, replace), module.__file__, "exec"), new.__dict__)
    return new


def reformulation(entry_id: str) -> dict:
    with (ROOT / "reformulations.toml").open("rb") as f:
        return next(r for r in tomllib.load(f)["reformulations"] if r["id"] == entry_id)


def figures(train_mod, seed: int, workdir: Path) -> dict:
    """One seed's model trained by `train_mod`, evaluated as `evaluation.evaluate` does."""
    trained = train_mod.train(TrainConfig.tiny(seed=seed))
    bits = hashlib.sha256()
    for name in sorted(trained.params):
        bits.update(name.encode() + np.ascontiguousarray(trained.params[name]).tobytes())
    directory = workdir / f"seed{seed}"
    train.write_model(trained, directory)
    heldout = data.heldout_set(Policy().split_seed, Policy().test_fraction)
    predictions = evaluation.predict_heldout(directory, heldout)
    metrics = evaluation.metrics_from_predictions(predictions, heldout.labels)
    return {
        "seed": seed,
        "accuracy": metrics["accuracy"],
        "errors": metrics["count"] - metrics["correct"],
        "min_class_recall": metrics["min_class_recall"],
        "worst_class": int(np.argmin(metrics["class_recall"])),
        "class_errors": [int(sum(row) - row[c]) for c, row in enumerate(metrics["confusion"])],
        "policy_misses": gates.thresholds(metrics, Policy()),
        "bits": bits.hexdigest()[:16],
        "_predictions": predictions,
    }


def summary(values, limit=None, fails_below=True, inclusive=False) -> dict:
    """Distribution of `values`; with a limit, the count of values that fail it
    (below it, or at it too when `inclusive`; above it when not `fails_below`)."""
    v = np.asarray(values, np.float64).ravel()
    out = {
        "n": int(v.size),
        "min": float(v.min()),
        "q001": float(np.quantile(v, 0.001)),
        "q01": float(np.quantile(v, 0.01)),
        "median": float(np.median(v)),
        "mean": float(v.mean()),
        "sd": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "q99": float(np.quantile(v, 0.99)),
        "max": float(v.max()),
    }
    if limit is not None:
        if fails_below:
            failed = v <= limit if inclusive else v < limit
        else:
            failed = v >= limit if inclusive else v > limit
        out["limit"] = float(limit)
        out["exceed"] = int(np.sum(failed))
    return out


def logit(p):
    p = np.asarray(p, np.float64)
    return np.log(p / (1 - p))


def sd_upper_99(sd: float, n: int) -> float:
    """The upper end of the 99% confidence interval of a normal spread from n values."""
    return float(sd * np.sqrt((n - 1) / stats.chi2.ppf(0.01, n - 1)))


def logit_normal_size(values, limit: float, fails_below: bool = True) -> dict:
    """Normal fit of logit(values), its spread at the upper end of the 99% interval:
    the chance of a value past `limit` and the margin in fitted spreads. Also the
    fit's own tail counts against the sample's, to show where it is conservative."""
    z = logit(values)
    mu, sd = float(z.mean()), float(z.std(ddof=1))
    sd_up = max(sd_upper_99(sd, z.size), 1e-12)
    lim = float(logit(limit))
    margin = (mu - lim) / sd_up if fails_below else (lim - mu) / sd_up
    u = (z - mu) / sd
    return {
        "transform": "logit",
        "mean": mu,
        "sd": sd,
        "sd_upper_99": sd_up,
        "skewness": float(stats.skew(z)),
        "excess_kurtosis": float(stats.kurtosis(z)),
        "margin_in_sd": float(margin),
        "size": float(stats.norm.sf(margin)),
        "lower_tail_observed_vs_normal": {
            str(c): {"observed": int(np.sum(u < -c)), "normal": float(z.size * stats.norm.sf(c))}
            for c in (2.0, 2.5, 3.0)
        },
    }


def class_count_size(h: dict, limit: float) -> dict:
    """Min class recall >= `limit` as ten per-class error counts: class c fails when its
    errors exceed floor((1 - limit) n_c). Each class's errors over seeds are fitted by a
    negative binomial with the sample's mean and variance (a Poisson where the variance
    is not above the mean); the size is the sum over classes (a union bound)."""
    out, total = {}, 0.0
    for c, (n_c, hist) in enumerate(zip(h["held_out_per_class"], h["class_errors"], strict=True)):
        allowed = int(np.floor((1 - limit) * n_c + 1e-9))
        e = expand(hist).astype(np.float64)
        mean, var = float(e.mean()), float(e.var(ddof=1))
        if var > mean > 0:
            r = mean**2 / (var - mean)
            size = float(stats.nbinom.sf(allowed, r, r / (r + mean)))
        else:
            size = float(stats.poisson.sf(allowed, max(mean, 1e-12)))
        total += size
        out[str(c)] = {
            "held_out": int(n_c),
            "errors_allowed": allowed,
            "errors_max_over_seeds": int(e.max()),
            "errors_mean": mean,
            "errors_var": var,
            "size": size,
        }
    return {
        "model": "negative binomial by moments",
        "per_class": out,
        "size_union_over_classes": total,
    }


# --------------------------------------------------------------------------- parts


def check_limits() -> None:
    """The limits used here are the tests' own: fail loudly if a test moved."""
    if S2_CHECK not in S2_TEST.read_text(encoding="utf-8"):
        raise SystemExit(f"`{S2_CHECK}` is no longer in {S2_TEST}; update S2_ACCURACY.")


_CACHE: dict[str, list[dict]] = {}


def reference_rows(args) -> list[dict]:
    if "reference" not in _CACHE:
        with tempfile.TemporaryDirectory() as tmp:
            _CACHE["reference"] = [figures(train, s, Path(tmp)) for s in range(args.seeds)]
    return _CACHE["reference"]


def histograms(rows: list[dict]) -> dict:
    """The figures of a set of runs as histograms (lossless for these discrete figures):
    total held-out errors, each class's errors, and min class recall (as `k/n_c`)."""
    per_class = np.bincount(data.heldout_set(0, 0.2).labels, minlength=data.NUM_CLASSES)
    errors = np.bincount([r["errors"] for r in rows], minlength=1)
    class_errors = np.asarray([r["class_errors"] for r in rows])
    recall = {}
    for r in rows:
        c = r["worst_class"]
        key = f"{per_class[c] - r['class_errors'][c]}/{per_class[c]}"
        recall[key] = recall.get(key, 0) + 1
    return {
        "seeds": len(rows),
        "held_out": int(per_class.sum()),
        "held_out_per_class": per_class.tolist(),
        "errors": errors.tolist(),
        "class_errors": [
            np.bincount(class_errors[:, c], minlength=1).tolist() for c in range(data.NUM_CLASSES)
        ],
        "min_class_recall": dict(sorted(recall.items(), key=lambda kv: ratio(kv[0]))),
        "worst_class": np.bincount(
            [r["worst_class"] for r in rows], minlength=data.NUM_CLASSES
        ).tolist(),
        "seeds_refused_by_the_policy": int(sum(bool(r["policy_misses"]) for r in rows)),
        "refusals": [
            {"seed": r["seed"], "misses": r["policy_misses"]} for r in rows if r["policy_misses"]
        ][:20],
    }


def ratio(text: str) -> float:
    hits, count = text.split("/")
    return int(hits) / int(count)


def expand(histogram: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(histogram)), histogram)


def fits(h: dict) -> dict:
    """Each threshold's distribution over seeds and the size fitted from the histograms."""
    n = h["held_out"]
    acc = 1 - expand(h["errors"]) / n
    rec = np.repeat(
        [ratio(k) for k in h["min_class_recall"]], list(h["min_class_recall"].values())
    ).astype(np.float64)
    policy = Policy()
    return {
        "histograms": h,
        "stage 2: accuracy > 0.85": {
            **summary(acc, S2_ACCURACY, inclusive=True),
            "fit": logit_normal_size(acc, S2_ACCURACY),
        },
        "premise: accuracy >= min_accuracy": {
            **summary(acc, policy.min_accuracy),
            "fit": logit_normal_size(acc, policy.min_accuracy),
        },
        "premise: min class recall >= min_class_recall": {
            **summary(rec, policy.min_class_recall),
            "fit": logit_normal_size(rec, policy.min_class_recall),
            "per_class_count_model": class_count_size(h, policy.min_class_recall),
        },
        "seed 2 premise: accuracy < 0.999 (at least one error)": {
            **summary(acc, STRICT_ACCURACY, fails_below=False, inclusive=True),
            "fit": logit_normal_size(acc, STRICT_ACCURACY, fails_below=False),
        },
    }


def empirical(failed: int, seeds: int) -> dict:
    """A failure rate over seeds with its exact (Clopper-Pearson) 95% upper bound."""
    upper = float(stats.beta.ppf(0.95, failed + 1, seeds - failed)) if failed < seeds else 1.0
    return {"failed": int(failed), "seeds": int(seeds), "rate": failed / seeds, "upper_95": upper}


def sizes_for_the_tests(f: dict) -> dict:
    """Sizes as the tests use the figures: two models (seeds 0 and 1) each time. The
    premise's size is the observed rate of refusals (the fits disagree in its tail: the
    logit-normal fit's lower tail is lighter than the sample's, the per-class count
    model's heavier), with its exact 95% upper bound; the fits are kept beside it."""
    h = f["histograms"]
    recall = f["premise: min class recall >= min_class_recall"]
    refused = empirical(h["seeds_refused_by_the_policy"], h["seeds"])
    return {
        "stage 2: accuracy > 0.85, seeds 0 and 1": 2 * f["stage 2: accuracy > 0.85"]["fit"]["size"],
        "premise: both policy thresholds, one model, observed": refused,
        "premise: both policy thresholds, seeds 0 and 1": {
            "observed_rate_x2": 2 * refused["rate"],
            "upper_95_x2": 2 * refused["upper_95"],
            "fits_x2": {
                "accuracy logit-normal + min recall logit-normal": 2
                * (f["premise: accuracy >= min_accuracy"]["fit"]["size"] + recall["fit"]["size"]),
                "accuracy logit-normal + min recall per-class count model": 2
                * (
                    f["premise: accuracy >= min_accuracy"]["fit"]["size"]
                    + recall["per_class_count_model"]["size_union_over_classes"]
                ),
            },
        },
        "seed 2 premise: accuracy < 0.999": f[
            "seed 2 premise: accuracy < 0.999 (at least one error)"
        ]["fit"]["size"],
    }


def part_training(args) -> dict:
    rows = reference_rows(args)
    h = histograms(rows)
    out = fits(h)
    out["sizes_for_the_tests"] = sizes_for_the_tests(out)
    out["test_seeds"] = {str(r["seed"]): margins(r) for r in rows if r["seed"] in (0, 1, 2)}
    return out


def margins(r: dict) -> dict:
    """A run's figures and how many more errors it could make before the policy refuses
    it: in all (accuracy) and in its closest class (min class recall)."""
    policy = Policy()
    per_class = np.bincount(data.heldout_set(0, 0.2).labels, minlength=data.NUM_CLASSES)
    n = int(per_class.sum())
    allowed = np.floor((1 - policy.min_class_recall) * per_class + 1e-9).astype(int)
    spare = allowed - np.asarray(r["class_errors"])
    return {
        "accuracy": r["accuracy"],
        "errors": r["errors"],
        "min_class_recall": r["min_class_recall"],
        "worst_class": r["worst_class"],
        "errors_to_spare_accuracy": int(np.floor((1 - policy.min_accuracy) * n + 1e-9))
        - r["errors"],
        "errors_to_spare_closest_class": int(spare.min()),
        "closest_class": int(np.argmin(spare)),
    }


def part_rewrites(args) -> dict:
    reference = {r["seed"]: r for r in reference_rows(args)}
    out = {}
    for name, find, replace in REWRITES:
        module = rewritten(train, find, replace, name)
        with tempfile.TemporaryDirectory() as tmp:
            rows = [figures(module, s, Path(tmp)) for s in range(args.rewrite_seeds)]
        h = histograms(rows)
        record = fits(h)
        record["sizes_for_the_tests"] = sizes_for_the_tests(record)
        record["seeds_with_other_bits"] = int(
            sum(r["bits"] != reference[r["seed"]]["bits"] for r in rows if r["seed"] in reference)
        )
        record["seeds_with_other_predictions"] = int(
            sum(
                not np.array_equal(r["_predictions"], reference[r["seed"]]["_predictions"])
                for r in rows
                if r["seed"] in reference
            )
        )
        # Against the reference at the same seed: how far the rounding moves the figures.
        same = [(r, reference[r["seed"]]) for r in rows if r["seed"] in reference]
        record["against_the_reference_at_the_same_seed"] = {
            "seeds": len(same),
            "changed_predictions": np.bincount(
                [int(np.sum(a["_predictions"] != b["_predictions"])) for a, b in same],
                minlength=1,
            ).tolist(),
            "abs_change_in_errors": np.bincount(
                [abs(a["errors"] - b["errors"]) for a, b in same], minlength=1
            ).tolist(),
            "max_abs_change_in_a_class_errors": np.bincount(
                [
                    int(np.max(np.abs(np.subtract(a["class_errors"], b["class_errors"]))))
                    for a, b in same
                ],
                minlength=1,
            ).tolist(),
        }
        record["test_seeds"] = {str(r["seed"]): margins(r) for r in rows if r["seed"] in (0, 1, 2)}
        out[name] = record
    return out


def refit(parts: dict) -> None:
    """Recomputes every fit from the stored histograms (no training)."""
    records = [parts.get("training")] + list(parts.get("rewrites", {}).values())
    for record in records:
        if isinstance(record, dict) and "histograms" in record:
            record.update(fits(record["histograms"]))
            record["sizes_for_the_tests"] = sizes_for_the_tests(record)


def part_reformulations(args) -> dict:
    rows = reference_rows(args)
    labels = data.heldout_set(0, 0.2).labels
    policy = Policy()
    out = {}
    for entry_id in (
        "confusion-from-bincount",
        "recall-as-array-division",
        "correct-count-from-equal-predictions",
    ):
        entry = reformulation(entry_id)
        module = rewritten(evaluation, entry["find"], entry["replace"], entry_id)
        differing = sum(
            module.metrics_from_predictions(r["_predictions"], labels)
            != evaluation.metrics_from_predictions(r["_predictions"], labels)
            for r in rows
        )
        out[entry_id] = {"file": entry["file"], "seeds": len(rows), "metrics_differing": differing}
    entry = reformulation("misses-from-a-table")
    module = rewritten(gates, entry["find"], entry["replace"], entry["id"])
    differing = 0
    for r in rows:
        m = evaluation.metrics_from_predictions(r["_predictions"], labels)
        for p in (policy, Policy(min_accuracy=STRICT_ACCURACY)):
            differing += module.thresholds(m, p) != gates.thresholds(m, p)
    out[entry["id"]] = {
        "file": entry["file"],
        "seeds": len(rows),
        "policies": ["default", "min_accuracy 0.999"],
        "verdicts_differing": differing,
    }
    out["not_applied"] = (
        "stage 1 (store.py), stage 3 (ledger.py, signing.py) and the other stage 4 entries "
        "(approval age, golden figures, serve switch) do not touch the trained figures"
    )
    return out


def part_power(args) -> dict:
    rows = reference_rows(args)
    labels = data.heldout_set(0, 0.2).labels
    out = {}
    # Stage 2's seeded bugs on the sweep's own predictions: what they do to the figures.
    with (ROOT / "seeded_bugs.toml").open("rb") as f:
        bugs = {b["id"]: b for b in tomllib.load(f)["bugs"]}
    for bug_id in ("accuracy-as-mean-recall", "confusion-transposed"):
        bug = bugs[bug_id]
        module = rewritten(evaluation, bug["find"], bug["replace"], bug_id)
        acc_gap, rec_gap, confusion_differs = [], [], 0
        for r in rows:
            good = evaluation.metrics_from_predictions(r["_predictions"], labels)
            bad = module.metrics_from_predictions(r["_predictions"], labels)
            acc_gap.append(abs(bad["accuracy"] - good["accuracy"]))
            rec_gap.append(abs(bad["min_class_recall"] - good["min_class_recall"]))
            confusion_differs += bad["confusion"] != good["confusion"]
        out[f"seeded bug {bug_id}"] = {
            "seeds": len(rows),
            "abs_accuracy_error": summary(acc_gap, 1e-12, fails_below=False),
            "abs_min_class_recall_error": summary(rec_gap, 1e-12, fails_below=False),
            "seeds_with_confusion_differing": confusion_differs,
            "seeds_caught_by_the_sklearn_comparisons_at_1e-12": int(
                sum(a > 1e-12 or b > 1e-12 for a, b in zip(acc_gap, rec_gap, strict=True))
            ),
        }
    for name, find, replace in TRAINING_BUGS:
        module = rewritten(train, find, replace, name)
        with tempfile.TemporaryDirectory() as tmp:
            bad = [figures(module, s, Path(tmp)) for s in range(args.bug_seeds)]
        out[f"training: {name}"] = {
            "accuracy": summary([r["accuracy"] for r in bad], S2_ACCURACY, inclusive=True),
            "min_class_recall": summary(
                [r["min_class_recall"] for r in bad], Policy().min_class_recall
            ),
            "seeds_refused_by_the_policy": int(sum(bool(r["policy_misses"]) for r in bad)),
        }
    return out


PARTS = {
    "training": part_training,
    "rewrites": part_rewrites,
    "reformulations": part_reformulations,
    "power": part_power,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10000, help="training seeds, reference")
    parser.add_argument("--rewrite-seeds", type=int, default=1000, help="seeds per rewrite")
    parser.add_argument("--bug-seeds", type=int, default=8, help="seeds per training mistake")
    parser.add_argument("--only", choices=sorted(PARTS), action="append")
    parser.add_argument(
        "--refit", action="store_true", help="run no part; refit the sizes from the histograms"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "evidence" / "size_sweep.json")
    args = parser.parse_args()
    check_limits()
    record = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    record.setdefault("parts", {})
    for name in [] if args.refit else args.only or list(PARTS):
        start = time.perf_counter()
        print(f"{name} ...", flush=True)
        result = PARTS[name](args)
        result["wall_s"] = round(time.perf_counter() - start, 1)
        result["command"] = (
            f"python tests/size_sweep.py --only {name} --seeds {args.seeds} "
            f"--rewrite-seeds {args.rewrite_seeds} --bug-seeds {args.bug_seeds}"
        )
        result["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        result["jax"] = jax.__version__
        result["machine"] = f"{platform.machine()}, {jax.default_backend()}"
        record["parts"][name] = result
        print(f"{name}: {result['wall_s']} s", flush=True)
        write(record, args.out)
    if args.refit:
        refit(record["parts"])
        write(record, args.out)


def write(record: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
