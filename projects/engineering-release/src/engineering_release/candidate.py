"""A candidate server's process: `python -m engineering_release.candidate`.

The serving host (`serve.Backend`) starts one process per candidate, so that
loading a model, its golden self-test and compiling its forward pass run in an
interpreter of their own and never hold the router's interpreter lock.

Arguments: `STORE_ROOT MODEL_ID SOCKET_FD STATUS_FD LOAD_NICE`.
  SOCKET_FD  a listening TCP socket on 127.0.0.1, bound by the host (so the host
             knows the port before this process has started);
  STATUS_FD  the write end of a pipe: one JSON line per status change,
             `{"status": "ready"|"failed", "reason": str, "self_test": dict}`;
  LOAD_NICE  how much lower the start-up work runs (0: not lower; 1-19 raise
             the nice value of the threads that import, load, self-test and
             compile, by that much above the process's own, so that a busy
             host's serving keeps the cores; the threads that serve afterwards,
             the event loop and XLA's, keep the process's own priority).
Standard input: the host keeps it open for the candidate's lifetime; end of
file (the host stopped it, or the host died) shuts the server down, and the
process exits at the latest `EXIT_GRACE_S` seconds later.

Endpoints (as the host's former in-process candidate): `GET /readyz` answers
200 only after the model loaded (digest checked), its golden self-test passed
and its forward pass compiled, 503 with the reason before (`loading`) or
forever after a failure (`failed`); `POST /predict` takes
`{"inputs": [[64 pixels 0..16], ...]}` and answers
`{"model_id", "predictions", "logits"}` (422 for a malformed body, 503 before
ready).

Start-up order: the web server is imported and serving `/readyz` (503,
`loading`) before JAX is imported, in a thread, with the model. `/readyz`
reports the process's CPU seconds for each part of its start-up (`startup`:
web server, JAX and model imports, JAX's CPU client, load + self-test +
compile, total), the wall seconds from its first line to ready (the
process's own clocks), and the names of the threads left at the lowered
priority (LLVM's compile workers, started by the compile).
"""

import asyncio
import json
import os
import socket
import sys
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

# The start-up clocks, before any third-party import (the web server's included).
_STARTED = (time.monotonic(), time.process_time())

EXIT_GRACE_S = 10.0


class Candidate:
    """The candidate's state and endpoints. `status`: `loading` -> `ready` or `failed`."""

    def __init__(self, store_root: Path, model_id: str, status_out, load_nice: int = 0):
        self.store_root, self.model_id, self.status_out = store_root, model_id, status_out
        self.load_nice = load_nice
        self.modules: tuple = ()
        self.status, self.reason = "loading", "loading the model and running its self-test"
        self.self_test: dict = {}
        self.startup: dict = {}
        self.loaded = None
        self.predict_fn = None
        self.parse = None
        from starlette.applications import Starlette
        from starlette.routing import Route

        self.app = Starlette(
            routes=[
                Route("/readyz", self.readyz),
                Route("/predict", self.predict, methods=["POST"]),
            ],
            lifespan=self._lifespan,
        )

    def _import(self) -> None:
        from engineering_release import data, gates, serve, train

        self.modules = (data, gates, serve, train)

    @staticmethod
    def _warm_backend() -> None:
        """Creates JAX's CPU client, and with it the threads that run every later
        computation, in a thread at the process's own priority."""
        import jax
        import jax.numpy as jnp

        jax.block_until_ready(jnp.zeros(1, jnp.float32) + 1)

    def _load(self) -> None:
        import numpy as np

        data, gates, serve, train = self.modules
        loaded, check = gates.prepare_candidate(self.store_root, self.model_id)
        self.self_test = check
        if not check["passed"]:
            raise RuntimeError(
                f"golden self-test failed: {check}; this is not the model the golden "
                f"outputs came from"
            )
        train.predict(loaded.graphdef, loaded.params, np.zeros((1, data.NUM_FEATURES), np.float32))
        self.loaded, self.predict_fn, self.parse = loaded, train.predict, serve.parse_inputs

    def _report(self) -> None:
        line = json.dumps(
            {"status": self.status, "reason": self.reason, "self_test": self.self_test}
        )
        try:
            self.status_out.write(line + "\n")
            self.status_out.flush()
        except OSError:
            pass  # The host is gone; standard input's end of file stops this process.

    async def _start(self) -> None:
        """Imports, then the JAX client (at normal priority), then load, self-test and
        compile; the imports and the load run in threads of their own at `load_nice`,
        which end when done, so no thread that serves later runs at that priority."""
        cpu = [time.process_time()]
        try:
            await _in_thread(self._import, self.load_nice)
            cpu.append(time.process_time())
            await _in_thread(self._warm_backend, 0)
            cpu.append(time.process_time())
            await _in_thread(self._load, self.load_nice)
            cpu.append(time.process_time())
        except Exception as err:  # noqa: BLE001 - any failure keeps the candidate unready.
            self.status, self.reason = "failed", f"{type(err).__name__}: {err}"
        else:
            self.startup = {
                "load_nice": self.load_nice,
                "cpu_s_web_server": cpu[0] - _STARTED[1],
                "cpu_s_jax_and_model_imports": cpu[1] - cpu[0],
                "cpu_s_jax_client": cpu[2] - cpu[1],
                "cpu_s_load_selftest_compile": cpu[3] - cpu[2],
                "cpu_s_total": cpu[3] - _STARTED[1],
                "wall_s_total": time.monotonic() - _STARTED[0],
                "threads_left_lowered": _threads_at_nice(self.load_nice),
            }
            self.status, self.reason = "ready", ""
        self._report()

    def _lifespan(self, app):
        @asynccontextmanager
        async def span(app):
            task = asyncio.create_task(self._start())
            yield
            task.cancel()

        return span(app)

    async def readyz(self, request):
        from starlette.responses import JSONResponse

        body = {
            "status": self.status,
            "reason": self.reason,
            "model_id": self.model_id,
            "self_test": self.self_test,
            "startup": self.startup,
        }
        return JSONResponse(body, status_code=200 if self.status == "ready" else 503)

    async def predict(self, request):
        from starlette.responses import JSONResponse

        if self.status != "ready":
            return JSONResponse({"error": f"not ready: {self.reason}"}, status_code=503)
        try:
            x = self.parse(json.loads(await request.body()))
        except ValueError as err:
            return JSONResponse({"error": str(err)}, status_code=422)
        import numpy as np

        logits = np.asarray(self.predict_fn(self.loaded.graphdef, self.loaded.params, x))
        return JSONResponse(
            {
                "model_id": self.model_id,
                "predictions": logits.argmax(axis=1).tolist(),
                "logits": logits.tolist(),
            }
        )


async def _in_thread(fn, nice: int):
    """Runs `fn()` in a new thread whose nice value is raised by `nice` (Linux: the
    nice value is per thread); the thread ends with `fn`. Returns its result."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(setter, value) -> None:
        if not done.done():
            setter(value)

    def body() -> None:
        try:
            if nice:
                _PHASE_THREADS.add(threading.get_native_id())
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _lowered(nice))
            result = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting task.
            loop.call_soon_threadsafe(settle, done.set_exception, err)
        else:
            loop.call_soon_threadsafe(settle, done.set_result, result)

    thread = threading.Thread(target=body, name=f"candidate-start-{fn.__name__}", daemon=True)
    thread.start()
    return await done


_PHASE_THREADS: set[int] = set()  # Native ids of the lowered start-up threads.


def _lowered(nice: int) -> int:
    """The nice value `nice` steps below the process's own (at most 19)."""
    return min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + nice)


def _threads_at_nice(nice: int) -> list[str] | None:
    """Names of this process's threads at the lowered nice value, other than the
    start-up threads themselves (which are ending; None: `nice` is 0, or no /proc).
    Threads that a lowered thread started inherit its value: LLVM's compile workers
    do; the event loop and XLA's execution threads do not."""
    if not nice:
        return None
    target, names = _lowered(nice), []
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        if int(task.name) in _PHASE_THREADS:
            continue
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[16]) == target:  # Field 19 of stat: nice.
                names.append((task / "comm").read_text().strip())
        except OSError:
            continue  # A thread that ended while being read.
    return sorted(names)


def _watch_host(server) -> None:
    """Blocks until standard input ends, then stops the server; exits if it lingers."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    server.should_exit = True
    deadline = threading.Timer(EXIT_GRACE_S, os._exit, args=(1,))
    deadline.daemon = True  # A clean exit before it fires does not wait for it.
    deadline.start()


def main(argv: list[str]) -> None:
    import numpy  # noqa: F401 - here, so that its BLAS threads start at normal priority.
    import uvicorn

    store_root, model_id, sock_fd, status_fd, load_nice = argv
    sock = socket.socket(fileno=int(sock_fd))
    with os.fdopen(int(status_fd), "w") as status_out:
        candidate = Candidate(Path(store_root), model_id, status_out, int(load_nice))
        server = uvicorn.Server(
            uvicorn.Config(
                candidate.app, log_level="warning", access_log=False, lifespan="on", http="h11"
            )
        )
        threading.Thread(target=_watch_host, args=(server,), daemon=True).start()
        asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main(sys.argv[1:])
