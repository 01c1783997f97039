"""Learner mode: write a project's starter, and check its stage-by-stage progression.

A starter is a standalone copy of a project folder in which every exercise
region (LEARNING.md) raises an error naming its stage and hint, plus
`progress.py`, the one command that shows the learner where they are.

Commands:
  python scripts/learner.py starter <id> [--out DIR] [--keep 1,2]
      write the starter (default `learn/<id>/`); `--keep` leaves those
      stages' regions written (used by the progression check)
  python scripts/learner.py check [<id> ...] [--jobs N]
      the progression check (default: the projects in learning_checked.txt),
      one pytest run per written state, forked from a warm server: the
      starter fails stage 1 with the stage-1 message; with stages <= k
      written, every stage-k test passes (none by swallowing a stripped
      region's error) and stage k+1's first test fails with its own message;
      fully written, every source equals the reference and every test file
      passes. These runs are also each project's suite in `make test`. Exit 1
      on any broken step.
  python scripts/learner.py publish --out DIR
      every ready project's starter as a folder under DIR (`catalog-compile`
      puts the same starter, zipped, on the site: `site/learn/<id>.zip`)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from catalog_compiler.exercises import project_regions, source_files, stage_prefix, strip_source
from catalog_compiler.starters import write_starter
from ready_projects import learning_checked, ready_projects
from schedule import Job, Worker, run_jobs
from scratch import ROOT, run_pytest, stage_ids, stage_rows, stage_tests
from warm_runner import WRONG_IMPORT


@dataclass
class Step:
    """One step of the progression: which stages are written, what ran, what it showed."""

    written: list[str]
    stage: str
    expect: str  # "pass" or "fail"
    code: int
    seconds: float
    ok: bool
    detail: str = ""


@dataclass
class Progression:
    project: str
    steps: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # Per stage (or `extra: <file>`), the stage tests' results over the runs.
    rows: dict[str, Counts] = field(default_factory=dict)
    # What the reference run's bad-input suite tried (`evidence/bad_input.json`).
    bad_input: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and all(s.ok for s in self.steps)


def _failure_detail(output: str, limit: int = 600) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith(("E ", "FAILED", "ERROR"))]
    return "\n".join(lines)[:limit] or output[-limit:]


def static_problems(project: Path) -> list[str]:
    """What is wrong with a project's regions before anything runs."""
    problems = []
    stages = stage_ids(project)
    with_regions = {r.stage for r in project_regions(project)}
    missing = [s for s in stages if s not in with_regions]
    if missing:
        problems.append(f"stages without an exercise region: {', '.join(missing)}")
    unknown = sorted(with_regions - set(stages))
    if unknown:
        problems.append(f"regions name stages the manifest lacks: {', '.join(unknown)}")
    for source in source_files(project):
        text = source.read_text(encoding="utf-8")
        if strip_source(text, set(stages)) != text:
            problems.append(f"{source.relative_to(project)}: fully written != reference")
    return problems


@dataclass
class Counts:
    """One stage's test results in one run (from its junit report)."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0


def junit_counts(xml: Path, stage_of: dict[str, str], only: set[str]) -> dict[str, Counts]:
    """Per row label (a stage id, or `extra: <stem>`), the results of the test files
    whose label is in ``only``; the report of a run that crashed counts nothing."""
    counts: dict[str, Counts] = {}
    if not xml.exists():
        return counts
    for case in ET.parse(xml).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        stem = next((p for p in parts if p.startswith("test_")), "(collection)")
        label = stage_of.get(stem, f"extra: {stem}")
        if label not in only:
            continue
        row = counts.setdefault(label, Counts())
        row.seconds += float(case.get("time", 0.0))
        if case.find("failure") is not None or case.find("error") is not None:
            row.failed += 1
        elif case.find("skipped") is not None:
            row.skipped += 1
        else:
            row.passed += 1
    return counts


def extra_tests(project: Path) -> list[str]:
    """The project's test files that no stage declares (CLI, bench, bad-input)."""
    declared = {t for s in stage_ids(project) for t in stage_tests(project, s)}
    return sorted(
        p.relative_to(project).as_posix()
        for p in (project / "tests").glob("test_*.py")
        if p.relative_to(project).as_posix() not in declared
    )


def stage_run_job(project: Path, k: int, result: Progression, work: Path, cache: Path) -> Job:
    """Run k of a project's progression, in a starter with stages 1..k written
    (k = 0: the bare starter; k = n: the reference, every stage written).

    Stage k's tests must all pass: that is both the learner's "stage k passes
    with only stages <= k written" and, for each stage, the project suite's
    verdict on those tests. A test that passes though it raised a stripped
    region's error (it swallowed it) breaks the step: it did not run the
    reference's code. Then, for k < n, stage k+1's first test must fail with
    stage k+1's message; `-x` stops the run there, so that costs one test. Run n
    adds the test files no stage declares and runs without `-x`, so that every
    failure in the reference is reported. The job's result is its steps."""
    stages = stage_ids(project)
    written = stages[:k]
    passing = stages[k - 1] if k else None
    failing = stages[k] if k < len(stages) else None
    label = "+".join(written) or "none"
    stage_of = stage_rows(project)

    def action(worker: Worker) -> list[Step]:
        copy = write_starter(project, work / f"{project.name}--{label}", set(written))
        pass_files = stage_tests(project, passing) if passing else []
        if failing is None:
            pass_files += extra_tests(project)
        fail_files = stage_tests(project, failing) if failing else []
        xml = work / f"{project.name}--{label}.xml"
        swallowed = work / f"{project.name}--{label}.swallowed.json"
        try:
            done = run_pytest(
                copy,
                pass_files + fail_files,
                cache,
                runner=worker.runner,
                stop_first=failing is not None,
                extra_args=(f"--junitxml={xml}",),
                stripped_report=swallowed,
            )
            bad_input = copy / "evidence" / "bad_input.json"
            if failing is None and bad_input.is_file():
                result.bad_input = json.loads(bad_input.read_text(encoding="utf-8"))
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        if done.code == WRONG_IMPORT:
            raise RuntimeError(f"{project.name}: the copy's package is not the one Python imports")
        rows = {stage_of.get(Path(f).stem, f"extra: {Path(f).stem}") for f in pass_files}
        counts = junit_counts(xml, stage_of, rows)
        entered = json.loads(swallowed.read_text()) if swallowed.exists() else {}
        first = done.first_failure.split("::")[0]
        steps = []
        if passing:
            ok = (done.code == 0 or (done.code == 1 and first in fail_files)) and not entered
            detail = "" if ok else f"pytest exit {done.code}\n" + _failure_detail(done.output)
            for node, messages in entered.items():
                detail += f"\n{node} passed though it raised: {'; '.join(messages)}"
            steps.append(Step(written, passing, "pass", done.code, done.seconds, ok, detail))
        if failing:
            prefix = stage_prefix(failing)
            ok = done.code == 1 and first in fail_files and prefix in done.output
            detail = (
                ""
                if ok
                else (
                    f"expected a failure in {', '.join(fail_files)} naming `{prefix}`; "
                    f"pytest exit {done.code}\n" + _failure_detail(done.output)
                )
            )
            # The run's seconds are counted once, on the first step it decides.
            seconds = 0.0 if passing else done.seconds
            steps.append(Step(written, failing, "fail", done.code, seconds, ok, detail))
        verdicts = ", ".join(
            f"stage {s.stage} {s.expect} {'ok' if s.ok else 'BROKEN'}" for s in steps
        )
        print(
            f"  {project.name}: written {label:<12} exit {done.code}  {done.seconds:6.1f} s  "
            f"{verdicts}",
            flush=True,
        )
        if done.code not in (0, 1) or any(not s.ok for s in steps):
            print(f"--- {project.name}, written {label}: pytest output\n{done.output}", flush=True)
        for row, c in counts.items():
            total = result.rows.setdefault(row, Counts())
            total.passed += c.passed
            total.failed += c.failed
            total.skipped += c.skipped
            total.seconds += c.seconds
        result.steps.extend(steps)
        return steps

    return Job(f"{project.name} written {label}", "stages", 30.0, action)


def progression_jobs(project: Path, work: Path, cache: Path) -> tuple[Progression, list[Job]]:
    """The progression of one project (which is also its suite's run) and its jobs,
    one per written state: none, stage 1, stages 1-2, ..., every stage."""
    result = Progression(project.name, problems=static_problems(project))
    if result.problems:
        return result, []
    n = len(stage_ids(project))
    return result, [stage_run_job(project, k, result, work, cache) for k in range(n + 1)]


def summarize(results: list[Progression], seconds: float, report: Path | None = None) -> int:
    """Print the per-project table and every broken step; write the JSON rows."""
    broken = 0
    print(f"\n{'project':<28} {'steps':>5} {'broken':>6} {'seconds':>8}")
    for r in results:
        r.steps.sort(key=lambda s: (len(s.written), s.expect == "fail"))
        bad = [s for s in r.steps if not s.ok]
        broken += len(bad) + len(r.problems)
        print(
            f"{r.project:<28} {len(r.steps):>5} {len(bad) + len(r.problems):>6} "
            f"{sum(s.seconds for s in r.steps):>8.1f}"
        )
        for problem in r.problems:
            print(f"    {problem}")
        for s in bad:
            print(
                f"    written {'+'.join(s.written) or 'none'}, stage {s.stage} should "
                f"{s.expect}:\n      " + s.detail.replace("\n", "\n      ")
            )
    steps = sum(len(r.steps) for r in results)
    print(f"progression: {steps} steps in {seconds:.0f} s, {broken} broken")
    if report is not None:
        rows = [
            {
                "row": r.project,
                "passed": sum(s.ok for s in r.steps),
                "failed": sum(not s.ok for s in r.steps) + len(r.problems),
                "seconds": sum(s.seconds for s in r.steps),
            }
            for r in results
        ]
        report.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 1 if broken else 0


def check(projects: list[Path], jobs: int, report: Path | None = None) -> int:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="learner-") as tmp:
        work, cache = Path(tmp) / "work", Path(tmp) / "jax-cache"
        work.mkdir()
        planned = [progression_jobs(p, work, cache) for p in projects]
        run_jobs([j for _, js in planned for j in js], jobs, cache)
    return summarize([r for r, _ in planned], time.perf_counter() - start, report)


def catalog_roles(project: Path) -> bytes:
    """The `roles.json` of ``project``: the routes whose skills cite it (the compiled catalog)."""
    from catalog_compiler.pipeline import compile_catalog
    from catalog_compiler.portfolio import roles_json

    compiled = compile_catalog(ROOT)
    if not compiled.ok:
        raise SystemExit("The catalog does not compile; run catalog-compile to see why.")
    return roles_json(compiled.catalog, project.name)


def publish(out: Path) -> int:
    """Every ready project's starter folder under ``out`` (the site holds the zips)."""
    out.mkdir(parents=True, exist_ok=True)
    for project in ready_projects():
        folder = write_starter(project, out / project.name, roles=catalog_roles(project))
        print(f"starter of {project.name}: {folder}")
    return 0


def project_folder(name: str) -> Path:
    folder = ROOT / "projects" / name
    if not (folder / "project.toml").is_file():
        known = ", ".join(p.name for p in ready_projects())
        raise SystemExit(f"No project `{name}` (a folder with project.toml). Ready: {known}.")
    return folder


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("starter", help="write one project's starter")
    p_start.add_argument("project")
    p_start.add_argument("--out", type=Path)
    p_start.add_argument("--keep", default="", help="stage ids to leave written, e.g. 1,2")
    p_check = sub.add_parser("check", help="the progression check")
    p_check.add_argument("projects", nargs="*")
    p_check.add_argument("--jobs", type=int, default=2)
    p_check.add_argument("--json", type=Path, help="also write per-project rows here")
    p_pub = sub.add_parser("publish", help="every ready project's starter folder")
    p_pub.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "starter":
        project = project_folder(args.project)
        dest = args.out or ROOT / "learn" / project.name
        keep = {s for s in args.keep.split(",") if s}
        write_starter(project, dest, keep, roles=catalog_roles(project))
        print(
            f"Starter of {project.name} written to {dest}. Next: cd {dest}, install as its "
            "README says, then `python progress.py`."
        )
        return 0
    if args.command == "check":
        projects = [project_folder(n) for n in args.projects] or learning_checked()
        return check(projects, max(1, args.jobs), args.json)
    return publish(args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
