"""The whole test matrix, as `make test` runs it.

Runs, each in its own pytest process: the compiler tests, the repository
contract tests, every `ready` project's tests (from inside the project folder,
as a learner would), and the browser check of the built site; then the two
checks of LEARNING.md over every ready project: the learner progression
(`learner.py check`) and the seeded bugs (`seeded_bugs.py`), one row per
project (passed = steps or bugs that behaved, failed = the others). Then prints one
table, suite x stage, with passed / failed / skipped counts and seconds, and a
closing line `N passed, N failed, N skipped`. A project's test files map to
stages through its `project.toml`; files no stage declares show as
`extra: <file>`.

Pytest suites run one per core, two to four at a time (`MATRIX_JOBS=N` sets
the number; 1 runs them one by one), each with its output printed in one
piece when it ends; the two checks run as many jobs.

Exit status: 0 when every suite passed, 1 otherwise. A JSON copy of the table
goes to `matrix-report.json`.

Usage: python scripts/run_matrix.py [SUITE ...]   (default: all suites)
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Pytest suites run side by side, one per core the process may use, from two
# to four (a container's quota can hide behind a larger CPU set); the two
# LEARNING.md checks run as many jobs each.
JOBS = int(os.environ.get("MATRIX_JOBS") or min(4, max(2, len(os.sched_getaffinity(0)))))
PRINT_LOCK = threading.Lock()
sys.path.insert(0, str(ROOT / "scripts"))
from ready_projects import learning_checked, ready_projects  # noqa: E402


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


def suites() -> list[Suite]:
    found = [
        Suite("compiler", ROOT, ["compiler/tests"]),
        Suite("contract", ROOT, ["tests", "-m", "not browser"]),
    ]
    for project in ready_projects():
        found.append(Suite(project.name, project, [], stage_rows(project)))
    found.append(Suite("browser", ROOT, ["tests", "-m", "browser"]))
    found.append(Suite("learner", ROOT, ["check"], script="learner.py"))
    found.append(Suite("seeded-bugs", ROOT, [], script="seeded_bugs.py"))
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


def run_script_suite(suite: Suite, report_dir: Path) -> tuple[list[Row], int]:
    """Run one check script; its JSON report gives one row per project."""
    report = report_dir / f"{suite.name}.json"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / suite.script),
        *suite.args,
        "--jobs",
        str(JOBS),
        "--json",
        str(report),
    ]
    print(f"\n=== {suite.name}: {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    code = subprocess.call(cmd, cwd=suite.cwd)
    if not report.exists():
        return [Row(suite.name, "(none)", failed=1, seconds=time.perf_counter() - start)], code
    rows = [
        Row(suite.name, r["row"], passed=r["passed"], failed=r["failed"], seconds=r["seconds"])
        for r in json.loads(report.read_text())
    ]
    checked = {p.name for p in learning_checked()}
    rows += [
        Row(suite.name, f"{p.name} (not checked yet)", skipped=1)
        for p in ready_projects()
        if p.name not in checked
    ]
    return rows, code


def run_suite(suite: Suite, report_dir: Path) -> tuple[list[Row], int]:
    """Run one pytest process; return its rows and its exit code."""
    if suite.script:
        return run_script_suite(suite, report_dir)
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
        code = subprocess.call(cmd, cwd=suite.cwd, stdout=out, stderr=subprocess.STDOUT)
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
        status = f"  (pytest exit {codes[r.suite]})" if codes[r.suite] else ""
        print(
            f"{r.suite:<28} {r.stage:<28} {r.passed:>6} {r.failed:>6} {r.skipped:>7} "
            f"{r.seconds:>8.1f}{status}"
        )
    print("-" * len(header))


def main(argv: list[str]) -> int:
    chosen = [s for s in suites() if not argv or s.name in argv]
    unknown = set(argv) - {s.name for s in suites()}
    if unknown:
        print(
            f"Unknown suite(s): {', '.join(sorted(unknown))}. "
            f"Known: {', '.join(s.name for s in suites())}.",
            file=sys.stderr,
        )
        return 2
    all_rows: list[Row] = []
    codes: dict[str, int] = {}
    start = time.perf_counter()
    # Pytest suites run JOBS at a time (one per core: most of a suite's time is one
    # Python thread); the two LEARNING.md checks, which run JOBS jobs each, follow.
    pytest_suites = [s for s in chosen if not s.script]
    script_suites = [s for s in chosen if s.script]
    with tempfile.TemporaryDirectory() as tmp:
        with ThreadPoolExecutor(max_workers=JOBS) as pool:
            results = list(pool.map(lambda s: run_suite(s, Path(tmp)), pytest_suites))
        results += [run_suite(s, Path(tmp)) for s in script_suites]
        for suite, (rows, code) in zip(pytest_suites + script_suites, results, strict=True):
            all_rows += rows
            codes[suite.name] = code
    print_table(all_rows, codes)
    passed = sum(r.passed for r in all_rows)
    failed = sum(r.failed for r in all_rows)
    skipped = sum(r.skipped for r in all_rows)
    bad = [name for name, code in codes.items() if code != 0]
    print(
        f"matrix wall time {time.perf_counter() - start:.0f} s; "
        f"suites not passing: {', '.join(bad) if bad else 'none'}"
    )
    (ROOT / "matrix-report.json").write_text(
        json.dumps({"rows": [r.__dict__ for r in all_rows], "exit_codes": codes}, indent=2) + "\n"
    )
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if bad or failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main(sys.argv[1:]))
