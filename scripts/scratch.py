"""Scratch copies of a project and pytest runs inside them.

Shared by the learner progression check (`learner.py`) and the seeded-bug
check (`seeded_bugs.py`): both change a project's source in a throw-away copy
and run some of its stage tests there, never touching the real folder.

A copy is importable in place of the installed project: the runs put the
copy's `src/` first on `sys.path` and `PYTHONPATH`, ahead of the editable
install, and each run proves it before its verdict is trusted (a warm run
exits `WRONG_IMPORT` otherwise). Every run uses one JAX compilation cache
shared by all runs, so a program that several runs compile is compiled once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from catalog_compiler.starters import copy_project  # noqa: F401  (re-exported)
from schedule import shared_cache_env
from warm_runner import TIMED_OUT, WarmRunner

ROOT = Path(__file__).resolve().parent.parent


def manifest(project: Path) -> dict:
    with (project / "project.toml").open("rb") as f:
        return tomllib.load(f)


def stage_ids(project: Path) -> list[str]:
    """The project's stage ids in manifest order."""
    return [s["id"] for s in manifest(project)["stages"]]


def stage_tests(project: Path, stage: str) -> list[str]:
    """The test files the manifest declares for ``stage``."""
    for s in manifest(project)["stages"]:
        if s["id"] == stage:
            return list(s.get("tests", []))
    raise KeyError(f"Project `{project.name}` has no stage `{stage}`.")


def stage_rows(project: Path) -> dict[str, str]:
    """Map each declared test file's stem to its stage id, e.g. `1`."""
    return {Path(t).stem: s["id"] for s in manifest(project)["stages"] for t in s.get("tests", [])}


def package_name(project: Path) -> str:
    """The one package under ``src/``."""
    packages = [p.name for p in (project / "src").iterdir() if (p / "__init__.py").is_file()]
    if len(packages) != 1:
        raise ValueError(f"`{project.name}/src` should hold exactly one package, not {packages}.")
    return packages[0]


@dataclass
class Run:
    """One pytest process in a copy: its exit status, output and seconds."""

    code: int
    output: str
    seconds: float

    @property
    def first_failure(self) -> str:
        """The first `FAILED <node>` or `ERROR <node>` line pytest printed, if any.

        A node's parameter id may hold spaces (`ids=str` of a tuple: `t[(4, 1)]`), so
        a bracketed id runs to the first `]` that ends the line or precedes the
        ` - ` of pytest's message."""
        match = re.search(r"^(FAILED|ERROR) (\S*?\[.*?\]|\S+)(?= - |$)", self.output, re.M)
        return match.group(2) if match else ""


def run_env(copy: Path, cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(copy / "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    shared_cache_env(env, cache_dir)
    env["EVIDENCE_DIR"] = str(copy / "evidence")
    env.setdefault("MPLBACKEND", "Agg")
    return env


def pytest_args(nodes: list[str], basetemp: str, stop_first: bool = True) -> list[str]:
    """``pytest [-x] -q`` on ``nodes``, as every check run calls it."""
    return [
        *(["-x"] if stop_first else []),
        "-q",
        "-p",
        "no:cacheprovider",
        "--tb=short",
        "-o",
        "console_output_style=classic",
        f"--basetemp={basetemp}",
        *nodes,
    ]


def run_pytest(
    copy: Path,
    nodes: list[str],
    cache_dir: Path,
    timeout: float = 2400,
    runner: WarmRunner | None = None,
    stop_first: bool = True,
    extra_args: tuple[str, ...] = (),
    stripped_report: Path | None = None,
) -> Run:
    """``pytest -x -q`` on ``nodes`` inside ``copy``; a timeout counts as exit 124.

    With a warm ``runner`` the run forks from its server (and the run itself
    proves that the copy's package is the one imported: exit `WRONG_IMPORT`
    otherwise); without one it is a fresh `python -m pytest` process."""
    # A temporary folder of the run's own: pytest prunes all but its three newest
    # numbered folders, which would delete a longer run's files under parallel runs.
    basetemp = tempfile.mkdtemp(prefix="pytest-", dir=copy.parent)
    args = [*extra_args, *pytest_args(nodes, basetemp, stop_first)]
    env = run_env(copy, cache_dir)
    if runner is not None:
        log = Path(f"{basetemp}.log")  # Beside it: pytest empties its basetemp first.
        changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
        # Plugin modules the warm server imported (jaxtyping's) cannot have their
        # asserts rewritten; pytest's warning about that says nothing of the tests.
        quiet = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
        code, seconds = runner.run(
            copy,
            quiet + args,
            changed,
            log,
            timeout,
            package_name(copy),
            copy / "src",
            stripped_report,
        )
        output = log.read_text(encoding="utf-8", errors="replace")
        log.unlink()
        if code == TIMED_OUT:
            output = f"timed out after {timeout:.0f} s\n{output}"
        return Run(code, output, seconds)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *args],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code = TIMED_OUT
        output = f"timed out after {timeout:.0f} s\n{exc.stdout or ''}"
    return Run(code, output, time.perf_counter() - start)
