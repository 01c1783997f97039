"""Learner mode: write a project's starter, and check its stage-by-stage progression.

A starter is a standalone copy of a project folder in which every exercise
region (LEARNING.md) raises an error naming its stage and hint, plus
`progress.py`, the one command that shows the learner where they are.

Commands:
  python scripts/learner.py starter <id> [--out DIR] [--keep 1,2]
      write the starter (default `learn/<id>/`); `--keep` leaves those
      stages' regions written (used by the progression check)
  python scripts/learner.py check [<id> ...] [--jobs N]
      the progression check (default: the projects in learning_checked.txt): the starter fails
      stage 1 with the stage-1 message; with stages <= k written, stage k
      passes and stage k+1 fails with its own message (one pytest run for
      both); fully written, every source equals the reference. Exit 1 on any
      broken step.
  python scripts/learner.py publish --out DIR
      every ready project's starter as a folder under DIR (`catalog-compile`
      puts the same starter, zipped, on the site: `site/learn/<id>.zip`)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from catalog_compiler.exercises import project_regions, source_files, stage_prefix, strip_source
from catalog_compiler.starters import write_sources, write_starter
from ready_projects import learning_checked, ready_projects
from scratch import (
    ROOT,
    imports_from_copy,
    package_name,
    run_pytest,
    stage_ids,
    stage_tests,
)


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

    @property
    def ok(self) -> bool:
        return not self.problems and all(s.ok for s in self.steps)


def _failure_detail(output: str, limit: int = 600) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith(("E ", "FAILED", "ERROR"))]
    return "\n".join(lines)[:limit] or output[-limit:]


def check_progression(project: Path, work: Path, cache: Path) -> Progression:
    """The progression check for one project, in a copy under ``work``."""
    result = Progression(project.name)
    stages = stage_ids(project)
    regions = project_regions(project)
    with_regions = {r.stage for r in regions}
    missing = [s for s in stages if s not in with_regions]
    if missing:
        result.problems.append(f"stages without an exercise region: {', '.join(missing)}")
    unknown = sorted(with_regions - set(stages))
    if unknown:
        result.problems.append(f"regions name stages the manifest lacks: {', '.join(unknown)}")
    for source in source_files(project):
        text = source.read_text(encoding="utf-8")
        if strip_source(text, set(stages)) != text:
            result.problems.append(f"{source.relative_to(project)}: fully written != reference")
    if result.problems:
        return result
    copy = write_starter(project, work / project.name)
    if not imports_from_copy(copy, package_name(project), cache):
        result.problems.append("the copy's package is not the one Python imports")
        return result

    def run(written: list[str], passing: str | None, failing: str | None) -> None:
        """One pytest run with the stages in ``written`` written: ``passing``'s tests
        must all pass, then ``failing``'s must fail with their stage's message.

        Both stages go to one `pytest -x` run, the passing stage's files first, so
        the run stops at the first failure: one in the passing stage's files breaks
        that step; none there and one in the failing stage's files, with its
        stage's message, completes both. One run instead of two pays the start-up
        and the session fixtures once."""
        write_sources(project, copy, set(written))
        pass_files = stage_tests(project, passing) if passing else []
        fail_files = stage_tests(project, failing) if failing else []
        done = run_pytest(copy, pass_files + fail_files, cache)
        first = done.first_failure.split("::")[0]
        label = "+".join(written) or "none"
        if passing:
            ok = done.code == 0 or (done.code == 1 and first in fail_files)
            detail = "" if ok else f"pytest exit {done.code}\n" + _failure_detail(done.output)
            result.steps.append(Step(written, passing, "pass", done.code, done.seconds, ok, detail))
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
            result.steps.append(Step(written, failing, "fail", done.code, seconds, ok, detail))
        verdicts = ", ".join(
            f"stage {s.stage} {s.expect} {'ok' if s.ok else 'BROKEN'}"
            for s in result.steps[-(bool(passing) + bool(failing)) :]
        )
        print(
            f"  {project.name}: written {label:<12} exit {done.code}  {done.seconds:6.1f} s  "
            f"{verdicts}",
            flush=True,
        )

    run([], None, stages[0])
    for k in range(len(stages) - 1):
        run(stages[: k + 1], stages[k], stages[k + 1])
    return result


def check(projects: list[Path], jobs: int, report: Path | None = None) -> int:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="learner-") as tmp:
        work, cache = Path(tmp) / "work", Path(tmp) / "jax-cache"
        work.mkdir()
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(lambda p: check_progression(p, work, cache), projects))
    broken = 0
    print(f"\n{'project':<28} {'steps':>5} {'broken':>6} {'seconds':>8}")
    for r in results:
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
    print(f"progression: {steps} steps in {time.perf_counter() - start:.0f} s, {broken} broken")
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


def publish(out: Path) -> int:
    """Every ready project's starter folder under ``out`` (the site holds the zips)."""
    out.mkdir(parents=True, exist_ok=True)
    for project in ready_projects():
        folder = write_starter(project, out / project.name)
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
        write_starter(project, dest, keep)
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
