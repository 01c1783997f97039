"""The learner's loop in every ready project's starter: `progress.py`, `hint`, `watch`.

Per starter (every region stripped), in one pass:
- `progress.py watch --runs 2` runs stage 1 first. Its report must name the
  test pytest itself reports as stage 1's first failure (a separate
  `pytest -x -rf` run read from pytest's own summary, not from the JUnit
  report `progress.py` reads), that test's "proves" sentence (its docstring,
  read here from its AST), and the file:line and hint of the region to write:
  the one whose hint that failure quotes, else stage 1's first, found by the
  compiler's region parser in the starter's text.
- `hint` three times gives levels 1, 2 and 3 in order, and a fourth time
  stays at 3. Level 1 is the region's hint; level 2 the function's contract
  and the stage's checks; level 3 a diff whose added lines are the region's
  body in the reference project's file (read here from the reference) and
  whose removed line is the starter's `raise NotImplementedError`.
- a save under `src/` makes `watch` run the stage again; it then exits (its
  `--runs 2`) with stage 1 still failing.
Each starter's seconds (pytest alone; progress's first run, its tests and its
own time, as it prints them) are written to `learner_loop.json` in the system's
temporary folder: figures to read, never a verdict.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from catalog_compiler.exercises import find_regions, source_files
from catalog_compiler.starters import write_starter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from ready_projects import ready_projects  # noqa: E402
from scratch import stage_tests  # noqa: E402

pytestmark = pytest.mark.learner_loop
PROJECTS = ready_projects()
FIGURES: dict[str, dict] = {}
FIGURES_FILE = Path(tempfile.gettempdir()) / "learner_loop.json"


def environment(folder: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(folder / "src"), MPLBACKEND="Agg", COLUMNS="400")
    env.pop("EVIDENCE_DIR", None)
    return env


def progress(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "progress.py", *args],
        cwd=folder,
        env=environment(folder),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )


def pytest_first_failure(folder: Path, tests: list[str]) -> tuple[str, str]:
    """The node id of the first failure and the rest of its line, from pytest's own
    short summary."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider", *tests],
        cwd=folder,
        env=environment(folder),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout[-2000:]
    found = re.findall(r"^(?:FAILED|ERROR) (\S+)(.*)$", done.stdout, re.M)
    assert found, done.stdout[-2000:]
    return found[0]


def first_sentence_of(folder: Path, node_id: str) -> str:
    path, *scope = node_id.split("::")
    tree = ast.parse((folder / path).read_text(encoding="utf-8"))
    name = scope[-1].split("[")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            text = " ".join((ast.get_docstring(node) or "").split())
            return text.split(". ")[0].rstrip(".") if text else ""
    raise AssertionError(f"{node_id}: no such test function")


def region_to_write(project: Path, folder: Path, stage: str, failure_line: str):
    """(starter region, reference region, reference file lines) of the region the
    failure's line quotes (a stripped region's error names its hint), else of
    ``stage``'s first region in file order."""
    found = []
    for source in source_files(project):
        rel = source.relative_to(project).as_posix()
        starter = find_regions((folder / rel).read_text(encoding="utf-8"), rel)
        reference_text = source.read_text(encoding="utf-8")
        reference = find_regions(reference_text, rel)
        for mine, theirs in zip(starter, reference, strict=True):
            if mine.stage == stage:
                found.append((mine, theirs, reference_text.splitlines()))
    assert found, f"{project.name}: no region of stage {stage}"
    named = [f for f in found if f"exercise: {f[0].hint}" in failure_line]
    return (named or found)[0]


class Watch:
    """`progress.py watch --runs 2` in the background, its output collected."""

    def __init__(self, folder: Path) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "progress.py", "watch", "--runs", "2"],
            cwd=folder,
            env=environment(folder),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, count: int = 1, poke=None) -> None:
        """Until ``needle`` was printed ``count`` times (calling ``poke`` each second)."""
        deadline = time.monotonic() + 600  # A hang guard, not a verdict on speed.
        while self.text().count(needle) < count:
            assert self.proc.poll() is None or self.text().count(needle) >= count, self.text()
            assert time.monotonic() < deadline, f"never printed {needle!r}:\n{self.text()}"
            if poke:
                poke()
            time.sleep(1)


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_progress_hint_and_watch_in_the_starter(project: Path, tmp_path: Path):
    folder = write_starter(project, tmp_path / project.name)
    tests = stage_tests(project, "1")
    started = time.perf_counter()
    expected_test, failure_line = pytest_first_failure(folder, tests)
    pytest_seconds = time.perf_counter() - started

    watch = Watch(folder)
    started = time.perf_counter()
    try:
        watch.wait_for("watching src/")
        progress_seconds = time.perf_counter() - started
        report = watch.text()
        assert "Next: stage 1" in report, report
        own = re.search(r"\(tests ([0-9.]+) s; progress.py itself ([0-9.]+) s\)", report)
        assert own, report
        assert f"failing: {expected_test}" in report, (expected_test, report)
        proves = first_sentence_of(folder, expected_test)
        assert proves, f"{expected_test} has no docstring saying what it proves"
        assert f"it proves: {proves}" in report, (proves, report)
        mine, theirs, reference = region_to_write(project, folder, "1", failure_line)
        assert f"write: {mine.path}:{mine.start}: {mine.hint}" in report, report

        levels = [progress(folder, "hint") for _ in range(4)]
        for n, done in enumerate(levels, start=1):
            assert done.returncode == 0, done.stderr
            assert f"{mine.path}:{mine.start}: level {min(n, 3)} of 3" in done.stdout, done.stdout
        assert f": {mine.hint}" in levels[0].stdout
        assert "What stage 1's checks prove:" in levels[1].stdout
        assert proves in levels[1].stdout
        diff = levels[2].stdout.splitlines()
        added = [ln[1:] for ln in diff if ln.startswith("+") and not ln.startswith("+++")]
        removed = [ln[1:] for ln in diff if ln.startswith("-") and not ln.startswith("---")]
        assert added == reference[theirs.start : theirs.end - 1], levels[2].stdout
        assert len(removed) == 1 and "raise NotImplementedError" in removed[0], removed
        assert levels[3].stdout == levels[2].stdout

        source = folder / mine.path

        def save() -> None:
            with source.open("a", encoding="utf-8") as f:
                f.write("# saved\n")

        watch.wait_for("running stage 1 tests", count=2, poke=save)
        assert watch.proc.wait(timeout=600) == 1, watch.text()
    finally:
        watch.proc.kill()
        watch.proc.wait()
    assert "saved: " in watch.text() and watch.text().count("Next: stage 1") == 2, watch.text()
    FIGURES[project.name] = {
        "pytest_alone_s": round(pytest_seconds, 2),
        "progress_first_run_s": round(progress_seconds, 2),
        "progress_tests_s": float(own.group(1)),
        "progress_itself_s": float(own.group(2)),
    }
    FIGURES_FILE.write_text(json.dumps(FIGURES, indent=1) + "\n", encoding="utf-8")


def refusal(folder: Path, python: list[str], env: dict[str, str]) -> str:
    """What `progress.py` says under ``python``: it must exit 2 with one line and
    write no stamps."""
    done = subprocess.run(
        [*python, "progress.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (folder / "evidence" / "progress.json").exists()
    return done.stderr


def test_progress_refuses_a_python_that_cannot_run_the_starter(tmp_path: Path):
    """Without the project, or with another copy of it installed, `progress.py` says so
    in one line instead of reporting stage 1 as failed."""
    project = next(p for p in PROJECTS if p.name == "workload-operations")
    folder = write_starter(project, tmp_path / project.name)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # No site-packages at all: not even pytest imports.
    said = refusal(folder, [sys.executable, "-S"], env)
    assert "cannot import `pytest`" in said and ". .venv/bin/activate" in said, said
    # The repository's environment holds the reference in editable mode, not this folder.
    said = refusal(folder, [sys.executable], env)
    assert f"from {project / 'src'}" in said and "pip install -e" in said, said
