"""Runs log-writing commands of `engineering-release` from several processes at once.

Usage: python stress_worker.py ROOT PROCESSES COMMANDS SPLIT.npz -- ARG ... [-- ARG ...]

Each `--`-separated group is the argument list of one command (after `--root
ROOT`; `{p}` and `{i}` in an argument become the process and command number);
process `p` runs its commands `i = 0..COMMANDS-1` cycling through the groups
from group `p`. The parent imports the command line and its heavy
dependencies once (no JAX backend, no database connection: nothing a child
could inherit in use), forks the processes, and releases them together
through a pipe, so that their commands overlap from the first one. Each child
runs its commands through the CLI's own entry point (click's test runner, in
the child) and writes one JSON line per command: the process, the command,
its exit code, its output, and the exception it raised, if any; the parent
prints them all.

`SPLIT.npz` holds the held-out split (`train`, `heldout`, as `data.split_ids`
computed it in the test process for `split_seed=0, test_fraction=0.2`): JAX
computes that split, and JAX may not run on both sides of a fork, so the
children read it instead of starting a JAX backend each.
"""

import json
import os
import sys

import mlflow.store.model_registry.sqlalchemy_store  # noqa: F401 - the slow import, once.
import numpy as np
import sklearn.datasets  # noqa: F401
from click.testing import CliRunner

from engineering_release import cli, data, gates, release  # noqa: F401


def _install_split(path: str) -> None:
    with np.load(path) as saved:
        split = (saved["train"], saved["heldout"])
    for array in split:
        array.setflags(write=False)

    def split_ids(split_seed: int, test_fraction: float):
        if (split_seed, test_fraction) != (0, 0.2):
            raise RuntimeError(f"No split handed over for {(split_seed, test_fraction)}.")
        return split

    data.split_ids = split_ids
    data._digits()  # NumPy arrays only: loaded once, before the fork.


def child(root: str, process: int, count: int, commands: list[list[str]], go: int, out) -> None:
    os.read(go, 1)  # Every process starts at once.
    runner = CliRunner()
    for i in range(count):
        args = [a.format(p=process, i=i) for a in commands[(process + i) % len(commands)]]
        result = runner.invoke(cli.main, ["--root", root, *args])
        exc = result.exception
        record = {
            "process": process,
            "i": i,
            "args": args,
            "exit": result.exit_code,
            "output": result.output,
            "exception": None if exc is None or isinstance(exc, SystemExit) else repr(exc),
        }
        out.write(json.dumps(record) + "\n")
        out.flush()


def main() -> None:
    root, processes, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    _install_split(sys.argv[4])
    commands, current = [], None
    for arg in sys.argv[5:]:
        if arg == "--":
            current = []
            commands.append(current)
        else:
            current.append(arg)
    go_read, go_write = os.pipe()
    pids = []
    for process in range(processes):
        pid = os.fork()
        if pid == 0:
            os.close(go_write)
            try:
                with open(f"{root}.proc{process}.jsonl", "w") as out:
                    child(root, process, count, commands, go_read, out)
            finally:
                os._exit(0)
        pids.append(pid)
    os.close(go_read)
    os.write(go_write, b"x" * processes)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += status != 0
    for process in range(processes):
        with open(f"{root}.proc{process}.jsonl") as f:
            sys.stdout.write(f.read())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
