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
import tomllib
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


# A wrong stage 1 per project: one of its seeded mistakes, written into the code the
# learner writes (a stage-1 region) of a starter whose stage-1 regions hold the
# reference. Each is one whose first failing check states figures.
WRONG_STAGE_ONE = {
    "bayesian-regression": "prior-rows-use-precision",
    "deployment-audit": "relu-on-logits",
    "derivative-audit": "fd-forgets-the-two",
    "engineering-release": "digest-hashes-mtime",
    "kernel-audit": "eps-outside-sqrt",
    "mlp-classifier": "no-hidden-activation",
    "policy-evaluation": "slip-draws-three-actions",
    "reproducible-experiments": "uncommitted-diff-ignored",
    "scientific-inverse": "rk4-equal-weights",
    "sharded-training": "batch-left-replicated",
    "training-methods": "mlm-mean-over-all-positions",
    "weight-conversion": "conv-kernel-hw-swapped",
    "workload-operations": "examples-counted-as-batches",
}
# What makes an assertion line a figure against a limit.
COMPARED = re.compile(r"\d.*(==|!=|<|>|±|tolerance|difference)|(==|!=|<|>|±|tolerance).*\d")


def last_failed_record(folder: Path) -> dict | None:
    """The last record marked failed in the stage-1 evidence the run wrote, read here."""
    path = folder / "evidence" / "stage_1.json"
    if not path.is_file():
        return None
    failed = [r for r in json.loads(path.read_text())["records"] if r.get("passed") is False]
    return failed[-1] if failed else None


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_a_wrong_stage_one_shows_its_figure_and_level_two_explains_the_check(
    project: Path, tmp_path: Path
):
    """A stage 1 written with one seeded mistake: `progress.py` names the failing test and
    one line with the check's figures against its limit (the last failed record of the
    evidence the run wrote, read here from the JSON, else pytest's assertion line with
    its figures); `hint` at level 2 starts from that check and lists the stage's
    known mistakes, the one written here among them."""
    bugs = tomllib.loads((project / "seeded_bugs.toml").read_text(encoding="utf-8"))["bugs"]
    bug = next(b for b in bugs if b["id"] == WRONG_STAGE_ONE[project.name])
    assert bug["stage"] == "1", bug
    folder = write_starter(project, tmp_path / project.name, keep={"1"})
    source = folder / bug["file"]
    text = source.read_text(encoding="utf-8")
    at = text.index(bug["find"])
    line = text[:at].count("\n") + 1
    regions = find_regions(text, bug["file"])
    assert any(r.stage == "1" and r.start <= line < r.end for r in regions), "not learner code"
    source.write_text(text.replace(bug["find"], bug["replace"], 1), encoding="utf-8")

    done = progress(folder)
    assert done.returncode == 1, done.stdout + done.stderr
    report = done.stdout.splitlines()
    failing = next(i for i, ln in enumerate(report) if ln.strip().startswith("failing: "))
    failing_test = report[failing].split("failing: ", 1)[1]
    record = last_failed_record(folder)
    figure_lines = [ln for ln in report if ln.strip().startswith("failed check: ")]
    if record is not None:
        assert len(figure_lines) == 1, report
        figure = figure_lines[0]
        # One line: the check, then its observed figures (cut short when long).
        assert record["check"] in figure and len(figure.strip()) <= 320, (record, figure)
        observed = record["observed"]
        first = next(iter(observed), None) if isinstance(observed, dict) else None
        assert first is None or f"observed {first} = " in figure, (first, figure)
    else:
        assert not figure_lines, report
        figure = report[failing + 1]
        assert COMPARED.search(figure), figure

    levels = [progress(folder, "hint") for _ in range(2)]
    assert all(level.returncode == 0 for level in levels), [lv.stderr for lv in levels]
    assert "level 2 of 3" in levels[1].stdout, levels[1].stdout
    second = levels[1].stdout
    assert f"The check that failed on the last run: {failing_test}" in second, second
    if record is not None:
        assert figure.strip() in second, (figure, second)
    assert "Mistakes known to fail this stage's checks" in second, second
    assert bug["why"] in second, (bug["why"], second)


_COMPILED: list = []


def catalog_roles_json(project: Path) -> bytes:
    """The `roles.json` the published starter of ``project`` ships (the compiled catalog,
    compiled once)."""
    from catalog_compiler.pipeline import compile_catalog
    from catalog_compiler.portfolio import roles_json

    if not _COMPILED:
        compiled = compile_catalog(ROOT)
        assert compiled.ok, "the catalog does not compile"
        _COMPILED.append(compiled.catalog)
    return roles_json(_COMPILED[0], project.name)


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_coverage_in_the_starter_names_every_stage_its_first_route_cites(
    project: Path, tmp_path: Path
):
    """`python progress.py coverage --role <first route of roles.json>` in a fresh starter
    (no stage run, so nothing demonstrated): exit 1, meaning a cited stage remains (0
    would mean every cited stage is demonstrated; 2 a usage or file problem), no
    traceback, and each stage of the project that the route cites shown as remaining
    with a reason; then `--help` lists every command. It runs no stage test."""
    folder = write_starter(project, tmp_path / project.name, roles=catalog_roles_json(project))
    routes = json.loads((folder / "roles.json").read_text("utf-8"))["roles"]
    assert routes, f"no route cites {project.name}"
    route = routes[0]
    stages = {s["id"] for s in tomllib.loads((folder / "project.toml").read_text())["stages"]}
    cited = {sid for skill in route["skills"] for sid in skill["stageIds"]} & stages
    assert cited, route
    done = progress(folder, "coverage", "--role", route["id"])
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "Traceback" not in said, said
    for sid in sorted(cited):
        shown = re.search(rf"^\s+remaining: stage {re.escape(sid)} \((.+)\)$", done.stdout, re.M)
        assert shown and shown.group(1).strip(), (sid, done.stdout)
    assert "demonstrated: stage" not in done.stdout, done.stdout
    # `--help` in the same starter: exit 0 and every command of the learner's loop.
    helped = progress(folder, "--help")
    assert helped.returncode == 0 and "Traceback" not in helped.stdout, helped.stderr
    for command in ("--all", "hint", "watch", "dossier", "coverage --role"):
        assert f"python progress.py {command}" in helped.stdout, (command, helped.stdout)
