"""What a run kept while its store was away is written once, by key and step.

A run on a SQLite store has `loss` at steps 0 and 1 and nothing else; what it
kept (`outage.keep_unsent`) holds `loss` at 0, 1 and 2 and `accuracy` at 1 and
2. Settling (`outage.settle_unsent`) must leave each key's history with every
kept step exactly once: `accuracy`@1 shares its step with a stored `loss`
value, so a settle keyed by step alone drops it. (MLflow's SQL store keeps one
row per key, timestamp, step and value, so writing a stored value again adds
nothing; the history is what is compared.) Then the run is FAILED at the kept
end time with the kept tags, the folder is gone, and a second settle changes
nothing. The step-alone settle is run here too, as the negative control: it
must leave a history that differs from the right one.
"""

import inspect
import json
import textwrap
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from reproducible_experiments import outage

KEPT = [
    ("loss", 0.9, 0),
    ("loss", 0.7, 1),
    ("loss", 0.5, 2),
    ("accuracy", 0.6, 1),
    ("accuracy", 0.8, 2),
]


def _history(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in ("loss", "accuracy")
    }


def _kept_run(tmp_path: Path) -> tuple[MlflowClient, str, Path]:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'store.db'}")
    experiment = client.create_experiment("settle")
    run_id = client.create_run(experiment).info.run_id
    stored = [Metric(k, v, 1000 + s, s) for k, v, s in KEPT[:2]]
    client.log_batch(run_id, metrics=stored)
    metrics = [Metric(k, v, 1000 + s, s) for k, v, s in KEPT]
    unsent = tmp_path / "unsent"
    tags = {"error.type": "StoreUnavailable", "error.message": "the store went away"}
    outage.keep_unsent(unsent, client.tracking_uri, run_id, tags, metrics)
    return client, run_id, unsent


def _variant(*edits: tuple[str, str]):
    """`settle_unsent` with lines of its source replaced, as a function of its own."""
    source = textwrap.dedent(inspect.getsource(outage.settle_unsent))
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    scope = dict(vars(outage))
    exec(compile(source, "<variant>", "exec"), scope)
    return scope["settle_unsent"]


RIGHT = {
    "loss": [(0, 0.9), (1, 0.7), (2, 0.5)],
    "accuracy": [(1, 0.6), (2, 0.8)],
}


def test_kept_values_are_written_once_by_key_and_step(tmp_path: Path):
    client, run_id, unsent = _kept_run(tmp_path)
    end_time = json.loads((unsent / run_id / "end.json").read_text())["end_time_ms"]
    assert outage.settle_unsent(client, unsent) == [run_id]
    assert _history(client, run_id) == RIGHT
    run = client.get_run(run_id)
    assert (run.info.status, run.info.end_time) == ("FAILED", end_time)
    assert run.data.tags["error.type"] == "StoreUnavailable"
    assert not (unsent / run_id).exists()
    assert outage.settle_unsent(client, unsent) == []
    assert _history(client, run_id) == RIGHT


@pytest.mark.parametrize(
    "edits",
    [
        [
            ("(m.key, m.step) for key in keys", "m.step for key in keys"),
            ("if (key, step) not in stored", "if step not in stored"),
        ],
    ],
    ids=["keyed-by-step-alone"],
)
def test_a_wrong_settle_leaves_another_history(tmp_path: Path, edits):
    client, run_id, unsent = _kept_run(tmp_path)
    _variant(*edits)(client, unsent)
    assert _history(client, run_id) != RIGHT
