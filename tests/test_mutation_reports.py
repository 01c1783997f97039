"""Every ready project's mutation report is current, consistent and strong enough.

`make mutate P=<id>` writes `<project>/mutation-report.json` (`scripts/mutate.py`).
For each stage of each ready project this checks that the report exists and
is fresh (its code hash equals the hash of the code on disk now, so the
sample it ran is the one that code calls for), that its counts and score
follow from its rows, that the score is at least 0.9 with at most 10%
equivalents, that every equivalent is declared with a reason in
`mutation.toml`, and that the README's
stage table shows the report's score. Whether the reported kills still kill
is the matrix's `mutants` part: it reruns a sample of them on every run.

A stage listed in `scripts/mutation_pending.txt` (`<project> <stage>: why`)
is skipped with that reason, and only while it falls short: a listed stage
whose report meets the bar fails, so the list only shrinks.
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
from mutants import SAMPLE  # noqa: E402
from ready_projects import ready_projects  # noqa: E402
from scratch import stage_ids  # noqa: E402

READY = ready_projects()
STAGES = [(p, s) for p in READY for s in stage_ids(p)]
PENDING_FILE = ROOT / "scripts" / "mutation_pending.txt"


def pending() -> dict[tuple[str, str], str]:
    """(project, stage) -> why it is not scored to the bar yet."""
    found = {}
    for line in PENDING_FILE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            head, _, why = line.partition(":")
            project, stage = head.split()
            found[(project, stage)] = why.strip()
    return found


PENDING = pending()


def report(project: Path) -> dict:
    path = project / mutants.REPORT
    assert path.is_file(), (
        f"{project.name} has no {mutants.REPORT}: run make mutate P={project.name}"
    )
    return json.loads(path.read_text(encoding="utf-8"))


def report_or_empty(project: Path) -> dict:
    path = project / mutants.REPORT
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"stages": {}}


@pytest.mark.parametrize(("project", "stage"), STAGES, ids=lambda v: getattr(v, "name", v))
def test_stage_report_is_fresh_consistent_and_strong(project: Path, stage: str):
    why = PENDING.get((project.name, stage))
    if why is not None:
        try:
            check_stage(project, stage)
        except AssertionError:
            pytest.skip(f"pending (scripts/mutation_pending.txt): {why}")
        pytest.fail(f"{project.name} stage {stage} meets the bar: remove it from the pending list")
    check_stage(project, stage)


def test_the_pending_list_names_real_stages():
    assert set(PENDING) <= {(p.name, s) for p, s in STAGES}, set(PENDING) - set(STAGES)


def check_stage(project: Path, stage: str) -> None:
    entry = report(project)["stages"].get(stage)
    where = f"{project.name} stage {stage}"
    assert entry, f"{where}: not in the mutation report; run make mutate P={project.name}"
    now = mutants.project_stage_hash(project, stage)
    assert entry["code_hash"] == now, (
        f"{where}: the report is stale (code, tests or mutation.toml changed since); "
        f"run make mutate P={project.name} STAGE={stage}"
    )
    # The hash covers every file the mutants come from, so a fresh report ran the
    # sample the code on disk calls for (`mutants.stage_mutants`, tested on the toy).
    assert len(entry["mutants"]) == entry["mutants_run"] == min(entry["mutants_total"], SAMPLE)
    assert entry["sampled"] == (entry["mutants_total"] > SAMPLE)
    assert len({r["key"] for r in entry["mutants"]}) == len(entry["mutants"]), "keys repeat"
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
    assert not unrepeated_kills(entry), f"{where}: kills not repeated: {unrepeated_kills(entry)}"
    declared = mutants.equivalents(project, stage)
    for row in entry["mutants"]:
        if row["outcome"] == mutate.EQUIVALENT:
            assert declared.get(row["key"], "").strip(), f"{where}: {row['key']} has no reason"


def unrepeated_kills(entry: dict) -> list[str]:
    """Keys of rows called killed that were not killed in each of the runs the stage
    was scored under (`kill_runs_required`; a stage scored before the rule has no
    such field, and its kills ran once)."""
    required = entry.get("kill_runs_required")
    if required is None:
        return []
    assert required >= mutate.KILL_RUNS, f"scored under {required} runs < {mutate.KILL_RUNS}"
    return [
        r["key"]
        for r in entry["mutants"]
        if r["outcome"] == mutate.KILLED and r.get("kill_runs") != required
    ]


def test_a_kill_that_ran_once_is_refused_once_the_rule_applies():
    """Negative control of `unrepeated_kills`: a row killed in fewer runs than its
    stage was scored under is named; with the field absent (scored before the
    rule) nothing is."""
    rows = [
        {"key": "a", "outcome": mutate.KILLED, "kill_runs": 3},
        {"key": "b", "outcome": mutate.KILLED, "kill_runs": 1},
        {"key": "c", "outcome": mutate.KILLED},
        {"key": "d", "outcome": mutate.SURVIVED},
    ]
    assert unrepeated_kills({"kill_runs_required": 3, "mutants": rows}) == ["b", "c"]
    assert unrepeated_kills({"mutants": rows}) == []
    with pytest.raises(AssertionError):
        unrepeated_kills({"kill_runs_required": 1, "mutants": rows})


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_readme_stage_table_shows_the_reported_scores(project: Path):
    stages = report_or_empty(project)["stages"]
    if not stages and all((project.name, s) in PENDING for s in stage_ids(project)):
        pytest.skip("no stage scored yet (scripts/mutation_pending.txt)")
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
