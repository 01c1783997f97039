"""Runs `engineering-release release` in child processes killed at chosen moments.

Usage: python kill_worker.py TEMPLATE MODEL_ID WORKDIR POINT [POINT ...]

This parent imports the package and its heavy dependencies once (no JAX
backend, no database connection: nothing that a child could inherit in use),
then forks one child per crash point, two at a time. Each child copies the
template state to `WORKDIR/<point>/release`, sets `ENGINEERING_RELEASE_CRASH_AT`
to the point, and runs the `release` command's entry point, which SIGKILLs
its own process on reaching that point. Forking saves each trial the
interpreter start-up and imports (seconds of CPU each), not any of the
release's own work. Prints one JSON line per trial: the point, the state
directory, how the child ended and the end of its stderr.
"""

import json
import os
import shutil
import signal
import sys
import traceback
from pathlib import Path

import mlflow.store.model_registry.sqlalchemy_store  # noqa: F401 - the slow import, once.
import sklearn.datasets  # noqa: F401

from engineering_release import cli, gates, release, serve  # noqa: F401


def child(template: Path, model_id: str, root: Path, point: str) -> None:
    code = 0
    try:
        # The child's own account, for a trial that ends without reaching its point.
        os.dup2(os.open(root.parent / "stderr.txt", os.O_WRONLY | os.O_CREAT, 0o644), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        shutil.copytree(template, root)
        os.environ[release.CRASH_ENV] = point
        cli.main(["--root", str(root), "release", model_id], standalone_mode=True)
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    template, model_id, workdir = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    pending = list(sys.argv[4:])
    running: dict[int, tuple[str, Path]] = {}
    while pending or running:
        while pending and len(running) < 2:
            point = pending.pop(0)
            root = workdir / point / "release"
            root.parent.mkdir(parents=True)
            pid = os.fork()
            if pid == 0:
                child(template, model_id, root, point)
            running[pid] = (point, root)
        pid, status, usage = os.wait4(-1, 0)
        point, root = running.pop(pid)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        print(
            json.dumps(
                {
                    "point": point,
                    "root": str(root),
                    "killed": killed,
                    "exit": os.waitstatus_to_exitcode(status),
                    "cpu_s": usage.ru_utime + usage.ru_stime,
                    "stderr_tail": (root.parent / "stderr.txt").read_text(errors="replace")[-2000:],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
