"""Serving: a router in front of candidate servers, and the traffic switch.

A candidate server (`Backend`) is a Starlette app on uvicorn, on its own
free port of 127.0.0.1, running in a process of its own
(`engineering_release.candidate`), so that its start-up never holds the
router's interpreter lock. At start it loads its model from the store (digest
checked), runs the golden self-test and compiles the forward pass;
`GET /readyz` answers 200 only after all of that passed, 503 with the reason
before (`loading`) or forever after a failure (`failed`). `POST /predict`
takes `{"inputs": [[64 pixels 0..16], ...]}` and answers
`{"model_id", "predictions", "logits"}`. The candidate's process ends when the
host stops it or when the host's process ends.

The serving host (`Host`) is the router clients talk to (127.0.0.1, one
port). `POST /predict` forwards to the ACTIVE backend. Admin endpoints (same
loopback port): `POST /admin/stage {"model_id"}` starts a candidate and
answers its port; `POST /admin/switch {"model_id"}` moves traffic to that
candidate, refused unless it is ready; `POST /admin/discard`; `GET /state`.

The switch is one pointer assignment in the router's event loop: a request
reads the active backend and counts itself in flight on it without yielding
in between, so every request goes wholly to the old or the new backend. The
old backend stops only once its in-flight count is zero, so no request is
cut off: the previous release serves until the switch and finishes what it
started after it.

The host also follows the release log: every `reconcile_s` it compares the
log's serving model with its active one and stages and switches as needed.
So a release command killed after its commit still ends with the committed
model serving, and a host restarted from nothing serves what the log says.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engineering_release import data, ledger

STOP_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 30.0


def bind_localhost(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (`port=0`: a free port chosen by the OS)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # h11 writes head and body separately; without TCP_NODELAY the body waits for
    # the client's delayed ACK (~40 ms on Linux).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    return sock


class _Server:
    """A Starlette app on uvicorn in a thread of its own (own event loop)."""

    def __init__(self, app: Starlette, port: int = 0, name: str = "server"):
        import uvicorn

        self.sock = bind_localhost(port)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http="h11")
        )
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(STOP_TIMEOUT_S)
        self.sock.close()


def parse_inputs(payload: Any) -> np.ndarray:
    """The request's inputs as float32 `(rows, 64)`; raises ValueError saying why not."""
    if not isinstance(payload, dict) or set(payload) != {"inputs"}:
        raise ValueError('The body must be {"inputs": [[64 numbers], ...]}.')
    try:
        x = np.asarray(payload["inputs"], dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError("`inputs` must be a rectangular list of rows of numbers.") from None
    if x.ndim != 2 or x.shape[1] != data.NUM_FEATURES or not 1 <= len(x) <= 256:
        raise ValueError(f"`inputs` must have shape (1..256, 64), not {x.shape}.")
    if not np.all(np.isfinite(x)) or x.min() < 0 or x.max() > data.PIXEL_MAX:
        raise ValueError(f"Pixels must lie in [0, {data.PIXEL_MAX:g}].")
    return x


class Backend:
    """One model's candidate server, in a process of its own (`engineering_release.candidate`).

    The host binds the candidate's loopback socket (so `port` is known at once) and
    hands it to the process. `status`: `loading` -> `ready`, or `loading` -> `failed`
    (load, digest or self-test failed, or the process exited); the process reports
    each change on a pipe, read here by a thread. `inflight` and `served` are counted
    by the router, which is the only way requests reach the candidate.
    """

    def __init__(self, store_root: str | Path, model_id: str, load_nice: int = 0):
        self.store_root, self.model_id = Path(store_root), model_id
        self.load_nice = load_nice
        self.status, self.reason = "loading", "starting its process"
        self.self_test: dict = {}
        self.inflight = 0
        self.served = 0
        self.client = None  # the router's httpx.AsyncClient to this backend
        self.started_at = time.monotonic()
        self.sock = bind_localhost()
        self.port = self.sock.getsockname()[1]
        self.proc: subprocess.Popen | None = None
        self._stopping = False

    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "engineering_release.candidate",
                    str(self.store_root),
                    self.model_id,
                    str(self.sock.fileno()),
                    str(write_fd),
                    str(self.load_nice),
                ],
                stdin=subprocess.PIPE,
                pass_fds=(self.sock.fileno(), write_fd),
            )
        except OSError as err:
            os.close(read_fd)
            self.status, self.reason = "failed", f"its process did not start: {err}"
            return
        finally:
            os.close(write_fd)
        name = f"candidate-{self.model_id[:8]}"
        threading.Thread(target=self._follow, args=(read_fd,), name=name, daemon=True).start()

    def _follow(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for line in pipe:
                try:
                    message = json.loads(line)
                    status = str(message["status"])
                except (ValueError, KeyError, TypeError):
                    continue
                self.self_test = message.get("self_test") or {}
                self.reason = str(message.get("reason", ""))
                self.status = status  # Last: a reader that sees `ready` sees the rest.
        code = self.proc.wait()
        if not self._stopping:
            self.reason = f"its process exited (code {code}) while {self.status}"
            self.status = "failed"

    def stop(self) -> None:
        self._stopping = True
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # End of file: the candidate shuts its server down.
            except OSError:
                pass
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.sock.close()

    def describe(self) -> dict:
        return {
            "model_id": self.model_id,
            "port": self.port,
            "pid": None if self.proc is None else self.proc.pid,
            "status": self.status,
            "reason": self.reason,
            "served": self.served,
            "inflight": self.inflight,
        }


class Host:
    """The router and its backends; follows the release log under `root`.

    `candidate_nice`: how much lower each candidate's start-up work runs (its
    imports, load, self-test and compile; see `engineering_release.candidate`)."""

    def __init__(
        self,
        root: str | Path,
        *,
        port: int = 0,
        reconcile_s: float = 0.25,
        follow_log: bool = True,
        candidate_nice: int = 0,
    ):
        self.root = Path(root)
        self.candidate_nice = candidate_nice
        self.store_root = self.root / "store"
        self.ledger_path = self.root / "ledger.jsonl"
        self.reconcile_s, self.follow_log = reconcile_s, follow_log
        self.active: Backend | None = None
        self.candidates: dict[str, Backend] = {}
        self.switches: list[dict] = []
        self.retired: list[dict] = []
        self._lock: asyncio.Lock | None = None
        app = Starlette(
            routes=[
                Route("/predict", self.predict, methods=["POST"]),
                Route("/state", self.state),
                Route("/healthz", self.healthz),
                Route("/admin/stage", self.stage, methods=["POST"]),
                Route("/admin/switch", self.switch, methods=["POST"]),
                Route("/admin/discard", self.discard, methods=["POST"]),
            ],
            lifespan=self._lifespan,
        )
        self._server = _Server(app, port=port, name="router")
        self.port = self._server.port

    # LIFECYCLE -------------------------------------------------------------

    def _lifespan(self, app: Starlette):
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def span(app: Starlette):
            self._lock = asyncio.Lock()
            task = asyncio.create_task(self._follow()) if self.follow_log else None
            yield
            if task is not None:
                task.cancel()
            for backend in [self.active, *self.candidates.values()]:
                if backend is not None:
                    await self._retire(backend, drain=False)

        return span(app)

    def start(self, host_file: str | Path | None = None) -> "Host":
        self._server.start()
        if host_file is not None:
            host_file = Path(host_file)
            tmp = host_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"port": self.port, "pid": os.getpid()}) + "\n")
            os.replace(tmp, host_file)
        return self

    def stop(self) -> None:
        self._server.stop()

    # ROUTING ---------------------------------------------------------------

    async def predict(self, request: Request) -> Response:
        import httpx

        backend = self.active
        if backend is None:
            return JSONResponse({"error": "no release is serving"}, status_code=503)
        backend.inflight += 1  # Counted before any await: the drain sees this request.
        try:
            if backend.client is None:
                backend.client = httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{backend.port}", timeout=30.0
                )
            upstream = await backend.client.post("/predict", content=await request.body())
            backend.served += 1
            return Response(upstream.content, upstream.status_code, media_type="application/json")
        finally:
            backend.inflight -= 1

    async def healthz(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "alive"})

    async def state(self, request: Request) -> JSONResponse:
        return JSONResponse(self.snapshot())

    def snapshot(self) -> dict:
        return {
            "serving": None if self.active is None else self.active.model_id,
            "active": None if self.active is None else self.active.describe(),
            "candidates": {k: b.describe() for k, b in self.candidates.items()},
            "switches": self.switches[-50:],
            "retired": self.retired[-50:],
        }

    # STAGE, SWITCH, DISCARD ------------------------------------------------

    def _stage(self, model_id: str) -> Backend:
        if self.active is not None and self.active.model_id == model_id:
            return self.active
        existing = self.candidates.get(model_id)
        if existing is not None and existing.status != "failed":
            return existing
        if existing is not None:
            self.candidates.pop(model_id)
            asyncio.get_running_loop().create_task(self._retire(existing, drain=False))
        backend = Backend(self.store_root, model_id, load_nice=self.candidate_nice)
        backend.start()
        self.candidates[model_id] = backend
        return backend

    def _switch(self, model_id: str) -> tuple[bool, str]:
        """Moves traffic to the staged candidate `model_id`; returns `(switched, message)`.

        Cases:
            `model_id` already active -> `(True, "already serving")`, nothing moves
                [claim:switch-already-serving]
            not staged, or staged but not `ready` -> `(False, "... traffic stays")`,
                the active backend keeps serving [claim:switch-refuses-unready]
            a ready candidate -> it becomes active (a switch is recorded) and the old
                active backend is retired with `drain=True` (its in-flight requests finish)
                [claim:switch-to-ready-retires-old]
        """
        # --- exercise stage 4: Switch only to a ready candidate; drain the old one. ---
        if self.active is not None and self.active.model_id == model_id:
            return True, "already serving"
        candidate = self.candidates.get(model_id)
        if candidate is None or candidate.status != "ready":
            status = "not staged" if candidate is None else candidate.status
            return False, f"candidate `{model_id[:12]}` is {status}; traffic stays"
        old, self.active = self.active, self.candidates.pop(model_id)
        self.switches.append({"model_id": model_id, "at": time.time()})
        if old is not None:
            asyncio.get_running_loop().create_task(self._retire(old, drain=True))
        return True, "switched"
        # --- end exercise ---

    async def _retire(self, backend: Backend, drain: bool) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while drain and backend.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if backend.client is not None:
            await backend.client.aclose()
        await asyncio.to_thread(backend.stop)
        self.retired.append({"model_id": backend.model_id, "inflight_at_stop": backend.inflight})

    async def _body(self, request: Request) -> str:
        payload = json.loads(await request.body())
        return str(payload["model_id"])

    async def stage(self, request: Request) -> JSONResponse:
        async with self._lock:
            backend = self._stage(await self._body(request))
        return JSONResponse(backend.describe())

    async def switch(self, request: Request) -> JSONResponse:
        async with self._lock:
            ok, message = self._switch(await self._body(request))
        return JSONResponse({"switched": ok, "message": message}, status_code=200 if ok else 409)

    async def discard(self, request: Request) -> JSONResponse:
        model_id = await self._body(request)
        async with self._lock:
            backend = self.candidates.pop(model_id, None)
        if backend is not None:
            await self._retire(backend, drain=False)
        return JSONResponse({"discarded": backend is not None})

    # FOLLOWING THE LOG -----------------------------------------------------

    async def _follow(self) -> None:
        while True:
            try:
                entries = await asyncio.to_thread(ledger.read, self.ledger_path)
                want = ledger.serving_model(entries) if not ledger.verify_chain(entries) else None
            except (ledger.LedgerError, OSError):
                want = None
            if want is not None and (self.active is None or self.active.model_id != want):
                async with self._lock:
                    backend = self._stage(want)
                    if backend.status == "ready":
                        self._switch(want)
            await asyncio.sleep(self.reconcile_s)


class HostClient:
    """The release command's side of the admin endpoints."""

    def __init__(self, port: int, timeout_s: float = 30.0):
        import httpx

        self.port = port
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s)

    def state(self) -> dict:
        return self.http.get("/state").raise_for_status().json()

    def stage(self, model_id: str) -> dict:
        return self.http.post("/admin/stage", json={"model_id": model_id}).raise_for_status().json()

    def wait_ready(self, candidate_port: int, timeout_s: float) -> dict:
        """Polls the candidate's `/readyz` until ready (returns its body), failed or
        timed out (raises `RuntimeError` with the last answer)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        body: dict = {"status": "unreachable"}
        with httpx.Client(base_url=f"http://127.0.0.1:{candidate_port}", timeout=5.0) as c:
            while time.monotonic() < deadline:
                try:
                    r = c.get("/readyz")
                    body = r.json()
                    if r.status_code == 200:
                        return body
                    if body.get("status") == "failed":
                        break
                except httpx.HTTPError as err:
                    body = {"status": "unreachable", "reason": str(err)}
                time.sleep(0.05)
        raise RuntimeError(
            f"the candidate never became ready ({body.get('status')}: {body.get('reason', '')})"
        )

    def switch(self, model_id: str) -> dict:
        r = self.http.post("/admin/switch", json={"model_id": model_id})
        return {"status_code": r.status_code, **r.json()}

    def discard(self, model_id: str) -> None:
        self.http.post("/admin/discard", json={"model_id": model_id})

    def close(self) -> None:
        self.http.close()


def find_host(host_file: str | Path) -> HostClient | None:
    """A client for the host announced in `host_file`, if it is alive; else None."""
    import httpx

    try:
        info = json.loads(Path(host_file).read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # No host announced, or a file torn by a host that died writing it.
    port = info.get("port") if isinstance(info, dict) else None
    if type(port) is not int or not 0 < port < 65536:
        return None
    client = HostClient(port, timeout_s=30.0)
    try:
        client.http.get("/healthz", timeout=2.0).raise_for_status()
    except httpx.HTTPError:
        client.close()
        return None
    return client
