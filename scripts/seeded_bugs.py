"""The seeded-bug check: every plausible bug a project lists must fail its stage's tests,
and every correct reformulation it lists must pass them.

Each ready project lists bugs in `seeded_bugs.toml` (LEARNING.md): an exact
code replacement in one file, the stage whose tests must catch it, the test
nodes that decide it, and one sentence saying what a learner did wrong. This
script applies each bug alone to a scratch copy of its project and runs
`pytest -x` on the bug's test nodes there:

- exit 1 (a test failed): caught;
- exit 0: a SURVIVOR, the stage's tests let the bug through;
- anything else (a collection or import error, a timeout): a BROKEN entry,
  since a seeded bug is a mistake that still runs.

`reformulations.toml` (optional, same fields, `[[reformulations]]`) lists the
other half: correct code written another way (reassociated arithmetic, another
equivalent library call, a loop for a vectorised expression), each applied alone
the same way, whose stage tests must all PASS: exit 0 is `passed`, exit 1 a
correct solution REJECTED by the tests, anything else BROKEN.

Commands:
  python scripts/seeded_bugs.py [<id> ...] [--jobs N]   run the check (default:
      the projects in learning_checked.txt); exit 1 on any survivor, broken or
      invalid entry
  python scripts/seeded_bugs.py --readme <id> ...        rewrite the README table
  python scripts/seeded_bugs.py --list <id>              print the table
  python scripts/seeded_bugs.py <id> --only a,b          apply only those bugs
  python scripts/seeded_bugs.py <id> ... --bugs DIR        try another list: DIR/<id>.toml
      in the same format (a fresh trial of bugs no project lists), same checks
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from catalog_compiler.exercises import find_regions
from ready_projects import learning_checked
from schedule import Job, Worker, run_jobs
from scratch import ROOT, copy_project, run_pytest, stage_ids
from scratch import manifest as read_manifest
from warm_runner import WRONG_IMPORT

BEGIN, END = "<!-- seeded-bugs:begin -->", "<!-- seeded-bugs:end -->"
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
FIELDS = {"id", "stage", "file", "find", "replace", "why", "tests"}
# List file and table name of each kind of entry, and the pytest verdict it must get.
KINDS = {
    "bugs": ("seeded_bugs.toml", "bugs", "fail"),
    "reformulations": ("reformulations.toml", "reformulations", "pass"),
}
MIN_PER_STAGE = 3


@dataclass(frozen=True)
class Bug:
    project: str
    id: str
    stage: str
    file: str
    find: str
    replace: str
    why: str
    tests: tuple[str, ...]
    expect: str = "fail"  # `fail`: a seeded bug; `pass`: a correct reformulation


def load_bugs(
    project: Path, bugs_dir: Path | None = None, kind: str = "bugs"
) -> tuple[list[Bug], list[str]]:
    """The project's bugs (or, with `kind="reformulations"`, its correct
    reformulations) and every problem with its list (empty when valid): its own
    `seeded_bugs.toml` / `reformulations.toml`, or with `bugs_dir`, `bugs_dir/<id>.toml`.
    A project without a reformulation list has none, which is no problem."""
    filename, table, expect = KINDS[kind]
    path = bugs_dir / f"{project.name}.toml" if bugs_dir else project / filename
    if not path.is_file():
        return [], [] if kind == "reformulations" else [f"{project.name}: no {path.name}"]
    try:
        with path.open("rb") as f:
            entries = tomllib.load(f).get(table, [])
    except tomllib.TOMLDecodeError as exc:
        return [], [f"{project.name}/{path.name}: {exc}"]
    stages = {s["id"]: s.get("tests", []) for s in read_manifest(project)["stages"]}
    bugs, problems, seen = [], [], set()
    for n, entry in enumerate(entries, start=1):
        where = f"{project.name}/{path.name} bug {n} (`{entry.get('id', '?')}`)"
        missing = (FIELDS - {"tests"}) - set(entry)
        extra = set(entry) - FIELDS
        if missing or extra:
            problems.append(f"{where}: missing {sorted(missing)}, unknown {sorted(extra)}")
            continue
        if not KEBAB.match(entry["id"]) or entry["id"] in seen:
            problems.append(f"{where}: the id must be kebab-case and unique")
        seen.add(entry["id"])
        if entry["stage"] not in stages:
            problems.append(f"{where}: stage `{entry['stage']}` is not in project.toml")
            continue
        target = project / entry["file"]
        if not target.is_file() or not target.resolve().is_relative_to(project.resolve()):
            problems.append(f"{where}: `{entry['file']}` is not a file of the project")
            continue
        count = target.read_text(encoding="utf-8").count(entry["find"])
        if count != 1 or entry["find"] == entry["replace"]:
            problems.append(
                f"{where}: `find` occurs {count} times in {entry['file']} "
                "(it must occur exactly once and differ from `replace`)"
            )
            continue
        tests = tuple(entry.get("tests") or stages[entry["stage"]])
        outside = [t for t in tests if t.split("::")[0] not in stages[entry["stage"]]]
        if outside:
            problems.append(f"{where}: tests {outside} are not stage {entry['stage']}'s files")
            continue
        bugs.append(
            Bug(
                project.name,
                entry["id"],
                entry["stage"],
                entry["file"],
                entry["find"],
                entry["replace"],
                entry["why"].strip(),
                tests,
                expect,
            )
        )
    # A project's own list must cover each stage; a trial list (`bugs_dir`)
    # may try any few bugs.
    for stage in stages if bugs_dir is None and kind == "bugs" else []:
        count = sum(b.stage == stage for b in bugs)
        if count < MIN_PER_STAGE:
            problems.append(
                f"{project.name}: stage {stage} lists {count} bugs (at least {MIN_PER_STAGE})"
            )
    return bugs, problems


def in_learner_code(project: Path, bug: Bug) -> bool:
    """Whether the bug's `find` lies wholly inside an exercise region: code the learner
    writes, which a starter leaves out (the other bugs are in code a starter ships)."""
    text = (project / bug.file).read_text(encoding="utf-8")
    first = text[: text.index(bug.find)].count("\n") + 1
    last = first + bug.find.count("\n")
    return any(r.start < first and last < r.end for r in find_regions(text, bug.file))


def readme_table(project: Path, bugs: list[Bug]) -> str:
    """The README section: one row per bug, in stage order; bugs in the code the
    learner writes first, then, in a table of their own, bugs in code a starter
    already provides (which the stage's tests catch too)."""
    order = {s: i for i, s in enumerate(stage_ids(project))}
    ordered = sorted(bugs, key=lambda b: order[b.stage])
    learner = [b for b in ordered if in_learner_code(project, b)]
    provided = [b for b in ordered if b not in learner]
    rows = [BEGIN]
    for title, group in (
        ("What a learner would have done wrong", learner),
        ("A mistake in code the starter provides (the learner does not write it)", provided),
    ):
        if not group:
            continue
        if len(rows) > 1:
            rows.append("")
        rows += [f"| Stage | Seeded bug | {title} | Caught by |", "|---|---|---|---|"]
        for bug in group:
            caught = ", ".join(f"`{t.split('::')[-1]}`" for t in bug.tests)
            rows.append(f"| {bug.stage} | `{bug.id}` | {bug.why} | {caught} |")
    rows.append(END)
    return "\n".join(rows)


def readme_with_table(project: Path, bugs: list[Bug]) -> str:
    text = (project / "README.md").read_text(encoding="utf-8")
    table = readme_table(project, bugs)
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head + table + rest.split(END, 1)[1]
    section = (
        "\n## Bugs each stage catches\n\n"
        "Every bug below is applied alone to a copy of this project by the "
        "repository's seeded-bug check; the stage's tests must fail on each.\n\n"
    )
    return text.rstrip("\n") + "\n" + section + table + "\n"


@dataclass
class Outcome:
    bug: Bug
    verdict: str  # caught | SURVIVED | BROKEN; for a reformulation passed | REJECTED | BROKEN
    seconds: float
    detail: str


GOOD = {"caught", "passed"}


def good(outcome: Outcome) -> bool:
    """A seeded bug caught, or a correct reformulation passed."""
    return outcome.verdict in GOOD


def _judge(bug: Bug, code: int, output: str, first_failure: str) -> tuple[str, str]:
    if bug.expect == "pass" and code in (0, 1):
        return ("passed", "every test passed") if code == 0 else ("REJECTED", first_failure)
    if code == 1:
        return "caught", first_failure
    if code == 0:
        return "SURVIVED", "every test passed"
    tail = "\n".join(output.strip().splitlines()[-6:])
    return "BROKEN", f"pytest exit {code}:\n{tail}"


def bug_job(
    bug: Bug, work: Path, cache: Path, estimate: float = 9.0, folder: Path | None = None
) -> Job:
    """The job that applies ``bug`` alone to a fresh copy of its project (``folder``,
    default `projects/<id>`) and runs its tests there, forked from the worker's warm
    pytest server."""
    source = folder or ROOT / "projects" / bug.project

    def action(worker: Worker) -> Outcome:
        copy = copy_project(source, work / f"{bug.project}--{bug.id}")
        try:
            target = copy / bug.file
            original = target.read_text(encoding="utf-8")
            target.write_text(original.replace(bug.find, bug.replace, 1), encoding="utf-8")
            done = run_pytest(copy, list(bug.tests), cache, timeout=1800, runner=worker.runner)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        if done.code == WRONG_IMPORT:
            raise RuntimeError(f"{bug.project}: the copy's package is not the one Python imports")
        verdict, detail = _judge(bug, done.code, done.output, done.first_failure)
        return Outcome(bug, verdict, done.seconds, detail)

    kind = "" if bug.expect == "fail" else "reformulation:"
    return Job(f"{bug.project}/{kind}{bug.id}", "seeded-bugs", estimate, action)


def print_outcome(outcome: Outcome, n: int, total: int) -> None:
    bug = outcome.bug
    print(
        f"  [{n:>3}/{total}] {outcome.verdict:<8} "
        f"{bug.project}/{bug.id} (stage {bug.stage}) {outcome.seconds:5.1f} s"
        f"  {outcome.detail.splitlines()[0] if outcome.detail else ''}",
        flush=True,
    )


def summarize(
    projects: list[Path],
    outcomes: list[Outcome],
    problems: list[str],
    expected: int,
    seconds: float,
    report: Path | None = None,
) -> int:
    """Print the per-project table and every bug not caught; write the JSON rows.
    Exit status: 1 on any survivor, broken or invalid entry, or a bug not applied."""
    bad = [o for o in outcomes if not good(o)]
    header = ("project", "bugs", "caught", "survived", "reforms", "passed", "broken", "seconds")
    print("\n{:<28} {:>4} {:>6} {:>8} {:>7} {:>6} {:>6} {:>8}".format(*header))
    for project in projects:
        mine = [o for o in outcomes if o.bug.project == project.name]
        bugs = [o for o in mine if o.bug.expect == "fail"]
        reforms = [o for o in mine if o.bug.expect == "pass"]
        print(
            f"{project.name:<28} {len(bugs):>4} {sum(o.verdict == 'caught' for o in bugs):>6} "
            f"{sum(o.verdict == 'SURVIVED' for o in bugs):>8} {len(reforms):>7} "
            f"{sum(o.verdict == 'passed' for o in reforms):>6} "
            f"{sum(o.verdict == 'BROKEN' for o in mine):>6} {sum(o.seconds for o in mine):>8.1f}"
        )
    for o in bad:
        print(
            f"\n{o.verdict}: {o.bug.project}/{o.bug.id} (stage {o.bug.stage}, {o.bug.file})\n"
            f"  {o.bug.why}\n  " + o.detail.replace("\n", "\n  ")
        )
    print(
        f"seeded bugs and reformulations: {len(outcomes)} applied in {seconds:.0f} s, "
        f"{len(bad)} with the wrong verdict, {len(problems)} invalid list entries"
    )
    if report is not None:
        rows = []
        for project in projects:
            mine = [o for o in outcomes if o.bug.project == project.name]
            invalid = sum(p.startswith(f"{project.name}") for p in problems)
            rows.append(
                {
                    "row": project.name,
                    "passed": sum(good(o) for o in mine),
                    "failed": sum(not good(o) for o in mine) + invalid,
                    "seconds": sum(o.seconds for o in mine),
                }
            )
        report.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 1 if bad or problems or len(outcomes) != expected else 0


def load_all(
    projects: list[Path],
    only: set[str] | None = None,
    bugs_dir: Path | None = None,
    reformulations: set[str] | None = None,
) -> tuple[list[Bug], list[str]]:
    """Every project's seeded bugs and, for the projects named in ``reformulations``
    (all of them when None), its correct reformulations."""
    bugs, problems = [], []
    for project in projects:
        with_reforms = not bugs_dir and (reformulations is None or project.name in reformulations)
        for kind in tuple(KINDS) if with_reforms else ("bugs",):
            found, bad = load_bugs(project, bugs_dir, kind)
            bugs += [b for b in found if not only or b.id in only]
            problems += bad
    return bugs, problems


def check(
    projects: list[Path],
    jobs: int,
    report: Path | None = None,
    only: set[str] | None = None,
    bugs_dir: Path | None = None,
) -> int:
    start = time.perf_counter()
    bugs, problems = load_all(projects, only, bugs_dir)
    for problem in problems:
        print(f"INVALID {problem}")
    with tempfile.TemporaryDirectory(prefix="seeded-bugs-") as tmp:
        work, cache = Path(tmp), Path(tmp) / "jax-cache"
        done = run_jobs(
            [bug_job(b, work, cache) for b in bugs],
            jobs,
            cache,
            lambda d, n, total: print_outcome(d.result, n, total),
        )
    outcomes = [d.result for d in done]
    return summarize(projects, outcomes, problems, len(bugs), time.perf_counter() - start, report)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("projects", nargs="*")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--readme", action="store_true", help="rewrite the README tables")
    parser.add_argument("--list", action="store_true", help="print the README table")
    parser.add_argument("--json", type=Path, help="also write per-project rows here")
    parser.add_argument("--only", default="", help="comma-separated bug ids to apply")
    parser.add_argument("--bugs", type=Path, help="a folder of <id>.toml lists to try instead")
    args = parser.parse_args(argv)
    projects = [ROOT / "projects" / n for n in args.projects] or learning_checked()
    for project in projects:
        if not (project / "project.toml").is_file():
            print(f"No project `{project.name}` (a folder with project.toml).", file=sys.stderr)
            return 2
    if args.readme or args.list:
        status = 0
        for project in projects:
            bugs, problems = load_bugs(project, args.bugs if args.list else None)
            for problem in problems:
                print(f"INVALID {problem}", file=sys.stderr)
                status = 1
            if args.list:
                print(readme_table(project, bugs))
            else:
                (project / "README.md").write_text(readme_with_table(project, bugs), "utf-8")
                print(f"{project.name}/README.md: {len(bugs)} seeded bugs in the table")
        return status
    only = {b for b in args.only.split(",") if b}
    return check(projects, args.jobs, args.json, only, args.bugs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
