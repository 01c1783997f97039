"""Stage 3: serving, with real server processes on 127.0.0.1.

Independent checks: readiness only after the hash check, warm-up and golden
self-test; each server's listening sockets read from /proc (127.0.0.1 only);
the server's answers against the in-process model (per row, so batching
cannot mix rows up) and the label map; every bad request's status and
message, followed by a good request; the batch records summed against the
rows sent; a burst into a tiny queue (503 with Retry-After, never a crash,
then normal service); three wrong artifacts (altered bytes, a swapped model
with a regenerated manifest, a pinned hash) that must never become ready; the
fitted model against the measured server latencies and CPU. Changed
conditions: two load rates, three wrong artifacts. Every server is stopped
when the module ends.
"""

import asyncio
import contextlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from deployment_audit import data, export, loadgen, report, train
from deployment_audit.cli import main
from deployment_audit.config import Config, LoadConfig, ServeConfig

SERVE = ServeConfig(batch_timeout_ms=5.0)
TINY_QUEUE = ServeConfig(
    max_batch_size=64, batch_timeout_ms=300.0, max_queue_rows=8, max_rows_per_request=8
)


@pytest.fixture(scope="module")
def other_artifact(tmp_path_factory):
    """Another model (seed 1), exported with its own consistent manifest and golden."""
    other = train.train_and_evaluate(Config.tiny().model_copy(update={"seed": 1, "num_epochs": 3}))
    out = tmp_path_factory.mktemp("other") / "artifact"
    exported = export.export_model(other["_params"], other["_spec"]["preprocessing"])
    export.write_artifact(out, exported, other["_spec"], other["_golden"])
    return out


@pytest.fixture(scope="module")
def servers(artifact, other_artifact, tmp_path_factory):
    """Five servers, started at once: good, tiny-queue, and three wrong artifacts."""
    root = tmp_path_factory.mktemp("wrong")
    altered = root / "altered"
    shutil.copytree(artifact, altered)
    blob = bytearray((altered / export.ARTIFACT_FILE).read_bytes())
    blob[len(blob) // 2] ^= 0x01
    (altered / export.ARTIFACT_FILE).write_bytes(bytes(blob))
    # A swapped model: the other model's bytes, with the manifest's hash regenerated to
    # match them, next to THIS model's golden sample. Every hash checks out; only the
    # self-test on the golden inputs can tell.
    swapped = root / "swapped"
    shutil.copytree(artifact, swapped)
    other_blob = (other_artifact / export.ARTIFACT_FILE).read_bytes()
    (swapped / export.ARTIFACT_FILE).write_bytes(other_blob)
    manifest = json.loads((swapped / export.MANIFEST_FILE).read_text())
    manifest.update(sha256=export.sha256(other_blob), size_bytes=len(other_blob))
    (swapped / export.MANIFEST_FILE).write_text(json.dumps(manifest))
    pinned = json.loads((artifact / export.MANIFEST_FILE).read_text())["sha256"]
    procs = {
        "good": loadgen.ServerProcess(artifact, SERVE),
        "tiny_queue": loadgen.ServerProcess(artifact, TINY_QUEUE),
        "altered bytes": loadgen.ServerProcess(altered, SERVE),
        "swapped model": loadgen.ServerProcess(swapped, SERVE),
        "another version than pinned": loadgen.ServerProcess(
            other_artifact, SERVE, expect_sha256=pinned
        ),
    }
    with contextlib.ExitStack() as stack:
        for proc in procs.values():
            stack.enter_context(contextlib.closing(_Stopper(proc)))
            proc.start()
        for proc in procs.values():
            proc.wait_listening()
        yield procs
    for proc in procs.values():  # The cleanup check: every child has exited.
        assert proc.proc.poll() is not None


class _Stopper:
    def __init__(self, proc):
        self.proc = proc

    def close(self):
        self.proc.__exit__(None, None, None)


@pytest.fixture(scope="module")
def good(servers):
    ready = servers["good"].wait_ready()
    assert ready["status"] == "ready", (ready, servers["good"].log())
    return servers["good"], ready


@pytest.mark.claims("ready-after-load-warm-up-self-test", "server-loads-after-hash-check")
def test_ready_only_after_load_and_self_test(evidence, good, artifact):
    """The server is alive, then ready with the manifest's sha256, a passed golden self-test and
    every bucket warmed."""
    server, ready = good
    manifest = json.loads((artifact / export.MANIFEST_FILE).read_text())
    with httpx.Client(base_url=server.url) as client:
        health = client.get("/healthz")
    observed = {
        "healthz": health.status_code,
        "readyz": ready["http_status"],
        "sha256_matches_manifest": ready["sha256"] == manifest["sha256"],
        "self_test": ready["self_test"],
        "buckets": ready["buckets"],
    }
    assert evidence.record(
        "healthz alive; readyz ready after hash check, warm-up and golden self-test",
        "the session's artifact, batch timeout 5 ms",
        observed,
        None,
        health.status_code == 200
        and ready["http_status"] == 200
        and observed["sha256_matches_manifest"]
        and ready["self_test"]["passed"]
        and ready["buckets"] == [1, 2, 4, 8, 16, 32, 64],
    )


def _listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket that process `pid` holds, read
    from /proc by the test itself: the socket inodes among its open files, looked up
    in its network namespace's IPv4 and IPv6 tables (state 0A: listening)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # Closed since the listing.
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:
                continue
            host, port = local.split(":")
            raw = bytes.fromhex(host)  # 32-bit words in the host's (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return sorted(found)


@pytest.mark.claims("server-localhost-only")
def test_every_server_listens_on_127_0_0_1_only(evidence, servers, good):
    """Each server the stage started (`deployment-audit serve` in a child process) holds
    one listening socket, bound to 127.0.0.1 at the port it announced, and none on any
    other address (0.0.0.0, ::, an interface's own): read from the kernel's socket
    tables for the server's process, not from what the server says. Servers of the
    wrong artifacts that have exited are left out; the good one must be running."""
    if not (Path("/proc/self/fd").is_dir() and Path("/proc/self/net/tcp").exists()):
        pytest.skip("reads a process's listening sockets from /proc, which this machine lacks")
    observed = {}
    for name, proc in servers.items():
        if proc.proc.poll() is not None:
            continue
        port = int(proc.url.rsplit(":", 1)[1])
        observed[name] = {"announced_port": port, "listening": _listening_sockets(proc.proc.pid)}
    assert evidence.record(
        "servers listen on 127.0.0.1 only",
        f"{len(observed)} running server processes of the stage",
        observed,
        {"listening": "[(127.0.0.1, announced port)]"},
        "good" in observed
        and all(o["listening"] == [("127.0.0.1", o["announced_port"])] for o in observed.values()),
    ), observed


def test_a_server_that_cannot_start_says_why(tmp_path):
    """A server that exits before it listens raises `ServerStartError` carrying the server's
    own output, read before the server's folder is removed: here click's message for an
    artifact path that does not exist."""
    missing = tmp_path / "no artifact here"
    server = loadgen.ServerProcess(missing, SERVE)
    with pytest.raises(loadgen.ServerStartError) as info:
        server.start().wait_listening()
    message = str(info.value)
    assert message.startswith("The server did not start listening:"), message
    assert f"Directory '{missing}' does not exist." in message, message
    assert server.proc.poll() is not None


@pytest.mark.claims("server-answers-with-label-map", "dynamic-batching")
def test_answers_match_the_in_process_model_per_row(evidence, good, artifact):
    """20 concurrent one-row answers equal in-process single-row logits within 1e-5, label map and
    batch rows agreeing.

    Size: 0 in the sweep: which rows share a batch depends on timing, so every contiguous
    batch of the 20 rows, padded to its bucket (210 per model, 4 training seeds), was
    compared with single-row calls: at most 9.5e-7 apart (2 ulps of the largest logit),
    a tenth of 1e-5. Power: a row answered with another row's logits, or from a
    mis-padded batch, is off by far more.
    (sweep: evidence/size_sweep.json, the `size_sweep` script beside the tests)"""
    server, _ = good
    images = data.load().images
    loaded = export.load_artifact(artifact)
    rows = images[200:220]

    async def burst():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(
                *[
                    client.post("/predict", json={"inputs": rows[i : i + 1].tolist()})
                    for i in range(20)
                ]
            )

    before = _metrics(server)
    responses = asyncio.run(burst())
    after = _metrics(server)
    bodies = [r.json() for r in responses]
    served = np.asarray([b["logits"][0] for b in bodies], np.float32)
    single = np.concatenate([loaded.predict(rows[i : i + 1]) for i in range(20)])
    new_batches = after["batches"][len(before["batches"]) :]
    observed = {
        "statuses": sorted({r.status_code for r in responses}),
        "max_abs_diff_vs_single_row_calls": float(np.abs(served - single).max()),
        "labels_follow_the_label_map": all(
            b["labels"][0] == data.LABELS[b["predictions"][0]] for b in bodies
        ),
        "rows_in_batches": sum(b["rows"] for b in new_batches),
        "batches": len(new_batches),
        "largest_batch_requests": max(b["requests"] for b in new_batches),
    }
    # 1e-5: a row computed inside a padded batch may round its float32 sums differently.
    assert evidence.record(
        "served logits equal the in-process model row by row; batches hold every row once",
        "20 concurrent one-row requests",
        observed,
        {"max_abs_diff": 1e-5},
        observed["statuses"] == [200]
        and observed["max_abs_diff_vs_single_row_calls"] <= 1e-5
        and observed["labels_follow_the_label_map"]
        and observed["rows_in_batches"] == 20
        and observed["largest_batch_requests"] > 1,
    )


BAD_REQUESTS = [
    ("malformed JSON", b'{"inputs": [[1, 2', 400, "not valid JSON"),
    ("not an object", b"[1, 2]", 400, "JSON object with an `inputs` field"),
    ("unknown field", b'{"inputs": [], "x": 1}', 400, "Unknown fields"),
    ("wrong shape", json.dumps({"inputs": [[0.0] * 63]}).encode(), 422, "must have 64 features"),
    ("wrong rank", json.dumps({"inputs": [0.0] * 64}).encode(), 422, "must have rank 2"),
    ("ragged", json.dumps({"inputs": [[0.0] * 64, [0.0] * 63]}).encode(), 422, "rectangular"),
    ("strings", json.dumps({"inputs": [["a"] * 64]}).encode(), 422, "must be a JSON number"),
    (
        "dtype float64",
        json.dumps({"inputs": [[0.0] * 64], "dtype": "float64"}).encode(),
        422,
        "must be `float32`",
    ),
    ("out of range", json.dumps({"inputs": [[0.5] * 63 + [255.0]]}).encode(), 422, r"\[0, 16\]"),
    ("too many rows", json.dumps({"inputs": [[0.0] * 64] * 65}).encode(), 400, "at most 64"),
    ("object as a row", b'{"inputs": [{"a": 1}]}', 422, r"`inputs\[0\]` must be a list"),
    ("object as a pixel", json.dumps({"inputs": [[{"a": 1}] * 64]}).encode(), 422, "JSON number"),
    (
        "400-digit integer pixel",
        b'{"inputs": [[' + b"9" * 400 + b", 0" * 63 + b"]]}",
        422,
        "integer of 400 digits",
    ),
    ("400-digit integer at the top level", b"9" * 400, 400, "JSON object with an `inputs`"),
    ("400-digit integer as dtype", b'{"inputs": [], "dtype": ' + b"9" * 400 + b"}", 422, "float32"),
    ("5000-digit integer", b'{"inputs": [[' + b"9" * 5000 + b"]]}", 400, "not valid JSON"),
    ("NaN pixel", b'{"inputs": [[NaN' + b", 0" * 63 + b"]]}", 422, r"\[0, 16\]"),
    ("nested 100000 deep", b"[" * 100_000 + b"]" * 100_000, 400, "nests 100000 levels"),
    (
        "nested 100000 deep inside inputs",
        b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        "nests 100001 levels",
    ),
    ("nested 5 deep inside inputs", b'{"inputs": [[[[0]]]]}', 400, "nests 5 levels"),
    ("brackets inside a string", b'{"inputs": [], "dtype": "[[[[[[["}', 422, "float32"),
]


@pytest.mark.claims("bad-requests-4xx-server-keeps-serving")
def test_bad_requests_get_4xx_and_the_server_keeps_serving(evidence, good):
    """Each of 21 bad requests gets its 4xx status and message, and a good request after them gets
    200."""
    server, _ = good
    seen = []
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for name, body, status, message in BAD_REQUESTS:
            response = client.post("/predict", content=body)
            seen.append({"case": name, "status": response.status_code, **response.json()})
            assert response.status_code == status, (name, response.text)
            assert __import__("re").search(message, response.json()["error"]), (name, response.text)
        after = client.post("/predict", json={"inputs": [[0.0] * 64]})
        wrong_method = client.get("/predict")
    assert evidence.record(
        "bad requests: 4xx with a message, then normal service",
        f"{len(BAD_REQUESTS)} kinds of bad request",
        {
            "responses": seen,
            "good_request_after": after.status_code,
            "get_on_predict": wrong_method.status_code,
        },
        None,
        after.status_code == 200 and wrong_method.status_code == 405,
    )


@pytest.mark.claims("full-queue-503-retry-after", "queue-refuses-past-row-bound")
def test_overload_gets_503_never_a_crash(evidence, servers):
    """A burst into an 8-row queue gets 503s with Retry-After, batches of at most 8 rows, then
    normal service."""
    server = servers["tiny_queue"]
    assert server.wait_ready()["status"] == "ready", server.log()
    row = data.load().images[:1].tolist()

    async def burst():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(
                *[client.post("/predict", json={"inputs": row}) for _ in range(40)]
            )

    responses = asyncio.run(burst())
    statuses = [r.status_code for r in responses]
    rejected = [r for r in responses if r.status_code == 503]
    with httpx.Client(base_url=server.url, timeout=120) as client:
        after = client.post("/predict", json={"inputs": row}).status_code
        metrics = client.get("/metrics").json()
    rows_per_batch = [b["rows"] for b in metrics["batches"]]
    observed = {
        "ok": statuses.count(200),
        "rejected_503": len(rejected),
        "rows_per_batch": rows_per_batch,
        "other_statuses": sorted(set(statuses) - {200, 503}),
        "retry_after_on_every_503": all(r.headers.get("retry-after") == "1" for r in rejected),
        "server_counted_rejections": metrics["rejected_overload"],
        "good_request_after": after,
        "process_alive": server.proc.poll() is None,
    }
    assert evidence.record(
        "overload: a full queue answers 503 (backpressure), then serves normally",
        "queue of 8 rows, batch timeout 300 ms, 40 concurrent one-row requests",
        observed,
        None,
        observed["ok"] >= 1
        and observed["rejected_503"] >= 1
        # The queue holds at most 8 rows and drains only into batches, so no batch
        # can exceed 8 rows; a 503 means it was full, so one batch held exactly 8.
        and max(rows_per_batch) == TINY_QUEUE.max_queue_rows
        and sum(rows_per_batch) == observed["ok"] + 1  # + the request after the burst
        and not observed["other_statuses"]
        and observed["retry_after_on_every_503"]
        and observed["server_counted_rejections"] == len(rejected)
        and after == 200
        and observed["process_alive"],
    )


@pytest.mark.claims(
    "wrong-model-never-ready",
    "server-loads-after-hash-check",
    "ready-after-load-warm-up-self-test",
)
@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("altered bytes", "truncated or altered; refusing to deserialize"),
        ("swapped model", "failed its self-test on the golden inputs"),
        ("another version than pinned", "expected model version"),
    ],
)
def test_a_wrong_artifact_never_becomes_ready(evidence, servers, case, reason):
    """A server on altered bytes, a swapped model or not the pinned version stays alive but never
    ready, saying why."""
    server = servers[case]
    first = server.wait_ready()
    time.sleep(0.5)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        health = client.get("/healthz").status_code
        again = client.get("/readyz")
        predict = client.post("/predict", json={"inputs": [[0.0] * 64]})
    observed = {
        "status": first["status"],
        "reason": first["reason"],
        "healthz": health,
        "readyz_later": again.status_code,
        "predict": predict.status_code,
    }
    assert evidence.record(
        "a server on a wrong artifact stays alive and never becomes ready",
        case,
        observed,
        None,
        first["status"] == "failed"
        and reason in first["reason"]
        and health == 200
        and again.status_code == 503
        and predict.status_code == 503,
    )


def _metrics(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        return client.get("/metrics").json()


def queue_model_verdict(checks: list[dict], batches: list[dict]) -> dict:
    """The load test's verdict on the queue model, from `checks` (the capacity
    report's) and the server's batch records.

    The model's server-side p50 (batch wait + service) within 3x of the measured
    one, or 3 ms: the event loop shares two busy cores with the load generator.
    Other jobs on the machine stretch the server's wall times by a factor the
    server's own batch records show (wall time of a model call over the CPU
    time its thread got); the bound is widened by that measured factor only,
    so on a quiet machine it is the plain 3x. CPU per request at the rate NOT
    used for the fit: a prediction, within 3x."""
    calls = [b for b in batches if b["compute_cpu_s"] > 0]
    stretches = [b["compute_s"] / b["compute_cpu_s"] for b in calls]
    stretch = max(1.0, float(np.median(stretches))) if stretches else 1.0
    p50_ok = all(
        1 / (3 * stretch) <= c["server_p50_ratio"] <= 3 * stretch
        or abs(c["server_p50_measured_s"] - c["server_p50_simulated_s"]) <= 3e-3 * stretch
        for c in checks
    )
    cpu = [
        c["cpu_per_request_measured_s"] / c["cpu_per_request_predicted_s"]
        for c in checks
        if not c["used_for_fit"]
    ]
    return {
        "stretch": stretch,
        "p50_ok": p50_ok,
        "cpu_ratios": cpu,
        "cpu_ok": all(1 / 3 <= ratio <= 3 for ratio in cpu),
    }


@pytest.mark.claims("open-loop-poisson-load", "queue-model-checked", "report-three-sections")
def test_load_measurement_and_queue_model(evidence, good, tmp_path):
    """Every Poisson-load request is answered; the queue model's p50 and CPU predictions are within
    3x of measured.

    Size: not established: the measured figures depend on the machine's other work more
    than on any key, and the bound is widened by the wall/CPU stretch the server's own
    batch records show. Five runs on a shared 2-core machine (schedule seeds 0-4, one
    server, stretch 2.6 to 5.0) gave p50 ratios 0.81 to 1.72 and CPU ratios 0.76 to
    1.02 against 1/3 to 3; none failed. Power: a queue model 3x (times the stretch) off
    the measured p50, or 3x off the CPU per request, fails.
    (sweep: evidence/size_sweep.json, the `size_sweep` script beside the tests)"""
    server, ready = good
    # The tiny workload, with its client timeout and per-rate stop as hang guards
    # only: on a loaded machine every request must still be answered.
    config = LoadConfig.tiny().model_copy(
        update={"request_timeout_s": 60.0, "max_seconds_per_rate": 300.0}
    )
    result = loadgen.measure(server.url, config, SERVE, ready)
    runs = result["observed_cpu"]["runs"]
    checks = result["simulated_queue"]["checks"]
    (tmp_path / "load.json").write_text(json.dumps(result))
    report.plot_load(result, tmp_path / "load.png")
    table = report.load_table(result)
    observed = {
        "rates": [r["rate_rps"] for r in runs],
        "ok": [r["ok"] for r in runs],
        "statuses": [r["statuses"] for r in runs],
        "latency_ms": [{k: 1e3 * v for k, v in r["latency"].items()} for r in runs],
        "throughput_rps": [r["throughput_rps"] for r in runs],
        "offered_rps": [r["offered_rps"] for r in runs],
        "sustained": [r["sustained"] for r in runs],
        "model": result["simulated_queue"]["model"],
        "capacity": result["simulated_queue"]["capacity"],
        # Recorded, not asserted: whether a rate is sustained on a shared 2-core
        # machine depends on the other jobs as much as on the server.
        "capacity_check": result["simulated_queue"]["capacity_check"],
        "checks": checks,
    }
    all_ok = all(r["ok"] == r["requests"] for r in runs)
    ordered = all(
        r["latency"]["p50_s"] <= r["latency"]["p95_s"] <= r["latency"]["p99_s"] for r in runs
    )
    verdict = queue_model_verdict(checks, _metrics(server)["batches"])
    observed["wall_over_cpu_per_model_call"] = verdict["stretch"]
    p50_ok, cpu_ok = verdict["p50_ok"], verdict["cpu_ok"]
    edge = result["edge_device_claims"]["claims"]
    sections = set(result) >= {"observed_cpu", "simulated_queue", "edge_device_claims"}
    assert evidence.record(
        "Poisson load at two rates: every request answered; the queue model checked",
        f"rates {list(config.rates)} req/s, {config.requests_per_rate} requests each, sizes "
        f"{list(config.request_sizes)} rows",
        observed,
        {"server_p50_ratio": "[1/3, 3] x wall/CPU stretch", "cpu_per_request_ratio": [1 / 3, 3]},
        all_ok and ordered and p50_ok and cpu_ok and sections,
    )
    assert all(c["measured"] is False and c["latency_s"] is None for c in edge)
    assert "UNMEASURED" in table and "OBSERVED" in table and "SIMULATED" in table
    assert (tmp_path / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_refuses_a_bad_config(tmp_path):
    """serve refuses max_rows_per_request above max_batch_size with exit 2 and a message naming
    both."""
    path = tmp_path / "serve.json"
    path.write_text('{"max_batch_size": 8, "max_rows_per_request": 16}')
    result = CliRunner().invoke(main, ["serve", str(tmp_path), "--config", str(path)])
    assert result.exit_code == 2
    assert "`max_rows_per_request` (16) must not exceed `max_batch_size` (8)" in result.output
