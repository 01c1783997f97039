"""Stage 2: failures are kept, inventories are complete.

Real processes end in each way a run can end (normal, exception, `sys.exit(1)`,
SIGTERM, SIGKILL); the test sends the real signals. Independent check: the
statuses and counts the store reports through `reproducible-experiments
inventory` are compared with a count taken by SQL directly on the database
behind the store, and with what the test itself launched. Repeated on both
back-ends, with a page size of 2 (every page must be read), and against
MLflow's own defaults (`mlflow.start_run()`), which lose these end states.

Concurrency: 8 processes log 200 metric values each into one store at once;
every value must be there (counted by SQL), with zero errors.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import workers
from click.testing import CliRunner

from reproducible_experiments import tracking
from reproducible_experiments.cli import main
from reproducible_experiments.inventory import inventory

EXPECTED = {
    "ok": ("FINISHED", 0, None),
    "raise": ("FAILED", 1, "ValueError"),
    "exit1": ("FAILED", 1, "SystemExit"),
    "sigterm": ("KILLED", 128 + signal.SIGTERM, "SIGTERM"),
    "sigkill": ("KILLED", -signal.SIGKILL, None),  # KILLED by the next start.
}


def _wait_ready(queue, n: int, timeout_s: float = 60.0) -> dict[str, str]:
    ready, deadline = {}, time.monotonic() + timeout_s
    while len(ready) < n:
        mode, run_id = queue.get(timeout=max(0.1, deadline - time.monotonic()))
        ready[mode] = run_id
    return ready


def test_every_end_state_is_kept_and_counted(evidence, store):
    client = store.client()
    name, exp_id = store.new_experiment(client, "failures")
    with workers.processes(
        workers.tracked_worker, [(store.uri, name, mode) for mode in EXPECTED]
    ) as (procs, queue):
        run_ids = _wait_ready(queue, len(EXPECTED))
        by_mode = dict(zip(EXPECTED, procs, strict=True))
        by_mode["sigterm"].terminate()  # SIGTERM
        by_mode["sigkill"].kill()  # SIGKILL
        for proc in procs:
            proc.join(timeout=60)
        exit_codes = {mode: proc.exitcode for mode, proc in by_mode.items()}

    killed = client.get_run(run_ids["sigkill"])
    before = {
        "status": killed.info.status,
        "liveness": tracking.liveness(killed.data.tags),
    }
    # The next start in the experiment finds the dead run and marks it KILLED.
    with tracking.TrackedRun(client, exp_id, "next start") as nxt:
        pass
    observed = {}
    for mode in EXPECTED:
        run = client.get_run(run_ids[mode])
        observed[mode] = {
            "status": run.info.status,
            "exit_code": exit_codes[mode],
            "error.type": run.data.tags.get("error.type"),
            "reconciled.reason": run.data.tags.get("reconciled.reason"),
            "metric_values_kept": len(client.get_metric_history(run.info.run_id, "started")),
        }
    expected_ok = all(
        observed[m]["status"] == s
        and observed[m]["exit_code"] == c
        and observed[m]["error.type"] == e
        and observed[m]["metric_values_kept"] == 1
        for m, (s, c, e) in EXPECTED.items()
    )
    assert evidence.record(
        "each way a process ends gives the true end state",
        f"{store.kind}: real processes, real SIGTERM and SIGKILL",
        {
            "runs": observed,
            "sigkill_before_next_start": before,
            "next_start_reconciled": nxt.reconciled,
        },
        {"expected": {m: s for m, (s, _, _) in EXPECTED.items()}},
        expected_ok
        and before == {"status": "RUNNING", "liveness": "dead: process gone"}
        and nxt.reconciled == [run_ids["sigkill"]]
        and observed["sigkill"]["reconciled.reason"] == "process gone",
    ), observed
    failed = client.get_run(run_ids["raise"])
    assert "deliberate failure" in failed.data.tags["error.message"]
    assert "error/traceback.txt" in {
        a.path for a in client.list_artifacts(run_ids["raise"], "error")
    }

    # One run deleted through MLflow: the inventory still lists it, marked deleted.
    client.delete_run(run_ids["ok"])
    sql_rows = store.sql(
        "SELECT run_uuid, status, lifecycle_stage FROM runs WHERE experiment_id = ?",
        (int(exp_id),),
    )
    reference = {run_id: (status, stage) for run_id, status, stage in sql_rows}
    for page_size in (1000, 2):
        inv = inventory(client, name, exp_id, page_size=page_size)
        listed = {row.run_id: (row.status, row.lifecycle) for row in inv.rows}
        counts_sql: dict[str, int] = {}
        for status, _ in reference.values():
            counts_sql[status] = counts_sql.get(status, 0) + 1
        launched = set(run_ids.values()) | {nxt.run_id}
        assert evidence.record(
            "inventory lists every run, counts by status equal a direct SQL count",
            f"{store.kind}, page size {page_size}, one run deleted",
            {"inventory_counts": inv.counts(), "sql_counts": counts_sql, "total": len(inv.rows)},
            None,
            listed == reference and inv.counts() == counts_sql and set(listed) == launched,
        ), (listed, reference)
    assert listed[run_ids["ok"]] == ("FINISHED", "deleted")

    result = CliRunner().invoke(
        main, ["inventory", "--tracking-uri", store.uri, "--experiment", name, "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["total"] == len(launched) and payload["deleted"] == 1
    assert payload["counts"] == {"FAILED": 2, "FINISHED": 2, "KILLED": 2}


def test_a_live_run_is_never_reconciled(evidence, store):
    """Changed condition: the holder is alive (same host), or elsewhere with a
    lease that has or has not expired."""
    client = store.client()
    name, exp_id = store.new_experiment(client, "leases")
    with workers.processes(workers.tracked_worker, [(store.uri, name, "sigkill")]) as (
        procs,
        queue,
    ):
        live_id = _wait_ready(queue, 1)["sigkill"]
        with tracking.TrackedRun(client, exp_id, "next start") as nxt:
            pass
        live_status = client.get_run(live_id).info.status
        procs[0].kill()
        procs[0].join(timeout=30)

    now_ms = int(time.time() * 1000)
    remote = {"lease.host": "another-host-" + socket.gethostname(), "lease.pid": "1"}
    fresh = client.create_run(
        exp_id,
        run_name="remote fresh",
        tags={**remote, "lease.pid_start": "1", "lease.expires_ms": str(now_ms + 600_000)},
    ).info.run_id
    stale = client.create_run(
        exp_id,
        run_name="remote stale",
        tags={**remote, "lease.pid_start": "1", "lease.expires_ms": str(now_ms - 1)},
    ).info.run_id
    foreign = client.create_run(exp_id, run_name="no lease").info.run_id
    reconciled = tracking.reconcile(client, exp_id, by="test")
    statuses = {
        "live (same host)": live_status,
        "remote, lease valid": client.get_run(fresh).info.status,
        "remote, lease expired": client.get_run(stale).info.status,
        "no lease": client.get_run(foreign).info.status,
        "live run after its SIGKILL": client.get_run(live_id).info.status,
    }
    expected = {
        "live (same host)": "RUNNING",
        "remote, lease valid": "RUNNING",
        "remote, lease expired": "KILLED",
        "no lease": "RUNNING",
        "live run after its SIGKILL": "KILLED",
    }
    assert evidence.record(
        "only dead holders are reconciled",
        f"{store.kind}: live worker, remote leases, a run without lease",
        {"statuses": statuses, "first_reconcile": nxt.reconciled, "second_reconcile": reconciled},
        {"expected": expected},
        statuses == expected
        and nxt.reconciled == []
        and set(reconciled) == {stale, live_id}
        and client.get_run(stale).data.tags["reconciled.reason"] == "lease expired",
    ), statuses
    for run_id in (fresh, foreign):
        client.set_terminated(run_id, "KILLED")


def test_a_stale_search_never_overwrites_a_normal_end(evidence, sqlite_store, monkeypatch):
    """The race a reconciler must not lose: it searched while a run was RUNNING,
    the holder then ended it FINISHED and exited; the run must stay FINISHED."""
    client = sqlite_store.client()
    _, exp_id = sqlite_store.new_experiment(client, "stale-search")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(timeout=60)  # A pid whose process is gone.
    tags = {
        "lease.host": socket.gethostname(),
        "lease.pid": str(ended.pid),
        "lease.pid_start": "1",
        "lease.expires_ms": str(int(time.time() * 1000) + 600_000),
    }
    run_id = client.create_run(exp_id, run_name="ended normally", tags=tags).info.run_id
    stale = client.get_run(run_id)  # What the search saw: RUNNING.
    client.set_terminated(run_id, "FINISHED")  # Then the holder ended normally.
    monkeypatch.setattr(tracking, "iter_runs", lambda *args, **kwargs: iter([stale]))
    reconciled = tracking.reconcile(client, exp_id, by="test")
    status = client.get_run(run_id).info.status
    assert evidence.record(
        "a stale RUNNING search result does not turn FINISHED into KILLED",
        "sqlite: holder gone, run already FINISHED when the reconciler acts",
        {"seen_by_search": stale.info.status, "status_after": status, "reconciled": reconciled},
        None,
        stale.info.status == "RUNNING" and status == "FINISHED" and reconciled == [],
    )


def test_heartbeat_renews_the_lease(evidence, store):
    client = store.client()
    _, exp_id = store.new_experiment(client, "heartbeat")
    with tracking.TrackedRun(client, exp_id, "short lease", lease_s=0.6) as run:
        first = dict(client.get_run(run.run_id).data.tags)
        time.sleep(1.0)  # Long enough for at least two beats (every lease_s / 3).
        later = dict(client.get_run(run.run_id).data.tags)
    beats = {
        "heartbeat_ms": [int(first["lease.heartbeat_ms"]), int(later["lease.heartbeat_ms"])],
        "expires_ms": [int(first["lease.expires_ms"]), int(later["lease.expires_ms"])],
    }
    assert evidence.record(
        "the heartbeat renews a live run's lease",
        f"{store.kind}, lease 0.6 s, 1 s of work",
        beats,
        None,
        beats["heartbeat_ms"][1] > beats["heartbeat_ms"][0]
        and beats["expires_ms"][1] > beats["expires_ms"][0]
        and tracking.liveness(later) == "alive",
    ), beats


def test_mlflow_defaults_lose_end_states(evidence, sqlite_store):
    """The reference behaviour this stage fixes, measured on MLflow's fluent API."""
    uri = sqlite_store.uri
    client = sqlite_store.client()
    _, exp_id = sqlite_store.new_experiment(client, "defaults")
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    procs = {
        mode: subprocess.Popen(
            [sys.executable, "-c", workers.MLFLOW_DEFAULTS, uri, exp_id, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        for mode in ("raise", "exit1", "sigterm", "sigkill")
    }
    try:
        run_ids = {mode: proc.stdout.readline().strip() for mode, proc in procs.items()}
        time.sleep(0.5)  # Let the sleeping ones reach `time.sleep`.
        procs["sigterm"].send_signal(signal.SIGTERM)
        procs["sigkill"].kill()
        codes = {mode: proc.wait(timeout=60) for mode, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            proc.stdout.close()
    statuses = {mode: client.get_run(run_id).info.status for mode, run_id in run_ids.items()}
    assert evidence.record(
        "MLflow's defaults: exceptions and exit(1) end FINISHED, signals leave RUNNING",
        "mlflow.start_run() without a context manager, SQLite",
        {"statuses": statuses, "exit_codes": codes},
        None,
        statuses
        == {"raise": "FINISHED", "exit1": "FINISHED", "sigterm": "RUNNING", "sigkill": "RUNNING"},
    ), statuses


def test_eight_concurrent_writers_lose_nothing(evidence, store):
    """The module's store was created (schema and all) once, before the workers
    start: eight processes migrating a fresh SQLite file at once break it."""
    target = store
    client = target.client()
    name, exp_id = target.new_experiment(client, "concurrent")
    count = 200
    with workers.processes(
        workers.metrics_worker, [(target.uri, name, i, count) for i in range(8)]
    ) as (procs, queue):
        results = [queue.get(timeout=120) for _ in procs]
    errors = sum(r[2] for r in results)
    per_run = {
        run_id: store_count
        for run_id, store_count in target.sql(
            "SELECT m.run_uuid, COUNT(*) FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
            "WHERE r.experiment_id = ? GROUP BY m.run_uuid",
            (int(exp_id),),
        )
    }
    histories = {r[1]: len(client.get_metric_history(r[1], "value")) for r in results}
    assert evidence.record(
        "8 processes x 200 metric values: none lost, no errors",
        f"{target.kind}, schema created once before the workers",
        {"errors": errors, "sql_counts": sorted(per_run.values()), "runs": len(per_run)},
        {"errors": 0, "per_run": count},
        errors == 0
        and len(per_run) == 8
        and all(v == count for v in per_run.values())
        and all(v == count for v in histories.values()),
    ), (errors, per_run)
