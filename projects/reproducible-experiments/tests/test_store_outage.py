"""The tracking database killed mid-run, behind a real `mlflow server`.

A throwaway PostgreSQL cluster and server of its own (the session's shared
one must not go down under other tests). A finished run first; then `train`
as a subprocess, and the moment its first metric values are in the database,
`pg_ctl stop -m immediate`. The process must end within the retry bound with
one line naming the store and no traceback, keeping its checkpoint; after
the database restarts, the next `train` must record the run as FAILED with
its error, every metric value, and leave the earlier run as it was.

The time limit is the bound `outage` states (a heartbeat interval, then at
most two calls' worth of retries: the call that meets the outage, and one
already in flight) plus a 300 s margin for training, JAX start-up and the
checkpoint on a loaded machine: a limit the process meets by minutes, that
only a retry loop longer than stated (MLflow's defaults: about 4 minutes per
call, several calls) can miss.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import services
from conftest import postgres_absent_outcome

from reproducible_experiments import outage, tracking

CLI = str(Path(sys.executable).parent / "reproducible-experiments")
HEARTBEAT_S = tracking.LEASE_S / 3
LIMIT_S = HEARTBEAT_S + 2 * outage.CALL_BOUND_S + 300


def _sql(backend_uri: str, query: str, params: tuple = ()) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(backend_uri.replace("postgresql+psycopg2://", "postgresql://"))
    try:
        with conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall()
    finally:
        conn.close()


def _pg_ctl(bin_dir: Path, datadir: Path, *args: str) -> None:
    cmd = [str(bin_dir / "pg_ctl"), "-D", str(datadir), *args]
    subprocess.run(services._as_postgres(cmd), check=True, capture_output=True, timeout=600)


def _snapshot(client, run_id: str) -> dict:
    run = client.get_run(run_id)
    return {
        "status": run.info.status,
        "end_time": run.info.end_time,
        "tags": dict(run.data.tags),
        "metrics": {
            key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            for key in run.data.metrics
        },
    }


def _wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.05)


def _answers(uri: str) -> bool:
    try:
        tracking.connect(uri).search_experiments(max_results=1)
    except Exception:  # noqa: BLE001 - still restarting; polled again.
        return False
    return True


@pytest.fixture
def pg():
    bin_dir = services.pg_bin_dir()
    if bin_dir is None:
        outcome, reason = postgres_absent_outcome(dict(os.environ))
        (pytest.fail if outcome == "fail" else pytest.skip)(reason)
    with services.postgres_cluster(bin_dir) as backend_uri:
        with services.mlflow_server(backend_uri) as server_uri:
            yield bin_dir, backend_uri, server_uri


def test_a_killed_database_ends_the_run_within_the_bound_and_fails_it_after(pg, tmp_path):
    bin_dir, backend_uri, uri = pg
    outage.bound_http_retries()  # This process's own client, for the checks.
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    for name in [n for n in env if n.startswith("MLFLOW_HTTP_")]:
        del env[name]  # The CLI's own bound, not one inherited from the test.
    tiny = json.loads((Path(__file__).parents[1] / "configs" / "tiny.json").read_text())
    (tmp_path / "tiny.json").write_text(json.dumps(tiny))
    # 400 epochs: the first background write (300 values, epoch 100) lands well
    # before training ends, and the rest meets the outage.
    long = {**tiny, "num_epochs": 400, "hidden_size": 256, "batch_size": 16}
    (tmp_path / "long.json").write_text(json.dumps(long))
    args = ["--tracking-uri", uri, "--experiment", "outage"]

    def train(config: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [CLI, "train", "--config", config, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )

    earlier = train("tiny.json")
    assert earlier.returncode == 0, earlier.stderr
    client = tracking.connect(uri)
    exp_id = client.get_experiment_by_name("outage").experiment_id
    (earlier_id,) = [r.info.run_id for r in client.search_runs([exp_id])]
    earlier_before = _snapshot(client, earlier_id)

    proc = subprocess.Popen(
        [CLI, "train", "--config", "long.json", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rows = _wait_until(
            lambda: _sql(
                backend_uri,
                "SELECT r.run_uuid, count(m.key) FROM runs r JOIN metrics m "
                "ON m.run_uuid = r.run_uuid WHERE r.run_uuid <> %s GROUP BY r.run_uuid",
                (earlier_id,),
            ),
            600,
            "the first metric values of the long run",
        )
        ((run_id, _),) = rows
        before = {
            (key, step): value
            for key, step, value in _sql(
                backend_uri,
                "SELECT key, step, value FROM metrics WHERE run_uuid = %s",
                (run_id,),
            )
        }
        (datadir,) = _sql(backend_uri, "SHOW data_directory")[0]
        assert proc.poll() is None, "training ended before the fault; lengthen it"
        _pg_ctl(bin_dir, Path(datadir), "-m", "immediate", "-w", "stop")
        fault = time.monotonic()
        try:
            out, err = proc.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`train` still running {LIMIT_S:.0f} s after the database was killed")
        ended_s = time.monotonic() - fault
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    last = err.strip().splitlines()[-1]
    print(f"train ended {ended_s:.1f} s after the fault (limit {LIMIT_S:.0f} s): {last}")

    assert proc.returncode == 1, err
    assert "Traceback" not in err, err
    assert last.startswith("Error: the tracking store `" + uri), err
    assert f"run `{run_id}` is left RUNNING" in last
    assert f"of its {400 * 3 + 2} metric values were not written" in last
    folder = tmp_path / "runs" / "unsent" / run_id
    assert (folder / "checkpoint").is_dir() and (folder / "end.json").is_file()

    # Restart with the options the cluster was started with (`postmaster.opts`).
    port = backend_uri.rsplit(":", 1)[1].split("/")[0]
    options = f"-h 127.0.0.1 -p {port} -k {Path(datadir).parent} -c fsync=off"
    _pg_ctl(
        bin_dir,
        Path(datadir),
        "-l",
        str(Path(datadir).parent / "server.log"),
        "-o",
        options,
        "-w",
        "-t",
        "60",
        "start",
    )
    _wait_until(lambda: _answers(uri), 300, "the server answering after the restart")
    assert client.get_run(run_id).info.status == "RUNNING"  # Nothing wrote it meanwhile.

    after = train("tiny.json")  # The next start on this store settles the run first.
    assert after.returncode == 0, after.stderr
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["error.type"] == "StoreUnavailable"
    assert run.data.tags["error.message"].startswith(f"the tracking store `{uri}`")
    assert run.data.tags["result.checkpoint"] == "checkpoint/"
    assert [a.path for a in client.list_artifacts(run_id)].count("checkpoint") == 1
    assert not folder.exists()
    stored = {
        (key, step): value
        for key, step, value in _sql(
            backend_uri, "SELECT key, step, value FROM metrics WHERE run_uuid = %s", (run_id,)
        )
    }
    assert len(stored) == 400 * 3 + 2 and before
    assert {k: stored[k] for k in before} == before  # Kept as written before the fault.
    assert _snapshot(client, earlier_id) == earlier_before
