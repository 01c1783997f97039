"""`failed_check` (a starter's learner tool): what a failing stage run shows.

On JUnit reports written here by hand, the failing test's line carries its
figures: pytest's rewritten assertion, NumPy's tolerance lines, the first
figure line of a Hypothesis failure group, and the file:line where an error
was raised in the learner's `src/` (never a frame of the test itself). On
evidence files written here, the record shown is the last one marked failed
(a negative control recorded as failed earlier stays out) and only from a
file written by the run that just ended.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from catalog_compiler.portfolio import progress_module

progress_module()  # Loads `failed_check` and `learner_files` as a starter has them.
import failed_check  # noqa: E402

TESTS = ["tests/test_stage_1_x.py"]


def _report(tmp_path: Path, message: str, text: str) -> Path:
    path = tmp_path / "junit.xml"
    path.write_text(
        "<testsuites><testsuite><testcase classname='tests.test_stage_1_x' name='test_y'>"
        f"<failure message='{message}'>{text}</failure></testcase></testsuite></testsuites>",
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("message", "text", "shown", "hidden"),
    [
        (
            "ExceptionGroup: Hypothesis found 2 distinct failures.",
            "tests/test_stage_1_x.py:9: in test_y\n"
            "E   AssertionError: Obtained: 0.5, Expected: 1.5",
            ["Obtained: 0.5, Expected: 1.5"],
            ["raised at"],
        ),
        (
            "AssertionError:&#10;Not equal to tolerance rtol=1e-05, atol=0&#10;"
            "Max absolute difference among violations: 0.25&#10;ACTUAL: array([1.])",
            "",
            ["Not equal to tolerance rtol=1e-05", "Max absolute difference among violations: 0.25"],
            ["ACTUAL"],
        ),
        (
            "TypeError: unsupported operand",
            "tests/test_stage_1_x.py:9: in test_y\nsrc/pkg/core.py:41: in helper\n"
            "src/pkg/core.py:57: TypeError",
            ["raised at src/pkg/core.py:57"],
            [],
        ),
        (
            "assert 3 == 4",
            "tests/test_stage_1_x.py:9: in test_y\nsrc/pkg/core.py:41: in helper\n"
            "tests/test_stage_1_x.py:12: AssertionError",
            ["assert 3 == 4"],
            ["raised at"],
        ),
    ],
)
def test_the_failing_line_carries_its_figures(tmp_path, message, text, shown, hidden):
    failure = failed_check.first_failure(_report(tmp_path, message, text), TESTS, tmp_path)
    assert failure.test == "tests/test_stage_1_x.py::test_y"
    for part in shown:
        assert part in failure.assertion, (part, failure.assertion)
    for part in hidden:
        assert part not in failure.assertion, (part, failure.assertion)


def _evidence(folder: Path, records: list[dict]) -> Path:
    path = folder / "evidence" / "stage_1.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stage": "1", "records": records}), encoding="utf-8")
    return path


def test_the_last_failed_record_of_this_run_is_the_one_shown(tmp_path):
    control = {"check": "a bound that must break", "observed": {"x": 1.0}, "passed": False}
    real = {
        "check": "sum vs loop",
        "condition": "n = 3",
        "observed": {"max_abs_error": 0.5},
        "tolerance": {"atol": 1e-6},
        "passed": False,
    }
    ok = {"check": "other", "observed": {}, "passed": True}
    start = time.time()
    _evidence(tmp_path, [control, real, ok])
    record = failed_check.failed_record(tmp_path, "1", start - 1)
    assert record == real
    line = failed_check.decisive_line(record)
    assert line == "sum vs loop (n = 3): observed max_abs_error = 0.5; limit atol = 1e-06"


def test_evidence_older_than_the_run_is_not_shown(tmp_path):
    path = _evidence(tmp_path, [{"check": "old", "observed": 1, "passed": False}])
    old = time.time() - 3600
    os.utime(path, (old, old))
    assert failed_check.failed_record(tmp_path, "1", time.time() - 60) is None


def test_a_new_failing_check_starts_the_hint_ladder_again():
    """`hint`'s levels climb while the failing check stays the same (its parameters
    aside) and start at 1 for another one; `hints` keeps the highest level shown."""
    from catalog_compiler.portfolio import _template_module

    hints = _template_module("hints")
    state: dict = {"stages": {}, "ladder": "not a ladder"}
    same = {"test": "tests/test_a.py::test_x[1]", "assertion": "a"}
    levels = [hints.next_level(state, "src/m.py#0", same) for _ in range(4)]
    assert levels == [1, 2, 3, 3]
    other_params = {"test": "tests/test_a.py::test_x[2]", "assertion": "b"}
    assert hints.next_level(state, "src/m.py#0", other_params) == 3
    other = {"test": "tests/test_a.py::test_z", "assertion": "c"}
    assert hints.next_level(state, "src/m.py#0", other) == 1
    assert hints.next_level(state, "src/m.py#1", other) == 1
    assert hints.next_level(state, "src/m.py#0", None) == 1
