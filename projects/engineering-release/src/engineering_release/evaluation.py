"""Evaluation evidence: a report bound to the model id it judged, and its verification.

A report (`evaluation.json`, canonical JSON, stored as its own object) holds:
the model id; the held-out data set (its definition, size and digest); the
code that produced it (package version, sha256 of the package's sources, git
commit where there is one); the runtime (Python, jax, jaxlib, numpy,
backend); the metrics; and every prediction, by sample ID. It holds no time
of day: evaluating the same model on the same data with the same code gives
the same bytes, hence the same evaluation id.

`verify_report` trusts none of the numbers in it: it recomputes the data
digest from the policy's held-out set, checks the model id, and recomputes
every metric from the stored predictions and the true labels. With
`rerun=True` it also runs the model again and compares the predictions.
"""

import hashlib
import json
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from engineering_release import data
from engineering_release.config import Policy, canonical_json
from engineering_release.store import Store

FORMAT = "engineering-release/evaluation-v1"
REPORT_FILE = "evaluation.json"


class EvaluationMismatch(ValueError):
    """A report that does not prove what it claims; the message says what differs."""


def metrics_from_predictions(predictions: np.ndarray, labels: np.ndarray) -> dict:
    """Accuracy, per-class recall and the confusion matrix of integer predictions.

    `predictions`, `labels`: int `(n,)`. Counts are integers; rates are
    `correct / count` in float64, so a recomputation gives the same bits
    [claim:metrics-recompute-to-the-same-bits].
    Raises `ValueError` naming the argument when either is not `n >= 1` class
    ids `0..9`, or when a class has no label (its recall would be undefined)
    [claim:metrics-refuse-bad-arrays].

    Returns exactly these keys, in this order (`verify_report` compares them in it):
    `count`, `correct` (ints), `accuracy`, `class_recall` (10 floats, class order),
    `min_class_recall`, `confusion` (10x10 ints, row = true label, column = prediction,
    as `sklearn.metrics.confusion_matrix(labels, predictions)`)
    [claim:metrics-keys-in-order-match-sklearn].
    """
    _check_class_ids(predictions, labels)
    # --- exercise stage 2: Count the confusion matrix, then accuracy and per-class recall. ---
    predictions = np.asarray(predictions, np.int64)
    labels = np.asarray(labels, np.int64)
    confusion = np.zeros((data.NUM_CLASSES, data.NUM_CLASSES), np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    per_class = confusion.sum(axis=1)
    correct = int(np.trace(confusion))
    count = int(len(labels))
    recall = [int(confusion[c, c]) / int(per_class[c]) for c in range(data.NUM_CLASSES)]
    return {
        "count": count,
        "correct": correct,
        "accuracy": correct / count,
        "class_recall": recall,
        "min_class_recall": min(recall),
        "confusion": confusion.tolist(),
    }
    # --- end exercise ---


def _class_ids(name: str, values: object) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"`{name}` must be a non-empty 1-D array, not shape {list(array.shape)}.")
    if array.dtype.kind not in "iu":
        raise ValueError(f"`{name}` must hold integer class ids, not dtype {array.dtype}.")
    if array.min() < 0 or array.max() >= data.NUM_CLASSES:
        raise ValueError(
            f"`{name}` holds class id {int(array.min() if array.min() < 0 else array.max())}, "
            f"outside 0..{data.NUM_CLASSES - 1}."
        )
    return array


def _check_class_ids(predictions: object, labels: object) -> None:
    predictions, labels = _class_ids("predictions", predictions), _class_ids("labels", labels)
    if predictions.shape != labels.shape:
        raise ValueError(
            f"`predictions` has {predictions.size} entries, `labels` {labels.size}: they pair up."
        )
    absent = sorted(set(range(data.NUM_CLASSES)) - set(labels.tolist()))
    if absent:
        raise ValueError(f"`labels` has no example of class(es) {absent}: recall is undefined.")


def _check_report_fields(report: object) -> None:
    """Refuses a report whose fields are missing or of the wrong type, naming the field
    (the values are for `verify_report` to judge)."""
    if not isinstance(report, dict):
        raise EvaluationMismatch(f"A report is a JSON object, not a {type(report).__name__}.")
    kinds = {"model_id": str, "data": dict, "metrics": dict, "ids": list, "predictions": list}
    for name, kind in kinds.items():
        if not isinstance(report.get(name), kind):
            raise EvaluationMismatch(
                f"The report's `{name}` is missing or not a JSON {kind.__name__}."
            )
    for name in ("ids", "predictions"):
        if not all(type(v) is int for v in report[name]):
            raise EvaluationMismatch(f"The report's `{name}` holds a value that is not an integer.")
    bad = [p for p in report["predictions"] if not 0 <= p < data.NUM_CLASSES]
    if bad:
        raise EvaluationMismatch(
            f"The report's `predictions` hold class id {bad[0]}, outside 0..{data.NUM_CLASSES - 1}."
        )


def source_sha256() -> str:
    """sha256 over the package's own `.py` files (name and bytes), in name order: each
    file as its name, a newline and its bytes, so that a rename or text moved from
    one module to another gives another digest."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\n" + path.read_bytes())
    return h.hexdigest()


def code_identity() -> dict:
    commit = "unknown"
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if out.returncode == 0:
            commit = out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {
        "package": "engineering-release",
        "version": metadata.version("engineering-release"),
        "source_sha256": source_sha256(),
        "commit": commit,
    }


def runtime_identity() -> dict:
    import jax

    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": metadata.version("jaxlib"),
        "numpy": np.__version__,
        "backend": jax.default_backend(),
    }


def data_identity(policy: Policy, examples: data.Examples) -> dict:
    return {
        "name": data.DATA_NAME,
        "split_seed": policy.split_seed,
        "test_fraction": policy.test_fraction,
        "count": int(len(examples.ids)),
        "digest": examples.digest(),
    }


def predict_heldout(model_dir: Path, examples: data.Examples) -> np.ndarray:
    import jax.numpy as jnp

    from engineering_release import checkpoint, train

    loaded = checkpoint.load_model(model_dir)
    logits = train.predict(loaded.graphdef, loaded.params, jnp.asarray(examples.images))
    return np.asarray(logits).argmax(axis=1).astype(np.int64)


def build_report(model_id: str, predictions: np.ndarray, policy: Policy) -> dict:
    """The report of `predictions` (int `(n,)`, in held-out ID order) for `model_id`."""
    examples = data.heldout_set(policy.split_seed, policy.test_fraction)
    return {
        "format": FORMAT,
        "model_id": model_id,
        "data": data_identity(policy, examples),
        "code": code_identity(),
        "runtime": runtime_identity(),
        "metrics": metrics_from_predictions(predictions, examples.labels),
        "ids": examples.ids.tolist(),
        "predictions": [int(p) for p in predictions],
    }


def evaluate(store: Store, model_id: str, policy: Policy) -> tuple[str, dict]:
    """Evaluates the stored model on the policy's held-out set and stores the
    report; returns `(evaluation_id, report)`."""
    model_dir = store.get(model_id)
    examples = data.heldout_set(policy.split_seed, policy.test_fraction)
    report = build_report(store.resolve(model_id), predict_heldout(model_dir, examples), policy)
    return store_report(store, report), report


def store_report(store: Store, report: dict) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / REPORT_FILE).write_bytes(canonical_json(report) + b"\n")
        return store.put(tmp)


def load_report(store: Store, evaluation_id: str) -> dict:
    """The report stored under `evaluation_id` (its digest checked on read)."""
    path = store.get(evaluation_id) / REPORT_FILE
    if not path.is_file():
        raise EvaluationMismatch(f"Object `{evaluation_id[:12]}` is not an evaluation report.")
    try:
        report = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise EvaluationMismatch(
            f"Object `{evaluation_id[:12]}` holds an `{REPORT_FILE}` that is not UTF-8 JSON."
        ) from None
    if not isinstance(report, dict) or report.get("format") != FORMAT:
        raise EvaluationMismatch(f"Object `{evaluation_id[:12]}` is not a `{FORMAT}` report.")
    return report


@dataclass
class Verified:
    """What verification established, for the record."""

    model_id: str
    data_digest: str
    metrics: dict
    reran: bool


def verify_report(
    report: dict,
    *,
    model_id: str,
    policy: Policy,
    model_dir: Path | None = None,
) -> Verified:
    """Checks that `report` judged `model_id` on the policy's held-out set and that
    its metrics follow from its predictions; raises `EvaluationMismatch` naming
    the first difference. With `model_dir`, re-runs the model and compares the
    predictions too [claim:verify-report-rerun].

    Cases, checked in this order (the first that fails is the message):
        another model id -> "The report judged model `<claimed>`, not `<model_id>`."
            [claim:verify-report-model-id]
        another data digest -> "The report was computed on data set `<claimed>`, but the
            policy's held-out set (split_seed=<s>, test_fraction=<f>) has digest `<digest>`."
            [claim:verify-report-data-digest]
        sample ids not the held-out set's, in order -> "The report's sample IDs are not the
            held-out set's." [claim:verify-report-sample-ids-in-order]
        wrong number of predictions -> "The report holds <k> predictions for <n> examples."
            [claim:verify-report-prediction-count]
        another set of metric names -> "The report's metrics are <sorted names>, expected
            <sorted names>." [claim:verify-report-metric-names]
        a metric that differs from the recomputed one (first in `metrics_from_predictions`
            key order) -> "The report's `<name>` is `<value>`, but its predictions give ..."
            [claim:verify-report-first-differing-metric]
    Ids are 12-digit prefixes. Comparisons are exact (`!=`), never within a tolerance
    [claim:verify-report-exact-comparisons].
    """
    examples = data.heldout_set(policy.split_seed, policy.test_fraction)
    _check_report_fields(report)
    # --- exercise stage 2: Check model and data, then recompute and compare every metric. ---
    if report.get("model_id") != model_id:
        raise EvaluationMismatch(
            f"The report judged model `{str(report.get('model_id'))[:12]}`, not `{model_id[:12]}`."
        )
    expected_digest = examples.digest()
    claimed = report.get("data", {}).get("digest")
    if claimed != expected_digest:
        raise EvaluationMismatch(
            f"The report was computed on data set `{str(claimed)[:12]}`, but the policy's "
            f"held-out set (split_seed={policy.split_seed}, test_fraction="
            f"{policy.test_fraction}) has digest `{expected_digest[:12]}`."
        )
    if report.get("ids") != examples.ids.tolist():
        raise EvaluationMismatch("The report's sample IDs are not the held-out set's.")
    predictions = np.asarray(report["predictions"], np.int64)
    if predictions.shape != examples.labels.shape:
        raise EvaluationMismatch(
            f"The report holds {predictions.size} predictions for {examples.labels.size} examples."
        )
    recomputed = metrics_from_predictions(predictions, examples.labels)
    if set(report["metrics"]) != set(recomputed):
        raise EvaluationMismatch(
            f"The report's metrics are {sorted(report['metrics'])}, expected {sorted(recomputed)}."
        )
    for name, value in recomputed.items():
        if report["metrics"].get(name) != value:
            raise EvaluationMismatch(
                f"The report's `{name}` is `{report['metrics'].get(name)}`, but its predictions "
                f"give `{value}`."
            )
    # --- end exercise ---
    if model_dir is not None:
        rerun = predict_heldout(model_dir, examples)
        differ = int(np.sum(rerun != predictions))
        if differ:
            raise EvaluationMismatch(
                f"Re-running model `{model_id[:12]}` changes {differ} of {predictions.size} "
                f"stored predictions."
            )
    return Verified(model_id, expected_digest, recomputed, model_dir is not None)
