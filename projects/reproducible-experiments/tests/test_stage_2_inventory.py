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

A tracking server that goes away: MLflow's client against a local server
answering 503 gives up after 5 attempts and 2 + 4 + 8 s of back-off (sleeps
recorded, not slept), then the circuit breaker fails later calls with no
request; a `train` whose store becomes unreachable at its first metric write
exits 1 with one line, keeping its end state, values and checkpoint under
`runs/unsent/`, which the next `train` writes to the store before its own run.
(`tests/test_store_outage.py` kills a real PostgreSQL database mid-run.)
"""

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import urllib3.util.retry
import workers
from click.testing import CliRunner

from reproducible_experiments import tracking
from reproducible_experiments.cli import main
from reproducible_experiments.inventory import inventory

PROJECT_ROOT = Path(__file__).resolve().parents[1]

EXPECTED = {
    "ok": ("FINISHED", 0, None),
    "raise": ("FAILED", 1, "ValueError"),
    "exit1": ("FAILED", 1, "SystemExit"),
    "sigterm": ("KILLED", 128 + signal.SIGTERM, "SIGTERM"),
    "sigkill": ("KILLED", -signal.SIGKILL, None),  # KILLED by the next start.
}


def _wait_ready(queue, n: int, timeout_s: float = 300.0) -> dict[str, str]:
    ready, deadline = {}, time.monotonic() + timeout_s
    while len(ready) < n:
        mode, run_id = queue.get(timeout=max(0.1, deadline - time.monotonic()))
        ready[mode] = run_id
    return ready


@pytest.mark.claims(
    "end-state-finished-on-clean-exit",
    "end-state-sigterm-killed",
    "end-state-ctrl-c-killed",
    "end-state-failed-with-type",
)
def test_each_way_a_body_ends_earns_its_status(evidence):
    """end_state gives the promised status and error type for 7 endings, exits and signals.

    `end_state` for each ending, against the table the module promises.
    """
    cases = {
        "normal end": (None, None, "FINISHED", None),
        "sys.exit(0)": (SystemExit, SystemExit(0), "FINISHED", None),
        "sys.exit()": (SystemExit, SystemExit(None), "FINISHED", None),
        "sys.exit(1)": (SystemExit, SystemExit(1), "FAILED", "SystemExit"),
        "exception": (ValueError, ValueError("bad"), "FAILED", "ValueError"),
        "SIGTERM": (tracking.Terminated, tracking.Terminated(), "KILLED", "SIGTERM"),
        "Ctrl-C": (KeyboardInterrupt, KeyboardInterrupt(), "KILLED", "KeyboardInterrupt"),
    }
    got = {}
    for name, (exc_type, exc, _, _) in cases.items():
        status, tags = tracking.end_state(exc_type, exc)
        got[name] = (status, {t.key: t.value for t in tags}.get("error.type"))
    assert evidence.record(
        "each way a run's body ends gives its status and error type",
        f"{len(cases)} endings",
        got,
        {name: (c[2], c[3]) for name, c in cases.items()},
        all(got[name] == (c[2], c[3]) for name, c in cases.items()),
    ), got


@pytest.mark.claims(
    "dead-runs-found-by-lease",
    "liveness-no-lease",
    "liveness-pid-and-start",
    "liveness-by-expiry",
)
def test_a_reused_pid_does_not_keep_a_dead_run_alive(evidence):
    """A lease whose pid lives with another start time is dead; remote leases go by expiry.

    The lease names the pid AND its start time: a live process that holds the
    pid now (here, this test's own) is not the run's holder."""
    import os

    here = {"lease.host": socket.gethostname(), "lease.pid": str(os.getpid())}
    start = tracking.process_start(os.getpid())
    # Independent reading of the start time: field 22 of /proc/<pid>/stat, counted
    # after the parenthesised command name.
    with open(f"/proc/{os.getpid()}/stat") as f:
        reference = f.read().rsplit(")", 1)[1].split()[19]
    judged = {
        "same pid, same start": tracking.liveness({**here, "lease.pid_start": start}),
        "same pid, other start": tracking.liveness(
            {**here, "lease.pid_start": str(int(start) + 1)}
        ),
        "same pid, start unknown": tracking.liveness({**here, "lease.pid_start": ""}),
    }
    # Changed condition: a holder on another host, judged by its lease's expiry alone.
    now_ms = int(time.time() * 1000)
    remote = {
        "lease.host": "another-" + socket.gethostname(),
        "lease.pid": str(os.getpid()),
        "lease.pid_start": start,
    }
    for name, expires in (
        ("remote, expired 1 s ago", now_ms - 1000),
        ("remote, expires in 60 s", now_ms + 60_000),
    ):
        judged[name] = tracking.liveness({**remote, "lease.expires_ms": str(expires)}, now_ms)
    judged["no holder tags"] = tracking.liveness({"mlflow.runName": "x"})
    expected = {
        "same pid, same start": "alive",
        "same pid, other start": "dead: process gone",
        "same pid, start unknown": "dead: process gone",
        "remote, expired 1 s ago": "dead: lease expired",
        "remote, expires in 60 s": "alive",
        "no holder tags": "no lease",
    }
    assert evidence.record(
        "a pid reused by another process does not keep a run alive",
        "this process's pid with its own and with another start time",
        {"judged": judged, "start": start, "reference_start": reference},
        {"expected": expected},
        judged == expected and start == reference and start != "",
    ), judged


# FAST, DIRECT CHECKS (first in the file: a wrong judgement fails within seconds) ------


def _own_lease(**extra: str) -> dict[str, str]:
    pid = os.getpid()
    return {
        "lease.host": socket.gethostname(),
        "lease.pid": str(pid),
        "lease.pid_start": tracking.process_start(pid),
        **extra,
    }


@pytest.mark.claims("liveness-pid-and-start", "liveness-by-expiry", "liveness-given-clock")
def test_liveness_on_both_sides_of_every_boundary():
    """liveness judges host, start time and expiry right one unit either side of each bound.

    Host equality (other hosts sorting before and after this one), the start
    time (one tick either side), expiry (a millisecond either side, and exactly
    at it), a clock given far from the wall clock, and the clock read when none
    is given."""
    here = socket.gethostname()
    mine = _own_lease()
    start = int(mine["lease.pid_start"])
    base = 10**9  # A `now_ms` far from the wall clock: only the argument may count.
    cases = {}
    for label, host in (("sorts before", here[:-1]), ("sorts after", here + "~")):
        # A remote holder that happens to carry this process's pid and start time.
        remote = {**mine, "lease.host": host}
        cases[f"remote {label}, expired"] = (
            tracking.liveness({**remote, "lease.expires_ms": str(base - 1)}, base),
            "dead: lease expired",
        )
        cases[f"remote {label}, valid"] = (
            tracking.liveness({**remote, "lease.expires_ms": str(base + 1)}, base),
            "alive",
        )
        cases[f"remote {label}, no expiry"] = (tracking.liveness(remote, base), "no lease")
    cases["expires exactly now"] = (
        tracking.liveness({"lease.host": "elsewhere", "lease.expires_ms": str(base)}, base),
        "alive",
    )
    far_future = str(_now() + 10**9)
    cases["no clock given, valid"] = (
        tracking.liveness({"lease.host": "elsewhere", "lease.expires_ms": far_future}),
        "alive",
    )
    cases["no clock given, expired"] = (
        tracking.liveness({"lease.host": "elsewhere", "lease.expires_ms": "1"}),
        "dead: lease expired",
    )
    cases["same host, expiry only"] = (
        tracking.liveness({"lease.host": here, "lease.expires_ms": str(base - 1)}, base),
        "dead: lease expired",
    )
    for delta in (-1, 1):
        cases[f"own pid, start {delta:+d} tick"] = (
            tracking.liveness({**mine, "lease.pid_start": str(start + delta)}, base),
            "dead: process gone",
        )
    cases["own pid, own start, lease long expired"] = (
        tracking.liveness({**mine, "lease.expires_ms": "1"}, base),
        "alive",
    )
    got = {name: judged for name, (judged, _) in cases.items()}
    assert got == {name: want for name, (_, want) in cases.items()}


def _now() -> int:
    return int(time.time() * 1000)


def _without_proc(monkeypatch) -> None:
    """A host without `/proc` (macOS, say), however the code asks: `Path.is_dir` and
    `.exists`, `os.path.isdir` and `.exists` all end in `os.stat`, which now finds no
    `/proc` (every other path is stat'ed as before)."""
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if isinstance(path, str | os.PathLike) and os.fspath(path).rstrip("/") == "/proc":
            raise FileNotFoundError(2, "No such file or directory", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)


@pytest.mark.claims("liveness-without-proc")
def test_liveness_without_proc_asks_the_process_table(monkeypatch):
    """Without /proc, kill(pid, 0) decides: gone is dead; alive or foreign checks the start.

    Where `/proc` is missing, `kill(pid, 0)` (signal 0: ask, never send)
    decides: gone is dead; alive, or owned by someone else, falls back to the
    recorded start time."""
    sent = []

    def fake_kill(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        if pid == 1001:
            raise ProcessLookupError(pid)
        if pid == 1002:
            raise PermissionError(pid)

    monkeypatch.setattr(tracking, "process_start", lambda pid: "")
    _without_proc(monkeypatch)
    monkeypatch.setattr(tracking.os, "kill", fake_kill)
    host = socket.gethostname()
    judged = {
        pid: tracking.liveness({"lease.host": host, "lease.pid": str(pid), "lease.pid_start": "7"})
        for pid in (1000, 1001, 1002)
    }
    assert judged == {1000: "alive", 1001: "dead: process gone", 1002: "alive"}
    assert sent == [(1000, 0), (1001, 0), (1002, 0)]


@pytest.mark.claims("liveness-pid-and-start")
def test_a_missing_proc_entry_means_the_holder_is_gone(monkeypatch):
    """With /proc present, a pid it does not list is judged dead, whatever kill() says.

    With `/proc` present, a pid it does not list is gone, whatever the pid
    table might say (the start time cannot be confirmed)."""
    monkeypatch.setattr(tracking, "process_start", lambda pid: "")
    monkeypatch.setattr(tracking.os, "kill", lambda pid, sig: None)  # "Still there."
    assert tracking.liveness(_own_lease(**{"lease.pid_start": "7"})) == "dead: process gone"


def test_process_start_reads_field_22_even_with_a_parenthesis_in_the_name(tmp_path):
    """process_start reads field 22 of /proc/<pid>/stat after the last `)`, odd names too.

    `/proc/<pid>/stat` puts the command name in parentheses, and a name may
    itself hold `) `: the fields are counted after the LAST `)`."""
    exe = tmp_path / "odd) name 1"
    exe.symlink_to(Path("/bin/sleep"))
    child = subprocess.Popen([str(exe), "30"])
    try:
        stat = Path(f"/proc/{child.pid}/stat").read_text()
        assert ") name 1)" in stat  # The kernel kept the odd name.
        after = stat[stat.rindex(")") + 1 :].split()
        assert tracking.process_start(child.pid) == after[22 - 3]  # stat(5): field 22.
        assert tracking.process_start(os.getpid()).isdigit()
    finally:
        child.kill()
        child.wait(timeout=60)
    assert tracking.process_start(child.pid) == ""  # Reaped: no /proc entry.


@pytest.mark.claims("end-state-failed-with-type", "end-state-message-cut-at-5000")
@pytest.mark.parametrize("length", [4999, 5000, 5001, 12_000])
def test_error_message_is_cut_at_5000_characters(length):
    """error.message keeps the first 5,000 characters, and the repr when str is empty.

    The message tag holds at most 5,000 characters (MLflow's tag limit): the
    first 5,000 exactly; an exception whose `str` is empty gives its `repr`."""

    class Quiet(Exception):
        def __str__(self) -> str:
            return ""

        def __repr__(self) -> str:
            return "r" * length

    status, tags = tracking.end_state(ValueError, ValueError("m" * length))
    assert status == "FAILED"
    assert {t.key: t.value for t in tags}["error.message"] == "m" * min(length, 5000)
    _, tags = tracking.end_state(Quiet, Quiet())
    assert {t.key: t.value for t in tags} == {
        "error.type": "Quiet",
        "error.message": "r" * min(length, 5000),
    }


@pytest.mark.claims("inventory-lists-every-run", "iter-runs-every-page")
@pytest.mark.parametrize("page_size", [1, 2, 3, 5])
def test_iter_runs_reads_every_page(sqlite_store, page_size):
    """iter_runs returns every run once, in start order, at page sizes 1, 2, 3 and 5.

    Five runs (two deleted) read back in pages of 1, 2, 3 and 5: every run
    exactly once, in start order. (First of the store tests: a reader that stops
    early, or never stops, fails here in seconds.)"""
    client = sqlite_store.client()
    _, exp_id = sqlite_store.new_experiment(client, "pages")
    made = []
    for i in range(5):
        made.append(client.create_run(exp_id, run_name=f"r{i}", start_time=1000 + i).info.run_id)
    for run_id in made[1:3]:
        client.delete_run(run_id)
    got = [r.info.run_id for r in tracking.iter_runs(client, exp_id, page_size=page_size)]
    assert got == made


def _running(client, exp_id: str, name: str, tags: dict[str, str]) -> str:
    return client.create_run(exp_id, run_name=name, tags=tags).info.run_id


@pytest.mark.claims("dead-runs-found-by-lease", "reconcile-kills-only-dead-runs")
def test_reconcile_kills_only_dead_running_runs(sqlite_store):
    """reconcile ends only dead RUNNING runs, KILLED at their last heartbeat, tagged why.

    One experiment, every kind of run; reconcile ends exactly the RUNNING runs
    whose holder is dead, as KILLED at their last heartbeat, saying why and by whom."""
    client = sqlite_store.client()
    _, exp_id = sqlite_store.new_experiment(client, "reconcile")
    past, future = str(_now() - 60_000), str(_now() + 600_000)
    remote = {"lease.host": "elsewhere", "lease.pid": "1"}
    dead = _running(
        client, exp_id, "dead", {**remote, "lease.expires_ms": past, "lease.heartbeat_ms": "1234"}
    )
    alive = _running(client, exp_id, "alive", {**remote, "lease.expires_ms": future})
    no_lease = _running(client, exp_id, "no lease", {})
    finished = _running(client, exp_id, "finished", {**remote, "lease.expires_ms": past})
    client.set_terminated(finished, "FINISHED")
    assert tracking.reconcile(client, exp_id, by="tester") == [dead]
    runs = {r: client.get_run(r) for r in (dead, alive, no_lease, finished)}
    assert {r: run.info.status for r, run in runs.items()} == {
        dead: "KILLED",
        alive: "RUNNING",
        no_lease: "RUNNING",
        finished: "FINISHED",
    }
    assert runs[dead].info.end_time == 1234
    tags = runs[dead].data.tags
    assert (tags["reconciled.reason"], tags["reconciled.by"]) == ("lease expired", "tester")
    assert abs(int(tags["reconciled.at_ms"]) - _now()) < 600_000
    # Without `by`, the reconciling process names itself.
    again = _running(client, exp_id, "dead too", {**remote, "lease.expires_ms": past})
    assert tracking.reconcile(client, exp_id) == [again]
    assert client.get_run(again).data.tags["reconciled.by"] == f"pid {os.getpid()}"


@pytest.mark.claims("reconcile-kills-only-dead-runs")
def test_a_stale_search_skips_each_ended_run_and_reconciles_the_rest(sqlite_store, monkeypatch):
    """Runs ended after a stale search keep their status; a dead one after them is reconciled.

    The search saw RUNNING; meanwhile the holders ended their runs in every
    way (SCHEDULED included, which sorts after RUNNING). Those are left as they
    are, and the dead run after them in the same search is still reconciled."""
    client = sqlite_store.client()
    _, exp_id = sqlite_store.new_experiment(client, "stale-many")
    lease = {"lease.host": "elsewhere", "lease.expires_ms": str(_now() - 60_000)}
    ended = {
        s: _running(client, exp_id, s, lease) for s in ("FINISHED", "FAILED", "KILLED", "SCHEDULED")
    }
    last = _running(client, exp_id, "dead", lease)
    stale = [client.get_run(r) for r in (*ended.values(), last)]
    for status, run_id in ended.items():
        client.update_run(run_id, status=status)
    monkeypatch.setattr(tracking, "iter_runs", lambda *args, **kwargs: iter(stale))
    assert tracking.reconcile(client, exp_id, by="t") == [last]
    assert {s: client.get_run(r).info.status for s, r in ended.items()} == {s: s for s in ended}


# THROUGH REAL PROCESSES AND BOTH STORES ----------------------------------------


@pytest.mark.claims("failures-kept", "dead-runs-found-by-lease", "inventory-lists-every-run")
def test_every_end_state_is_kept_and_counted(evidence, store):
    """Real endings get their true status; the inventory's counts equal a SQL count."""
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
            proc.join(timeout=300)
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


@pytest.mark.claims("dead-runs-found-by-lease", "reconcile-kills-only-dead-runs")
def test_a_live_run_is_never_reconciled(evidence, store):
    """Reconcile leaves live holders and valid remote leases RUNNING and kills expired ones.

    Changed condition: the holder is alive (same host), or elsewhere with a
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
        procs[0].join(timeout=300)

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


@pytest.mark.claims("reconcile-kills-only-dead-runs")
def test_a_stale_search_never_overwrites_a_normal_end(evidence, sqlite_store, monkeypatch):
    """A reconciler acting on a stale RUNNING result leaves a FINISHED run FINISHED.

    The race a reconciler must not lose: it searched while a run was RUNNING,
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


@pytest.mark.claims("dead-runs-found-by-lease")
def test_heartbeat_renews_the_lease(evidence, store):
    """A live run's heartbeat moves its heartbeat and expiry tags forward; it stays alive."""
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


@pytest.mark.claims("mlflow-defaults-lose-end-states")
def test_mlflow_defaults_lose_end_states(evidence, sqlite_store):
    """MLflow's fluent defaults record failures as FINISHED and leave signalled runs RUNNING.

    The reference behaviour this stage fixes, measured on MLflow's fluent API.
    """
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
        codes = {mode: proc.wait(timeout=300) for mode, proc in procs.items()}
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


@pytest.mark.claims("many-writers-lose-nothing")
def test_eight_concurrent_writers_lose_nothing(evidence, store):
    """8 processes x 200 metric values in one store: all kept by SQL count, with 0 errors.

    The module's store was created (schema and all) once, before the workers
    start: eight processes migrating a fresh SQLite file at once break it."""
    target = store
    client = target.client()
    name, exp_id = target.new_experiment(client, "concurrent")
    count = 200
    with workers.processes(
        workers.metrics_worker, [(target.uri, name, i, count) for i in range(8)]
    ) as (procs, queue):
        results = [queue.get(timeout=300) for _ in procs]
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


@pytest.mark.claims("lease-in-the-first-row")
def test_a_run_killed_at_its_first_row_is_reconciled(evidence, store):
    """A run SIGKILLed right after its row is written is judged dead at once, then KILLED.

    SIGKILL right after the run row is written, before params, metrics or a
    heartbeat: the run must be judgeable at once, and the next start ends it."""
    client = store.client()
    name, exp_id = store.new_experiment(client, "first-row")
    with workers.processes(workers.killed_at_first_row, [(store.uri, name)]) as (procs, queue):
        run_id = _wait_ready(queue, 1)["first-row"]
        procs[0].join(timeout=300)
        exit_code = procs[0].exitcode
    row = client.get_run(run_id)
    before = {"status": row.info.status, "liveness": tracking.liveness(row.data.tags)}
    listed_before = {r.run_id: r.status for r in inventory(client, name, exp_id).rows}
    with tracking.TrackedRun(client, exp_id, "next start") as nxt:
        pass
    after = client.get_run(run_id)
    # Independent check: the status column read by SQL, not through MLflow.
    (sql_status,) = store.sql("SELECT status FROM runs WHERE run_uuid = ?", (run_id,))[0]
    observed = {
        "exit_code": exit_code,
        "before_next_start": before,
        "inventory_before": listed_before.get(run_id),
        "reconciled": nxt.reconciled,
        "status_after": after.info.status,
        "sql_status_after": sql_status,
        "reason": after.data.tags.get("reconciled.reason"),
        "params_written": dict(after.data.params),
    }
    assert evidence.record(
        "a run is reconcilable from the moment it exists",
        f"{store.kind}: SIGKILL inside `create_run`, before any other write",
        observed,
        None,
        exit_code == -9
        and before == {"status": "RUNNING", "liveness": "dead: process gone"}
        and nxt.reconciled == [run_id]
        and after.info.status == "KILLED" == sql_status
        and observed["reason"] == "process gone"
        and observed["params_written"] == {},
    ), observed


def _break_artifact_folder(store, name: str) -> Path:
    """Puts a plain file where the experiment's artifact folder must go."""
    folder = Path(store.uri.removeprefix("sqlite:///")).parent / "artifacts" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("not a folder\n")
    return folder


@pytest.mark.claims("end-state-before-traceback")
def test_a_broken_artifact_folder_still_ends_the_run(evidence, sqlite_store):
    """An unwritable artifact folder still leaves the run FAILED, and the message says so.

    The end state is written before the traceback artifact; when the artifact
    cannot be written, the message says so, and the run is not left RUNNING."""
    client = sqlite_store.client()
    observed = {}
    # Directly: a body that raises, in an experiment whose artifact folder is a file.
    name, exp_id = sqlite_store.new_experiment(client, "broken-artifacts")
    _break_artifact_folder(sqlite_store, name)
    with pytest.raises(ValueError) as raised:
        with tracking.TrackedRun(client, exp_id, "fails") as run:
            raise ValueError("deliberate failure")
    notes = " ".join(getattr(raised.value, "__notes__", []))
    observed["direct"] = {
        "status": client.get_run(run.run_id).info.status,
        "traceback_tag": client.get_run(run.run_id).data.tags.get("error.traceback"),
        "note": notes,
    }
    # Changed condition: the `train` command, whose first artifact (config.json)
    # already fails; the next start must find nothing to reconcile.
    name2, exp_id2 = sqlite_store.new_experiment(client, "broken-artifacts-cli")
    _break_artifact_folder(sqlite_store, name2)
    result = CliRunner().invoke(
        main,
        [
            "train",
            "--config",
            str(PROJECT_ROOT / "configs" / "tiny.json"),
            "--tracking-uri",
            sqlite_store.uri,
            "--experiment",
            name2,
        ],
    )
    cli_notes = " ".join(getattr(result.exception, "__notes__", []))
    (cli_run,) = tracking.iter_runs(client, exp_id2)
    with tracking.TrackedRun(client, exp_id2, "next start") as nxt:
        pass
    (sql_status,) = sqlite_store.sql(
        "SELECT status FROM runs WHERE run_uuid = ?", (cli_run.info.run_id,)
    )[0]
    observed["cli"] = {
        "exit_code": result.exit_code,
        "status": client.get_run(cli_run.info.run_id).info.status,
        "sql_status": sql_status,
        "note": cli_notes,
        "reconciled_by_next_start": nxt.reconciled,
    }
    said = "recorded as FAILED; its traceback artifact was not written"
    assert evidence.record(
        "an unwritable artifact folder still leaves a FAILED run, and says so",
        "TrackedRun directly, and the `train` command, artifact folder replaced by a file",
        observed,
        None,
        observed["direct"]["status"] == "FAILED"
        and observed["direct"]["traceback_tag"] == "not written"
        and said in notes
        and observed["cli"]["exit_code"] != 0
        and observed["cli"]["status"] == "FAILED" == sql_status
        and said in cli_notes
        and nxt.reconciled == [],
    ), observed


@pytest.mark.claims("fresh-store-created-in-turn")
def test_eight_processes_share_a_fresh_sqlite_store(evidence, tmp_path):
    """8 processes starting on a missing SQLite store create it in turn and all finish.

    Eight processes start together on a store file that does not exist yet
    (nobody created the schema before them): they take turns creating it, and
    every one of them ends its run FINISHED. Repeated on a second fresh file
    whose folder does not exist either."""
    import sqlite3

    observed = {}
    for label, path in (
        ("fresh file", tmp_path / "a" / "mlflow.db"),
        ("fresh file, new folder", tmp_path / "b" / "c" / "mlflow.db"),
    ):
        if label == "fresh file":
            path.parent.mkdir(parents=True)
        uri = f"sqlite:///{path}"
        gate = workers.barrier(8)
        with workers.processes(
            workers.fresh_store_worker, [(uri, "fresh", i, gate) for i in range(8)]
        ) as (procs, queue):
            results = sorted(queue.get(timeout=300) for _ in procs)
            for proc in procs:
                proc.join(timeout=300)
            codes = [proc.exitcode for proc in procs]
        with sqlite3.connect(path) as conn:
            statuses = sorted(s for (s,) in conn.execute("SELECT status FROM runs"))
            versions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
            leftovers = conn.execute(
                "SELECT name FROM sqlite_master WHERE name LIKE '_alembic_tmp%'"
            ).fetchall()
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        # The store stays usable: a later process opens it and sees all eight runs.
        later = tracking.connect(uri)
        seen = len(list(tracking.iter_runs(later, tracking.experiment_id(later, "fresh"))))
        observed[label] = {
            "exit_codes": codes,
            "errors": [r[2] for r in results if r[2]],
            "statuses": statuses,
            "alembic_versions": len(versions),
            "alembic_tmp_tables": len(leftovers),
            "integrity": integrity,
            "runs_seen_later": seen,
        }
    assert evidence.record(
        "eight processes starting together on a fresh SQLite store all succeed",
        "no schema before the workers; two fresh files",
        observed,
        {"exit_codes": [0] * 8, "statuses": ["FINISHED"] * 8},
        all(
            o["exit_codes"] == [0] * 8
            and o["errors"] == []
            and o["statuses"] == ["FINISHED"] * 8
            and o["alembic_versions"] == 1
            and o["alembic_tmp_tables"] == 0
            and o["integrity"] == "ok"
            and o["runs_seen_later"] == 8
            for o in observed.values()
        ),
    ), observed


# A TRACKING SERVER THAT GOES AWAY ---------------------------------------------


class _RecordingTime:
    """`time` for urllib3's `Retry`: records each sleep instead of sleeping."""

    def __init__(self, slept: list[float]) -> None:
        self.slept = slept

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    def __getattr__(self, name: str):
        return getattr(time, name)


class _ServiceUnavailable(http.server.BaseHTTPRequestHandler):
    """A tracking server whose database is down: every request gets a 503 that asks
    the client to come back in 30 s (`Retry-After`), which the bound ignores."""

    requests: list[str] = []

    def _answer(self) -> None:
        self.requests.append(self.path)
        self.send_response(503)
        self.send_header("Retry-After", "30")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.mark.claims("store-outage-bounded")
def test_an_unanswering_server_costs_one_bounded_call_then_none(evidence, monkeypatch):
    """MLflow's own client gives up after 5 attempts and 2 + 4 + 8 s of back-off; the
    circuit breaker then fails every later call at once, without a request.

    `bound_http_retries` on an empty environment gives the README's values and
    leaves a value the user set alone. With those values in force, a
    `GuardedClient` against a local server answering every request with 503 and
    `Retry-After: 30`: the server counts the attempts, urllib3's sleeps are
    recorded instead of slept (the 0 s back-off before the first retry is no
    sleep). The first call raises `StoreUnavailable` naming the store and the
    bound; two later calls raise the same message with no request sent."""
    from reproducible_experiments import outage

    bound: dict[str, str] = {}
    outage.bound_http_retries(bound)
    user = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}
    outage.bound_http_retries(user)
    for name, value in bound.items():
        monkeypatch.setenv(name, value)
    slept: list[float] = []
    monkeypatch.setattr(urllib3.util.retry, "time", _RecordingTime(slept))
    handler = type("Handler", (_ServiceUnavailable,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    uri = f"http://127.0.0.1:{server.server_port}"
    try:
        client = outage.GuardedClient(tracking_uri=uri)
        messages, requests_per_call, seconds = [], [], []
        for call in (
            lambda: client.get_run("0" * 32),
            lambda: client.set_tag("0" * 32, "note", "written?"),
            lambda: client.set_terminated("0" * 32, status="FAILED"),
        ):
            before, start = len(handler.requests), time.monotonic()
            with pytest.raises(outage.StoreUnavailable) as raised:
                call()
            seconds.append(round(time.monotonic() - start, 3))
            requests_per_call.append(len(handler.requests) - before)
            messages.append(str(raised.value))
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    expected_env = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
        "MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER": "false",
    }
    head = f"the tracking store `{uri}` could not be reached within 5 attempts and 14 s of back-off"
    observed = {
        "environment": bound,
        "user_value_kept": user["MLFLOW_HTTP_REQUEST_MAX_RETRIES"],
        "requests_per_call": requests_per_call,
        "backoff_sleeps_s": slept,
        "wall_s_per_call": seconds,
        "first_message": messages[0][:200],
        "later_messages_equal_first": messages[1:] == messages[:1] * 2,
    }
    assert evidence.record(
        "bounded retries, then the circuit breaker",
        "server answering 503 with Retry-After 30; three calls of one client",
        observed,
        {"requests_per_call": [5, 0, 0], "backoff_sleeps_s": [2, 4, 8]},
        bound == expected_env
        and observed["user_value_kept"] == "1"
        and requests_per_call == [5, 0, 0]
        and slept == [2, 4, 8]
        and messages[0].startswith(head)
        and observed["later_messages_equal_first"],
    ), observed


def _unreachable_client(down: dict[str, bool]) -> type:
    """Stands in for `tracking.Client` behind `GuardedClient`: the store goes away at
    the run's first metric write, and from then on every call fails as MLflow fails
    once its retries against an unreachable server are spent."""
    from mlflow.exceptions import MlflowException

    def through(name: str):
        real = getattr(tracking.Client, name)

        def method(self, *args, **kwargs):
            if name == "log_batch" and kwargs.get("metrics"):
                down["down"] = True
            if down["down"]:
                raise MlflowException(
                    f"API request to {self.tracking_uri} failed: Max retries exceeded"
                ) from requests.ConnectionError("connection refused")
            return real(self, *args, **kwargs)

        return method

    names = (
        "create_run get_run log_batch set_tag set_terminated log_text log_dict log_figure "
        "log_artifacts search_runs get_metric_history"
    ).split()
    return type("UnreachableClient", (), {name: through(name) for name in names})


def _stand_in_training(config, *, on_epoch=None, digits=None):
    """`train.train_and_evaluate` without the training (stage 1 tests that): each
    epoch's figures reported as it ends, and a small parameter tree to keep."""
    import numpy as np

    from reproducible_experiments import checkpoint, train

    history = []
    for epoch in range(1, config.num_epochs + 1):
        figures = {"train_loss": 1.0 / epoch, "val_loss": 1.5 / epoch, "val_accuracy": 0.1 * epoch}
        history.append({"epoch": epoch, **figures})
        if on_epoch is not None:
            on_epoch(history[-1])
    params = {"dense": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}
    return train.TrainResult(
        config=config,
        split={},
        data_identity={},
        history=history,
        test={"test_loss": 0.25, "test_accuracy": 0.75},
        params_sha256=checkpoint.digest(params),
        train_s=0.0,
        params=params,
    )


@pytest.fixture(scope="module")
def outage_train(sqlite_store, tmp_path_factory):
    """`train` (tiny config, checkpoint on) whose store goes away at its first metric
    write: the CLI's own path, with `outage.guard` giving a `GuardedClient` on the
    SQLite store and the store's calls failing as an unreachable server's do; the
    training itself is a stand-in (`_stand_in_training`), the record around it real.
    Returns what the exit left: the result, the run as SQL sees it, the kept folder."""
    from reproducible_experiments import outage, train

    workdir = tmp_path_factory.mktemp("outage-train")
    client = sqlite_store.client()
    name, exp_id = sqlite_store.new_experiment(client, "outage")
    down = {"down": False}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        patch.setattr(outage, "guard", lambda c: outage.GuardedClient(tracking_uri=c.tracking_uri))
        patch.setattr(outage, "Client", _unreachable_client(down))
        patch.setattr(train, "train_and_evaluate", _stand_in_training)
        result = CliRunner().invoke(
            main,
            [
                "train",
                "--config",
                str(PROJECT_ROOT / "configs" / "tiny.json"),
                "--tracking-uri",
                sqlite_store.uri,
                "--experiment",
                name,
            ],
        )
    (run,) = tracking.iter_runs(client, exp_id)
    run_id = run.info.run_id
    folder = workdir / "runs" / "unsent" / run_id
    end = json.loads((folder / "end.json").read_text()) if (folder / "end.json").is_file() else {}
    return {
        "workdir": workdir,
        "experiment": name,
        "result": result,
        "run_id": run_id,
        "sql_status": sqlite_store.sql("SELECT status FROM runs WHERE run_uuid = ?", (run_id,)),
        "sql_metrics": sqlite_store.sql(
            "SELECT count(*) FROM metrics WHERE run_uuid = ?", (run_id,)
        )[0][0],
        "folder": folder,
        "end": end,
        "checkpoint_kept": (folder / "checkpoint").is_dir(),
    }


@pytest.mark.claims("store-outage-bounded")
def test_a_train_that_meets_the_outage_ends_with_one_line(evidence, outage_train):
    """The `train` that meets the outage exits 1 with one line naming the store, the
    run left RUNNING, the unwritten values and the folder that keeps them.

    The line against the store (SQL: the run RUNNING with none of its values)
    and against the folder: `end.json` holds FAILED with `error.type`
    `StoreUnavailable`, every metric value (3 per epoch of the tiny config's 5,
    plus the 2 test figures) and `checkpoint/` the trained parameters."""
    result, run_id = outage_train["result"], outage_train["run_id"]
    lines = result.stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    end = outage_train["end"]
    values = 5 * 3 + 2
    unwritten = (
        f"run `{run_id}` is left RUNNING there; {values} of its {values} metric values "
        "were not written"
    )
    observed = {
        "exit_code": result.exit_code,
        "last_line": last,
        "traceback": "Traceback" in result.output,
        "sql_status": outage_train["sql_status"],
        "sql_metric_values": outage_train["sql_metrics"],
        "kept_status": end.get("status"),
        "kept_error_type": end.get("tags", {}).get("error.type"),
        "kept_metric_values": len(end.get("metrics", [])),
        "checkpoint_kept": outage_train["checkpoint_kept"],
    }
    assert evidence.record(
        "a train that meets the outage: one line, exit 1, everything kept",
        "tiny config; the store unreachable from the first metric write",
        observed,
        {"exit_code": 1, "kept_metric_values": values},
        result.exit_code == 1
        and isinstance(result.exception, SystemExit)
        and not observed["traceback"]
        and last.startswith("Error: the tracking store `sqlite:///")
        and "could not be reached within 5 attempts and 14 s of back-off" in last
        and unwritten in last
        and f"runs/unsent/{run_id}" in last
        and outage_train["sql_status"] == [("RUNNING",)]
        and outage_train["sql_metrics"] == 0
        and end.get("status") == "FAILED"
        and observed["kept_error_type"] == "StoreUnavailable"
        and bool(end.get("tags", {}).get("error.message"))
        and observed["kept_metric_values"] == values
        and observed["checkpoint_kept"],
    ), observed


@pytest.mark.claims("unsent-run-settled-later")
def test_the_next_train_writes_the_kept_run_first(evidence, sqlite_store, outage_train):
    """The next `train` on the store, once it answers, writes what the outage kept
    before it starts its own run, and removes the folder.

    The later `train` runs the CLI's own path up to its run; the run itself is
    replaced by a probe that looks at the store at the moment it would start:
    the kept run must already be FAILED at the kept end time, with the kept
    tags, every kept metric value once (by key and step), the `checkpoint/`
    artifact, and the folder gone."""
    from reproducible_experiments import record

    run_id, end = outage_train["run_id"], outage_train["end"]
    client = sqlite_store.client()
    seen: dict = {}

    class _Probe(Exception):
        pass

    def probe(store_client, exp_id, config, **kwargs):
        run = client.get_run(run_id)
        history = {
            key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            for key in {key for key, *_ in end["metrics"]}
        }
        seen.update(
            status=run.info.status,
            end_time=run.info.end_time,
            tags={k: run.data.tags.get(k) for k in end["tags"]},
            checkpoint_tag=run.data.tags.get("result.checkpoint"),
            artifacts=[a.path for a in client.list_artifacts(run_id, "checkpoint")],
            history=history,
            folder_left=outage_train["folder"].exists(),
        )
        raise _Probe

    kept = {}
    for key, value, _, step in end["metrics"]:
        kept.setdefault(key, []).append((step, value))
    kept = {key: sorted(values) for key, values in kept.items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(outage_train["workdir"])
        patch.setattr(record, "run_tracked", probe)
        result = CliRunner().invoke(
            main,
            [
                "train",
                "--config",
                str(PROJECT_ROOT / "configs" / "tiny.json"),
                "--tracking-uri",
                sqlite_store.uri,
                "--experiment",
                outage_train["experiment"],
            ],
        )
    observed = {
        "reached_the_run": isinstance(result.exception, _Probe),
        "status": seen.get("status"),
        "end_time_equals_kept": seen.get("end_time") == end["end_time_ms"],
        "tags_equal_kept": seen.get("tags") == end["tags"],
        "checkpoint_tag": seen.get("checkpoint_tag"),
        "checkpoint_artifacts": len(seen.get("artifacts", [])),
        "history_equals_kept": seen.get("history") == kept,
        "folder_left": seen.get("folder_left"),
    }
    assert evidence.record(
        "the next train writes the kept run first",
        "tiny config after an outage at the first metric write; SQLite store",
        observed,
        {"status": "FAILED", "folder_left": False},
        observed["reached_the_run"]
        and observed["status"] == "FAILED"
        and observed["end_time_equals_kept"]
        and observed["tags_equal_kept"]
        and observed["checkpoint_tag"] == "checkpoint/"
        and observed["checkpoint_artifacts"] > 0
        and observed["history_equals_kept"]
        and observed["folder_left"] is False,
    ), observed
