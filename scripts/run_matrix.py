"""The whole test matrix, as `make test` runs it.

Runs, each in its own pytest process: the compiler tests, the repository
contract tests, every `ready` project's tests (from inside the project folder,
as a learner would), and the browser check of the built site; and the two
checks of LEARNING.md over every checked project: the learner progression
(`learner.py`) and the seeded bugs (`seeded_bugs.py`); and a sample of the kills each
project's mutation report claims, rerun (`mutate.py`, one per stage, drawn
by the stage's code hash, so the same code draws the same kills). Then prints one table,
suite x stage, with passed / failed / skipped counts and seconds, each part's
time (suites, learner, seeded bugs), and a closing line
`N passed, N failed, N skipped`. A project's test files map to stages through
its `project.toml`; files no stage declares show as `extra: <file>`.

One scheduler (`schedule.py`) runs everything, one job per core (two to four;
`MATRIX_JOBS=N` sets the number), always the longest queued job next, using
the job times in `matrix_estimates.json`: the suites first, and a project's
check runs are queued when its suite ends. Check runs fork from a warm pytest
server per worker (`warm_runner.py`). All runs share one JAX compilation
cache, so a program the suites compiled is loaded, not compiled, by the checks.
`--update-estimates` rewrites the estimates file from this run's times.

Exit status: 0 when every suite passed, 1 otherwise. A JSON copy of the table
goes to `matrix-report.json`.

Usage: python scripts/run_matrix.py [--update-estimates] [SUITE ...]   (default: all suites)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Jobs run side by side, one per core the process may use, from two to four (a
# container's quota can hide behind a larger CPU set).
JOBS = int(os.environ.get("MATRIX_JOBS") or min(4, max(2, len(os.sched_getaffinity(0)))))
PRINT_LOCK = threading.Lock()
sys.path.insert(0, str(ROOT / "scripts"))
import learner  # noqa: E402
import mutate  # noqa: E402
import seeded_bugs  # noqa: E402
from learner import Progression  # noqa: E402
from ready_projects import learning_checked, ready_projects, reformulations_checked  # noqa: E402
from schedule import Done, Job, run_jobs, warm_env  # noqa: E402

ESTIMATES = ROOT / "scripts" / "matrix_estimates.json"
# Kills each stage's mutation report claims that every run repeats.
MUTANTS_PER_STAGE = 1


@dataclass
class Suite:
    """One pytest process: a name, where it runs, its arguments, and how test
    files group into rows (file stem -> row label)."""

    name: str
    cwd: Path
    args: list[str]
    rows: dict[str, str] = field(default_factory=dict)
    script: str = ""  # A check script (not pytest) that writes its rows as JSON.


@dataclass
class Row:
    suite: str
    stage: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0


def stage_rows(project: Path) -> dict[str, str]:
    """Map each declared test file's stem to its stage label, e.g. `1`."""
    with (project / "project.toml").open("rb") as f:
        manifest = tomllib.load(f)
    rows = {}
    for stage in manifest.get("stages", []):
        for test in stage.get("tests", []):
            rows[Path(test).stem] = stage["id"]
    return rows


# Repository test markers that run as matrix jobs of their own, not in `contract`.
OWN_JOBS = ("browser", "portfolio", "learner_loop")


def suites() -> list[Suite]:
    found = [
        Suite("compiler", ROOT, ["compiler/tests"]),
        Suite("contract", ROOT, ["tests", "-m", f"not ({' or '.join(OWN_JOBS)})"]),
        Suite("portfolio", ROOT, ["tests", "-m", "portfolio"]),
        Suite("learner-loop", ROOT, ["tests", "-m", "learner_loop"]),
    ]
    for project in ready_projects():
        found.append(Suite(project.name, project, [], stage_rows(project)))
    found.append(Suite("browser", ROOT, ["tests", "-m", "browser"]))
    # The two checks are scheduled run by run (`learner.py`, `seeded_bugs.py`).
    found.append(Suite("learner", ROOT, [], script="learner.py"))
    found.append(Suite("seeded-bugs", ROOT, [], script="seeded_bugs.py"))
    found.append(Suite("mutants", ROOT, [], script="mutate.py"))
    return found


def row_label(suite: Suite, classname: str, name: str) -> str:
    """The row a junit testcase belongs to: its stage, else its file stem."""
    parts = (classname or name).split(".")
    for part in parts:
        if part in suite.rows:
            return suite.rows[part]
    stems = [p for p in parts if p.startswith("test_")]
    stem = stems[0] if stems else "(collection)"
    # In a project, a test file that no stage declares is extra to the stages.
    return f"extra: {stem}" if suite.rows else stem


def run_suite(suite: Suite, report_dir: Path, cache: Path) -> tuple[list[Row], int]:
    """Run one pytest process; return its rows and its exit code."""
    xml_path = report_dir / f"{suite.name}.xml"
    # A temporary folder of the suite's own: pytest prunes all but its three newest
    # numbered folders, which would delete a running suite's files under parallel suites.
    basetemp = report_dir / f"tmp-{suite.name}"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        f"--junitxml={xml_path}",
        f"--basetemp={basetemp}",
        *suite.args,
    ]
    header = f"=== {suite.name}: {' '.join(cmd[2:])} (in {suite.cwd.relative_to(ROOT) or '.'})"
    print(f"{header} started", flush=True)
    start = time.perf_counter()
    log = report_dir / f"{suite.name}.log"
    with log.open("w") as out:
        code = subprocess.call(
            cmd, cwd=suite.cwd, stdout=out, stderr=subprocess.STDOUT, env=warm_env(cache)
        )
    wall = time.perf_counter() - start
    with PRINT_LOCK:  # Each suite's output in one piece, even when suites run side by side.
        print(f"\n{header}: exit {code} in {wall:.0f} s\n{log.read_text()}", flush=True)
    rows: dict[str, Row] = {}
    if xml_path.exists():
        for case in ET.parse(xml_path).getroot().iter("testcase"):
            label = row_label(suite, case.get("classname", ""), case.get("name", ""))
            row = rows.setdefault(label, Row(suite.name, label))
            row.seconds += float(case.get("time", 0.0))
            if case.find("failure") is not None or case.find("error") is not None:
                row.failed += 1
            elif case.find("skipped") is not None:
                row.skipped += 1
            else:
                row.passed += 1
    if not rows:
        # Nothing ran (pytest exit 5, or a crash before the report was written).
        rows["(none)"] = Row(suite.name, "(none)", failed=0 if code == 0 else 1, seconds=wall)
    return sorted(rows.values(), key=lambda r: r.stage), code


def print_table(rows: list[Row], codes: dict[str, int]) -> None:
    header = (
        f"{'suite':<28} {'stage':<28} {'passed':>6} {'failed':>6} {'skipped':>7} {'seconds':>8}"
    )
    print("\n" + header)
    print("-" * len(header))
    for r in rows:
        status = f"  (exit {codes[r.suite]})" if codes.get(r.suite) else ""
        print(
            f"{r.suite:<28} {r.stage:<28} {r.passed:>6} {r.failed:>6} {r.skipped:>7} "
            f"{r.seconds:>8.1f}{status}"
        )
    print("-" * len(header))


def print_parts(done: list[Done]) -> None:
    """Each part's job count, job-seconds and span (first start to last end)."""
    print(f"\n{'part':<14} {'jobs':>5} {'job-seconds':>12} {'span':>18}")
    for part in ("suites", "stages", "seeded-bugs", "mutants"):
        mine = [d for d in done if d.job.part == part]
        if not mine:
            continue
        first = min(d.started for d in mine)
        last = max(d.started + d.seconds for d in mine)
        print(
            f"{part:<14} {len(mine):>5} {sum(d.seconds for d in mine):>12.0f} "
            f"{f'{first:.0f}-{last:.0f} s':>18}"
        )


def load_estimates() -> dict[str, float]:
    try:
        return json.loads(ESTIMATES.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def main(argv: list[str]) -> int:
    update = "--update-estimates" in argv
    argv = [a for a in argv if a != "--update-estimates"]
    known = suites()
    chosen = [s for s in known if not argv or s.name in argv]
    unknown = set(argv) - {s.name for s in known}
    if unknown:
        print(
            f"Unknown suite(s): {', '.join(sorted(unknown))}. "
            f"Known: {', '.join(s.name for s in known)}.",
            file=sys.stderr,
        )
        return 2
    estimates = load_estimates()
    names = {s.name for s in chosen}
    run_bugs = "seeded-bugs" in names
    run_mutants = "mutants" in names
    checked = {p.name: p for p in learning_checked()}
    project_suites = names & {p.name for p in ready_projects()}
    if project_suites:  # The checks follow the project suites asked for, and only those.
        checked = {n: p for n, p in checked.items() if n in project_suites}
    # A checked project's suite runs as its learner progression: one run per written
    # state, stage k's tests in the starter with stages <= k written (`learner.py`).
    staged = set(checked) if (project_suites or "learner" in names) else set()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report_dir = Path(tmp)
        cache = report_dir / "jax-cache"
        work = report_dir / "work"
        work.mkdir()
        progressions: list[Progression] = []
        reformed = {p.name for p in reformulations_checked()}
        bugs, problems = (
            seeded_bugs.load_all(list(checked.values()), reformulations=reformed)
            if run_bugs
            else ([], [])
        )
        if run_bugs:
            apart = sorted(
                n
                for n, p in checked.items()
                if n not in reformed and (p / "reformulations.toml").is_file()
            )
            if apart:  # Applying every list costs more than the matrix's time allows.
                print(
                    "reformulations applied by hand, not in the matrix "
                    f"(scripts/reformulations_checked.txt): {', '.join(apart)}; "
                    "python scripts/seeded_bugs.py <id> applies them"
                )
        for problem in problems:
            print(f"INVALID {problem}")
        initial: list[Job] = []
        for suite in (s for s in chosen if not s.script and s.name not in staged):
            initial.append(
                Job(
                    suite.name,
                    "suites",
                    60.0,
                    lambda w, s=suite: run_suite(s, report_dir, cache),
                )
            )
        for name in sorted(staged):
            progression, jobs = learner.progression_jobs(checked[name], work, cache)
            progressions.append(progression)
            initial += jobs
        if run_bugs:
            initial += [seeded_bugs.bug_job(b, work, cache) for b in bugs]
        if run_mutants:  # Reported kills, drawn by each stage's code hash (`mutate.py confirm`).
            initial += mutate.confirm_jobs(
                list(checked.values()), MUTANTS_PER_STAGE, "", work / "mutants", cache
            )
        for job in initial:
            job.estimate = estimates.get(f"{job.part}:{job.name}", job.estimate)

        def on_done(done: Done, n: int, total: int) -> None:
            if done.job.part == "seeded-bugs":
                seeded_bugs.print_outcome(done.result, n, total)
            elif done.job.part == "mutants" and done.result.outcome not in mutate.DETECTED:
                print(f"  NOT KILLED on rerun: {done.job.name}", flush=True)

        done = run_jobs(initial, JOBS, cache, on_done)
    all_rows: list[Row] = []
    codes: dict[str, int] = {}
    for d in sorted((d for d in done if d.job.part == "suites"), key=lambda d: d.job.name):
        rows, code = d.result
        all_rows += rows
        codes[d.job.name] = code
    for r in sorted(progressions, key=lambda r: r.project):
        all_rows += [
            Row(r.project, label, c.passed, c.failed, c.skipped, c.seconds)
            for label, c in sorted(r.rows.items())
        ]
        codes[r.project] = 1 if any(c.failed for c in r.rows.values()) or not r.rows else 0
    wall = time.perf_counter() - start
    if progressions:
        codes["learner"] = learner.summarize(progressions, wall)
        all_rows += [
            Row(
                "learner",
                r.project,
                passed=sum(s.ok for s in r.steps),
                failed=sum(not s.ok for s in r.steps) + len(r.problems),
                seconds=sum(s.seconds for s in r.steps),
            )
            for r in sorted(progressions, key=lambda r: r.project)
        ]
    if run_bugs:
        outcomes = [d.result for d in done if d.job.part == "seeded-bugs"]
        codes["seeded-bugs"] = seeded_bugs.summarize(
            list(checked.values()), outcomes, problems, len(bugs), wall
        )
        for project in checked:
            mine = [o for o in outcomes if o.bug.project == project]
            invalid = sum(p.startswith(project) for p in problems)
            all_rows.append(
                Row(
                    "seeded-bugs",
                    project,
                    passed=sum(seeded_bugs.good(o) for o in mine),
                    failed=sum(not seeded_bugs.good(o) for o in mine) + invalid,
                    seconds=sum(o.seconds for o in mine),
                )
            )
    if run_mutants:
        reran = [d for d in done if d.job.part == "mutants"]
        codes["mutants"] = int(any(d.result.outcome not in mutate.DETECTED for d in reran))
        for project in checked:
            mine = [d for d in reran if d.job.name.startswith(f"{project}/")]
            all_rows.append(
                Row(
                    "mutants",
                    project,
                    passed=sum(d.result.outcome in mutate.DETECTED for d in mine),
                    failed=sum(d.result.outcome not in mutate.DETECTED for d in mine),
                    seconds=sum(d.seconds for d in mine),
                )
            )
        print(
            f"mutation sample (drawn by code hash): {len(reran)} reported kills rerun, "
            f"{MUTANTS_PER_STAGE} per stage, "
            f"{sum(d.result.outcome not in mutate.DETECTED for d in reran)} not killed, "
            f"{sum(d.seconds for d in reran):.0f} job-seconds"
        )
    listed = {p.name for p in learning_checked()}
    for check in ("learner", "seeded-bugs", "mutants"):
        if check in codes and not project_suites:
            all_rows += [
                Row(check, f"{p.name} (not checked yet)", skipped=1)
                for p in ready_projects()
                if p.name not in listed
            ]
    print_table(all_rows, codes)
    print_parts(done)
    if progressions:
        tried = {r.project: r.bad_input for r in progressions if r.bad_input}
        missing = sorted(r.project for r in progressions if not r.bad_input)
        print(
            f"bad-input suites: {sum(b.get('cases', 0) for b in tried.values())} damaged inputs "
            f"over {len(tried)} projects, "
            f"{sum(b.get('tracebacks', 0) for b in tried.values())} tracebacks"
            + (f"; no evidence/bad_input.json from {', '.join(missing)}" if missing else "")
        )
    passed = sum(r.passed for r in all_rows)
    failed = sum(r.failed for r in all_rows)
    skipped = sum(r.skipped for r in all_rows)
    bad = [name for name, code in codes.items() if code != 0]
    print(
        f"matrix wall time {time.perf_counter() - start:.0f} s on {JOBS} jobs; "
        f"suites not passing: {', '.join(bad) if bad else 'none'}"
    )
    # Keyed as the estimates are looked up: `<part>:<job name>`.
    timings = {f"{d.job.part}:{d.job.name}": round(d.seconds, 1) for d in done}
    (ROOT / "matrix-report.json").write_text(
        json.dumps(
            {"rows": [r.__dict__ for r in all_rows], "exit_codes": codes, "job_seconds": timings},
            indent=2,
        )
        + "\n"
    )
    if update:
        ESTIMATES.write_text(json.dumps(dict(sorted(timings.items())), indent=1) + "\n")
        print(f"job times written to {ESTIMATES.relative_to(ROOT)}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if bad or failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main(sys.argv[1:]))
