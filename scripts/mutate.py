"""Mutation testing of each stage: does the stage's test file kill its mutants?

    make mutate P=<id> [STAGE=<k>]      score the stages, write the report
    python scripts/mutate.py <id> --survivors   rerun only the report's survivors
    python scripts/mutate.py confirm    rerun a sample of reported kills (the matrix)

Mutants come from Cosmic Ray (`mutants.py`: targets, operators, keys,
sampling). Each mutant is written into a scratch copy of the project and the
stage's declared test files run there with `-x`, forked from a warm pytest
server: every mutant gets its own process, which imports the mutated source
fresh, and no process that started a JAX backend is ever forked.

Outcomes: `killed` (a test failed, or collection failed because the mutant
broke an import, in each of `KILL_RUNS` runs: the first failing test, or the
stage's tests after a collection error, is run again; a kill that does not
repeat is reported `survived`, with how many runs killed it), `timed out`
(the tests ran past three times the unmutated run plus 30 s: a hang a learner
sees), `survived` (every test passed), and `equivalent` (survived, and
`mutation.toml` says why no test can tell it apart). A stage's score is
(killed + timed out) / (mutants - equivalent).

The report, `<project>/mutation-report.json`, holds per stage the code hash
(`mutants.stage_hash`), the counts, the score and every mutant's outcome,
and the README's stage table shows the scores (`--readme`).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.metadata
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mutants import (
    CONFIG,
    EXCLUDED,
    REPORT,
    SAMPLE,
    Mutant,
    StageMutants,
    equivalents,
    find_mutant,
    mutated_source,
    stage_hash,
    stage_mutants,
)
from mutation_readme import rewrite_readme
from ready_projects import learning_checked
from schedule import Job, Worker, run_jobs
from scratch import copy_project, run_pytest, stage_ids, stage_tests
from warm_runner import TIMED_OUT, WRONG_IMPORT

ROOT = Path(__file__).resolve().parent.parent
COSMIC_RAY_VERSION = importlib.metadata.version("cosmic-ray")
KILLED, SURVIVED, TIMEOUT, EQUIVALENT = "killed", "survived", "timed out", "equivalent"
OUTCOMES = (KILLED, SURVIVED, TIMEOUT, EQUIVALENT)
DETECTED = (KILLED, TIMEOUT)
MIN_SCORE, MAX_EQUIVALENT = 0.9, 0.10
# A mutant counts as killed only when it is killed in each of this many runs: the run
# of the stage's tests, then its first failing test (or, for a collection error, the
# stage's tests) again. A kill that does not repeat is a verdict of chance.
KILL_RUNS = 3


@dataclass
class Result:
    mutant: Mutant
    outcome: str
    detail: str  # the first failing test, or why the run counts as it does
    seconds: float
    kill_runs: int = 0  # runs that killed it, up to KILL_RUNS (0 unless it was killed)


class Copies:
    """One scratch copy of the project per worker, reused for every mutant that
    worker runs (each run restores the file it mutated)."""

    def __init__(self, project: Path, work: Path) -> None:
        self.project, self.work = project, work

    def of(self, worker: Worker) -> Path:
        copies = worker.__dict__.setdefault("copies", {})
        if self.project not in copies:
            parent = Path(tempfile.mkdtemp(prefix=f"{self.project.name}-", dir=self.work))
            copies[self.project] = copy_project(self.project, parent / self.project.name)
        return copies[self.project]


def judge(code: int, output: str, first_failure: str) -> tuple[str, str]:
    if code == 0:
        return SURVIVED, "every test passed"
    if code == 1:
        return KILLED, first_failure
    if code == 2 and "error" in output.lower():
        return KILLED, "collection failed: " + (first_failure or "the mutant breaks an import")
    if code == TIMED_OUT:
        return TIMEOUT, "the tests ran past the timeout"
    if code == WRONG_IMPORT:
        raise RuntimeError("the copy's package is not the one Python imports")
    tail = " | ".join(output.strip().splitlines()[-3:])
    raise RuntimeError(f"pytest exit {code} is no verdict on a mutant: {tail}")


def mutant_job(
    project: Path,
    copies: Copies,
    tests: list[str],
    cache: Path,
    timeout: float,
    mutant: Mutant,
    estimate: float,
    kill_runs: int = KILL_RUNS,
) -> Job:
    """The job that runs ``tests`` on ``mutant`` in the worker's copy; a kill is
    rerun until it has killed ``kill_runs`` times (the matrix's confirmation of a
    reported kill, already repeated when scored, runs once)."""
    source = mutated_source(project, mutant)

    def action(worker: Worker) -> Result:
        copy = copies.of(worker)
        target = copy / mutant.path
        original = target.read_text(encoding="utf-8")
        target.write_text(source, encoding="utf-8")
        try:
            run = run_pytest(copy, tests, cache, timeout=timeout, runner=worker.runner)
            outcome, detail = judge(run.code, run.output, run.first_failure)
            runs = 1 if outcome == KILLED else 0
            again = [run.first_failure] if run.code == 1 and run.first_failure else tests
            while outcome == KILLED and runs < kill_runs:
                rerun = run_pytest(copy, again, cache, timeout=timeout, runner=worker.runner)
                if judge(rerun.code, rerun.output, rerun.first_failure)[0] != KILLED:
                    outcome = SURVIVED
                    detail = f"killed in {runs} of {runs + 1} runs, not each: {detail}"
                    break
                runs += 1
        finally:
            target.write_text(original, encoding="utf-8")
        return Result(mutant, outcome, detail, run.seconds, runs if outcome == KILLED else 0)

    return Job(mutant.key, f"mutants:{mutant.stage}", estimate, action)


def baseline(
    project: Path, copies: Copies, stages: list[str], cache: Path, jobs: int
) -> dict[str, float]:
    """Run each stage's tests once unmutated; they must pass. Returns seconds."""

    def job(stage: str) -> Job:
        def action(worker: Worker) -> tuple[str, float]:
            run = run_pytest(
                copies.of(worker), stage_tests(project, stage), cache, runner=worker.runner
            )
            if run.code != 0:
                tail = "\n".join(run.output.strip().splitlines()[-8:])
                raise RuntimeError(f"stage {stage} fails unmutated (exit {run.code}):\n{tail}")
            return stage, run.seconds

        return Job(f"baseline {stage}", "baseline", 1.0, action)

    return dict(d.result for d in run_jobs([job(s) for s in stages], jobs, cache))


def stage_report(
    project: Path, found: StageMutants, code_hash: str, results: list[Result], seconds: float
) -> dict:
    declared = equivalents(project, found.stage)
    rows, counts = [], {KILLED: 0, SURVIVED: 0, TIMEOUT: 0, EQUIVALENT: 0}
    for r in sorted(results, key=lambda r: (r.mutant.path, r.mutant.line, r.mutant.key)):
        outcome = r.outcome
        if outcome == SURVIVED and r.mutant.key in declared:
            outcome = EQUIVALENT
        counts[outcome] += 1
        row = {
            "key": r.mutant.key,
            "operator": r.mutant.operator,
            "line": r.mutant.line,
            "outcome": outcome,
            "detail": declared.get(r.mutant.key, r.detail),
            "seconds": round(r.seconds, 2),
        }
        if outcome == KILLED:
            row["kill_runs"] = r.kill_runs
        rows.append(row)
    judged = len(results) - counts[EQUIVALENT]
    score = (counts[KILLED] + counts[TIMEOUT]) / judged if judged else 1.0
    tests = stage_tests(project, found.stage)
    return {
        "code_hash": code_hash,
        "tests": tests,
        "targets": [f"{t.path}::{t.name}" for t in found.targets],
        "mutants_total": found.total,
        "mutants_run": len(results),
        "sampled": found.sampled,
        "sample_seed": f"{project.name}/stage {found.stage}" if found.sampled else None,
        "killed": counts[KILLED],
        "survived": counts[SURVIVED],
        "timed_out": counts[TIMEOUT],
        "equivalent": counts[EQUIVALENT],
        "score": round(score, 4),
        "kill_runs_required": KILL_RUNS,
        "seconds": round(seconds, 1),
        "mutants": rows,
    }


def current_hash(project: Path, found: StageMutants) -> str:
    return stage_hash(project, found.stage, stage_tests(project, found.stage), found.targets)


def write_report(project: Path, stages: dict[str, dict]) -> Path:
    """Merges `stages` into the project's report. Two runs of other stages may end
    at once: the read, merge and replace happen under an exclusive lock, so
    neither loses the other's stages."""
    path = project / REPORT
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _merge_report(path, project, stages)


def _merge_report(path: Path, project: Path, stages: dict[str, dict]) -> Path:
    old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    merged = {**old.get("stages", {}), **stages}
    order = stage_ids(project)
    report = {
        "project": project.name,
        "tool": f"cosmic-ray {COSMIC_RAY_VERSION}",
        "score": "(killed + timed out) / (mutants run - equivalent), per stage",
        "sample_size": SAMPLE,
        "excluded_operators": EXCLUDED,
        "stages": {s: merged[s] for s in order if s in merged},
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # A reader never sees half a report.
    return path


def sources_digest(project: Path) -> str:
    """A digest of every file the mutants and the stage hash are made from
    (`src/`, `tests/`, `mutation.toml`, `project.toml`), bytes and names."""
    h = hashlib.sha256()
    files = [project / CONFIG, project / "project.toml"]
    for folder in ("src", "tests"):
        files += sorted(p for p in (project / folder).rglob("*") if p.is_file())
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(project)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def run_stages(project: Path, stages: list[str], jobs: int, survivors_only: bool) -> int:
    # The mutants are enumerated, and the stage hashes taken, from the files as they
    # are now; an edit between the two would pair the mutants of one version with
    # the hash of another, so the files must be the same before and after both.
    sources = sources_digest(project)
    found = {s: stage_mutants(project, s) for s in stages}
    # The identity of what the copies hold: taken before the first copy is made.
    hashes = {s: current_hash(project, found[s]) for s in stages}
    if sources_digest(project) != sources:
        print("the project's files changed while its mutants were listed; run again")
        return 1
    if survivors_only:
        old = json.loads((project / REPORT).read_text(encoding="utf-8"))["stages"]
        keep = {
            r["key"]
            for s in stages
            for r in old.get(s, {}).get("mutants", [])
            if r["outcome"] in (SURVIVED, EQUIVALENT)
        }
        for f in found.values():
            f.mutants = [m for m in f.mutants if m.key in keep]
    total = sum(len(f.mutants) for f in found.values())
    print(
        f"{project.name}: {total} mutants over stages {', '.join(stages)} "
        f"(cosmic-ray {COSMIC_RAY_VERSION}, {jobs} jobs)",
        flush=True,
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        work, cache = Path(tmp), Path(tmp) / "jax-cache"
        copies = Copies(project, work)
        base = baseline(project, copies, stages, cache, jobs)
        job_list = [
            mutant_job(
                project, copies, stage_tests(project, s), cache, 3 * base[s] + 30, m, base[s]
            )
            for s in stages
            for m in found[s].mutants
        ]

        def show(done, n, total):
            r = done.result
            mark = "" if r.outcome == KILLED else f"  <- {r.detail}"
            print(
                f"  [{n:>4}/{total}] {r.outcome:<9} {r.seconds:5.1f} s  stage {r.mutant.stage}"
                f"  {r.mutant.key}{mark}",
                flush=True,
            )

        done = run_jobs(job_list, jobs, cache, show)
    by_stage: dict[str, list[Result]] = {s: [] for s in stages}
    seconds: dict[str, float] = {s: 0.0 for s in stages}
    for d in done:
        by_stage[d.result.mutant.stage].append(d.result)
        seconds[d.result.mutant.stage] += d.seconds
    reports = {
        s: stage_report(project, found[s], hashes[s], by_stage[s], seconds[s]) for s in stages
    }
    status = print_scores(project, reports)
    moved = [s for s in stages if current_hash(project, found[s]) != hashes[s]]
    if moved and not survivors_only:
        print(
            f"the code of stage {', '.join(moved)} changed while its mutants ran: "
            "the report is not written; run again"
        )
        return 1
    if survivors_only:
        print("(survivors only: the report is not rewritten; run without --survivors)")
    else:
        path = write_report(project, reports)
        print(f"wrote {path} in {time.perf_counter() - start:.0f} s")
    return status


def print_scores(project: Path, reports: dict[str, dict]) -> int:
    status = 0
    print(
        f"\n{'stage':<6} {'run':>4} {'killed':>6} {'t/o':>4} {'surv':>5} {'equiv':>5} {'score':>6}"
    )
    for stage, r in reports.items():
        low = r["score"] < MIN_SCORE or r["equivalent"] > MAX_EQUIVALENT * r["mutants_run"]
        status |= int(low)
        print(
            f"{stage:<6} {r['mutants_run']:>4} {r['killed']:>6} {r['timed_out']:>4} "
            f"{r['survived']:>5} {r['equivalent']:>5} {r['score']:>6.2f}"
            f"{'  BELOW 0.9 OR OVER 10% EQUIVALENT' if low else ''}"
        )
        for row in r["mutants"]:
            if row["outcome"] == SURVIVED:
                print(f"    survived: {row['key']}  [line {row['line']}, {row['operator']}]")
    return status


def confirm_jobs(
    projects: list[Path], per_stage: int, seed: str, work: Path, cache: Path
) -> list[Job]:
    """Jobs that rerun ``per_stage`` mutants each stage's report calls killed,
    drawn with the stage's code hash (from its report) and ``seed``: the same code
    draws the same mutants, so the matrix's verdict is a function of the code, not
    of the commit that carries it; a stage's draw changes when its code does (and
    its report is rescored). ``seed`` (`mutate.py confirm --seed`) draws others.
    A job's result is (project, stage, key, verdict) where verdict is `confirmed`
    or what the rerun found instead."""
    jobs: list[Job] = []
    for project in projects:
        if not (project / REPORT).is_file():  # The contract test fails it.
            continue
        report = json.loads((project / REPORT).read_text(encoding="utf-8"))["stages"]
        copies = Copies(project, work / project.name)
        (work / project.name).mkdir(parents=True, exist_ok=True)
        for stage in stage_ids(project):
            entry = report.get(stage, {})
            killed = [r["key"] for r in entry.get("mutants", []) if r["outcome"] == KILLED]
            rng = random.Random(f"{entry.get('code_hash')}/{seed}/{project.name}/{stage}")
            chosen = set(rng.sample(killed, min(per_stage, len(killed))))
            rows = {r["key"]: r for r in entry.get("mutants", [])}
            for key in sorted(chosen):
                row = rows[key]
                mutant = find_mutant(project, stage, key, row["operator"], row["line"])
                if mutant is None:  # The code moved on: the contract test says stale.
                    continue
                job = mutant_job(
                    project, copies, stage_tests(project, stage), cache, 600, mutant, 3.0, 1
                )
                job.name, job.part = f"{project.name}/{stage}: {key}", "mutants"
                jobs.append(job)
    return jobs


def confirm(projects: list[Path], per_stage: int, jobs: int, seed: str = "") -> int:
    with tempfile.TemporaryDirectory(prefix="mutate-confirm-") as tmp:
        work, cache = Path(tmp), Path(tmp) / "jax-cache"
        job_list = confirm_jobs(projects, per_stage, seed, work, cache)
        done = run_jobs(job_list, jobs, cache)
    bad = [d for d in done if d.result.outcome not in DETECTED]
    for d in bad:
        print(f"NOT KILLED on rerun: {d.job.name}")
    print(
        f"mutation sample (drawn by code hash{', seed ' + seed if seed else ''}): "
        f"{len(done)} reported kills rerun, "
        f"{len(bad)} not killed, {sum(d.seconds for d in done):.0f} job-seconds"
    )
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("project", help="a project id, or `confirm`")
    parser.add_argument("--stage", action="append", default=[], help="only these stages")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--survivors", action="store_true", help="rerun survivors only")
    parser.add_argument("--readme", action="store_true", help="only rewrite the README table")
    parser.add_argument("--per-stage", type=int, default=1, help="confirm: kills per stage")
    parser.add_argument("--seed", default="", help="confirm: draw other kills than the matrix")
    args = parser.parse_args(argv)
    if args.project == "confirm":
        return confirm(learning_checked(), args.per_stage, args.jobs, args.seed)
    project = ROOT / "projects" / args.project
    if not (project / "project.toml").is_file():
        print(f"No project `{args.project}` (a folder with project.toml).", file=sys.stderr)
        return 2
    if args.readme:
        rewrite_readme(project)
        return 0
    stages = args.stage or stage_ids(project)
    unknown = sorted(set(stages) - set(stage_ids(project)))
    if unknown:
        print(f"{project.name} has no stage {', '.join(unknown)}.", file=sys.stderr)
        return 2
    try:
        status = run_stages(project, stages, args.jobs, args.survivors)
    except (ValueError, RuntimeError) as exc:
        print(f"mutate: {exc}", file=sys.stderr)
        return 2
    if not args.survivors:
        rewrite_readme(project)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
