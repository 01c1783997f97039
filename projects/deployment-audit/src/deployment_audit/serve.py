"""The HTTP server: Starlette on uvicorn, one verified artifact, dynamic batching.

Endpoints:
  `GET /healthz`  200 while the process runs (alive), whatever the model's state.
  `GET /readyz`   200 only after the artifact loaded (its sha256 matched the
                  manifest, and the pinned hash if one was given), every batch
                  bucket compiled, and the self-test on the golden inputs
                  passed; 503 with the reason otherwise. A server pointed at a
                  swapped or altered artifact stays alive and never ready.
  `POST /predict` body `{"inputs": [[64 numbers], ...], "dtype": "float32"}`
                  (`dtype` optional, must be float32); answers `logits`,
                  `predictions`, `labels` (the manifest's label map) and the
                  model's sha256. 400 for malformed JSON or structure (a body
                  nested deeper than `MAX_JSON_DEPTH` is refused before it is
                  parsed), 422 for a wrong shape, dtype or value range
                  (checked on the JSON numbers before any conversion, so a
                  400-digit integer is a 422, not an overflow), 503 (with
                  `Retry-After`) when not ready or when the queue is full.
                  Every malformed body gets a 4xx and a message, never a 500.
  `GET /metrics`  counters, batch records and process CPU time (JSON), read
                  by the load generator and the queue model.

Dynamic batching: requests wait in a queue; the batcher takes the first one,
waits up to `batch_timeout_ms` for more, and runs up to `max_batch_size` rows
in one call, padded to the next power of two so that only a few shapes ever
compile (all of them before the server reports ready). The model runs in a
worker thread, so the event loop keeps answering (and refusing) meanwhile.

Run: `deployment-audit serve ARTIFACT_DIR [--port 0] [--port-file F]`; it
listens on 127.0.0.1 only.
"""

import asyncio
import json
import math
import re
import socket
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from deployment_audit import data
from deployment_audit.config import ServeConfig
from deployment_audit.export import (
    PIXEL_MAX,
    ArtifactError,
    InputError,
    LoadedArtifact,
    check_input,
)

MAX_JSON_DEPTH = 4  # object > `inputs` > row > pixel needs 3; deeper bodies are refused unparsed.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
MAX_RECORDS = 20_000  # batch/request records kept for /metrics (a ring buffer)


class Overloaded(Exception):
    """The queue is full: the request is refused with 503."""


@dataclass
class _Pending:
    x: np.ndarray
    future: asyncio.Future
    arrived: float


@dataclass
class Stats:
    """What /metrics reports; times in seconds, `time.perf_counter` clock."""

    requests_ok: int = 0
    rejected_overload: int = 0
    rejected_not_ready: int = 0
    bad_requests: int = 0
    batches: deque = field(default_factory=lambda: deque(maxlen=MAX_RECORDS))
    latencies: deque = field(default_factory=lambda: deque(maxlen=MAX_RECORDS))


def bucket(rows: int, max_batch: int) -> int:
    """The padded batch size for `rows`: the next power of two, capped at `max_batch`."""
    return min(max_batch, 1 << max(0, math.ceil(math.log2(rows))))


class Batcher:
    """Collects queued requests into batches and runs them on `model.predict`."""

    def __init__(self, model: LoadedArtifact, config: ServeConfig, stats: Stats):
        self.model = model
        self.config = config
        self.stats = stats
        self.queue: deque[_Pending] = deque()
        self.queued_rows = 0
        self.wakeup = asyncio.Event()

    def warm_up(self) -> list[int]:
        """Compiles every bucket size before the server reports ready."""
        sizes = sorted(
            {
                bucket(n, self.config.max_batch_size)
                for n in range(1, self.config.max_batch_size + 1)
            }
        )
        for size in sizes:
            self.model.predict(np.zeros((size, data.NUM_FEATURES), np.float32))
        return sizes

    async def submit(self, x: np.ndarray) -> np.ndarray:
        """Queues the rows `x` and returns their logits once a batch has run them.

        Cases (the bound counts ROWS, not requests):
            queued rows + `len(x)` <= `max_queue_rows` -> enqueued (arrival time
                recorded), the batcher woken, the rows counted in `queued_rows`
                [claim:queue-admits-within-row-bound]
            queued rows + `len(x)` > `max_queue_rows` -> raises `Overloaded` at once,
                nothing enqueued (the server answers 503) [claim:queue-refuses-past-row-bound]
        """
        # --- exercise stage 3: Refuse when the queued rows would pass the bound; else enqueue. ---
        if self.queued_rows + len(x) > self.config.max_queue_rows:
            raise Overloaded
        future = asyncio.get_running_loop().create_future()
        self.queue.append(_Pending(x, future, time.perf_counter()))
        self.queued_rows += len(x)
        self.wakeup.set()
        return await future
        # --- end exercise ---

    async def run(self) -> None:
        timeout = self.config.batch_timeout_ms / 1000.0
        while True:
            while not self.queue:
                self.wakeup.clear()
                await self.wakeup.wait()
            deadline = self.queue[0].arrived + timeout
            while self.queued_rows < self.config.max_batch_size:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self.wakeup.clear()
                try:
                    await asyncio.wait_for(self.wakeup.wait(), remaining)
                except TimeoutError:
                    break
            batch, rows = self._take_batch()
            await self._run_batch(batch, rows)

    def _take_batch(self) -> tuple[list[_Pending], int]:
        """Whole requests from the queue's head, up to `max_batch_size` rows.

        Cases: requests are taken in arrival order and never split
        [claim:batch-whole-requests-in-order]; the first one that would pass
        `max_batch_size` ends the batch (no later, smaller request jumps ahead of it)
        [claim:batch-no-jumping-ahead]; a batch may fill exactly `max_batch_size`
        [claim:batch-fills-exactly]. The rows taken leave `queued_rows`
        [claim:batch-releases-its-rows]. Returns `(requests, rows)`.
        """
        # --- exercise stage 3: Pop whole requests while they fit in max_batch_size rows. ---
        batch: list[_Pending] = []
        rows = 0
        while self.queue and rows + len(self.queue[0].x) <= self.config.max_batch_size:
            item = self.queue.popleft()
            batch.append(item)
            rows += len(item.x)
        self.queued_rows -= rows
        return batch, rows
        # --- end exercise ---

    def _predict(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        """The model call and the CPU time of the calling thread (for tiny batches
        XLA's CPU backend runs on the calling thread)."""
        start = time.thread_time()
        logits = self.model.predict(x)
        return logits, time.thread_time() - start

    async def _run_batch(self, batch: list[_Pending], rows: int) -> None:
        size = bucket(rows, self.config.max_batch_size)
        x = np.zeros((size, data.NUM_FEATURES), np.float32)
        np.concatenate([item.x for item in batch], axis=0, out=x[:rows])
        started = time.perf_counter()
        try:
            logits, cpu_s = await asyncio.to_thread(self._predict, x)
        except Exception as err:  # noqa: BLE001 - reported to every waiting request.
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(err)
            return
        finished = time.perf_counter()
        self.stats.batches.append(
            {
                "rows": rows,
                "padded": size,
                "requests": len(batch),
                "compute_s": finished - started,
                "compute_cpu_s": cpu_s,
                "wait_s": started - batch[0].arrived,
            }
        )
        offset = 0
        for item in batch:
            n = len(item.x)
            if not item.future.done():
                item.future.set_result(logits[offset : offset + n])
            offset += n


class ModelHolder:
    """The server's model state: loading -> ready, or loading -> failed (never ready)."""

    def __init__(self) -> None:
        self.status = "loading"
        self.reason = "the artifact is being verified and loaded"
        self.model: LoadedArtifact | None = None
        self.batcher: Batcher | None = None
        self.details: dict[str, Any] = {}


def _bad(status: int, message: str, stats: Stats) -> JSONResponse:
    stats.bad_requests += 1
    return JSONResponse({"error": message}, status_code=status)


def json_depth(body: bytes) -> int:
    """The deepest nesting of `[` and `{` in a JSON text, strings left out; found
    without parsing (a parser recurses once per level and can run out of stack)."""
    codes = np.frombuffer(_JSON_STRING.sub(b'""', body), dtype=np.uint8)
    opens = (codes == ord("[")) | (codes == ord("{"))
    closes = (codes == ord("]")) | (codes == ord("}"))
    steps = opens.astype(np.int64) - closes.astype(np.int64)
    return int(np.cumsum(steps).max(initial=0))


def parse_body(body: bytes) -> Any:
    """The request body as JSON; raises `ValueError` (400) for a body that is not
    JSON, or that nests deeper than any valid request does."""
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(
            f"The body nests {depth} levels deep; a request nests at most {MAX_JSON_DEPTH} "
            '({"inputs": [[...]]} is 3).'
        )
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"The body is not valid JSON: {err}.") from None


def _describe(value: Any) -> str:
    """A number for a message, whatever its size (a 400-digit integer has no float)."""
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{value:g}"


def parse_inputs(payload: Any, max_rows: int) -> np.ndarray:
    """The request's `inputs` as float32 `(rows, 64)`; raises `InputError` (422) or
    `ValueError` (400) with a message a client can act on."""
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise ValueError(
            'The body must be a JSON object with an `inputs` field: {"inputs": [[...]]}.'
        )
    unknown = set(payload) - {"inputs", "dtype"}
    if unknown:
        raise ValueError(f"Unknown fields {sorted(unknown)}; the body takes `inputs` and `dtype`.")
    dtype = payload.get("dtype", "float32")
    if dtype != "float32":
        raise InputError(f"`dtype` must be `float32`, the model's input dtype, not `{dtype}`.")
    inputs = payload["inputs"]
    if not isinstance(inputs, list):
        raise ValueError(f"`inputs` must be a list of rows, not a `{type(inputs).__name__}`.")
    if len(inputs) > max_rows:
        raise ValueError(f"`inputs` holds {len(inputs)} rows; at most {max_rows} are allowed.")
    flat: list[Any] = []
    for i, row in enumerate(inputs):
        if isinstance(row, list):
            flat.extend(row)
        elif isinstance(row, int | float) and not isinstance(row, bool):
            flat.append(row)  # A rank-1 `inputs`: refused below, by its rank.
        else:
            raise InputError(
                f"`inputs[{i}]` must be a list of {data.NUM_FEATURES} numbers, "
                f"not a `{type(row).__name__}`."
            )
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in flat):
        raise InputError("Every pixel in `inputs` must be a JSON number.")
    # Range first, on the Python numbers: a huge integer has no float32 (or float).
    outside = [v for v in flat if not 0 <= v <= PIXEL_MAX]  # NaN is outside too.
    if outside:
        raise InputError(
            f"Pixels must be raw intensities in [0, {PIXEL_MAX:g}] (the artifact's input "
            f"layout: {data.INPUT_LAYOUT}), but `inputs` holds {_describe(outside[0])}"
            + (f" and {len(outside) - 1} more out of range." if len(outside) > 1 else ".")
        )
    try:
        x = np.asarray(inputs, dtype=np.float32)
    except ValueError:
        raise InputError(
            f"`inputs` must be a rectangular list of rows of {data.NUM_FEATURES} numbers."
        ) from None
    return check_input(x)  # Shape, dtype and (after float32 rounding) the range again.


def create_app(
    artifact_dir: str | Path,
    config: ServeConfig | None = None,
    *,
    expected_sha256: str | None = None,
) -> Starlette:
    """The Starlette app; the artifact is loaded in the background at start-up."""
    from deployment_audit.export import load_artifact

    config = config or ServeConfig()
    holder = ModelHolder()
    stats = Stats()
    started_at = time.perf_counter()

    def load() -> None:
        model = load_artifact(artifact_dir, expected_sha256=expected_sha256)
        holder.details["sha256"] = model.checks["sha256"]
        holder.details["compatibility"] = model.checks["compatibility"]
        self_test = model.self_test()
        holder.details["self_test"] = self_test
        if not self_test["passed"]:
            raise ArtifactError(
                f"The artifact loaded but failed its self-test on the golden inputs "
                f"({self_test}): it is not the model the golden sample came from."
            )
        batcher = Batcher(model, config, stats)
        holder.details["buckets"] = batcher.warm_up()
        holder.model, holder.batcher = model, batcher

    async def start() -> None:
        try:
            await asyncio.to_thread(load)
        except Exception as err:  # noqa: BLE001 - any load failure keeps the server unready.
            holder.status = "failed"
            holder.reason = f"{type(err).__name__}: {err}"
            return
        holder.status = "ready"
        holder.reason = ""
        await holder.batcher.run()

    @asynccontextmanager
    async def lifespan(app: Starlette):
        task = asyncio.create_task(start())
        yield
        task.cancel()

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> JSONResponse:
        body = {"status": holder.status, "reason": holder.reason, **holder.details}
        return JSONResponse(body, status_code=200 if holder.status == "ready" else 503)

    async def predict(request: Request) -> JSONResponse:
        arrived = time.perf_counter()
        if holder.status != "ready":
            stats.rejected_not_ready += 1
            return JSONResponse(
                {"error": f"The model is not ready ({holder.status}): {holder.reason}"},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        try:
            payload = parse_body(await request.body())
        except ValueError as err:
            return _bad(400, str(err), stats)
        try:
            x = parse_inputs(payload, config.max_rows_per_request)
        except InputError as err:
            return _bad(422, str(err), stats)
        except ValueError as err:
            return _bad(400, str(err), stats)
        try:
            logits = await holder.batcher.submit(x)
        except Overloaded:
            stats.rejected_overload += 1
            return JSONResponse(
                {"error": "The server is at capacity (queue full); retry later."},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        predictions = logits.argmax(axis=1)
        stats.requests_ok += 1
        stats.latencies.append(time.perf_counter() - arrived)
        labels = holder.model.labels
        return JSONResponse(
            {
                "logits": logits.tolist(),
                "predictions": predictions.tolist(),
                "labels": [labels[int(p)] for p in predictions],
                "model_sha256": holder.details["sha256"],
            }
        )

    async def metrics(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": holder.status,
                "uptime_s": time.perf_counter() - started_at,
                "process_cpu_s": time.process_time(),
                "requests_ok": stats.requests_ok,
                "rejected_overload": stats.rejected_overload,
                "rejected_not_ready": stats.rejected_not_ready,
                "bad_requests": stats.bad_requests,
                "batches": list(stats.batches),
                "server_latencies_s": list(stats.latencies),
                "config": config.model_dump(mode="json"),
            }
        )

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/predict", predict, methods=["POST"]),
            Route("/metrics", metrics),
        ],
        lifespan=lifespan,
    )


def bind_localhost(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (`port=0`: a free port chosen by the OS)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn's h11 protocol writes a response's head and body separately; with
    # Nagle's algorithm the body then waits for the client's delayed ACK (~40 ms
    # on Linux). Accepted connections inherit TCP_NODELAY from this socket.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def run_server(
    artifact_dir: str | Path,
    config: ServeConfig,
    *,
    port: int = 0,
    port_file: str | Path | None = None,
    expected_sha256: str | None = None,
) -> None:
    """Serves until SIGINT/SIGTERM. The bound port goes to `port_file` (if given)
    once the socket listens, so a caller never races for a port."""
    import uvicorn

    app = create_app(artifact_dir, config, expected_sha256=expected_sha256)
    sock = bind_localhost(port)
    bound = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http="h11")
    )

    async def main() -> None:
        # Listen first, then announce the port: a client reading the file can connect.
        sock.listen(2048)
        if port_file is not None:
            tmp = Path(f"{port_file}.tmp")
            tmp.write_text(f"{bound}\n")
            tmp.rename(port_file)
        await server.serve(sockets=[sock])

    print(f"serving {artifact_dir} on http://127.0.0.1:{bound}", flush=True)
    asyncio.run(main())
