"""Warm pytest runs: each check run forks from a process that has already
imported pytest and the third-party stack, so a run pays only for its own
project's code, its tests and its compiles.

The server (this file run as a script, with `python -P` so that no script
folder lands on `sys.path`) imports the stack named in `PRELOAD`, proves that
no JAX backend has started and that only the main thread runs (a JAX backend's
threads do not survive a fork; JAX's own fork warning is made an error), then
answers one JSON request per line on stdin with one JSON line on stdout:

    {"cwd": DIR, "args": [...], "env": {...}, "log": FILE, "timeout": S,
     "package": NAME, "src": DIR}
    -> {"code": N, "seconds": S}

Each request forks a child that starts a process group of its own, sends its
stdout and stderr to ``log``, enters ``cwd``, applies ``env``, puts ``cwd``
and ``src`` first on `sys.path` (as `python -m pytest` with `PYTHONPATH=src`
would), proves that ``package`` imports from ``src`` (else exit
`WRONG_IMPORT`), and calls `pytest.main(args)`. A run past ``timeout``
seconds has its whole process group killed and reports exit 124.

`WarmRunner` is the client: one server process, one request at a time.
Environment that JAX reads when it is imported (`JAX_*`) must be given to the
server when it starts (``base_env``); a request's ``env`` can change only what
is read at run time.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

# What check runs import again and again; a module missing here is skipped
# (a project that needs it imports it in the child, at the usual cost).
PRELOAD = (
    "pytest",
    "_pytest.junitxml",
    "hypothesis",
    "numpy",
    "scipy.stats",
    "jax",
    "jax.numpy",
    "jax.export",
    "flax.nnx",
    "optax",
    "orbax.checkpoint",
    "grain",
    "numpyro",
    "diffrax",
    "click",
    "pydantic",
    "matplotlib",
    "matplotlib.pyplot",
    "mlflow",
    "torch",
    "safetensors",
    "sklearn.datasets",
)
WRONG_IMPORT = 97  # The copy's package is not the one Python imports.
CHILD_CRASH = 98  # The child failed before pytest could report.
TIMED_OUT = 124
STRIPPED = re.compile(r"Stage [A-Za-z0-9_-]+ exercise: ")  # A stripped region's error.


def preload() -> list[str]:
    """Import the stack; return the modules that could not be imported."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    assert_forkable()
    gc.collect()
    gc.freeze()  # Keep the imported objects out of the children's collections.
    return missing


def assert_forkable() -> None:
    """No JAX backend and no second Python thread may exist at a fork."""
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if threads:
        raise RuntimeError(f"the warm process runs threads {threads}; it cannot fork safely")
    if "jax" in sys.modules:
        from jax._src import xla_bridge

        if xla_bridge._backends:
            raise RuntimeError("a JAX backend started in the warm process; it cannot fork")
    # JAX warns at a fork once a backend runs; in the warm process that is an error.
    warnings.filterwarnings("error", message=r".*os\.fork\(\).*", category=RuntimeWarning)


class StrippedRegionWatch:
    """A pytest plugin that finds tests which PASSED although they raised a stripped
    region's error (`Stage <id> exercise: ...`): a test that swallowed it ran code
    other than the reference's, so its pass proves nothing about the reference.

    It shadows the builtin name `NotImplementedError` with a subclass that notes
    each stripped-region message as it is built; `except NotImplementedError`
    still catches it. Written to ``report`` at the session's end as JSON:
    ``{nodeid: [message, ...]}`` for each passing test that raised one."""

    def __init__(self, report: Path) -> None:
        import builtins

        self.report = report
        self.raised: list[str] = []
        self.swallowed: dict[str, list[str]] = {}
        real = builtins.NotImplementedError
        watch = self

        class NotImplementedError(real):  # noqa: A001 - shadows the builtin on purpose
            def __init__(self, *args):
                super().__init__(*args)
                if args and isinstance(args[0], str) and STRIPPED.match(args[0]):
                    watch.raised.append(args[0])

        builtins.NotImplementedError = NotImplementedError

    def pytest_runtest_logstart(self, nodeid, location):
        self.raised = []

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.raised and nodeid not in self.failed:
            self.swallowed[nodeid] = sorted(set(self.raised))

    def pytest_sessionstart(self, session):
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_sessionfinish(self, session, exitstatus):
        self.report.write_text(json.dumps(self.swallowed, indent=1), encoding="utf-8")


def _child(request: dict) -> None:
    """In the forked child: run pytest as the request says; never returns."""
    code = CHILD_CRASH
    try:
        os.setpgid(0, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        cwd = request["cwd"]
        os.chdir(cwd)
        os.environ.update(request.get("env", {}))
        sys.dont_write_bytecode = True
        src = request.get("src")
        sys.path[:0] = [cwd] + ([src] if src else [])
        package = request.get("package")
        if package:
            module = importlib.import_module(package)
            where = Path(module.__file__ or "").resolve()
            if not src or not where.is_relative_to(Path(src).resolve()):
                print(f"`{package}` imports from {where}, not from {src}", flush=True)
                code = WRONG_IMPORT
                return
        import pytest

        plugins = []
        if request.get("stripped_report"):
            plugins.append(StrippedRegionWatch(Path(request["stripped_report"])))
        code = int(pytest.main(list(request["args"]), plugins=plugins))
    except BaseException:  # noqa: BLE001 - whatever happened must reach the log
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return TIMED_OUT
        time.sleep(delay)
        delay = min(0.1, delay * 2)
    code = os.waitstatus_to_exitcode(status)
    try:  # Reap what the run left in its group (servers a test forgot to stop).
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return code if code >= 0 else 128 - code


def serve() -> int:
    missing = preload()
    print(json.dumps({"ready": True, "missing": missing}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            _child(request)
        code = _wait(pid, float(request.get("timeout", 2400)))
        reply = {"code": code, "seconds": time.perf_counter() - start}
        print(json.dumps(reply), flush=True)
    return 0


class WarmRunner:
    """A client of one warm server; `run` is one forked pytest run. Not thread-safe:
    one runner per worker thread."""

    def __init__(self, base_env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-P", str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=base_env,
            cwd="/",
        )
        hello = self.process.stdout.readline()
        if not hello:
            raise RuntimeError("the warm pytest server did not start")
        self.missing = json.loads(hello)["missing"]

    def run(
        self,
        cwd: Path,
        args: list[str],
        env: dict[str, str],
        log: Path,
        timeout: float,
        package: str | None = None,
        src: Path | None = None,
        stripped_report: Path | None = None,
    ) -> tuple[int, float]:
        """One pytest run; returns (exit code, seconds). The output is in ``log``;
        with ``stripped_report``, the tests that passed though they raised a
        stripped region's error are written there (`StrippedRegionWatch`)."""
        request = {
            "cwd": str(cwd),
            "args": args,
            "env": env,
            "log": str(log),
            "timeout": timeout,
            "package": package,
            "src": str(src) if src else None,
            "stripped_report": str(stripped_report) if stripped_report else None,
        }
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline()
        if not reply:
            raise RuntimeError("the warm pytest server ended during a run")
        answer = json.loads(reply)
        return answer["code"], answer["seconds"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(serve())
