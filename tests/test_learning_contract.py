"""Learner mode and seeded bugs (LEARNING.md), checked for every ready project.

Every ready project has an exercise region for each stage, a valid seeded-bug
list with at least three bugs per stage and a README table generated from it,
a stage marker per stage (`pytest -m stage<id>`), and what a folder copied out
alone needs: a `.gitignore`, its own generated `constraints.txt` used by its
README's install line, and no reference to the monorepo's files. (Whether the
regions progress stage by stage and whether each bug is caught is run by the
matrix itself: `scripts/learner.py check`, `scripts/seeded_bugs.py`.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from catalog_compiler.exercises import project_regions, strip_source  # noqa: E402
from catalog_compiler.starters import starter_files  # noqa: E402
from project_constraints import project_constraints, root_pins  # noqa: E402
from ready_projects import ready_projects  # noqa: E402
from seeded_bugs import load_bugs, readme_with_table  # noqa: E402

READY = ready_projects()


def manifest(project: Path) -> dict:
    with (project / "project.toml").open("rb") as f:
        return tomllib.load(f)


# Names of the monorepo's own files that a standalone project must not point at.
OUTSIDE = re.compile(r"BENCHMARKS\.md|DESIGN\.md|STYLE\.md|LEARNING\.md|\.\./\.\./|\.\./shared")


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_has_an_exercise_region_per_stage(project: Path):
    regions = project_regions(project)  # Raises, naming file and line, on a bad marker.
    stages = [s["id"] for s in manifest(project)["stages"]]
    covered = {r.stage for r in regions}
    assert not [s for s in stages if s not in covered], (
        f"{project.name}: stages without an exercise region: "
        f"{[s for s in stages if s not in covered]}"
    )
    unknown = covered - set(stages)
    assert not unknown, f"{project.name}: regions of unknown stages {unknown}"
    for source in project.glob("src/**/*.py"):
        text = source.read_text(encoding="utf-8")
        assert strip_source(text, set(stages)) == text


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_lists_seeded_bugs_and_its_readme_shows_them(project: Path):
    bugs, problems = load_bugs(project)
    assert not problems, "\n".join(problems)
    readme = (project / "README.md").read_text(encoding="utf-8")
    assert readme == readme_with_table(project, bugs), (
        f"{project.name}/README.md's seeded-bug table is stale: "
        f"run `python scripts/seeded_bugs.py --readme {project.name}`"
    )


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_lists_three_correct_reformulations_a_stage(project: Path):
    """`reformulations.toml` loads (each `find` once, tests of the stage's files) and
    holds at least three entries for every stage. Whether each passes is
    `scripts/seeded_bugs.py` (the matrix, for `scripts/reformulations_checked.txt`)."""
    assert (project / "reformulations.toml").is_file(), f"{project.name}: no reformulations.toml"
    found, problems = load_bugs(project, kind="reformulations")
    assert not problems, "\n".join(problems)
    counts = {s["id"]: sum(b.stage == s["id"] for b in found) for s in manifest(project)["stages"]}
    assert min(counts.values()) >= 3, counts


def _toml_bugs(bugs) -> str:
    """A bug list in `seeded_bugs.toml` form (JSON strings are TOML basic strings)."""
    keys = ("id", "stage", "file", "find", "replace", "why")
    return "".join(
        "[[bugs]]\n" + "".join(f"{k} = {json.dumps(getattr(b, k))}\n" for k in keys) for b in bugs
    )


def test_a_trial_list_may_try_one_bug_where_a_project_list_must_cover_each_stage(tmp_path):
    project = READY[0]
    first = load_bugs(project)[0][0]
    trials = tmp_path / "trials"
    trials.mkdir()
    (trials / f"{project.name}.toml").write_text(_toml_bugs([first]), encoding="utf-8")
    bugs, problems = load_bugs(project, trials)
    assert [(b.id, b.stage) for b in bugs] == [(first.id, first.stage)] and problems == []

    # The same one-entry list as a project's own is refused, stage by stage.
    alone = tmp_path / project.name
    (alone / first.file).parent.mkdir(parents=True)
    shutil.copy(project / first.file, alone / first.file)
    shutil.copy(project / "project.toml", alone / "project.toml")
    (alone / "seeded_bugs.toml").write_text(_toml_bugs([first]), encoding="utf-8")
    _, problems = load_bugs(alone)
    stages = [s["id"] for s in manifest(project)["stages"]]
    assert problems == [
        f"{project.name}: stage {s} lists {int(s == first.stage)} bugs (at least 3)" for s in stages
    ]


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_stands_alone(project: Path):
    ignored = (project / ".gitignore").read_text(encoding="utf-8").split()
    for entry in (".venv/", "runs/", "evidence/", "__pycache__/"):
        assert entry in ignored, f"{project.name}/.gitignore does not ignore {entry}"
    expected = project_constraints(project, root_pins())
    assert (project / "constraints.txt").is_file(), f"{project.name} has no constraints.txt"
    assert (project / "constraints.txt").read_text(encoding="utf-8") == expected, (
        f"{project.name}/constraints.txt is stale: run `python scripts/project_constraints.py`"
    )
    texts = [project / "README.md", *project.glob("src/**/*.py"), *project.glob("tests/**/*.py")]
    for path in texts:
        found = OUTSIDE.search(path.read_text(encoding="utf-8"))
        assert not found, f"{path.relative_to(ROOT)} names `{found.group(0)}`, outside the project"
    assert "-c constraints.txt" in (project / "README.md").read_text(encoding="utf-8"), (
        f"{project.name}/README.md's install line does not use its constraints.txt"
    )


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_selects_each_stage_by_marker(project: Path):
    """`pytest -m stage<id>` selects exactly the tests of the files that stage declares."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--markers", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for stage in manifest(project)["stages"]:
        assert f"@pytest.mark.stage{stage['id']}:" in done.stdout, (
            f"{project.name}: no `stage{stage['id']}` marker (tests/conftest.py registers them)"
        )


def test_the_checked_list_names_only_ready_projects():
    """`scripts/learning_checked.txt` (the projects whose progression and seeded bugs
    the matrix runs) lists ready projects only, each once."""
    lines = (ROOT / "scripts" / "learning_checked.txt").read_text(encoding="utf-8").splitlines()
    listed = [x.strip() for x in lines if x.strip() and not x.startswith("#")]
    assert len(listed) == len(set(listed)), listed
    assert set(listed) <= {p.name for p in READY}, set(listed) - {p.name for p in READY}


INSTALL = "python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e '.[test]'"
ACTIVATE = ". .venv/bin/activate"


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_every_readme_installs_and_activates_one_way(project: Path):
    """One environment convention in every project (and so every starter): the README's
    first code block that makes `.venv` creates and fills it, then activates it, so
    `python progress.py` and `pytest` run in the project's environment."""
    readme = (project / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```\w*\n(.*?)^```", readme, re.M | re.S)
    block = next((b for b in blocks if "python3 -m venv" in b), None)
    assert block, f"{project.name}/README.md: no code block makes the environment"
    lines = [ln.split("  #")[0].strip() for ln in block.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    assert lines[:2] == [INSTALL, ACTIVATE], (project.name, lines[:2])


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_the_starter_gives_no_region_away_outside_the_hint_ladder(project: Path):
    """No line a region holds (of 20 characters or more, and found nowhere outside the
    regions) is a line of any starter file but hints.json, which holds it compressed.
    Test files are left out: an independent reference in a test may share a line with
    the solution, and the tests are the learner's to read."""
    inside: set[str] = set()
    outside: set[str] = set()
    regions = project_regions(project)
    for source in project.glob("src/**/*.py"):
        rel = source.relative_to(project).as_posix()
        spans = [(r.start, r.end) for r in regions if r.path == rel]
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            inside_region = any(start < number < end for start, end in spans)
            (inside if inside_region else outside).add(line.strip())
    telling = {t for t in inside - outside if len(t) >= 20}
    assert telling, f"{project.name}: no region line to look for"
    for name, content in starter_files(project).items():
        if name == "hints.json" or name.startswith("tests/"):
            continue
        lines = {ln.strip() for ln in content.decode("utf-8", errors="replace").splitlines()}
        leaked = sorted(lines & telling)
        assert not leaked, f"{project.name} starter {name} holds region lines: {leaked[:3]}"
