"""Stage 3: serving and capacity, with real server processes on 127.0.0.1.

Independent checks: the server's answers against the in-process model (per
row, so batching cannot mix rows up) and the label map; every bad request's
status and message, followed by a good request; the batch records summed
against the rows sent; a burst into a tiny queue (503 with Retry-After, never
a crash, then normal service); three wrong artifacts (altered bytes, a
swapped model with a regenerated manifest, a pinned hash) that must never
become ready; the queue simulator against the M/D/1 Pollaczek-Khinchine
formula; the fitted model against the measured server latencies and CPU.
Changed conditions: two load rates, two utilizations, three wrong artifacts.
Every server is stopped when the module ends.
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
import jax
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from deployment_audit import data, export, loadgen, queue_model, report, serve, train
from deployment_audit.cli import main
from deployment_audit.config import Config, LoadConfig, ServeConfig

SERVE = ServeConfig(batch_timeout_ms=5.0)
TINY_QUEUE = ServeConfig(
    max_batch_size=64, batch_timeout_ms=300.0, max_queue_rows=8, max_rows_per_request=8
)


FAST = settings(max_examples=150, derandomize=True, deadline=None, database=None)


def next_power_of_two(rows: int) -> int:
    size = 1
    while size < rows:
        size *= 2
    return size


@pytest.mark.parametrize("max_batch", [1, 8, 48, 64])
def test_bucket_is_the_next_power_of_two_capped(max_batch):
    """bucket(rows) equals the next power of two capped at max_batch, computed by a loop, for 4
    caps."""
    for rows in range(1, max_batch + 1):
        assert serve.bucket(rows, max_batch) == min(max_batch, next_power_of_two(rows)), rows


def capacity_reference(a, c, h, mean_rows, max_batch):
    """The saturation rates from their definitions: the worker packs as many whole
    requests of `mean_rows` rows (at least 1) as fit, padded to its bucket."""
    per_batch = max(1, int(max_batch // max(mean_rows, 1.0)))
    rows = min(max_batch, int(round(per_batch * mean_rows)))
    worker = per_batch / (a + c * min(max_batch, next_power_of_two(rows)))
    loop = 1.0 / h if h > 0 else float("inf")
    return loop, worker


@pytest.mark.claims("queue-model-checked")
@FAST
@given(
    a=st.floats(1e-4, 1e-2),
    c=st.floats(1e-6, 1e-3),
    h=st.sampled_from([0.0, 1e-5, 2e-4, 3e-3, 0.5, 2.0]),
    mean_rows=st.sampled_from([0.6, 1.0, 1.5, 2.0, 3.0, 7.5, 20.0, 40.0, 64.0]),
    max_batch=st.sampled_from([8, 48, 64]),
)
def test_capacity_against_its_definition(a, c, h, mean_rows, max_batch):
    """queue_model.capacity equals the loop and worker limits rebuilt from their definitions, over
    hypothesis inputs."""
    model = {"a_s": a, "c_s_per_row": c, "h_s": h, "mean_rows": mean_rows}
    got = queue_model.capacity(model, max_batch)
    loop, worker = capacity_reference(a, c, h, mean_rows, max_batch)
    assert got["loop_limit_rps"] == pytest.approx(loop, rel=1e-12)
    assert got["worker_limit_rps"] == pytest.approx(worker, rel=1e-12)
    assert got["capacity_rps"] == pytest.approx(min(loop, worker), rel=1e-12)
    assert got["bottleneck"] == ("event loop" if loop < worker else "model worker")


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


class _EchoModel:
    """A stand-in for the artifact: the logits are a row's first ten pixels, so
    every answer shows which rows it was computed from."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x[:, :10], np.float32)


def _batcher_scenario(max_queue_rows: int, sizes: list[int]) -> tuple[list, list]:
    """Requests of `sizes` rows (request i holds the value i) submitted back to back
    into a batcher with batches of at most 4 rows; returns what each request got
    and the batches' rows and request counts."""
    config = ServeConfig(
        max_batch_size=4,
        batch_timeout_ms=50.0,
        max_queue_rows=max_queue_rows,
        max_rows_per_request=4,
    )

    async def scenario():
        stats = serve.Stats()
        batcher = serve.Batcher(_EchoModel(), config, stats)
        runner = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)  # The batcher waits for work.
        tasks = [
            asyncio.create_task(batcher.submit(np.full((n, data.NUM_FEATURES), i, np.float32)))
            for i, n in enumerate(sizes)
        ]
        answers = asyncio.gather(*tasks, return_exceptions=True)
        # A liveness guard, not a timing check: the batcher's loop only ends by failing.
        await asyncio.wait({answers, runner}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if runner.done():
            runner.result()  # Raises the error that stopped the batcher.
            raise AssertionError("the batcher stopped with requests unanswered")
        if not answers.done():
            raise AssertionError("the batcher left requests unanswered for 120 s")
        got = answers.result()
        runner.cancel()
        return got, [(b["rows"], b["requests"]) for b in stats.batches]

    got, batches = asyncio.run(scenario())
    for g in got:  # Only a full queue may refuse a request; any other error is the batcher's.
        if isinstance(g, BaseException) and not isinstance(g, serve.Overloaded):
            raise g
    answers = [
        "503" if isinstance(g, serve.Overloaded) else sorted({float(v) for v in np.ravel(g)})
        for g in got
    ]
    return answers, batches


@pytest.mark.claims(
    "dynamic-batching",
    "queue-admits-within-row-bound",
    "queue-refuses-past-row-bound",
    "batch-whole-requests-in-order",
    "batch-no-jumping-ahead",
    "batch-fills-exactly",
)
def test_the_queue_bound_counts_rows_and_batches_hold_whole_requests(evidence):
    """The queue bound counts rows and batches take whole requests, against hand-worked answers.

    In-process, no server: six requests of 1, 2, 3, 1, 2, 1 rows arrive before
    the batcher runs. The expectation is worked out by hand from the rules (accept
    while the queued rows stay within the bound; a batch takes whole requests
    from the head up to 4 rows). Repeated with a bound of 6 and of 7 rows."""
    sizes = [1, 2, 3, 1, 2, 1]
    expected = {
        6: (["0", "1", "2", "503", "503", "503"], [(3, 2), (3, 1)]),
        7: (["0", "1", "2", "3", "503", "503"], [(3, 2), (4, 2)]),
    }
    observed, ok = {}, True
    for bound, (answers, batches) in expected.items():
        got, got_batches = _batcher_scenario(bound, sizes)
        shown = [g if g == "503" else ",".join(f"{v:g}" for v in g) for g in got]
        observed[f"bound {bound}"] = {"answers": shown, "batches": got_batches}
        ok &= shown == answers and got_batches == batches
    assert evidence.record(
        "queue bound in rows, and batches of whole requests",
        "requests of 1, 2, 3, 1, 2, 1 rows; batches of at most 4; queue bound 6 and 7 rows",
        observed,
        {k: {"answers": v[0], "batches": v[1]} for k, v in expected.items()},
        ok,
    ), observed


@pytest.mark.claims(
    "dynamic-batching",
    "batch-whole-requests-in-order",
    "batch-no-jumping-ahead",
    "batch-fills-exactly",
)
def test_a_batch_never_passes_its_maximum():
    """Batches never pass 4 rows and take whole requests in arrival order, as worked out by hand.

    Requests of 1, 4, 2, 2, 3, 1 rows, all queued (bound 20), batches of at most 4
    rows, worked out by hand: the 4-row request cannot join the 1-row one (5 > 4),
    two requests fill a batch exactly (2 + 2, 3 + 1)."""
    answers, batches = _batcher_scenario(20, [1, 4, 2, 2, 3, 1])
    assert answers == [[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]]
    assert batches == [(1, 1), (4, 1), (4, 2), (4, 2)]


NEVER_S = 600.0  # A batch timeout no correct run reaches: the full batch must not wait for it.
GUARD_S = 30.0  # How long the test waits for an answer that needs a few event-loop turns.


def _full_batch_scenario(max_batch: int) -> dict:
    """Drives a batcher whose timeout is `NEVER_S` across the full-batch boundary.

    First `max_batch - 1` rows (one request) are queued and the batcher is given
    time to take them; then one more row fills the batch. Then `max_batch`
    one-row requests arrive at once into the idle batcher. Returns what was
    observed at each step."""
    # `ServeConfig` caps the timeout at 1 s for a real server; the batcher only
    # reads the fields, and this test needs one no machine mistakes for prompt.
    config = ServeConfig.model_construct(
        max_batch_size=max_batch,
        batch_timeout_ms=NEVER_S * 1e3,
        max_queue_rows=4 * max_batch,
        max_rows_per_request=max_batch,
    )

    def rows(n: int, value: int) -> np.ndarray:
        return np.full((n, data.NUM_FEATURES), value, np.float32)

    async def answered(runner, tasks) -> bool:
        """Whether every task finished within GUARD_S (a liveness guard: the
        batcher's loop only ends by failing, which is re-raised)."""
        answers = asyncio.gather(*tasks)
        await asyncio.wait({answers, runner}, timeout=GUARD_S, return_when=asyncio.FIRST_COMPLETED)
        if runner.done():
            runner.result()
            raise AssertionError("the batcher stopped")
        return answers.done()

    async def scenario():
        stats = serve.Stats()
        batcher = serve.Batcher(_EchoModel(), config, stats)
        runner = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)
        seen = {}
        # One row short of a batch: the batcher must keep waiting (for NEVER_S).
        short = asyncio.create_task(batcher.submit(rows(max_batch - 1, 1)))
        for _ in range(20):
            await asyncio.sleep(0)  # Turns of the loop: the batcher sees the rows...
        await asyncio.sleep(0.2)  # ...and real time passes; neither may start a batch.
        seen["one_short"] = {
            "answered": short.done(),
            "queued_rows": batcher.queued_rows,
            "batches": len(stats.batches),
        }
        # The row that fills the batch: it must run now, not after NEVER_S.
        last = asyncio.create_task(batcher.submit(rows(1, 2)))
        filled = await answered(runner, [short, last])
        seen["filled"] = {
            "answered_within_guard": filled,
            "batches": [(b["rows"], b["requests"]) for b in stats.batches],
            "values": [sorted({float(v) for v in np.ravel(t.result())}) for t in (short, last)]
            if filled
            else None,
        }
        if not filled:  # The batcher holds a full batch: the verdict is in.
            runner.cancel()
            return seen
        # A full batch at once, into an idle batcher.
        before = len(stats.batches)
        burst = [asyncio.create_task(batcher.submit(rows(1, 10 + i))) for i in range(max_batch)]
        at_once = await answered(runner, burst)
        seen["at_once"] = {
            "answered_within_guard": at_once,
            "batches": [(b["rows"], b["requests"]) for b in list(stats.batches)[before:]],
            "values": [float(t.result()[0, 0]) for t in burst] if at_once else None,
        }
        runner.cancel()
        return seen

    return asyncio.run(scenario())


@pytest.mark.claims("dynamic-batching", "batch-fills-exactly", "queue-admits-within-row-bound")
@pytest.mark.parametrize("max_batch", [2, 8])
def test_a_full_batch_runs_without_waiting_for_the_timeout(evidence, max_batch):
    """Exactly max_batch_size queued rows run at once; one row fewer waits for the timeout.

    In-process, no server, no clock read by the test. The batch timeout is
    `NEVER_S` (600 s): with `max_batch - 1` rows queued a correct batcher keeps
    waiting, so nothing has been taken after a few loop turns and 0.2 s (a
    negative a correct batcher meets at any machine speed: its deadline is 600 s
    away). The row that fills the batch needs only a few event-loop turns and one
    echo call to be answered, which the test waits for up to `GUARD_S` (30 s,
    orders of magnitude more than it needs on any machine), while a batcher that
    waits on a full batch would hold it for the 600 s timeout, 20 times the
    guard: the verdict does not depend on the machine's speed. Then a full batch
    of one-row requests arriving at once must run the same way. For batches of
    at most 2 and 8 rows."""
    seen = _full_batch_scenario(max_batch)
    expected = {
        "one_short": {"answered": False, "queued_rows": max_batch - 1, "batches": 0},
        "filled": {
            "answered_within_guard": True,
            "batches": [(max_batch, 2)],
            "values": [[1.0], [2.0]],
        },
        "at_once": {
            "answered_within_guard": True,
            "batches": [(max_batch, max_batch)],
            "values": [float(10 + i) for i in range(max_batch)],
        },
    }
    assert evidence.record(
        "a full batch runs at once; one row short of it waits for the timeout",
        f"in-process batcher, max batch {max_batch} rows, batch timeout {NEVER_S:g} s, "
        f"guard {GUARD_S:g} s",
        seen,
        expected,
        seen == expected,
    ), seen


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


MD1_SERVICE_S, MD1_ARRIVALS = 1e-3, 400_000
MD1_LIMIT = 0.08  # Largest |simulated / theory - 1| of the mean time in system.


def md1_figures(key: jax.Array, rho: float) -> dict:
    """The M/D/1 test's figures for one arrival key: the simulated mean time in
    system of `MD1_ARRIVALS` Poisson arrivals (no batching, no loop cost, constant
    service `MD1_SERVICE_S`), the Pollaczek-Khinchine value, their relative error."""
    service = MD1_SERVICE_S
    plan = loadgen.schedule(key, rho / service, MD1_ARRIVALS, (1,), pool=10)
    model = {"a_s": service, "c_s_per_row": 0.0, "h_s": 0.0, "mean_rows": 1.0}
    sim = queue_model.simulate(plan["arrivals"], plan["rows"], model, 1, 0.0)
    theory = service + rho * service / (2 * (1 - rho))
    mean = float(sim["latencies_s"].mean())
    return {"simulated_mean_s": mean, "theory_s": theory, "relative_error": abs(mean / theory - 1)}


@pytest.mark.claims("queue-model-checked")
@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_queue_simulator_matches_md1_theory(evidence, rho):
    """The simulated mean time in system is within 8% of the M/D/1 formula, at rho 0.5 and 0.8.

    With no batching (max batch 1, no timeout), no loop cost and a constant
    service time S, the server is an M/D/1 queue: mean time in system
    S + rho * S / (2 (1 - rho)) (Pollaczek-Khinchine), over `MD1_ARRIVALS` arrivals.

    Size: below 1e-12 over arrival keys: with 400,000 arrivals the relative error's
    spread over 48 keys was 0.0023 (rho 0.5) and 0.0078 (rho 0.8, skew 0.06), so 8% lies
    7.8 spreads (upper 99% bound) out; with the former 40,000 it was 0.027 at rho 0.8
    and 2 of 300 keys failed (largest 0.125). Power: a simulated mean 10% off the
    formula fails at 98% of keys; an M/M/1 answer (67% off at rho 0.8) fails.
    (sweep: evidence/size_sweep.json, the `size_sweep` script beside the tests)"""
    figures = md1_figures(jax.random.key(7), rho)
    assert evidence.record(
        "queue simulator vs the M/D/1 mean time in system",
        f"rho = {rho}, {MD1_ARRIVALS} Poisson arrivals",
        figures,
        {"relative_error": MD1_LIMIT},
        figures["relative_error"] <= MD1_LIMIT,
    )


@pytest.mark.claims("queue-model-checked")
def test_simulator_batching_closed_forms():
    """The simulator's latencies equal closed forms for lone requests and a full batch, and capacity
    its definition."""
    model = {"a_s": 1e-3, "c_s_per_row": 1e-5, "h_s": 2e-4, "mean_rows": 1.0}
    # Isolated requests: each waits the full timeout alone, then one batch of 1.
    alone = queue_model.simulate(np.arange(5.0), np.ones(5, np.int64), model, 64, 5e-3)
    np.testing.assert_allclose(alone["latencies_s"], 2e-4 + 5e-3 + 1e-3 + 1e-5, rtol=1e-12)
    # 64 simultaneous rows with no loop cost fill a batch at once: it starts
    # without the timeout wait, so every latency is one batch of 64.
    instant = dict(model, h_s=0.0)
    full = queue_model.simulate(np.zeros(64), np.ones(64, np.int64), instant, 64, 5e-3)
    np.testing.assert_allclose(full["latencies_s"], 1e-3 + 64e-5, rtol=1e-12)
    # With the loop's 0.2 ms per request they are queued at (i + 1) * 0.2 ms;
    # a 20 ms timeout lets the 64th fill the batch at 12.8 ms, which then runs
    # at once (a batch that waited out the timeout would finish at 21.84 ms).
    queued = 2e-4 * np.arange(1, 65)
    finish = 64 * 2e-4 + 1e-3 + 64e-5
    full = queue_model.simulate(np.zeros(64), np.ones(64, np.int64), model, 64, 20e-3)
    np.testing.assert_allclose(full["latencies_s"], finish - queued + 2e-4, rtol=1e-12)
    cap = queue_model.capacity(model, 64)
    assert cap["capacity_rps"] == pytest.approx(min(1 / 2e-4, 64 / (1e-3 + 64e-5)))


SCHEDULE_WORKLOAD = (200.0, 4000, (1, 8), 1797)  # rate, count, sizes, pool
# Exponential gaps: mean 1/rate (5 ms; standard error 1.6% over 3,999 gaps),
# coefficient of variation 1 (sd 0.016); each of two sizes drawn half the time.
SCHEDULE_LIMITS = {"mean_gap_relative": 0.07, "cv": [0.9, 1.1], "size_fraction": [0.45, 0.55]}


def schedule_figures(key: jax.Array) -> tuple[dict, dict]:
    """The schedule test's workload drawn with `key`, and its figures: the mean gap,
    the gaps' coefficient of variation, the fraction of requests of each size."""
    rate, count, sizes, pool = SCHEDULE_WORKLOAD
    plan = loadgen.schedule(key, rate, count, sizes, pool=pool)
    gaps = np.diff(plan["arrivals"])
    return plan, {
        "mean_gap_s": float(gaps.mean()),
        "gap_cv": float(gaps.std() / gaps.mean()),
        "size_fractions": {s: float(np.mean(plan["rows"] == s)) for s in sizes},
    }


def schedule_within_limits(figures: dict) -> bool:
    low, high = SCHEDULE_LIMITS["cv"]
    f_low, f_high = SCHEDULE_LIMITS["size_fraction"]
    return (
        abs(figures["mean_gap_s"] * SCHEDULE_WORKLOAD[0] - 1)
        <= SCHEDULE_LIMITS["mean_gap_relative"]
        and low <= figures["gap_cv"] <= high
        and all(f_low <= f <= f_high for f in figures["size_fractions"].values())
    )


@pytest.mark.claims("open-loop-poisson-load")
def test_schedule_is_poisson_and_deterministic(evidence):
    """The arrival schedule repeats for one key and starts at t = 0, with exponential gaps: mean
    1/rate within 7%, CV 0.9 to 1.1.

    Size: 1.0e-5 over keys: the mean of 3,999 gaps times the rate is Gamma(3999)/3999,
    outside 1 +- 0.07 with probability 1.0e-5 (the former 6%: 1.5e-4); the CV (sd 0.016)
    and each size's share (sd 0.008) lie 6.3 sd inside their limits (below 1e-9). Over
    6,000 keys the largest deviation of the mean was 0.067: one key past 6%, none past
    7%. Power: a rate 10% off fails 98% of keys (7% off: 64%); constant or uniform gaps
    (CV 0, 0.58) fail, and so does a size drawn with a share of 0.43 or less.
    (sweep: evidence/size_sweep.json, the `size_sweep` script beside the tests)"""
    # Two keys built from the same seed (one key is never used twice).
    a, figures = schedule_figures(jax.random.key(11))
    b = loadgen.schedule(jax.random.key(11), *SCHEDULE_WORKLOAD)
    observed = {
        "deterministic": all(np.array_equal(a[k], b[k]) for k in a),
        "first_arrival_s": float(a["arrivals"][0]),
        **figures,
    }
    assert evidence.record(
        "arrival schedule: exponential gaps at the stated rate, same key same schedule",
        "rate 200 req/s, 4000 requests",
        observed,
        SCHEDULE_LIMITS,
        observed["deterministic"]
        and observed["first_arrival_s"] == 0.0  # The run starts with its first request.
        and schedule_within_limits(figures),
    )


STALLS_S = (0.25, 0.5)  # How long the stand-in blocks the shared event loop.
STALL_REQUESTS = 12


async def _stalled_run(stall_s: float) -> tuple[list[dict], dict[int, dict], np.ndarray]:
    """`loadgen._drive` against a stand-in `/predict` on 127.0.0.1 served by the
    SAME event loop; the stand-in blocks that loop for `stall_s` while answering
    request 0, so the requests scheduled during the stall cannot be sent on time
    (a client that falls behind). Request 0 is scheduled at 0, the others evenly
    between a quarter and three quarters of the stall. Returns the load
    generator's records, the stand-in's own `loop.time()` stamps per request
    (received, answered) and the arrival schedule."""
    n = STALL_REQUESTS
    arrivals = np.concatenate([[0.0], stall_s * np.linspace(0.25, 0.75, n - 1)])
    plan = {"arrivals": arrivals, "rows": np.ones(n, np.int64), "ids": np.zeros(n, np.int64)}
    bodies = [json.dumps({"i": i}).encode() for i in range(n)]
    stamps: dict[int, dict] = {}

    async def handle(reader, writer):
        loop = asyncio.get_running_loop()
        try:
            while True:  # One connection may carry several requests (keep-alive).
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = next(
                    int(line.split(":", 1)[1])
                    for line in head.split("\r\n")
                    if line.startswith("content-length:")
                )
                i = json.loads(await reader.readexactly(length))["i"]
                stamps[i] = {"received": loop.time()}
                if i == 0:
                    time.sleep(stall_s)  # Blocks the loop: no other request can go out.
                payload = b'{"logits": []}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
                )
                await writer.drain()
                stamps[i]["answered"] = loop.time()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # The client closed the connection.
        finally:
            writer.close()

    # The listening socket is made here, not by `start_server`: asyncio skips an
    # address family the machine refuses and serves on no socket at all, where
    # `create_server` raises the machine's own error.
    listening = socket.create_server(("127.0.0.1", 0))
    server = await asyncio.start_server(handle, sock=listening)
    port = listening.getsockname()[1]
    config = LoadConfig(
        rates=(1.0,), requests_per_rate=n, max_seconds_per_rate=120.0, request_timeout_s=60.0
    )
    try:
        records = await loadgen._drive(f"http://127.0.0.1:{port}", plan, bodies, config)
    finally:
        server.close()
        await server.wait_closed()
    return records, stamps, arrivals


@pytest.mark.claims("open-loop-poisson-load")
@pytest.mark.parametrize("stall_s", STALLS_S)
def test_latency_counts_from_the_scheduled_send_time(evidence, stall_s):
    """Every recorded latency is at least (answer - scheduled send time), from the schedule and the
    stand-in's own clock, when a stall keeps the client from sending on time; stalls of 0.25 and
    0.5 s.

    The rule (`loadgen` module docstring): "Latency is measured from each
    request's SCHEDULED send time to its response, so a client or server that
    falls behind cannot hide it (no coordinated omission)." The stand-in server
    shares the load generator's event loop and blocks it while answering request
    0, so the requests scheduled during the stall go out late. The expected lower
    bound is computed here, not by the load generator: request i is scheduled at
    `start + arrivals[i]`, and `start` is no later than the moment the stand-in
    received request 0 (scheduled at 0), so its latency is at least
    `answered_i - received_0 - arrivals[i]`, both stamps read by the stand-in on
    the loop's clock. A latency counted from the actual send drops the stall (up
    to three quarters of it) and falls below the bound; no wall-clock figure is
    compared with a fixed limit. Changed condition: two stall lengths."""
    records, stamps, arrivals = asyncio.run(_stalled_run(stall_s))
    by_index = {r["i"]: r for r in records}
    received_0 = stamps[0]["received"]
    rows, ok = [], len(by_index) == STALL_REQUESTS
    for i in range(STALL_REQUESTS):
        record = by_index.get(i, {})
        if i not in stamps or "answered" not in stamps[i] or record.get("status") != 200:
            ok = False
            rows.append({"i": i, "record": record, "stamps": stamps.get(i)})
            continue
        bound = stamps[i]["answered"] - received_0 - arrivals[i]
        rows.append(
            {
                "i": i,
                "scheduled_s": float(arrivals[i]),
                "latency_s": record["latency_s"],
                "lower_bound_from_schedule_s": float(bound),
                "held_by_the_stall": bool(stamps[i]["received"] >= received_0 + stall_s),
            }
        )
        ok &= record["latency_s"] >= bound - 1e-9
    assert evidence.record(
        "latency from the SCHEDULED send time: at least answer - schedule (no omission)",
        f"stand-in blocks the client's event loop for {stall_s:g} s on request 0; "
        f"{STALL_REQUESTS - 1} requests scheduled during the stall",
        {"requests": rows},
        {"latency_s >= answered - received_0 - scheduled, slack_s": 1e-9},
        ok,
    ), rows


def test_serve_refuses_a_bad_config(tmp_path):
    """serve refuses max_rows_per_request above max_batch_size with exit 2 and a message naming
    both."""
    path = tmp_path / "serve.json"
    path.write_text('{"max_batch_size": 8, "max_rows_per_request": 16}')
    result = CliRunner().invoke(main, ["serve", str(tmp_path), "--config", str(path)])
    assert result.exit_code == 2
    assert "`max_rows_per_request` (16) must not exceed `max_batch_size` (8)" in result.output
