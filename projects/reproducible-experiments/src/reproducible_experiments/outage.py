"""A tracking server that goes away mid-run: bounded retries, one error, nothing lost silently.

MLflow's HTTP client retries every call to a tracking server on its own
(urllib3 `Retry`, configured by environment variables read at each call). Its
defaults (mlflow 3.17: 7 retries, back-off factor 2, 120 s per request) let
one call wait about 4 minutes before it gives up, and a run makes several
calls after the store is gone (heartbeat, background metric writes, the end
of the run), so a process could wait far longer than any user would.

`bound_http_retries` sets MLflow's own variables (unless already set) to:

  5 attempts (`MLFLOW_HTTP_REQUEST_MAX_RETRIES` = 4), back-off 0, 2, 4, 8 s
  between them (`..._BACKOFF_FACTOR` = 1, `..._BACKOFF_JITTER` = 0, and no
  waiting on a `Retry-After` header): 14 s of back-off per call; each attempt
  waits at most `HTTP_TIMEOUT_S` = 10 s to connect and 10 s per read
  (`MLFLOW_HTTP_REQUEST_TIMEOUT`).

So one call fails after about `BACKOFF_S` = 14 s against a server that
answers with an error (its database down) or refuses connections (the server
down), and after at most `CALL_BOUND_S` = 114 s against a host that answers
nothing at all.

`GuardedClient` adds a circuit breaker, not a retry: once a call has failed
because the server could not be reached (MLflow's retries exhausted), every
later call of that client fails at once with `StoreUnavailable`, so a run
pays the retry budget once, not once per remaining write. What the store did
not receive is kept locally (`keep_unsent`: the end state, the error, every
metric value, the checkpoint) and written by `settle_unsent` at the next
start that writes to the same store.
"""

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import requests
from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.async_logging.run_operations import RunOperations

from reproducible_experiments.tracking import (
    METRICS_PER_CALL,
    Client,
    TrackingError,
    is_sqlite,
)

HTTP_MAX_RETRIES = 4
HTTP_BACKOFF_FACTOR = 1
HTTP_TIMEOUT_S = 10
# urllib3 sleeps 0 before the first retry, then factor * 2**(n - 1) before retry n.
BACKOFF_S = sum(HTTP_BACKOFF_FACTOR * 2 ** (n - 1) for n in range(2, HTTP_MAX_RETRIES + 1))
CALL_BOUND_S = BACKOFF_S + (HTTP_MAX_RETRIES + 1) * 2 * HTTP_TIMEOUT_S
UNSENT_DIR = Path("runs") / "unsent"


class StoreUnavailable(TrackingError):
    """The tracking server could not be reached within the retry bound."""


def bound_http_retries(environ: Any = os.environ) -> None:
    """Sets MLflow's HTTP retry variables to the bound in the module docstring,
    leaving any that the user has set alone."""
    environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_MAX_RETRIES))
    environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", str(HTTP_BACKOFF_FACTOR))
    environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0")
    environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))
    environ.setdefault("MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER", "false")


def unreachable(err: BaseException) -> bool:
    """Whether `err` is MLflow giving up on reaching the server (a connection
    error, retries exhausted or a timeout), as opposed to the server refusing
    the request (a bad value, a missing run), which retrying cannot change."""
    cause = err.__cause__ or err.__context__
    return isinstance(err, MlflowException) and isinstance(cause, requests.RequestException)


class _Operations(RunOperations):
    """MLflow's handle on a background write, reporting an unreachable server to
    its client's circuit breaker."""

    def __init__(self, client: "GuardedClient", operations: RunOperations) -> None:
        super().__init__(operations._operation_futures)
        self.client = client

    def wait(self) -> None:
        for future in self._operation_futures:
            error = future.exception()
            if error is not None and unreachable(error):
                raise self.client.trip(error)
        super().wait()


def _guarded(name: str) -> Any:
    def method(self: "GuardedClient", *args: Any, **kwargs: Any) -> Any:
        if self.failure is not None:
            raise StoreUnavailable(self.failure)
        try:
            result = getattr(Client, name)(self, *args, **kwargs)
        except MlflowException as err:
            if unreachable(err):
                raise self.trip(err) from None
            raise
        if name == "log_batch":
            count = len(kwargs.get("metrics") or (args[1] if len(args) > 1 else []) or [])
            if isinstance(result, RunOperations):
                result = _Operations(self, result)
                self.background.append((result, count))
            else:
                self.written += count
        return result

    method.__name__ = name
    method.__doc__ = f"`Client.{name}`, failing at once after the server was unreachable."
    return method


class GuardedClient(Client):
    """A `Client` of a tracking server with a circuit breaker: after the first
    call that could not reach the server, every call raises `StoreUnavailable`
    at once (with the first failure's message). Counts the metric values the
    store confirmed (`confirmed_metrics`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failure: str | None = None
        self.written = 0
        self.background: list[tuple[RunOperations, int]] = []

    def trip(self, err: BaseException) -> StoreUnavailable:
        """Opens the circuit (once) and returns the error to raise."""
        if self.failure is None:
            detail = " ".join(str(getattr(err, "message", err)).split())[:300]
            self.failure = (
                f"the tracking store `{self.tracking_uri}` could not be reached within "
                f"{HTTP_MAX_RETRIES + 1} attempts and {BACKOFF_S} s of back-off ({detail})"
            )
        return StoreUnavailable(self.failure)

    def confirmed_metrics(self) -> int:
        """Metric values the store has acknowledged, synchronously or in the background."""
        done = sum(
            count
            for operations, count in self.background
            if all(f.done() and f.exception() is None for f in operations._operation_futures)
        )
        return self.written + done

    create_run = _guarded("create_run")
    get_run = _guarded("get_run")
    log_batch = _guarded("log_batch")
    set_tag = _guarded("set_tag")
    set_terminated = _guarded("set_terminated")
    log_text = _guarded("log_text")
    log_dict = _guarded("log_dict")
    log_figure = _guarded("log_figure")
    log_artifacts = _guarded("log_artifacts")
    search_runs = _guarded("search_runs")
    get_metric_history = _guarded("get_metric_history")


def guard(client: Any) -> Any:
    """A `GuardedClient` on the same tracking server; a SQLite store's client is
    returned as it is (a local file does not go away between two calls)."""
    if is_sqlite(client.tracking_uri):
        return client
    return GuardedClient(tracking_uri=client.tracking_uri)


def keep_unsent(
    directory: Path,
    tracking_uri: str,
    run_id: str,
    tags: dict[str, str],
    metrics: list[Metric],
) -> Path:
    """Writes `directory/<run_id>/end.json`: the store, the run, the end state
    (FAILED, now), its tags and every metric value of the run; returns the
    folder (a checkpoint may be saved beside it as `checkpoint/`)."""
    folder = directory / run_id
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "tracking_uri": tracking_uri,
        "run_id": run_id,
        "status": "FAILED",
        "end_time_ms": int(time.time() * 1000),
        "tags": tags,
        "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics],
    }
    (folder / "end.json").write_text(json.dumps(record), encoding="utf-8")
    return folder


def settle_unsent(client: Any, directory: Path = UNSENT_DIR) -> list[str]:
    """Writes what runs of `client`'s store kept in `directory` while it was
    unreachable, and removes each folder once written; returns their run ids.

    Per run: the metric values the store lacks (by key and step), the tags
    (`error.type`, `error.message`, ...), the checkpoint as the artifact folder
    `checkpoint/` (tag `result.checkpoint`), then the end state FAILED at the
    recorded end time, unless the run has already ended (e.g. marked KILLED by
    another host's start): that status is kept. Raises `TrackingError` when
    the store refuses or cannot be reached; what was kept stays for next time.
    """
    settled = []
    for end in sorted(directory.glob("*/end.json")) if directory.is_dir() else []:
        record = json.loads(end.read_text(encoding="utf-8"))
        if record["tracking_uri"] != client.tracking_uri:
            continue
        run_id = record["run_id"]
        try:
            run = client.get_run(run_id)
            keys = {key for key, *_ in record["metrics"]}
            stored = {
                (m.key, m.step) for key in keys for m in client.get_metric_history(run_id, key)
            }
            missing = [
                Metric(key, value, stamp, step)
                for key, value, stamp, step in record["metrics"]
                if (key, step) not in stored
            ]
            for start in range(0, len(missing), METRICS_PER_CALL):
                client.log_batch(run_id, metrics=missing[start : start + METRICS_PER_CALL])
            tags = [RunTag(k, v) for k, v in record["tags"].items()]
            checkpoint = end.parent / "checkpoint"
            if checkpoint.is_dir():
                client.log_artifacts(run_id, str(checkpoint), "checkpoint")
                tags.append(RunTag("result.checkpoint", "checkpoint/"))
            client.log_batch(run_id, tags=tags)
            if run.info.status == "RUNNING":
                client.set_terminated(
                    run_id, status=record["status"], end_time=record["end_time_ms"]
                )
        except MlflowException as err:
            raise TrackingError(
                f"Cannot write the end of run `{run_id}` kept in `{end.parent}` to "
                f"`{client.tracking_uri}`: {' '.join(str(err.message).split())[:300]}"
            ) from None
        shutil.rmtree(end.parent)
        settled.append(run_id)
    return settled
