"""One scheduler for the matrix: jobs run longest first, one per core.

A `Job` has an estimate (seconds), a part (`suites`, `stages`,
`seeded-bugs`) and an action that a `Worker` runs. `run_jobs` runs every job
with ``jobs`` worker threads, always taking the longest queued job next
(longest-processing-time-first packs the tail tight), and returns each job's
result and seconds.

Each worker owns one warm pytest server (`warm_runner`), started on its first
check run, so no two threads ever share one.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warm_runner import WarmRunner

_SEQ = itertools.count()


@dataclass(order=True)
class Job:
    sort_key: tuple = field(init=False, repr=False)
    name: str = field(compare=False)
    part: str = field(compare=False)
    estimate: float = field(compare=False)
    action: Callable[[Worker], Any] = field(compare=False, repr=False)

    def __post_init__(self) -> None:
        self.sort_key = (-self.estimate, next(_SEQ))


@dataclass
class Done:
    job: Job
    result: Any
    seconds: float
    started: float  # Seconds since the schedule began.


def scratch_tmp(cache_dir: Path) -> Path:
    """The temporary folder of the check runs that use ``cache_dir``: beside it, in
    the folder the caller removes when its runs end."""
    return cache_dir.parent / "tmp"


def warm_env(cache_dir: Path) -> dict[str, str]:
    """The environment a warm server starts with: what JAX reads at import."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # A forked run ends in `os._exit` (or is killed at its timeout), so `atexit`
    # clean-up such as a `TemporaryDirectory` made at import never runs: what a
    # run leaves in its temporary folder is removed with the caller's folder.
    tmp = scratch_tmp(cache_dir)
    tmp.mkdir(parents=True, exist_ok=True)
    # Open to every account, as the system temporary folder is: some tests start
    # a server under another one (PostgreSQL's initdb runs as `postgres`) in a
    # folder made here, so this folder is world-writable with the sticky bit and
    # the caller's private folder above it lets other accounts pass through.
    tmp.chmod(0o1777)
    tmp.parent.chmod(tmp.parent.stat().st_mode | 0o111)
    env["TMPDIR"] = str(tmp)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    return shared_cache_env(env, cache_dir)


# JAX's warning when a cache entry cannot be read; it then compiles, as on a miss.
CACHE_READ_WARNING = "Error reading persistent compilation cache entry"


def shared_cache_env(env: dict[str, str], cache_dir: Path) -> dict[str, str]:
    """``env`` with JAX's persistent compilation cache at ``cache_dir``, which
    runs side by side share.

    JAX writes a cache entry in place (without a lock when the cache has no size
    limit, and a limit makes every write list the whole folder), so one run can
    read the half-written entry of another. JAX then warns with
    `CACHE_READ_WARNING` and compiles the program itself: the result is the same
    as on a miss. A project's `filterwarnings = error` would make that warning
    fail whichever test was compiling, so runs that share a cache show it in the
    warnings summary instead (a command-line `-W` outranks the ini file)."""
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
    # Cache every program, not only those over JAX's default 1 s of compile:
    # the runs of one check compile mostly the same small programs again.
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    shown = f'-W "default:{CACHE_READ_WARNING}:UserWarning"'
    if shown not in env.get("PYTEST_ADDOPTS", ""):
        env["PYTEST_ADDOPTS"] = " ".join(filter(None, [env.get("PYTEST_ADDOPTS", ""), shown]))
    return env


class Worker:
    """One scheduler thread's resources: a warm pytest server, started lazily."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._runner: WarmRunner | None = None

    @property
    def runner(self) -> WarmRunner:
        if self._runner is None:
            self._runner = WarmRunner(warm_env(self.cache_dir))
        return self._runner

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()


def run_jobs(
    initial: list[Job],
    jobs: int,
    cache_dir: Path,
    on_done: Callable[[Done, int, int], None] | None = None,
) -> list[Done]:
    """Run ``initial``, ``jobs`` at a time, longest first. ``on_done(done, finished,
    total)`` is called under a lock as each ends."""
    heap: list[Job] = list(initial)
    heapq.heapify(heap)
    cond = threading.Condition()
    running = 0
    total = len(heap)
    finished: list[Done] = []
    errors: list[BaseException] = []
    start = time.perf_counter()

    def work() -> None:
        nonlocal running
        worker = Worker(cache_dir)
        try:
            while True:
                with cond:
                    while not heap and running and not errors:
                        cond.wait()
                    if not heap or errors:
                        return
                    job = heapq.heappop(heap)
                    running += 1
                began = time.perf_counter()
                try:
                    result = job.action(worker)
                except BaseException as exc:  # noqa: BLE001 - reported once all stop
                    with cond:
                        errors.append(exc)
                        running -= 1
                        cond.notify_all()
                    return
                done = Done(job, result, time.perf_counter() - began, began - start)
                with cond:
                    running -= 1
                    finished.append(done)
                    if on_done:
                        on_done(done, len(finished), total)
                    cond.notify_all()
        finally:
            worker.close()

    threads = [threading.Thread(target=work) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return finished
