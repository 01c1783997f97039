"""The load generator: a real server process on 127.0.0.1, open-loop Poisson
arrivals at several stated rates, and the capacity report.

Workload (a `LoadConfig`): for each rate, `requests_per_rate` requests whose
inter-arrival times are exponential with that rate and whose sizes are drawn
uniformly from `request_sizes` rows (images drawn from all 1,797 digits: the
server's cost does not depend on which). All draws come
from `jax.random` keys derived from the config's seed, so the schedule is
the same on every run. Latency is measured from each request's SCHEDULED
send time to its response, so a client or server that falls behind cannot
hide it (no coordinated omission). Every run is bounded: at most
`requests_per_rate` requests and `max_seconds_per_rate` seconds per rate, and
each request has a client timeout.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np

from deployment_audit import data
from deployment_audit.config import LoadConfig, ServeConfig

IDLE_PROBE_S = 1.0


class ServerStartError(RuntimeError):
    """The server process did not start listening; the message holds its log."""


HANG_S = 1800.0  # Wall-clock guard against a child that never gets anywhere.


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used, from Linux `/proc`; None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Budget:
    """A start-up limit counted in the child's own CPU seconds where `/proc` says
    them (a loaded machine slows a start in wall time, not in CPU time), else in
    wall seconds; and always a wall-clock hang guard of `HANG_S`."""

    def __init__(self, pid: int, seconds: float):
        self.pid, self.seconds = pid, seconds
        self.wall_start = time.monotonic()

    def spent(self) -> bool:
        wall = time.monotonic() - self.wall_start
        cpu = cpu_seconds(self.pid)
        return wall > HANG_S or (cpu if cpu is not None else wall) > self.seconds


class ServerProcess:
    """`deployment-audit serve` in a child process; a context manager that always
    stops it (SIGTERM, then SIGKILL after 10 s). `start_timeout_s` is counted in
    the child's CPU seconds (see `_Budget`), so a busy machine does not fail a
    start that is merely slow."""

    def __init__(
        self,
        artifact: str | Path,
        config: ServeConfig | None = None,
        *,
        expect_sha256: str | None = None,
        start_timeout_s: float = 60.0,
    ):
        self.artifact = Path(artifact)
        self.config = config or ServeConfig()
        self.expect_sha256 = expect_sha256
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self._log: Any = None
        self._tmp = tempfile.TemporaryDirectory(prefix="deployment-audit-serve-")
        self.url = ""

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self.wait_listening()

    def start(self) -> "ServerProcess":
        """Starts the child process without waiting (to start several at once)."""
        tmp = Path(self._tmp.name)
        (tmp / "serve.json").write_text(self.config.to_json())
        port_file = tmp / "port"
        command = [
            sys.executable,
            "-m",
            "deployment_audit.cli",
            "serve",
            str(self.artifact),
            "--port-file",
            str(port_file),
            "--config",
            str(tmp / "serve.json"),
        ]
        if self.expect_sha256:
            command += ["--expect-sha256", self.expect_sha256]
        self.log_path = tmp / "server.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        self._port_file = port_file
        return self

    def wait_listening(self) -> "ServerProcess":
        """Waits until the child listens (its port file exists); sets `url`."""
        port_file = self._port_file
        budget = _Budget(self.proc.pid, self.start_timeout_s)
        while not port_file.exists():
            if self.proc.poll() is not None or budget.spent():
                log = self.log()  # Read before `__exit__` removes the folder it is in.
                self.__exit__(None, None, None)
                raise ServerStartError(f"The server did not start listening:\n{log}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Polls /readyz until ready, failed, or `timeout_s` of the server's CPU
        time (see `_Budget`); returns the last body."""
        budget = _Budget(self.proc.pid, timeout_s)
        body: dict[str, Any] = {}
        with httpx.Client(base_url=self.url, timeout=60.0) as client:
            while not budget.spent():
                if self.proc is not None and self.proc.poll() is not None:
                    return {"status": "exited", "reason": self.log()}
                try:
                    response = client.get("/readyz")
                except httpx.TransportError as err:
                    body = {"status": "unreachable", "reason": str(err)}
                    time.sleep(0.1)
                    continue
                body = {"http_status": response.status_code, **response.json()}
                if body["status"] in ("ready", "failed"):
                    return body
                time.sleep(0.1)
        return body

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None and not self._log.closed:
            self._log.close()
        self._tmp.cleanup()


def schedule(
    key: jax.Array, rate: float, count: int, sizes: tuple[int, ...], pool: int
) -> dict[str, np.ndarray]:
    """Arrival times (s, from 0), rows per request, and the sample IDs each carries."""
    k_gap, k_size, k_ids = jax.random.split(key, 3)
    gaps = np.asarray(jax.random.exponential(k_gap, (count,)), np.float64) / rate
    arrivals = np.cumsum(gaps) - gaps[0]  # The first request goes at t = 0.
    rows = np.asarray(sizes)[np.asarray(jax.random.randint(k_size, (count,), 0, len(sizes)))]
    ids = np.asarray(jax.random.randint(k_ids, (int(rows.sum()),), 0, pool))
    return {"arrivals": arrivals, "rows": rows.astype(np.int64), "ids": ids}


async def _drive(
    url: str, plan: dict[str, np.ndarray], bodies: list[bytes], config: LoadConfig
) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    # TCP_NODELAY: httpx writes headers and body separately; with Nagle's algorithm
    # the body then waits for the server's delayed ACK (~40 ms on Linux).
    transport = httpx.AsyncHTTPTransport(
        limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    )
    records: list[dict[str, Any]] = []
    async with httpx.AsyncClient(
        base_url=url, timeout=config.request_timeout_s, transport=transport
    ) as c:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05

        async def one(i: int) -> None:
            scheduled = start + plan["arrivals"][i]
            await asyncio.sleep(max(0.0, scheduled - loop.time()))
            sent = loop.time()
            record: dict[str, Any] = {"i": i, "rows": int(plan["rows"][i])}
            try:
                response = await c.post(
                    "/predict", content=bodies[i], headers={"content-type": "application/json"}
                )
                record["status"] = response.status_code
            except httpx.HTTPError as err:
                record["status"] = None
                record["error"] = type(err).__name__
            finished = loop.time()
            record.update(
                latency_s=finished - scheduled, send_lag_s=sent - scheduled, done_s=finished - start
            )
            records.append(record)

        tasks = [asyncio.create_task(one(i)) for i in range(len(bodies))]
        _, pending = await asyncio.wait(tasks, timeout=config.max_seconds_per_rate)
        for task in pending:  # The hard stop: whatever has not finished is cancelled.
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return records


def _metrics(url: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=10.0) as client:
        return client.get("/metrics").json()


def _percentiles(values: np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {"p50_s": float("nan"), "p95_s": float("nan"), "p99_s": float("nan")}
    return {f"p{q}_s": float(np.percentile(values, q)) for q in (50, 95, 99)}


def run_rate(
    url: str, rate: float, config: LoadConfig, key: jax.Array, images: np.ndarray
) -> dict[str, Any]:
    """One rate of the workload against the server at `url`; the observed figures."""
    plan = schedule(key, rate, config.requests_per_rate, config.request_sizes, len(images))
    offsets = np.concatenate([[0], np.cumsum(plan["rows"])])
    bodies = [
        json.dumps({"inputs": images[plan["ids"][offsets[i] : offsets[i + 1]]].tolist()}).encode()
        for i in range(len(plan["rows"]))
    ]
    before = _metrics(url)
    wall, client_cpu = time.perf_counter(), time.process_time()
    records = asyncio.run(_drive(url, plan, bodies, config))
    wall, client_cpu = time.perf_counter() - wall, time.process_time() - client_cpu
    after = _metrics(url)
    new_batches = after["batches"][len(before["batches"]) :]
    server_latencies = np.asarray(after["server_latencies_s"][len(before["server_latencies_s"]) :])
    ok = [r for r in records if r["status"] == 200]
    latencies = np.asarray([r["latency_s"] for r in ok])
    statuses: dict[str, int] = {}
    for r in records:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    offered = (len(plan["arrivals"]) - 1) / max(plan["arrivals"][-1], 1e-9)
    last_done = max((r["done_s"] for r in ok), default=float("nan"))
    throughput = len(ok) / last_done if ok else 0.0
    result = {
        "rate_rps": rate,
        "offered_rps": offered,
        "requests": len(plan["rows"]),
        "completed": len(records),
        "ok": len(ok),
        "statuses": statuses,
        "throughput_rps": throughput,
        "latency": {**_percentiles(latencies), "mean_s": float(latencies.mean()) if ok else None},
        "client_send_lag_p99_s": float(np.percentile([r["send_lag_s"] for r in records], 99)),
        # The load generator's own CPU: near 1.0 means the client, not the server, limits.
        "client_cpu_busy_fraction": client_cpu / max(wall, 1e-9),
        "server": {
            "cpu_s": after["process_cpu_s"] - before["process_cpu_s"],
            "requests": after["requests_ok"] - before["requests_ok"],
            "wall_s": wall,
            "batches": len(new_batches),
            "mean_batch_rows": float(np.mean([b["rows"] for b in new_batches]))
            if new_batches
            else 0.0,
            "latency": _percentiles(server_latencies),
        },
        "schedule": {k: v.tolist() for k, v in plan.items() if k != "ids"},
        "batch_records": new_batches,
    }
    result["server"]["cpu_busy_fraction"] = result["server"]["cpu_s"] / max(wall, 1e-9)
    result["sustained"] = bool(len(ok) == len(plan["rows"]) and throughput >= 0.9 * offered)
    return result


def run_load_test(
    artifact: str | Path,
    config: LoadConfig,
    serve_config: ServeConfig,
    *,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Starts a server on `artifact`, runs the workload against it, stops it, and
    returns the capacity report (see `measure`)."""
    with ServerProcess(artifact, serve_config) as server:
        ready = server.wait_ready()
        if ready.get("status") != "ready":
            raise ServerStartError(f"The server never became ready: {ready}\n{server.log()}")
        return measure(server.url, config, serve_config, ready, log=log)


def measure(
    url: str,
    config: LoadConfig,
    serve_config: ServeConfig,
    ready: dict[str, Any],
    *,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Runs every rate (lowest first) against the ready server at `url`, fits and
    checks the queue model; returns `report.capacity_report`."""
    from deployment_audit import report

    images = data.load().images
    keys = jax.random.split(jax.random.key(config.seed), len(config.rates))
    # The server's idle CPU (timers, the batcher's polling), measured with no load,
    # so that the per-request cost fitted below does not absorb it.
    idle_before = _metrics(url)
    time.sleep(IDLE_PROBE_S)
    idle_after = _metrics(url)
    idle = (idle_after["process_cpu_s"] - idle_before["process_cpu_s"]) / max(
        idle_after["uptime_s"] - idle_before["uptime_s"], 1e-9
    )
    runs = []
    for rate, key in sorted(zip(config.rates, keys, strict=True), key=lambda p: p[0]):
        log(f"rate {rate:g} req/s: {config.requests_per_rate} requests ...")
        run = run_rate(url, rate, config, key, images)
        runs.append(run)
        lat = run["latency"]
        log(
            f"  ok {run['ok']}/{run['requests']}  throughput {run['throughput_rps']:.1f}/s  "
            f"p50 {1e3 * lat['p50_s']:.2f} ms  p99 {1e3 * lat['p99_s']:.2f} ms  "
            f"{'sustained' if run['sustained'] else 'NOT sustained'}"
        )
    return report.capacity_report(runs, config, serve_config, ready, _identity(), idle)


def _identity() -> dict[str, Any]:
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }
