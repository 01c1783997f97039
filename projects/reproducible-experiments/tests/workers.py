"""Worker processes for the failure and concurrency tests.

The workers are real processes, started through a multiprocessing
`forkserver` that has imported MLflow once, so each one starts in a fraction
of a second instead of re-importing MLflow (the tests kill them with real
SIGTERM and SIGKILL). They import no JAX: the failure paths are about the
tracking, and a light body keeps the tests fast.

`MLFLOW_DEFAULTS` is a stand-alone script that uses MLflow's own fluent API
(`mlflow.start_run()`), run with a fresh interpreter so that MLflow's exit
hooks run exactly as they would in a user's program.
"""

import contextlib
import multiprocessing
import sys
import time
from collections.abc import Iterator
from typing import Any

MODES = ("ok", "raise", "exit1", "sigterm", "sigkill")
LIFETIME_S = 300.0  # A worker waiting to be killed gives up (exit 3) after this long.

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(["workers", "reproducible_experiments.tracking"])


def tracked_worker(uri: str, experiment: str, mode: str, queue: Any) -> None:
    """Starts a `TrackedRun`, reports its id on `queue`, then ends as `mode` says."""
    from reproducible_experiments import tracking

    client = tracking.connect(uri)
    exp_id = tracking.experiment_id(client, experiment)
    with tracking.TrackedRun(client, exp_id, f"worker {mode}") as run:
        run.metrics.log({"started": 1.0}, step=0)
        run.metrics.flush()
        queue.put((mode, run.run_id))
        if mode == "raise":
            raise ValueError("deliberate failure in the worker")
        if mode == "exit1":
            sys.exit(1)
        if mode in ("sigterm", "sigkill"):
            deadline = time.monotonic() + LIFETIME_S
            step = 1
            while time.monotonic() < deadline:  # Working until a signal arrives.
                run.metrics.log({"tick": float(step)}, step=step)
                run.metrics.flush()
                step += 1
                time.sleep(0.05)
            sys.exit(3)


def killed_at_first_row(uri: str, experiment: str, queue: Any) -> None:
    """Starts a `TrackedRun` and dies by SIGKILL the moment its run row exists,
    before any other write (no params, no metric, no heartbeat)."""
    import os
    import signal

    from reproducible_experiments import tracking

    client = tracking.connect(uri)
    exp_id = tracking.experiment_id(client, experiment)
    create_run = client.create_run

    def create_then_die(*args: Any, **kwargs: Any) -> Any:
        run = create_run(*args, **kwargs)
        queue.put(("first-row", run.info.run_id))
        queue.close()
        queue.join_thread()  # The id is on its way before the process dies.
        os.kill(os.getpid(), signal.SIGKILL)
        return run

    client.create_run = create_then_die  # type: ignore[method-assign]
    with tracking.TrackedRun(client, exp_id, "killed at first row", params={"a": "1"}):
        sys.exit(3)  # Never reached.


def fresh_store_worker(uri: str, experiment: str, index: int, barrier: Any, queue: Any) -> None:
    """Waits until all its siblings are up, then opens the store (a fresh file on
    first use), and runs one tracked run; reports `(index, run_id, error)`."""
    from reproducible_experiments import tracking

    barrier.wait(timeout=LIFETIME_S)
    try:
        client = tracking.connect(uri)
        exp_id = tracking.experiment_id(client, experiment)
        with tracking.TrackedRun(client, exp_id, f"fresh store {index}") as run:
            run.metrics.log({"index": float(index)}, step=0)
        queue.put((index, run.run_id, ""))
    except Exception as err:  # noqa: BLE001 - reported, and the test asserts none.
        queue.put((index, "", f"{type(err).__name__}: {err}"))
        raise


def barrier(parties: int) -> Any:
    """A barrier the worker processes can share."""
    return _context.Barrier(parties)


def metrics_worker(uri: str, experiment: str, index: int, count: int, queue: Any) -> None:
    """Logs `count` metric values in batches of 10 into its own run; reports
    `(index, run_id, errors)`."""
    from mlflow.entities import Metric

    from reproducible_experiments import tracking

    client = tracking.connect(uri)
    exp_id = tracking.experiment_id(client, experiment)
    errors = 0
    run_id = client.create_run(exp_id, run_name=f"concurrent {index}").info.run_id
    for start in range(0, count, 10):
        batch = [
            Metric("value", float(index * 1000 + i), int(time.time() * 1000), i)
            for i in range(start, min(start + 10, count))
        ]
        try:
            client.log_batch(run_id, metrics=batch)
        except Exception:  # noqa: BLE001 - counted, and the test asserts zero.
            errors += 1
    client.set_terminated(run_id)
    queue.put((index, run_id, errors))


@contextlib.contextmanager
def processes(
    target: Any, arg_sets: list[tuple], timeout_s: float = 300.0
) -> Iterator[tuple[list[Any], Any]]:
    """Starts one process per argument tuple (each gets a shared queue as its
    last argument); at exit every process still alive is killed and joined."""
    queue = _context.Queue()
    procs = [_context.Process(target=target, args=(*args, queue)) for args in arg_sets]
    for proc in procs:
        proc.start()
    try:
        yield procs, queue
    finally:
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        queue.close()


MLFLOW_DEFAULTS = r"""
import os, sys, time
import mlflow
uri, experiment_id, mode = sys.argv[1:4]
mlflow.set_tracking_uri(uri)
run = mlflow.start_run(experiment_id=experiment_id, run_name=f"mlflow default {mode}")
print(run.info.run_id, flush=True)
if mode == "raise":
    raise ValueError("an exception outside `with mlflow.start_run()`")
if mode == "exit1":
    sys.exit(1)
time.sleep(60)  # sigterm / sigkill: wait for the signal.
sys.exit(3)
"""
