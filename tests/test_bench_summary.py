"""`scripts/bench_summary.py`: ranges over bench runs and the rerun check.

The reports here are written by hand, so every expected figure below is
worked out from the numbers in the test, not from the script.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from ready_projects import ready_projects  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_summary.py"


def _report(tmp_path: Path, name: str, ratios: dict, aa: dict | None = None) -> Path:
    details = {k: {"aa": v, "min": 0.5, "median": 1.0, "max": 2.0} for k, v in (aa or {}).items()}
    path = tmp_path / name
    path.write_text(json.dumps({"ratios": ratios, "ratio_details": details}))
    return path


def _run(*args: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True
    )


@pytest.fixture
def three_runs(tmp_path: Path) -> list[Path]:
    """`speedup` 4, 5, 6 with A/A 1.0, 0.8 (a 1.25x deviation), 1.1;
    `count` 2.5 in every run, with no A/A; `moving` 2, 3, 2 with no A/A."""
    return [
        _report(
            tmp_path, "r1.json", {"speedup": 4.0, "count": 2.5, "moving": 2.0}, {"speedup": 1.0}
        ),
        _report(
            tmp_path, "r2.json", {"speedup": 5.0, "count": 2.5, "moving": 3.0}, {"speedup": 0.8}
        ),
        _report(
            tmp_path, "r3.json", {"speedup": 6.0, "count": 2.5, "moving": 2.0}, {"speedup": 1.1}
        ),
    ]


def test_range_and_expected_range_widen_by_the_largest_aa_deviation(three_runs):
    """The observed range is min to max of the runs; the expected range widens
    it by the A/A's largest deviation from 1 (0.8 -> 1.25x): 3.2 to 7.5."""
    result = _run(*three_runs)
    assert result.returncode == 0, result.stderr
    line = next(s for s in result.stdout.splitlines() if s.startswith("speedup:"))
    assert "4 to 6 (4, 5, 6)" in line
    assert "A/A 0.8 to 1.1" in line
    assert "expected in a rerun 3.2 to 7.5" in line
    count = next(s for s in result.stdout.splitlines() if s.startswith("count:"))
    assert "2.5 to 2.5" in count and "expected" not in count
    # No A/A of its own but it moves: the runs' largest A/A factor, 1.25.
    moving = next(s for s in result.stdout.splitlines() if s.startswith("moving:"))
    assert "expected in a rerun 1.6 to 3.75" in moving


@pytest.mark.parametrize(
    ("speedup", "count", "status", "verdict"),
    [
        (3.25, 2.5, 0, "inside"),  # just inside the widened lower edge 3.2
        (7.45, 2.5, 0, "inside"),  # just inside the widened upper edge 7.5
        (3.15, 2.5, 1, "OUTSIDE"),  # just below it
        (7.55, 2.5, 1, "OUTSIDE"),  # just above it
        (5.0, 2.6, 1, "inside"),  # the deterministic figure moved: outside
    ],
)
def test_a_rerun_is_judged_against_the_expected_range(
    tmp_path, three_runs, speedup, count, status, verdict
):
    """Both sides of both edges, and a figure without A/A that must not move."""
    rerun = _report(tmp_path, "rerun.json", {"speedup": speedup, "count": count})
    result = _run(*three_runs, "--check", rerun)
    assert result.returncode == status, result.stdout + result.stderr
    line = next(s for s in result.stdout.splitlines() if s.startswith("speedup:"))
    assert line.endswith(f"rerun.json: {speedup:.3g} {verdict}")
    count_line = next(s for s in result.stdout.splitlines() if s.startswith("count:"))
    assert count_line.endswith("inside" if count == 2.5 else "OUTSIDE")


def test_ratios_missing_from_some_runs_or_the_rerun_are_named(tmp_path, three_runs):
    """A ratio only some runs have says so; one the rerun lacks is `absent`."""
    extra = _report(tmp_path, "r4.json", {"speedup": 5.0, "new": 1.5})
    rerun = _report(tmp_path, "rerun.json", {"count": 2.5})
    result = _run(*three_runs, extra, "--check", rerun)
    assert "new: 1.5 to 1.5 (1.5) [in 1 of 4 runs]" in result.stdout
    assert "rerun.json: absent" in result.stdout


@pytest.mark.parametrize("content", ["{not json", json.dumps({"measurements": {}})])
def test_a_file_that_is_not_a_bench_report_is_one_clear_error(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = _run(bad)
    assert result.returncode != 0
    assert result.stderr.startswith("error:") and "bad.json" in result.stderr
    assert "Traceback" not in result.stderr


def _project(tmp_path: Path, runs: list[float], reruns: list[float]) -> Path:
    """A project folder with `speedup` runs (A/A 1.1 each) and reruns."""
    project = tmp_path / "toy"
    (project / "benchmarks").mkdir(parents=True)
    for kind, values in (("run", runs), ("rerun", reruns)):
        for n, value in enumerate(values, start=1):
            _report(
                project / "benchmarks", f"{kind}-{n}.json", {"speedup": value}, {"speedup": 1.1}
            )
    (project / "README.md").write_text("# toy\n\n## Performance\n\nProse.\n\n## Next\n\nMore.\n")
    return project


def _readme(project: Path, *flags: str) -> subprocess.CompletedProcess:
    return _run("--readme", project, *flags)


def test_the_readme_block_is_placed_in_the_performance_section_and_verified(tmp_path):
    """Runs 4, 5, 6 with A/A 1.1: expected 3.64 to 6.6; rerun 7 is outside."""
    project = _project(tmp_path, [4.0, 5.0, 6.0], [5.5, 7.0])
    assert _readme(project, "--verify").returncode == 1  # no block yet
    assert _readme(project).returncode == 0
    text = (project / "README.md").read_text()
    block = text[text.index("<!-- bench-runs:begin -->") : text.index("## Next")]
    assert text.index("Prose.") < text.index("<!-- bench-runs:begin -->") < text.index("## Next")
    assert "`toy bench --out runs/bench.json`" in block
    assert (
        "| `speedup` |  | 4 to 6 | 1.1 to 1.1 | 3.64 to 6.6 | 5.5 inside | 7 **outside** |" in block
    )
    assert "outside their expected range in the reruns: 1." in block
    assert _readme(project, "--verify").returncode == 0
    # A changed run makes the block stale; rewriting it replaces the old one.
    _report(project / "benchmarks", "run-2.json", {"speedup": 8.0}, {"speedup": 1.1})
    assert _readme(project, "--verify").returncode == 1
    assert _readme(project).returncode == 0
    text = (project / "README.md").read_text()
    assert text.count("<!-- bench-runs:begin -->") == 1 and "4 to 8" in text


def test_fewer_than_three_runs_give_no_block(tmp_path):
    project = _project(tmp_path, [4.0, 5.0], [])
    result = _readme(project)
    assert result.returncode == 2 and "at least 3" in result.stderr
    assert "bench-runs" not in (project / "README.md").read_text()


READY = ready_projects()


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_every_ready_project_states_its_bench_from_kept_runs(project):
    """The README's bench block matches the reports in `benchmarks/` (at least
    three runs), so every range it states can be recomputed from them."""
    result = _readme(project, "--verify")
    assert result.returncode == 0, result.stderr
