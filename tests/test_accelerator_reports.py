"""Every committed `accelerator-report.json` is well formed and says what ran where.

CI has no accelerator, so these reports are what a lent chip left behind
(`scripts/accelerator_lane.py` there, `scripts/accelerator_report.py` here). For
each ready project that has one: it validates against
`catalog_compiler.accelerator.AcceleratorReport` (every skip names its reason,
counts agree with their lists), names its own project and a non-CPU device, and
hashes exactly the manifest's stages; every stage passed or was skipped with
its reason, in every mode; no seeded bug run there survived. Runs of one mode
over other stages join into one run, exiting as the worst of them, and two runs
of one stage are refused. Negative controls
show the schema refusing a skip without a reason, a count that disagrees with
its list and a run that leaves a stage out, and `stage_summaries` calling a
stage stale once its code hash differs from the mutation report's. Each README's
stage table shows, per stage, the last accelerator run (verdict, device, date,
commit) and `code changed since` when the stage's code hash has moved on.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import accelerator_report  # noqa: E402
from catalog_compiler import accelerator  # noqa: E402
from ready_projects import ready_projects  # noqa: E402
from scratch import stage_ids  # noqa: E402

REPORTED = [p for p in ready_projects() if (p / accelerator.REPORT).is_file()]


def test_at_least_one_project_has_run_on_an_accelerator():
    assert REPORTED, "no project keeps an accelerator-report.json"


@pytest.mark.parametrize("project", REPORTED, ids=lambda p: p.name)
def test_report_is_valid_and_every_stage_passed_or_skipped_with_its_reason(project: Path):
    report = accelerator.load(project)
    assert report.project == project.name
    assert report.device.backend != "cpu", "an accelerator report must come from an accelerator"
    assert list(report.code_hashes) == stage_ids(project)
    for stage in report.code_hashes:
        verdict = accelerator.stage_verdict(report, stage)
        runs = {run.mode: run.stages[stage] for run in report.runs}
        assert verdict in ("passed", "skipped"), (stage, verdict, runs)
    survived = [b.id for b in report.seeded_bugs if b.outcome not in ("caught", "untestable")]
    assert not survived, f"seeded bugs not caught on {report.device.device_kind}: {survived}"
    caught = sum(b.outcome == "caught" for b in report.seeded_bugs)
    assert caught >= 3, f"{caught} seeded bugs caught on {report.device.device_kind}; at least 3"


def _sample() -> dict:
    """A minimal valid report, written out by hand."""
    stage = {"passed": 2, "failed": 0, "skipped": 1, "seconds": 1.5, "failures": []}
    stage["skips"] = [{"test": "test_a.py::test_x", "reason": "needs two processes"}]
    return {
        "schema_version": 1,
        "project": "toy",
        "device": {
            "backend": "tpu",
            "device_kind": "TPU v5 lite",
            "device_count": 1,
            "jax": "0.10.2",
            "jaxlib": "0.10.2",
            "libtpu": "0.0.42.1",
        },
        "commit": "0" * 40,
        "ran_on": "2026-12-06",
        "command": "python scripts/accelerator_lane.py run toy",
        "code_hashes": {"1": "a" * 64, "2": "b" * 64},
        "runs": [
            {
                "mode": "auto",
                "exit_code": 0,
                "wall_seconds": 3.0,
                "stages": {"1": stage, "2": copy.deepcopy(stage)},
            }
        ],
        "seeded_bugs": [{"id": "off-by-one", "stage": "1", "outcome": "caught", "seconds": 2.0}],
    }


def test_the_schema_accepts_the_sample():
    report = accelerator.AcceleratorReport.model_validate(_sample())
    assert accelerator.stage_verdict(report, "1") == "passed"


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: r["runs"][0]["stages"]["1"]["skips"][0].update(reason=""),
        lambda r: r["runs"][0]["stages"]["1"].update(skipped=0),
        lambda r: r["runs"][0]["stages"].pop("2"),
        lambda r: r.update(commit="829c30b"),
        lambda r: r["device"].update(extra="x"),
    ],
    ids=["skip-without-reason", "count-disagrees", "stage-left-out", "short-commit", "unknown-key"],
)
def test_the_schema_refuses_a_damaged_report(damage):
    report = _sample()
    damage(report)
    with pytest.raises(ValidationError):
        accelerator.AcceleratorReport.model_validate(report)


def test_verdicts_fail_a_failure_and_skip_only_when_every_test_skipped():
    report = _sample()
    report["runs"][0]["stages"]["1"].update(
        failed=1, failures=[{"test": "test_a.py::test_y", "message": "AssertionError"}]
    )
    report["runs"][0]["stages"]["2"].update(passed=0)
    parsed = accelerator.AcceleratorReport.model_validate(report)
    assert accelerator.stage_verdict(parsed, "1") == "failed"
    assert accelerator.stage_verdict(parsed, "2") == "skipped"


def test_a_stage_is_current_only_while_its_code_hash_matches_the_mutation_report(tmp_path):
    (tmp_path / accelerator.REPORT).write_text(json.dumps(_sample()))
    stages = {"1": {"code_hash": "a" * 64}, "2": {"code_hash": "c" * 64}}
    (tmp_path / "mutation-report.json").write_text(json.dumps({"stages": stages}))
    summary = accelerator.stage_summaries(tmp_path)
    assert (summary["1"]["current"], summary["2"]["current"]) == (True, False)
    assert summary["1"]["bugs_caught"] == summary["1"]["bugs_run"] == 1
    assert accelerator.stage_summaries(tmp_path / "elsewhere") is None


def _run(mode: str, exit_code, seconds: float, stages: list[str]) -> dict:
    stage = _sample()["runs"][0]["stages"]["1"]
    return {
        "mode": mode,
        "exit_code": exit_code,
        "wall_seconds": seconds,
        "stages": {s: copy.deepcopy(stage) for s in stages},
    }


@pytest.mark.parametrize(
    ("codes", "joined"),
    [
        ((0, 0), 0),
        ((0, 1), 1),
        ((1, 0), 1),
        (("timeout", 1), "timeout"),
        ((0, "timeout"), "timeout"),
    ],
)
def test_runs_of_one_mode_over_other_stages_join_into_one(codes, joined):
    runs = [
        _run("auto", codes[0], 10.0, ["1"]),
        _run("auto", codes[1], 2.5, ["2", "3"]),
        _run("interpret", 0, 1.0, ["1", "2", "3"]),
    ]
    result = accelerator_report.join_by_mode(runs)
    assert [(r["mode"], sorted(r["stages"]), r["wall_seconds"]) for r in result] == [
        ("auto", ["1", "2", "3"], 12.5),
        ("interpret", ["1", "2", "3"], 1.0),
    ]
    assert result[0]["exit_code"] == joined
    assert sorted(runs[0]["stages"]) == ["1"], "the runs given are left as they were"


def test_two_runs_of_one_stage_in_one_mode_are_refused():
    with pytest.raises(ValueError, match=r"stages \['2'\]"):
        accelerator_report.join_by_mode(
            [_run("auto", 0, 1.0, ["1", "2"]), _run("auto", 0, 1.0, ["2"])]
        )


def _readme_rows(project: Path) -> dict[str, list[str]]:
    """Stage id -> the cells of its row in the README's stage table, by column name."""
    lines = (project / "README.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Stage | Deliverable |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows[cells["Stage"].split(".", 1)[0]] = cells
    return rows


def _expected_accelerator_cell(project: Path, stage: str) -> str:
    """What the README must say, read straight from the two JSON reports: the
    stage's verdict words, device, date and commit, and `code changed since` exactly
    when the report's code hash is not the mutation report's."""
    path = project / accelerator.REPORT
    if not path.is_file():
        return "not run"
    report = json.loads(path.read_text(encoding="utf-8"))
    runs = [run["stages"][stage] for run in report["runs"]]
    timed_out = any(run["exit_code"] == "timeout" for run in report["runs"])
    if timed_out or any(r["failed"] for r in runs):
        verdict = "failed"
    elif any(r["passed"] for r in runs):
        verdict = "passed"
    else:
        verdict = "skipped" if all(r["skipped"] for r in runs) else "failed"
    scored = json.loads((project / "mutation-report.json").read_text(encoding="utf-8"))
    stale = scored["stages"].get(stage, {}).get("code_hash") != report["code_hashes"][stage]
    cell = (
        f"{verdict} on {report['device']['device_kind']} "
        f"({report['ran_on']}, {report['commit'][:7]})"
    )
    return f"{cell}; code changed since" if stale else cell


@pytest.mark.parametrize("project", ready_projects(), ids=lambda p: p.name)
def test_readme_shows_each_stage_s_last_accelerator_run_and_whether_it_is_current(project):
    rows = _readme_rows(project)
    assert sorted(rows) == sorted(stage_ids(project))
    for stage, cells in rows.items():
        assert cells["Accelerator"] == _expected_accelerator_cell(project, stage), (
            f"{project.name}/README.md stage {stage}: run `python scripts/mutate.py "
            f"{project.name} --readme` after the accelerator or mutation report changes"
        )


def test_the_readme_check_sees_a_stale_stage(tmp_path):
    """Negative control: a current stage's expected cell gains `code changed since`
    once the mutation report's code hash differs from the accelerator report's."""
    project, stage = next(
        (p, s)
        for p in REPORTED
        for s in stage_ids(p)
        if not _expected_accelerator_cell(p, s).endswith("code changed since")
    )
    copy_ = tmp_path / project.name
    copy_.mkdir()
    for name in (accelerator.REPORT, "mutation-report.json"):
        (copy_ / name).write_text((project / name).read_text(encoding="utf-8"))
    before = _expected_accelerator_cell(copy_, stage)
    scored = json.loads((copy_ / "mutation-report.json").read_text(encoding="utf-8"))
    scored["stages"][stage]["code_hash"] = "0" * 64
    (copy_ / "mutation-report.json").write_text(json.dumps(scored))
    assert _expected_accelerator_cell(copy_, stage) == f"{before}; code changed since"


def _junit(tmp_path: Path, cases: dict[str, str | None]) -> Path:
    """A JUnit file holding `module.py::name` -> skip reason (None: it passed)."""
    rows = []
    for node, reason in cases.items():
        module, name = node.split("::")
        inner = "" if reason is None else f'<skipped message="{reason}"/>'
        rows.append(f'<testcase classname="tests.{module[:-3]}" name="{name}">{inner}</testcase>')
    path = tmp_path / "junit-toy-auto.xml"
    path.write_text(f"<testsuites><testsuite>{''.join(rows)}</testsuite></testsuites>")
    return path


A, B = "tests/test_s.py::test_a", "tests/test_s.py::test_b"


@pytest.mark.parametrize(
    ("named", "cases", "expected"),
    [
        ([A], {"test_s.py::test_a[1]": "no sockets", "test_s.py::test_a[2]": "no sockets"}, True),
        ([A], {"test_s.py::test_a[1]": "no sockets", "test_s.py::test_a[2]": None}, False),
        ([A, B], {"test_s.py::test_a": "no sockets", "test_s.py::test_b": None}, False),
        ([A], {"test_s.py::test_ab": "no sockets"}, False),
    ],
    ids=["every-parameter-skipped", "one-parameter-ran", "another-named-test-ran", "absent"],
)
def test_a_bug_is_untestable_only_when_every_test_it_names_skipped(
    tmp_path, named, cases, expected
):
    found = accelerator_report.junit_cases([_junit(tmp_path, cases)])
    reason = accelerator_report.untestable_reason(named, found)
    assert (reason == "no sockets") if expected else reason is None


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [("untestable", None), ("caught", "no sockets")],
    ids=["no-reason", "reason-on-a-catch"],
)
def test_the_schema_ties_a_reason_to_untestable_only(outcome, reason):
    report = _sample()
    report["seeded_bugs"][0].update(outcome=outcome, reason=reason)
    with pytest.raises(ValidationError):
        accelerator.AcceleratorReport.model_validate(report)
