"""Stage 2: evaluation evidence.

A report is bound to the model id it judged and to the held-out data's
digest; verification recomputes every metric from the stored predictions.
Independent checks: scikit-learn's metrics on the stored predictions, and
predictions recomputed by the NumPy float64 forward pass. Changed
conditions: the other model, another held-out split, and one edited field at
a time.
"""

import copy
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.metrics import accuracy_score, confusion_matrix, recall_score

from engineering_release import checkpoint, data, evaluation, model, store
from engineering_release.config import Policy


@pytest.mark.claims("metrics-keys-in-order-match-sklearn", "report-binds-model-data-code-runtime")
@pytest.mark.parametrize("seed", [0, 1])
def test_report_metrics_agree_with_sklearn_and_numpy(evaluated_store, seed, evidence):
    """Stored predictions equal a NumPy float64 forward pass and the metrics equal scikit-learn's,
    for both models.

    Size: below 1e-19 for the accuracy line (> 0.85, seeds 0 and 1). Over 10,000
    training seeds the tiny model's held-out accuracy was 0.939 to 0.981 (7 to 22 of
    the 359 digits wrong; the line allows 53); logit(accuracy) had mean 3.23 and sd
    0.158 (0.161 at the upper end of its 99% interval), so 0.85 lies 9.3 spreads
    below the mean, and the sample's lower tail is lighter than the normal's (1
    value past 3 sd, 13.5 expected). 4,000 runs under four rewrites of the training
    (two cross-entropies written by hand: other bits on every seed, not one
    held-out prediction changed; the batch mean as a sum: the same program; the init
    and shuffle keys split the other way: another draw) gave 0.944 at the least. The
    comparisons with scikit-learn and NumPy are exact (the same float64 quotients,
    equal integers): the stage's reformulations of the metrics (bincount, array
    division, count_nonzero) gave equal metrics on all 10,000 seeds' predictions.
    Power: a metric 1e-12 off scikit-learn's fails. Accuracy as the mean recall
    (seeded bug) is 6e-7 to 5.8e-4 off on every seed; the transposed confusion
    (seeded bug) changes the confusion matrix on every seed (and the min recall on
    95% of them). The accuracy line fails a model that does not learn: labels not
    aligned with their images (accuracy 0.09 to 0.24), one epoch of twelve (0.50 to
    0.69), the step size divided by the batch size (0.10 to 0.24).
    (sweep: evidence/size_sweep.json, the `size_sweep` script beside the tests)"""
    objects, models, reports = evaluated_store
    evaluation_id, report = reports[seed]
    heldout = data.heldout_set(0, 0.2)
    predictions = np.asarray(report["predictions"])
    artifact = checkpoint.read_artifact(objects.get(models[seed]))
    numpy_predictions = model.forward_numpy(artifact.params, heldout.images).argmax(axis=1)
    assert evidence.record(
        "stored predictions = NumPy float64 forward pass",
        f"seed {seed}",
        {
            "differing": int(np.sum(numpy_predictions != predictions)),
            "count": int(predictions.size),
        },
        {"differing": 0},
        np.array_equal(numpy_predictions, predictions),
    )
    m = report["metrics"]
    reference = {
        "accuracy": accuracy_score(heldout.labels, predictions),
        "class_recall": recall_score(heldout.labels, predictions, average=None).tolist(),
        "confusion": confusion_matrix(heldout.labels, predictions).tolist(),
        "min_class_recall": recall_score(heldout.labels, predictions, average=None).min(),
    }
    # Counts in plain NumPy: the number of examples and of equal entries.
    assert m["count"] == len(heldout.labels)
    assert m["correct"] == int(np.sum(predictions == heldout.labels))
    assert evidence.allclose(
        "min class recall vs sklearn",
        f"seed {seed}",
        m["min_class_recall"],
        reference["min_class_recall"],
        rtol=0,
        atol=1e-12,
    )
    assert evidence.allclose(
        "accuracy vs sklearn",
        f"seed {seed}",
        m["accuracy"],
        reference["accuracy"],
        rtol=0,
        atol=1e-12,
    )
    assert evidence.allclose(
        "class recall vs sklearn",
        f"seed {seed}",
        m["class_recall"],
        reference["class_recall"],
        rtol=0,
        atol=1e-12,
    )
    assert m["confusion"] == reference["confusion"]
    assert m["accuracy"] > 0.85, "a tiny model still learns the digits"
    assert report["model_id"] == models[seed]
    assert evaluation_id == store.tree_digest(objects.get(evaluation_id))


def _uneven_predictions(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels of all 10 classes and predictions whose per-class recall ranges from ~0.1 to 1.

    Each class gets its own hit rate (a permutation of 0.1..1.0, drawn from `seed`), so
    the minimum recall sits far from the mean and the maximum; a miss is a random other
    class, so it lands off the diagonal."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(data.NUM_CLASSES), rng.integers(15, 40, data.NUM_CLASSES))
    rng.shuffle(labels)
    hit_rate = rng.permutation(np.linspace(0.1, 1.0, data.NUM_CLASSES))
    hit = rng.random(labels.size) < hit_rate[labels]
    shift = rng.integers(1, data.NUM_CLASSES, labels.size)  # Never 0: a miss is another class.
    predictions = np.where(hit, labels, (labels + shift) % data.NUM_CLASSES)
    return predictions.astype(np.int64), labels.astype(np.int64)


@pytest.mark.claims("metrics-keys-in-order-match-sklearn")
@pytest.mark.parametrize("seed", [3, 11])
def test_metrics_from_predictions_match_sklearn_field_by_field(seed, evidence):
    """Every field of `metrics_from_predictions` equals scikit-learn / plain NumPy on inputs whose
    per-class recalls differ a lot.

    The trained models are accurate on every class, so their recalls bunch together near
    1 and a wrong summary (the mean or the max for the min) could pass there by chance;
    here the recalls spread from ~0.1 to 1, so the min is far from the mean, the max and
    class 0's recall, and `correct` is well below `count`. Two seeds, two draws."""
    predictions, labels = _uneven_predictions(seed)
    sk_recall = recall_score(labels, predictions, average=None)
    # The inputs must separate the min from the other summaries, or the test proves nothing.
    assert sk_recall.min() < sk_recall.mean() - 0.2
    assert sk_recall.min() < sk_recall.max() - 0.5
    assert sk_recall.min() < sk_recall[0]
    m = evaluation.metrics_from_predictions(predictions, labels)
    assert list(m) == [
        "count",
        "correct",
        "accuracy",
        "class_recall",
        "min_class_recall",
        "confusion",
    ]
    # Counts in plain NumPy; `correct` is far from `count`, so swapping them is caught.
    numpy_correct = int(np.sum(predictions == labels))
    assert numpy_correct < len(labels) - 20
    assert m["count"] == len(labels)
    assert m["correct"] == numpy_correct
    assert evidence.allclose(
        "min class recall vs sklearn (uneven recalls)",
        f"seed {seed}",
        m["min_class_recall"],
        sk_recall.min(),
        rtol=0,
        atol=1e-12,
    )
    assert evidence.allclose(
        "class recall vs sklearn (uneven recalls)",
        f"seed {seed}",
        m["class_recall"],
        sk_recall,
        rtol=0,
        atol=1e-12,
    )
    assert evidence.allclose(
        "accuracy vs sklearn (uneven recalls)",
        f"seed {seed}",
        m["accuracy"],
        accuracy_score(labels, predictions),
        rtol=0,
        atol=1e-12,
    )
    assert m["confusion"] == confusion_matrix(labels, predictions).tolist()


@pytest.mark.claims("metrics-refuse-bad-arrays")
def test_metrics_refuse_empty_out_of_range_and_unlabelled_classes(evidence):
    """`metrics_from_predictions` raises `ValueError` naming the argument for an empty
    array, a class id just outside 0..9 (-1 or 10) in either argument, and labels
    without an example of some class (its recall would be 0 / 0); the same arrays
    with the fault removed give metrics. Each refusal is a `ValueError` with its
    message, never a ZeroDivisionError, an IndexError or NaN metrics."""
    labels = np.arange(30, dtype=np.int64) % data.NUM_CLASSES  # Every class, three times.
    predictions = labels.copy()
    assert evaluation.metrics_from_predictions(predictions, labels)["accuracy"] == 1.0

    def changed(array, index, value):
        out = array.copy()
        out[index] = value
        return out

    without_7 = np.where(labels == 7, 6, labels)
    cases = {
        "empty predictions": ((np.array([], np.int64), labels), "`predictions`"),
        "empty labels": ((predictions, np.array([], np.int64)), "`labels`"),
        "both empty": ((np.array([], np.int64), np.array([], np.int64)), "`predictions`"),
        "prediction 10": ((changed(predictions, 4, 10), labels), "`predictions`"),
        "prediction -1": ((changed(predictions, 4, -1), labels), "`predictions`"),
        "label 10": ((predictions, changed(labels, 4, 10)), "`labels`"),
        "label -1": ((predictions, changed(labels, 4, -1)), "`labels`"),
        "no label of class 7": ((predictions, without_7), "`labels` has no example of class"),
    }
    observed = {}
    for case, ((p, y), needle) in cases.items():
        try:
            evaluation.metrics_from_predictions(p, y)
            observed[case] = {"raised": None, "names": False}
        except Exception as err:  # noqa: BLE001 - recording whatever is raised.
            observed[case] = {
                "raised": type(err).__name__,
                "is_value_error": isinstance(err, ValueError),
                "names": needle in str(err),
                "message": str(err)[:200],
            }
    assert evidence.record(
        "metrics_from_predictions refuses bad arrays, naming the argument",
        f"{len(cases)} bad (predictions, labels) pairs",
        observed,
        None,
        all(o["raised"] and o["is_value_error"] and o["names"] for o in observed.values()),
    ), observed
    assert "[7]" in observed["no label of class 7"]["message"]


def _source_digest_of(folder: Path) -> str:
    """`source_sha256` as the package at ``folder`` computes it: its `evaluation.py`
    loaded from there, so that the digest reads that folder's modules."""
    spec = importlib.util.spec_from_file_location("evaluation_of_a_copy", folder / "evaluation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.source_sha256()


@pytest.mark.claims("report-binds-model-data-code-runtime")
def test_source_digest_names_every_module_and_its_bytes(tmp_path, evidence):
    """The report's source sha256 covers each module's name and bytes, in name order.

    Against sha256 computed here from that definition over the package's files; then, in
    copies of the package: the same files give the same digest, and a module renamed
    (keeping its place in name order) or a line moved from one module to the next, which
    leave the bytes in order unchanged, each give another one.
    """
    package = Path(evaluation.__file__).parent
    modules = sorted(package.glob("*.py"))
    expected = hashlib.sha256(
        b"".join(p.name.encode() + b"\n" + p.read_bytes() for p in modules)
    ).hexdigest()

    def copy(name: str) -> Path:
        folder = tmp_path / name
        shutil.copytree(package, folder, ignore=shutil.ignore_patterns("__pycache__"))
        return folder

    same = _source_digest_of(copy("same"))
    renamed = copy("renamed")
    last = modules[-1].name
    (renamed / last).rename(renamed / f"{last[:-3]}_renamed.py")
    moved = copy("moved")
    # The first module of more than one line, and the module after it.
    i = next(i for i, p in enumerate(modules) if p.read_bytes().strip().count(b"\n"))
    first, second = moved / modules[i].name, moved / modules[i + 1].name
    head, _, tail = first.read_bytes().rstrip(b"\n").rpartition(b"\n")
    first.write_bytes(head + b"\n")
    second.write_bytes(tail + b"\n" + second.read_bytes())
    digests = {
        "package": evaluation.source_sha256(),
        "copy": same,
        "module renamed": _source_digest_of(renamed),
        "line moved between modules": _source_digest_of(moved),
    }
    assert evidence.record(
        "source sha256 over module names and bytes",
        f"{len(modules)} modules; {last} renamed; a line of {modules[i].name} moved",
        digests | {"expected": expected},
        None,
        digests["package"] == digests["copy"] == expected and len(set(digests.values())) == 3,
    )


@pytest.mark.claims("report-binds-model-data-code-runtime")
def test_report_binds_data_code_and_runtime(evaluated_store, evidence):
    """The report names the held-out data digest, the source sha256 and the jax version, and holds
    no wall-clock time."""
    objects, models, reports = evaluated_store
    _, report = reports[0]
    heldout = data.heldout_set(0, 0.2)
    other = data.heldout_set(1, 0.2)
    assert report["data"]["digest"] == heldout.digest() != other.digest()
    assert report["data"]["count"] == len(heldout.ids) == len(report["predictions"])
    assert report["ids"] == heldout.ids.tolist()
    assert report["code"]["source_sha256"] == evaluation.source_sha256()
    assert report["code"]["commit"]
    import jax

    assert report["runtime"]["jax"] == jax.__version__
    # No wall-clock time anywhere: the same inputs give the same bytes.
    assert set(report) == {
        "format",
        "model_id",
        "data",
        "code",
        "runtime",
        "metrics",
        "ids",
        "predictions",
    }
    assert "signed_at" not in json.dumps(report) and "_ms" not in json.dumps(report)
    evidence.record(
        "report identity fields",
        "seed 0",
        {"data": report["data"], "code": report["code"], "runtime": report["runtime"]},
        None,
        True,
    )


def test_same_model_same_evaluation_id(evaluated_store, evidence):
    """Evaluating model A again gives the same evaluation id, and model B another."""
    objects, models, reports = evaluated_store
    again, _ = evaluation.evaluate(objects, models[0], Policy())
    ok = again == reports[0][0] and again != reports[1][0]
    assert evidence.record(
        "evaluation id is reproducible",
        "model A evaluated twice, then B",
        {"first": reports[0][0], "again": again, "other": reports[1][0]},
        None,
        ok,
    )


def _edited(report: dict, how: str) -> dict:
    out = copy.deepcopy(report)
    if how == "accuracy":
        out["metrics"]["accuracy"] += 0.01
    elif how == "accuracy-lowered":
        out["metrics"]["accuracy"] -= 0.01
    elif how == "recall-lowered":
        out["metrics"]["min_class_recall"] -= 0.01
    elif how == "prediction":
        out["predictions"][0] = (out["predictions"][0] + 1) % data.NUM_CLASSES
    elif how == "recall":
        out["metrics"]["class_recall"][3] = 1.0
    elif how == "count":
        out["metrics"]["correct"] += 1
    elif how == "extra-metric":
        out["metrics"]["f1"] = 0.99
    return out


@pytest.mark.claims(
    "verify-recomputes-digest-and-metrics",
    "verify-report-first-differing-metric",
    "verify-report-metric-names",
    "metrics-recompute-to-the-same-bits",
)
@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("accuracy", "`accuracy`"),
        ("accuracy-lowered", "`accuracy`"),
        ("recall-lowered", "`min_class_recall`"),
        ("prediction", "`correct`"),
        ("recall", "`class_recall`"),
        ("count", "`correct`"),
        ("extra-metric", "metrics are"),
    ],
)
def test_verify_refuses_an_edited_report(evaluated_store, how, message, evidence):
    """verify_report passes the original report and refuses each of 7 single-field edits, naming the
    field."""
    _, models, reports = evaluated_store
    report = reports[0][1]
    evaluation.verify_report(report, model_id=models[0], policy=Policy())  # The original passes.
    with pytest.raises(evaluation.EvaluationMismatch, match=message) as info:
        evaluation.verify_report(_edited(report, how), model_id=models[0], policy=Policy())
    evidence.record("edited report refused", how, {"message": str(info.value)}, None, True)


@pytest.mark.claims("verify-report-exact-comparisons", "verify-report-first-differing-metric")
def test_verify_refuses_a_metric_one_ulp_off(evaluated_store, evidence):
    """verify_report compares every float metric exactly: `accuracy`,
    `min_class_recall` and one `class_recall` entry each moved by one ulp
    (`np.nextafter`, up and down) are refused, naming the metric; the untouched
    report passes. A comparison within a tolerance of an ulp or more (`np.isclose`,
    `math.isclose`, a rounding to fewer digits) accepts all six."""
    _, models, reports = evaluated_store
    report = reports[0][1]
    evaluation.verify_report(report, model_id=models[0], policy=Policy())  # The original passes.
    observed = {}
    for name in ("accuracy", "min_class_recall", "class_recall"):
        for direction in (-np.inf, np.inf):
            edited = copy.deepcopy(report)
            if name == "class_recall":
                value = edited["metrics"][name][3]
                edited["metrics"][name][3] = float(np.nextafter(value, direction))
                moved = edited["metrics"][name][3]
            else:
                value = edited["metrics"][name]
                edited["metrics"][name] = moved = float(np.nextafter(value, direction))
            case = f"{name} {'down' if direction < 0 else 'up'} one ulp"
            try:
                evaluation.verify_report(edited, model_id=models[0], policy=Policy())
                observed[case] = {
                    "refused": False,
                    "names_the_metric": False,
                    "from": value,
                    "to": moved,
                }
            except evaluation.EvaluationMismatch as err:
                observed[case] = {
                    "refused": True,
                    "names_the_metric": f"`{name}`" in str(err),
                    "from": value,
                    "to": moved,
                }
    assert evidence.record(
        "verify_report compares metrics exactly",
        "accuracy, min_class_recall, class_recall[3] each one ulp up and down",
        observed,
        {"ulps": 0},
        all(
            o["refused"] and o["names_the_metric"] and o["from"] != o["to"]
            for o in observed.values()
        ),
    ), observed


@pytest.mark.claims(
    "verify-recomputes-digest-and-metrics",
    "verify-report-model-id",
    "verify-report-data-digest",
)
def test_verify_refuses_another_model_or_data_set(evaluated_store, evidence):
    """verify_report refuses A's report claimed for B, and a split_seed 1 report checked under
    split_seed 0."""
    objects, models, reports = evaluated_store
    with pytest.raises(evaluation.EvaluationMismatch, match="judged model") as other_model:
        evaluation.verify_report(reports[0][1], model_id=models[1], policy=Policy())
    # A sound report, but on another held-out split: refused under the policy's split.
    shifted = Policy(split_seed=1)
    _, elsewhere = evaluation.evaluate(objects, models[0], shifted)
    evaluation.verify_report(elsewhere, model_id=models[0], policy=shifted)
    with pytest.raises(evaluation.EvaluationMismatch, match="data set") as other_data:
        evaluation.verify_report(elsewhere, model_id=models[0], policy=Policy())
    evidence.record(
        "binding refusals",
        "model B for A's report; split_seed 1 report",
        {"other_model": str(other_model.value), "other_data": str(other_data.value)},
        None,
        True,
    )


@pytest.mark.claims("verify-can-rerun-the-model", "verify-report-rerun")
def test_rerun_catches_predictions_of_another_model(evaluated_store, evidence):
    """A forged report, B's predictions and metrics claimed for A, is caught only by re-running A.

    B's predictions with metrics recomputed to match, claimed for A: the metric
    check passes; re-running model A catches it."""
    objects, models, reports = evaluated_store
    forged = copy.deepcopy(reports[1][1])
    forged["model_id"] = models[0]
    evaluation.verify_report(forged, model_id=models[0], policy=Policy())
    with pytest.raises(evaluation.EvaluationMismatch, match="Re-running model") as info:
        evaluation.verify_report(
            forged, model_id=models[0], policy=Policy(), model_dir=objects.get(models[0])
        )
    verified = evaluation.verify_report(
        reports[0][1], model_id=models[0], policy=Policy(), model_dir=objects.get(models[0])
    )
    assert evidence.record(
        "re-run verification",
        "forged vs genuine report of A",
        {"forged": str(info.value), "genuine_reran": verified.reran},
        None,
        verified.reran,
    )


@pytest.mark.claims("store-refuses-tampered-objects")
def test_tampered_report_object_is_refused(evaluated_store, tmp_path, evidence):
    """A stored report with one added space (same JSON value) is refused on load as a tampered
    object."""
    objects, models, reports = evaluated_store
    copy_store = store.Store(tmp_path / "store")
    src = objects.get(reports[0][0])
    evaluation_id = copy_store.put(src)
    path = copy_store.objects / evaluation_id / evaluation.REPORT_FILE
    path.chmod(0o644)
    path.write_text(path.read_text().replace('"correct":', '"correct": ', 1))  # Same JSON value.
    with pytest.raises(store.TamperedObject):
        evaluation.load_report(copy_store, evaluation_id)
    evidence.record(
        "report bytes are its identity", "whitespace added", {"id": evaluation_id}, None, True
    )


def _reference_digest(examples) -> str:
    """The held-out set's digest by the documented recipe, with hashlib alone."""
    import hashlib

    h = hashlib.sha256(b"sklearn-digits\n")
    for name in ("ids", "images", "labels"):
        array = np.ascontiguousarray(getattr(examples, name))
        h.update(f"{name}:{array.dtype.str}:{array.shape}\n".encode() + array.tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def shifted_report(evaluated_store):
    """Model A's report on the held-out set of split_seed 1."""
    objects, models, _ = evaluated_store
    return evaluation.evaluate(objects, models[0], Policy(split_seed=1))[1]


@pytest.mark.claims(
    "verify-recomputes-digest-and-metrics",
    "verify-report-model-id",
    "verify-report-data-digest",
)
def test_verify_names_the_model_and_the_data_set_either_way(evaluated_store, shifted_report):
    """The model and data-set mismatch messages name both ids, in both directions, with digests from
    hashlib alone."""
    _, models, reports = evaluated_store
    for judged, claimed in ((0, 1), (1, 0)):
        with pytest.raises(evaluation.EvaluationMismatch) as info:
            evaluation.verify_report(reports[judged][1], model_id=models[claimed], policy=Policy())
        assert str(info.value) == (
            f"The report judged model `{models[judged][:12]}`, not `{models[claimed][:12]}`."
        )
    split0, split1 = data.heldout_set(0, 0.2), data.heldout_set(1, 0.2)
    digests = {0: _reference_digest(split0), 1: _reference_digest(split1)}
    assert reports[0][1]["data"]["digest"] == digests[0]
    assert shifted_report["data"]["digest"] == digests[1] != digests[0]
    for report, seed, other in ((shifted_report, 0, 1), (reports[0][1], 1, 0)):
        with pytest.raises(evaluation.EvaluationMismatch) as info:
            evaluation.verify_report(report, model_id=models[0], policy=Policy(split_seed=seed))
        assert str(info.value) == (
            f"The report was computed on data set `{digests[other][:12]}`, but the policy's "
            f"held-out set (split_seed={seed}, test_fraction=0.2) has digest "
            f"`{digests[seed][:12]}`."
        )


@pytest.mark.claims(
    "verify-report-sample-ids-in-order",
    "verify-report-prediction-count",
    "verify-report-metric-names",
)
@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("id-above", "The report's sample IDs are not the held-out set's."),
        ("id-below", "The report's sample IDs are not the held-out set's."),
        ("one-prediction-short", "The report holds {short} predictions for {n} examples."),
        ("one-prediction-extra", "The report holds {extra} predictions for {n} examples."),
        ("metric-missing", "The report's metrics are {without}, expected {every}."),
    ],
)
def test_verify_refuses_ids_counts_and_metric_sets(evaluated_store, how, message):
    """verify_report refuses an out-of-set sample id, one prediction short or extra, a missing
    metric, word for word."""
    _, models, reports = evaluated_store
    report = copy.deepcopy(reports[0][1])
    n = len(report["predictions"])
    every = sorted(report["metrics"])
    if how == "id-above":
        report["ids"][0] = 10**9
    elif how == "id-below":
        report["ids"][0] = -1
    elif how == "one-prediction-short":
        report["predictions"].pop()
    elif how == "one-prediction-extra":
        report["predictions"].append(0)
    else:
        del report["metrics"]["confusion"]
    without = sorted(report["metrics"])
    with pytest.raises(evaluation.EvaluationMismatch) as info:
        evaluation.verify_report(report, model_id=models[0], policy=Policy())
    assert str(info.value) == message.format(
        n=n, short=n - 1, extra=n + 1, without=without, every=every
    )


@pytest.mark.claims("verify-report-sample-ids-in-order", "metrics-recompute-to-the-same-bits")
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "how", ["first-two-swapped", "last-two-swapped", "reversed", "class-shuffled", "id-repeated"]
)
def test_verify_refuses_ids_out_of_held_out_order(evaluated_store, seed, how):
    """verify_report refuses the held-out ids reordered (or one repeated), for both models, by the
    documented rule: the held-out set's ids, in its ascending order; the untouched report passes.

    Swaps at either end and an extra copy of one id change the ids alone; `reversed` and
    `class-shuffled` move each prediction with its id, the latter within each true class
    (labels from scikit-learn), so scikit-learn's confusion matrix, hence every stored
    metric, still matches. The set of ids is unchanged in every case, so only an in-order
    comparison refuses these."""
    _, models, reports = evaluated_store
    report = copy.deepcopy(reports[seed][1])
    evaluation.verify_report(report, model_id=models[seed], policy=Policy())
    ids, predictions = report["ids"], report["predictions"]
    assert all(a < b for a, b in zip(ids, ids[1:], strict=False))  # Documented: ascending.
    order = np.arange(len(ids))[::-1] if how == "reversed" else np.arange(len(ids))
    if how == "class-shuffled":
        labels, rng = load_digits().target[ids], np.random.default_rng(seed)
        for c in range(data.NUM_CLASSES):
            order[labels == c] = rng.permutation(np.flatnonzero(labels == c))
        shuffled = [predictions[i] for i in order]
        assert confusion_matrix(labels, shuffled).tolist() == report["metrics"]["confusion"]
    report["ids"], report["predictions"] = [ids[i] for i in order], [predictions[i] for i in order]
    if how == "first-two-swapped":
        report["ids"][:2] = ids[1::-1]
    elif how == "last-two-swapped":
        report["ids"][-2:] = ids[:-3:-1]
    elif how == "id-repeated":  # One extra copy of an id: the same set, one id too many.
        report["ids"].insert(1, ids[0])
    assert report["ids"] != reports[seed][1]["ids"]
    with pytest.raises(evaluation.EvaluationMismatch) as info:
        evaluation.verify_report(report, model_id=models[seed], policy=Policy())
    assert str(info.value) == "The report's sample IDs are not the held-out set's."


@pytest.mark.claims("verify-can-rerun-the-model", "verify-report-rerun")
def test_rerun_counts_the_predictions_that_change(evaluated_store):
    """A re-run of A on B's forged report names the number of changed predictions, counted with
    NumPy."""
    objects, models, reports = evaluated_store
    forged = copy.deepcopy(reports[1][1])
    forged["model_id"] = models[0]
    differ = int(
        np.sum(np.asarray(reports[0][1]["predictions"]) != np.asarray(forged["predictions"]))
    )
    assert differ > 0
    with pytest.raises(evaluation.EvaluationMismatch) as info:
        evaluation.verify_report(
            forged, model_id=models[0], policy=Policy(), model_dir=objects.get(models[0])
        )
    n = len(forged["predictions"])
    assert str(info.value) == (
        f"Re-running model `{models[0][:12]}` changes {differ} of {n} stored predictions."
    )
