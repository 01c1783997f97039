"""A tracked training run, and the same run read back from the store alone.

`run_tracked` writes, before training starts (so a failed run carries them too):
  params   every config field, `train_seed` and `eval_seed` among them;
  tags     `config.sha256`, `code.*`, `data.*`, `runtime.*` (see `identity`, `data`);
  artifacts `config.json`, `split_ids.json`;
and while and after training: per-epoch metrics in batches, `test_loss`,
`test_accuracy`, the tag `result.params_sha256`, `learning_curve.png`, and
with `save_checkpoint` an Orbax checkpoint of the trained parameters
(`checkpoint/`, tag `result.checkpoint`).

With a tracking server, the run goes through `outage.GuardedClient`: when the
server cannot be reached, training goes on without writing, and the run ends
with one `outage.StoreUnavailable`, after its end state (FAILED, with the
error), every metric value and the checkpoint were kept under `unsent_dir` for
`outage.settle_unsent` to write when the store is back.

`load_record` rebuilds all of it from a fresh client: nothing is taken from
memory, so what it returns is what the record holds.
"""

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow import MlflowClient
from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException

from reproducible_experiments import outage
from reproducible_experiments.config import Config, ConfigError
from reproducible_experiments.tracking import TrackedRun, TrackingError, end_state

if TYPE_CHECKING:
    from reproducible_experiments import data, train

SEEDS = ("train_seed", "eval_seed")


def run_tracked(
    client: MlflowClient,
    exp_id: str,
    config: Config,
    *,
    run_name: str = "train",
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    before_train: Callable[[TrackedRun], None] | None = None,
    progress: Callable[[dict[str, float]], None] | None = None,
    digits: "data.Digits | None" = None,
    save_checkpoint: bool = False,
    unsent_dir: Path = outage.UNSENT_DIR,
) -> "tuple[str, train.TrainResult | None, str]":
    """Trains `config` inside a `TrackedRun`; returns `(run_id, result, status)`.

    `save_checkpoint` attaches an Orbax checkpoint of the trained parameters.
    `before_train` runs inside the run, after the identities are recorded (the
    comparison tests use it to make one arm fail). Exceptions propagate, after
    the run is marked FAILED or KILLED. When a tracking server cannot be
    reached, raises `outage.StoreUnavailable` (message: the store, the run, how
    many metric values it lacks, where the rest was kept) once training ends.
    """
    # Imported here: reading a record back (`load_record`) needs neither JAX nor
    # matplotlib, and a fresh process that only reads should start fast.
    import jax

    from reproducible_experiments import checkpoint, data, identity, plots, train

    digits = data.load() if digits is None else digits
    split = data.split_ids(
        digits.labels, jax.random.key(config.eval_seed), config.val_fraction, config.test_fraction
    )
    all_tags = {
        "config.sha256": config.sha256(),
        **identity.code_identity(),
        **identity.runtime_identity(),
        **data.data_identity(digits, split),
        **(tags or {}),
    }
    params = {k: json.dumps(v) for k, v in config.model_dump(mode="json").items()}
    client = outage.guard(client)
    tracked = TrackedRun(
        client, exp_id, run_name, tags=all_tags, params=params, parent_run_id=parent_run_id
    )
    produced: list[Metric] = []  # Every value, for the store to get later if it goes away.
    result = None
    try:
        with tracked as run:
            client.log_text(run.run_id, config.to_json(), "config.json")
            client.log_dict(run.run_id, {k: v.tolist() for k, v in split.items()}, "split_ids.json")
            if before_train is not None:
                before_train(run)

            def log(values: dict[str, float], step: int) -> None:
                stamp = int(time.time() * 1000)
                produced.extend(Metric(k, float(v), stamp, step) for k, v in values.items())
                if getattr(client, "failure", None) is None:  # Else: kept, written later.
                    run.metrics.log(values, step)

            def on_epoch(record: dict[str, float]) -> None:
                log({k: v for k, v in record.items() if k != "epoch"}, int(record["epoch"]))
                if progress is not None:
                    progress(record)

            result = train.train_and_evaluate(config, on_epoch=on_epoch, digits=digits)
            log(result.test, step=len(result.history))
            if getattr(client, "failure", None) is not None:
                raise outage.StoreUnavailable(client.failure)
            run.metrics.flush()
            client.log_batch(
                run.run_id, tags=[RunTag("result.params_sha256", result.params_sha256)]
            )
            fig = plots.learning_curve(result.history, f"{run_name}: config {config.sha256()[:12]}")
            client.log_figure(run.run_id, fig, "learning_curve.png")
            plots.close(fig)
            if save_checkpoint:
                checkpoint.log_to_run(client, run.run_id, result.params)
                client.set_tag(run.run_id, "result.checkpoint", "checkpoint/")
    except Exception as err:
        # The run is FAILED and kept; say which one, for callers that carry on.
        err.run_id = tracked.run_id  # type: ignore[attr-defined]
        failure = getattr(client, "failure", None)
        if failure is not None and tracked.run_id and tracked.status == "":
            raise _keep_unsent(
                client, tracked.run_id, err, produced, result, save_checkpoint, unsent_dir
            ) from None
        # (`TrackedRun` has added a note saying what the store holds about its end.)
        raise
    return tracked.run_id, result, tracked.status


def _keep_unsent(
    client: "outage.GuardedClient",
    run_id: str,
    err: Exception,
    produced: list[Metric],
    result: "train.TrainResult | None",
    save_checkpoint: bool,
    unsent_dir: Path,
) -> "outage.StoreUnavailable":
    """Keeps what the unreachable store lacks; returns the one error to raise."""
    from reproducible_experiments import checkpoint

    _, error_tags = end_state(type(err), err)
    tags = {tag.key: tag.value for tag in error_tags}
    if result is not None:
        tags["result.params_sha256"] = result.params_sha256
    folder = outage.keep_unsent(unsent_dir, client.tracking_uri, run_id, tags, produced)
    kept = "its end state (FAILED, with the error) and every metric value"
    if result is not None and save_checkpoint:
        checkpoint.save(folder / "checkpoint", result.params)
        kept += ", and the trained parameters (`checkpoint/`)"
    missing = len(produced) - min(client.confirmed_metrics(), len(produced))
    return outage.StoreUnavailable(
        f"{client.failure}: run `{run_id}` is left RUNNING there; {missing} of its "
        f"{len(produced)} metric values were not written; {kept} are kept in "
        f"`{folder}`, written by the next `train` or `compare` on this store."
    )


@dataclass
class RunRecord:
    """A run as the store holds it."""

    run_id: str
    run_name: str
    status: str
    experiment_id: str
    config: Config
    seeds: dict[str, int]
    code: dict[str, str]
    data: dict[str, str]
    runtime: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, list[tuple[int, float]]]
    split_ids: dict[str, list[int]] | None

    def identities(self) -> dict[str, Any]:
        """The JSON-ready identity of the run: config, seeds, code, data, runtime."""
        return {
            "config": self.config.model_dump(mode="json"),
            "config_sha256": self.tags.get("config.sha256"),
            "seeds": self.seeds,
            "code": self.code,
            "data": self.data,
            "runtime": self.runtime,
        }


def _prefixed(tags: dict[str, str], prefix: str) -> dict[str, str]:
    return {k: v for k, v in tags.items() if k.startswith(prefix)}


def _read_split_ids(run_id: str, path: Path) -> dict[str, list[int]]:
    """The run's `split_ids.json`: disjoint lists of sample IDs covering the data set."""
    from reproducible_experiments.data import NUM_EXAMPLES, SPLITS

    where = f"Run `{run_id}`: `split_ids.json`"
    try:
        split = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TrackingError(f"{where} is not JSON text ({err}).") from None
    if not isinstance(split, dict) or set(split) != set(SPLITS):
        keys = sorted(split) if isinstance(split, dict) else type(split).__name__
        raise TrackingError(f"{where} must map exactly {list(SPLITS)} to ID lists, not {keys}.")
    seen: set[int] = set()
    for name in SPLITS:
        ids = split[name]
        if not isinstance(ids, list) or not all(
            type(i) is int and 0 <= i < NUM_EXAMPLES for i in ids
        ):
            raise TrackingError(
                f"{where}: `{name}` must be a list of sample IDs from 0 to {NUM_EXAMPLES - 1}."
            )
        if seen & set(ids) or len(set(ids)) != len(ids):
            raise TrackingError(f"{where}: `{name}` repeats sample IDs.")
        seen |= set(ids)
    if len(seen) != NUM_EXAMPLES:
        raise TrackingError(f"{where}: the lists hold {len(seen)} of the {NUM_EXAMPLES} IDs.")
    return split


def load_record(client: MlflowClient, run_id: str) -> RunRecord:
    """Reads run `run_id` back from the store; raises `TrackingError` when the
    run is missing or its record is inconsistent (a config that does not match
    its hash or its params)."""
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise TrackingError(
            f"Run `{run_id}` is not in `{client.tracking_uri}`: {err.message}"
        ) from None
    tags = dict(run.data.tags)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            config_path = client.download_artifacts(run_id, "config.json", tmp)
        except (MlflowException, OSError) as err:
            raise TrackingError(f"Run `{run_id}` has no `config.json` artifact: {err}") from None
        try:
            text = Path(config_path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise TrackingError(f"Run `{run_id}`: `config.json` is not UTF-8 text.") from None
        try:
            config = Config.from_json(text, f"{run_id}/config.json")
        except ConfigError as err:
            raise TrackingError(str(err)) from None
        try:
            split_path = client.download_artifacts(run_id, "split_ids.json", tmp)
        except (MlflowException, OSError):
            split_ids = None  # A record without split lists; `reproduce` checks the hashes.
        else:
            split_ids = _read_split_ids(run_id, Path(split_path))
    if tags.get("config.sha256") != config.sha256():
        raise TrackingError(
            f"Run `{run_id}`: `config.json` hashes to `{config.sha256()}` but the tag "
            f"`config.sha256` says `{tags.get('config.sha256')}`; the record was altered."
        )
    params = {k: json.dumps(v) for k, v in config.model_dump(mode="json").items()}
    recorded = dict(run.data.params)
    for name in sorted(set(params) | set(recorded)):
        if recorded.get(name) != params.get(name):
            raise TrackingError(
                f"Run `{run_id}`: its param `{name}` is `{recorded.get(name)}` but its "
                f"`config.json` says `{params.get(name)}`; the record was altered."
            )
    metrics = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in sorted(run.data.metrics)
    }
    return RunRecord(
        run_id=run_id,
        run_name=run.info.run_name,
        status=run.info.status,
        experiment_id=run.info.experiment_id,
        config=config,
        seeds={name: json.loads(run.data.params[name]) for name in SEEDS},
        code=_prefixed(tags, "code."),
        data=_prefixed(tags, "data."),
        runtime=_prefixed(tags, "runtime."),
        tags=tags,
        metrics=metrics,
        split_ids=split_ids,
    )
