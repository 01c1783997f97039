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
    """`speedup` 5.0, 5.01, 5.02 with A/A 1.0, 0.8 (a 1.25x deviation), 1.1;
    `drift` 4, 5, 6 with no A/A; `count` 2.5 in every run, with no A/A."""
    return [
        _report(
            tmp_path, "r1.json", {"speedup": 5.0, "drift": 4.0, "count": 2.5}, {"speedup": 1.0}
        ),
        _report(
            tmp_path, "r2.json", {"speedup": 5.01, "drift": 5.0, "count": 2.5}, {"speedup": 0.8}
        ),
        _report(
            tmp_path, "r3.json", {"speedup": 5.02, "drift": 6.0, "count": 2.5}, {"speedup": 1.1}
        ),
    ]


def _line(stdout: str, name: str) -> str:
    return next(s for s in stdout.splitlines() if s.startswith(f"{name}:"))


def test_expected_range_is_the_wider_of_the_aa_widening_and_the_prediction_interval(
    three_runs,
):
    """Worked by hand. `speedup` barely moves between runs, so its A/A decides:
    5.0 / 1.25 = 4 to 5.02 * 1.25 = 6.275 (the 99% prediction interval, 4.90 to
    5.13, is narrower). `drift` moves a lot: logs of 4, 5, 6 have mean 1.5958
    and sd 0.2031; t(0.995, 2) = 9.9248, so the half-width is 9.9248 * 0.2031 *
    sqrt(4/3) = 2.3273 and the interval exp(1.5958 -+ 2.3273) = 0.481 to 50.6,
    far wider than its widening by the runs' largest A/A factor (3.2 to 7.5).
    A figure that never moves is expected exactly."""
    result = _run(*three_runs)
    assert result.returncode == 0, result.stderr
    speedup = _line(result.stdout, "speedup")
    assert "5 to 5.02 (5, 5.01, 5.02)" in speedup
    assert "A/A 0.8 to 1.1" in speedup
    assert "expected in a rerun 4 to 6.27" in speedup  # 6.275, stored just below
    assert "expected in a rerun 0.481 to 50.6" in _line(result.stdout, "drift")
    count = _line(result.stdout, "count")
    assert "2.5 to 2.5" in count and "expected" not in count


@pytest.mark.parametrize(
    ("speedup", "drift", "count", "status", "outside"),
    [
        (4.02, 5.0, 2.5, 0, set()),  # just inside the A/A-widened lower edge 4
        (6.25, 5.0, 2.5, 0, set()),  # just inside its upper edge 6.275
        (3.98, 5.0, 2.5, 1, {"speedup"}),  # just below it
        (6.30, 5.0, 2.5, 1, {"speedup"}),  # just above it
        (5.0, 0.49, 2.5, 0, set()),  # just inside the prediction interval's 0.4812
        (5.0, 50.0, 2.5, 0, set()),  # just inside its 50.558
        (5.0, 0.47, 2.5, 1, {"drift"}),  # just below it
        (5.0, 51.5, 2.5, 1, {"drift"}),  # just above it
        (5.0, 5.0, 2.6, 1, {"count"}),  # the deterministic figure moved
    ],
)
def test_a_rerun_is_judged_against_the_expected_range(
    tmp_path, three_runs, speedup, drift, count, status, outside
):
    """Both sides of both edges of each kind of range, and a figure without
    A/A that must not move."""
    values = {"speedup": speedup, "drift": drift, "count": count}
    rerun = _report(tmp_path, "rerun.json", values)
    result = _run(*three_runs, "--check", rerun)
    assert result.returncode == status, result.stdout + result.stderr
    for name, value in values.items():
        verdict = "OUTSIDE" if name in outside else "inside"
        assert _line(result.stdout, name).endswith(f"rerun.json: {value:.3g} {verdict}")
    assert f"{len(outside)} ratio(s) outside the expected range" in result.stdout


def test_more_runs_narrow_the_prediction_interval(tmp_path, three_runs):
    """A fourth run of 4.5 beside 4, 5, 6: mean 1.5729 and sd 0.1720 of the
    logs, t(0.995, 3) = 5.8409, half-width 5.8409 * 0.1720 * sqrt(5/4) = 1.1235,
    exp(1.5729 -+ 1.1235) = 1.57 to 14.8, inside the three-run 0.481 to 50.6.
    With one run there is no interval: only the A/A widening counts."""
    fourth = _report(tmp_path, "r4.json", {"speedup": 5.0, "drift": 4.5, "count": 2.5})
    result = _run(*three_runs, fourth)
    assert "expected in a rerun 1.57 to 14.8" in _line(result.stdout, "drift")
    alone = _run(three_runs[1])
    assert "expected in a rerun 4.01 to 6.26" in _line(alone.stdout, "speedup")


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
    return subprocess.run(
        [sys.executable, str(SCRIPT.with_name("bench_readme.py")), str(project), *flags],
        capture_output=True,
        text=True,
    )


def test_the_readme_block_is_placed_in_the_performance_section_and_verified(tmp_path):
    """Runs 4, 5, 6 with A/A 1.1: expected 0.481 to 50.6 (the prediction
    interval worked out above is wider than 3.64 to 6.6); rerun 60 is outside."""
    project = _project(tmp_path, [4.0, 5.0, 6.0], [5.5, 60.0])
    assert _readme(project, "--verify").returncode == 1  # no block yet
    assert _readme(project).returncode == 0
    text = (project / "README.md").read_text()
    block = text[text.index("<!-- bench-runs:begin -->") : text.index("## Next")]
    assert text.index("Prose.") < text.index("<!-- bench-runs:begin -->") < text.index("## Next")
    assert "`toy bench --out runs/bench.json`" in block
    assert (
        "| `speedup` |  | 4 to 6 | 1.1 to 1.1 | 0.481 to 50.6 | 5.5 inside | 60 **outside** |"
        in block
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


def test_the_summary_never_imports_the_readme_writer():
    """One direction: `bench_readme` uses `bench_summary`, not the reverse."""
    import ast

    def imported(path: Path) -> set[str]:
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names.add(node.module or "")
        return names

    assert "bench_summary" in imported(SCRIPT.with_name("bench_readme.py"))
    assert "bench_readme" not in imported(SCRIPT)
