"""`scripts/accelerator_lane.py`: what a lane run records per stage, checked on the toy project.

The JUnit text below is written by hand, so every expected count, skip reason and
failure is read off the text itself; the stage runs use the toy project's own two
stages on this machine's CPU (the lane only needs pytest), once as written and once
with a stage broken in a scratch copy. Seeded bugs written here into a scratch
copy's `seeded_bugs.toml` show `bugs` choosing by id, calling a wrong sum caught
and a harmless rewrite survived, keeping each result as it comes, and starting
none once its budget is spent.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from accelerator_lane import parse_junit, run_bugs, run_stages  # noqa: E402

TOY = Path(__file__).resolve().parent / "fixtures" / "toy-project"
STAGES = [
    {"id": "1", "tests": ["tests/test_stage_1_sum.py"]},
    {"id": "2", "tests": ["tests/test_stage_2_mean.py"]},
]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.test_stage_1_sum" name="test_a" time="1.5"/>
<testcase classname="tests.test_stage_1_sum" name="test_b" time="0.5">
  <skipped type="pytest.skip" message="needs a TPU: backend is cpu"/>
</testcase>
<testcase classname="tests.test_stage_2_mean" name="test_c" time="2.0">
  <failure message="AssertionError: 3 != 4">trace</failure>
</testcase>
<testcase classname="tests.test_stage_2_mean" name="test_d" time="0.25"/>
<testcase classname="tests.test_other" name="test_e" time="9.0"/>
</testsuite></testsuites>
"""


def test_junit_is_counted_per_stage_with_every_skip_reason_and_failure(tmp_path):
    """Each stage gets its passed, failed and skipped counts and seconds; a skip keeps its reason,
    a failure its message; a test of no declared stage file is left out."""
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    got = parse_junit(path, STAGES)
    assert got == {
        "1": {
            "passed": 1,
            "failed": 0,
            "skipped": 1,
            "seconds": 2.0,
            "skips": [
                {"test": "test_stage_1_sum.py::test_b", "reason": "needs a TPU: backend is cpu"}
            ],
            "failures": [],
        },
        "2": {
            "passed": 1,
            "failed": 1,
            "skipped": 0,
            "seconds": 2.25,
            "skips": [],
            "failures": [
                {"test": "test_stage_2_mean.py::test_c", "message": "AssertionError: 3 != 4"}
            ],
        },
    }


def test_a_lane_run_counts_the_toy_project_and_sees_a_broken_stage(tmp_path):
    """The toy project's stage tests run in one pytest process and are counted per stage; with
    stage 2's test broken in a scratch copy, only stage 2 records the failure."""
    copy = tmp_path / "toy-project"
    shutil.copytree(TOY, copy)
    clean = run_stages(copy, tmp_path, "auto", timeout=120)
    test_file = copy / "tests" / "test_stage_2_mean.py"
    test_file.write_text(test_file.read_text() + "\n\ndef test_broken():\n    assert 1 == 2\n")
    broken = run_stages(copy, tmp_path, "auto", timeout=120)
    assert clean["exit_code"] == 0 and broken["exit_code"] == 1
    assert all(s["failed"] == 0 and s["passed"] > 0 for s in clean["stages"].values())
    assert broken["stages"]["1"]["failed"] == 0
    assert broken["stages"]["2"]["failed"] == 1
    assert broken["stages"]["2"]["failures"][0]["test"] == "test_stage_2_mean.py::test_broken"


def test_a_stage_declared_cpu_multi_device_is_skipped_with_its_reason_off_the_cpu(tmp_path):
    """A stage whose manifest declares `cpu-multi-device` is skipped, every test with the
    reason, where the default backend is an accelerator, and runs where it is the CPU."""
    copy = tmp_path / "toy-project"
    shutil.copytree(TOY, copy)
    manifest = copy / "project.toml"
    text = manifest.read_text()
    marker = 'id = "2"\n'
    assert text.count(marker) == 1
    head, tail = text.split(marker)
    tail = re.sub(r'hardware = "[^"]*"', 'hardware = "cpu-multi-device"', tail, count=1)
    manifest.write_text(head + marker + tail)
    on_chip = run_stages(copy, tmp_path, "auto", timeout=120, backend="tpu")
    on_cpu = run_stages(copy, tmp_path, "auto", timeout=120, backend="cpu")
    stage2 = on_chip["stages"]["2"]
    assert stage2["passed"] == stage2["failed"] == 0 and stage2["skipped"] > 0
    assert all(
        "cpu-multi-device" in s["reason"] and "`tpu`" in s["reason"] for s in stage2["skips"]
    )
    assert on_chip["stages"]["1"]["passed"] > 0 and on_chip["stages"]["1"]["skipped"] == 0
    assert on_cpu["stages"]["2"]["passed"] == stage2["skipped"]


BUGS = """
[[bugs]]
id = "sum-skips-the-first"
stage = "1"
file = "src/toy_project/core.py"
find = "for value in values:"
replace = "for value in values[1:]:"
tests = ["tests/test_stage_1_sum.py"]

[[bugs]]
id = "sum-reassociated"
stage = "1"
file = "src/toy_project/core.py"
find = "result += value"
replace = "result = value + result"
tests = ["tests/test_stage_1_sum.py"]

[[bugs]]
id = "mean-off-by-one"
stage = "2"
file = "src/toy_project/core.py"
find = "/ len(values)"
replace = "/ (len(values) + 1)"
tests = ["tests/test_stage_2_mean.py"]
"""


def test_bugs_by_id_kept_as_they_come_and_none_past_the_budget(tmp_path):
    copy = tmp_path / "toy-project"
    shutil.copytree(TOY, copy)
    (copy / "seeded_bugs.toml").write_text(BUGS)
    kept: list[list[str]] = []
    results = run_bugs(
        copy,
        None,
        120,
        only=["sum-skips-the-first", "sum-reassociated"],
        keep=lambda r: kept.append([b["id"] for b in r]),
    )
    assert [(b["id"], b["outcome"]) for b in results] == [
        ("sum-skips-the-first", "caught"),
        ("sum-reassociated", "survived"),
    ]
    assert kept == [["sum-skips-the-first"], ["sum-skips-the-first", "sum-reassociated"]]
    assert run_bugs(copy, ["2"], 120)[0]["outcome"] == "caught"
    assert run_bugs(copy, None, 120, budget=0) == []
