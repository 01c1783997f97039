"""Every ready project's mutation report is current, consistent and strong enough.

`make mutate P=<id>` writes `<project>/mutation-report.json` (`scripts/mutate.py`).
For each stage of each ready project this checks that the report exists and
is fresh (its code hash equals the hash of the code on disk now), that it ran
the sample the mutants on disk call for, that its counts and score follow
from its rows, that the score is at least 0.9 with at most 10% equivalents,
that every equivalent is declared with a reason in `mutation.toml` (and no
declaration names a mutant that no longer exists), and that the README's
stage table shows the report's score. Whether the reported kills still kill
is the matrix's `mutants` part: it reruns a sample of them on every run.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import mutants  # noqa: E402
import mutate  # noqa: E402
from ready_projects import ready_projects  # noqa: E402
from scratch import stage_ids, stage_tests  # noqa: E402

READY = ready_projects()
STAGES = [(p, s) for p in READY for s in stage_ids(p)]


def report(project: Path) -> dict:
    path = project / mutants.REPORT
    assert path.is_file(), (
        f"{project.name} has no {mutants.REPORT}: run make mutate P={project.name}"
    )
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize(("project", "stage"), STAGES, ids=lambda v: getattr(v, "name", v))
def test_stage_report_is_fresh_consistent_and_strong(project: Path, stage: str):
    entry = report(project)["stages"].get(stage)
    where = f"{project.name} stage {stage}"
    assert entry, f"{where}: not in the mutation report; run make mutate P={project.name}"
    targets = mutants.stage_targets(project, stage)
    now = mutants.stage_hash(project, stage, stage_tests(project, stage), targets)
    assert entry["code_hash"] == now, (
        f"{where}: the report is stale (code, tests or mutation.toml changed since); "
        f"run make mutate P={project.name} STAGE={stage}"
    )
    found = mutants.stage_mutants(project, stage)
    assert entry["mutants_total"] == found.total
    assert sorted(r["key"] for r in entry["mutants"]) == sorted(m.key for m in found.mutants)
    counts = {o: sum(r["outcome"] == o for r in entry["mutants"]) for o in mutate.OUTCOMES}
    assert counts == {
        mutate.KILLED: entry["killed"],
        mutate.SURVIVED: entry["survived"],
        mutate.TIMEOUT: entry["timed_out"],
        mutate.EQUIVALENT: entry["equivalent"],
    }
    judged = len(entry["mutants"]) - entry["equivalent"]
    assert judged > 0, f"{where}: no mutant to judge"
    assert entry["score"] == round((entry["killed"] + entry["timed_out"]) / judged, 4)
    assert entry["score"] >= mutate.MIN_SCORE, (
        f"{where}: mutation score {entry['score']} < {mutate.MIN_SCORE}; survivors: "
        + "; ".join(r["key"] for r in entry["mutants"] if r["outcome"] == mutate.SURVIVED)
    )
    assert entry["equivalent"] <= mutate.MAX_EQUIVALENT * len(entry["mutants"]), (
        f"{where}: {entry['equivalent']} equivalents of {len(entry['mutants'])} mutants"
    )
    declared = mutants.equivalents(project, stage)
    for row in entry["mutants"]:
        if row["outcome"] == mutate.EQUIVALENT:
            assert declared.get(row["key"], "").strip(), f"{where}: {row['key']} has no reason"
    every = {m.key for m in mutants.enumerate_mutants(project, stage, targets)}
    assert set(declared) <= every, f"{where}: declared equivalents that no longer exist: " + (
        "; ".join(sorted(set(declared) - every))
    )


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_readme_stage_table_shows_the_reported_scores(project: Path):
    stages = report(project)["stages"]
    text = (project / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^\| Stage \|.*\| Mutation score \|$", text, re.M), (
        f"{project.name}/README.md: the stage table has no Mutation score column"
    )
    for stage, entry in stages.items():
        shown = (
            f"{entry['score']:.2f} ({entry['killed'] + entry['timed_out']}/"
            f"{entry['mutants_run'] - entry['equivalent']})"
        )
        row = re.search(rf"^\| {re.escape(stage)}\. .*\| {re.escape(shown)} \|$", text, re.M)
        assert row, f"{project.name}/README.md: stage {stage} does not show {shown}"
