"""Route coverage: `progress.py coverage --role ID` in a starter, and the text of
`catalog-compile coverage` (no empty section, no count of nothing, evidence of a
project the route does not cite said in one line).

The starter is a small project written here: two stages, each with one exercise
region and one fast test, and a conftest that writes the stage's evidence. Its
`roles.json` is built by `portfolio.roles_json` from a catalog written here, so
the route's skills and stages are this test's inputs, not the code's output.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from catalog_compiler.coverage import role_coverage, text_report
from catalog_compiler.pipeline import compile_catalog
from catalog_compiler.portfolio import dossier_module, roles_json
from catalog_compiler.starters import NOTE, write_starter
from conftest import REPO

TIMEOUT = 120
REGION = '''\
def {name}(x):
    """{doc}"""
    # --- exercise stage {stage}: {hint} ---
    return {body}
    # --- end exercise ---
'''
TEST = '''\
from cov_demo.calc import {name}


def test_{name}():
    """{doc}"""
    assert {name}(3) == {value}
'''
CONFTEST = """\
import json
import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="module")
def evidence(request):
    yield
    stage = Path(request.node.fspath).stem.split("_")[2]
    folder = Path(__file__).resolve().parent.parent / "evidence"
    folder.mkdir(exist_ok=True)
    payload = {"stage": stage, "records": [{"check": "x", "passed": True}]}
    (folder / f"stage_{stage}.json").write_text(json.dumps(payload) + "\\n")
"""
MANIFEST = """\
id = "cov-demo"
title = "Coverage demo"
status = "ready"

[[stages]]
id = "1"
title = "Double"
deliverable = "Doubling"
tests = ["tests/test_stage_1_double.py"]

[[stages]]
id = "2"
title = "Square"
deliverable = "Squaring"
tests = ["tests/test_stage_2_square.py"]
"""
REQUIRED = "Required route practice"
# Two routes citing the project: one with a required skill per stage, one whose only
# skill is required (so it has no optional section to show).
CATALOG = {
    "roles": [
        {
            "id": "demo-route",
            "title": "Demo route",
            "portfolio": "A demo portfolio",
            "reviewQuestions": ["Why double?"],
            "scopeNote": "A learning route.",
            "skillEvidence": [
                {
                    "skill": "Doubling numbers",
                    "projectId": "cov-demo",
                    "stageIds": ["1"],
                    "scope": REQUIRED,
                    "evidence": "e",
                    "reviewCriterion": "r",
                },
                {
                    "skill": "Squaring numbers",
                    "projectId": "cov-demo",
                    "stageIds": ["2"],
                    "scope": "Optional extension",
                    "evidence": "e",
                    "reviewCriterion": "r",
                },
            ],
        },
        {
            "id": "other-route",
            "title": "Other route",
            "portfolio": "Another portfolio",
            "reviewQuestions": [],
            "scopeNote": "A learning route.",
            "skillEvidence": [
                {
                    "skill": "Both at once",
                    "projectId": "cov-demo",
                    "stageIds": ["1", "2"],
                    "scope": REQUIRED,
                    "evidence": "e",
                    "reviewCriterion": "r",
                }
            ],
        },
    ]
}


# How a learner might write each stage's region: equal in effect to the reference
# (`2 * x`, `x * x`), not in text.
OWN = {"1": ("return 2 * x", "return x * 2"), "2": ("return x * x", "return x**2")}


def make_starter(tmp_path: Path, keep: set[str] = frozenset(), own: bool = True) -> Path:
    """The starter with the regions of ``keep`` written: the learner's way (`OWN`),
    or, with ``own=False``, as the reference wrote them."""
    project = tmp_path / "cov-demo"
    calc = (
        REGION.format(
            name="double", doc="Twice x.", stage="1", hint="Return x times two.", body="2 * x"
        )
        + "\n\n"
        + REGION.format(
            name="square", doc="x squared.", stage="2", hint="Return x times x.", body="x * x"
        )
    )
    files = {
        "project.toml": MANIFEST,
        "README.md": "# Coverage demo\n\nNumbers.\n",
        "src/cov_demo/__init__.py": "",
        "src/cov_demo/calc.py": calc,
        "tests/conftest.py": CONFTEST,
        "tests/test_stage_1_double.py": TEST.format(name="double", doc="Doubles.", value=6),
        "tests/test_stage_2_square.py": TEST.format(name="square", doc="Squares.", value=9),
    }
    for rel, text in files.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text, encoding="utf-8")
    folder = write_starter(project, tmp_path / "starter", keep, roles_json(CATALOG, "cov-demo"))
    calc = folder / "src" / "cov_demo" / "calc.py"
    text = calc.read_text(encoding="utf-8")
    for stage in sorted(keep) if own else []:
        reference, mine = OWN[stage]
        assert text.count(reference) == 1
        text = text.replace(reference, mine)
    calc.write_text(text, encoding="utf-8")
    return folder


def progress(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(folder / "src"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "progress.py", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT,
    )


def stage_lines(out: str) -> dict[str, tuple[str, str]]:
    """Stage id -> (demonstrated|remaining, reason) as the report shows each stage."""
    found = re.findall(r"^\s+(demonstrated|remaining): stage (\S+) \((.+)\)$", out, re.M)
    return {stage: (word, reason) for word, stage, reason in found}


def empty_headings(out: str) -> list[str]:
    """Lines ending in a colon with nothing more indented under them."""
    lines = out.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.rstrip().endswith(":") and line.strip():
            depth = len(line) - len(line.lstrip())
            after = lines[i + 1] if i + 1 < len(lines) else ""
            if not after.strip() or len(after) - len(after.lstrip()) <= depth:
                found.append(line)
    return found


def assert_clean(out: str) -> None:
    assert not empty_headings(out), out
    assert not re.search(r"\b0 of 0\b", out), out
    assert "Traceback" not in out


def test_a_fresh_starter_has_every_cited_stage_remaining_with_the_reason(tmp_path: Path):
    folder = make_starter(tmp_path)
    done = progress(folder, "coverage", "--role", "demo-route")
    assert done.returncode == 1, done.stdout + done.stderr
    shown = stage_lines(done.stdout)
    stages = {"1", "2"}
    assert set(shown) == stages, done.stdout
    assert all(word == "remaining" and reason for word, reason in shown.values()), done.stdout
    assert "[covered]" not in done.stdout
    assert_clean(done.stdout)


def test_forged_stamps_are_not_demonstrated(tmp_path: Path):
    """A stamp saying passed, with an evidence file, but the hashes of neither the
    code nor the evidence: remaining, for the reason the dossier gives."""
    folder = make_starter(tmp_path)
    (folder / "evidence").mkdir()
    (folder / "evidence" / "stage_1.json").write_text('{"records": []}\n')
    forged = {"result": "passed", "code_hash": "0" * 64, "evidence_sha256": "0" * 64}
    stamps = {"project": "cov-demo", "stages": {"1": forged}}
    (folder / "evidence" / "progress.json").write_text(json.dumps(stamps))
    done = progress(folder, "coverage", "--role", "demo-route")
    assert done.returncode == 1, done.stdout + done.stderr
    word, reason = stage_lines(done.stdout)["1"]
    dossier = dossier_module()
    manifest = dossier.progress.manifest(folder)
    status, why = dossier.stage_status(folder, manifest["stages"][0], forged)
    assert status != dossier.DEMONSTRATED
    assert (word, reason) == ("remaining", f"{status}: {why}"), done.stdout


def _stamp_as_passed(folder: Path, stage_id: str) -> dict:
    """A stamp forged with the right hashes: of the code as it is, and of an evidence
    file written by hand."""
    dossier = dossier_module()
    stage = next(s for s in dossier.progress.manifest(folder)["stages"] if s["id"] == stage_id)
    (folder / "evidence").mkdir(exist_ok=True)
    evidence = folder / "evidence" / f"stage_{stage_id}.json"
    evidence.write_text('{"records": [{"check": "x", "passed": true}]}\n')
    record = {
        "result": "passed",
        "code_hash": dossier.progress.stage_code_hash(folder, stage_id, stage["tests"]),
        "evidence_sha256": dossier.progress.file_sha256(evidence),
    }
    stamps = {"project": "cov-demo", "stages": {stage_id: record}}
    (folder / "evidence" / "progress.json").write_text(json.dumps(stamps))
    return record


def test_a_stamp_with_the_right_hashes_over_unwritten_regions_is_not_demonstrated(
    tmp_path: Path,
):
    """... and `progress.py` itself reads the regions: it runs the stage (which fails)
    instead of answering that every stage passes."""
    folder = make_starter(tmp_path)
    _stamp_as_passed(folder, "1")
    done = progress(folder, "coverage", "--role", "demo-route")
    assert done.returncode == 1, done.stdout + done.stderr
    word, reason = stage_lines(done.stdout)["1"]
    assert word == "remaining" and "still raise the starter's error" in reason, done.stdout
    assert_clean(done.stdout)
    run = progress(folder)
    assert run.returncode == 1 and "Every stage passes" not in run.stdout, run.stdout
    assert "stage 1" in run.stdout, run.stdout


def test_the_reference_code_passing_is_not_the_learners_demonstration(tmp_path: Path):
    """Regions that are the reference's own code pass their tests, and are said to be
    the reference's, reindented or annotated alike; the learner's own passes."""
    folder = make_starter(tmp_path, keep={"1"}, own=False)
    assert progress(folder).returncode == 1  # Stage 1 passes; stage 2 is still to write.
    done = progress(folder, "coverage", "--role", "demo-route")
    assert done.returncode == 1, done.stdout + done.stderr
    word, reason = stage_lines(done.stdout)["1"]
    assert word == "remaining" and reason.startswith("reference code: "), done.stdout
    calc = folder / "src" / "cov_demo" / "calc.py"
    annotated = calc.read_text().replace(
        "    return 2 * x", "    # my answer\n\n        return 2 * x  # twice"
    )
    calc.write_text(annotated.replace("        return 2 * x", "    return 2 * x"))
    assert progress(folder).returncode == 1
    again = stage_lines(progress(folder, "coverage", "--role", "demo-route").stdout)
    assert again["1"][0] == "remaining" and again["1"][1].startswith("reference code: ")
    calc.write_text(calc.read_text().replace("return 2 * x", "return x + x"))
    assert progress(folder).returncode == 1
    mine = stage_lines(progress(folder, "coverage", "--role", "demo-route").stdout)
    assert mine["1"][0] == "demonstrated", mine


def test_a_stage_that_really_passed_is_demonstrated(tmp_path: Path):
    folder = make_starter(tmp_path, keep={"1"})
    run = progress(folder)
    assert run.returncode == 1, run.stdout + run.stderr  # Stage 2 is still to write.
    done = progress(folder, "coverage", "--role", "demo-route")
    assert done.returncode == 1, done.stdout + done.stderr
    shown = stage_lines(done.stdout)
    assert shown["1"][0] == "demonstrated" and shown["2"][0] == "remaining", done.stdout
    assert "[covered] Doubling numbers" in done.stdout
    assert "[remaining] Squaring numbers" in done.stdout
    assert_clean(done.stdout)
    # Changing stage 1's code after the run takes the demonstration back.
    calc = folder / "src" / "cov_demo" / "calc.py"
    calc.write_text(calc.read_text().replace("return x * 2", "return x + x"))
    again = stage_lines(progress(folder, "coverage", "--role", "demo-route").stdout)
    assert again["1"][0] == "remaining"


def test_every_stage_demonstrated_exits_0_and_shows_no_optional_heading(tmp_path: Path):
    folder = make_starter(tmp_path, keep={"1", "2"})
    assert progress(folder).returncode == 0
    done = progress(folder, "coverage", "--role", "other-route")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {w for w, _ in stage_lines(done.stdout).values()} == {"demonstrated"}
    assert "Optional" not in done.stdout  # The route has no optional skill here.
    assert_clean(done.stdout)


@pytest.mark.parametrize("args", [[], ["--role", "no-such-route"]])
def test_no_route_or_an_unknown_one_exits_2_in_one_line_naming_the_routes(tmp_path, args):
    folder = make_starter(tmp_path)
    done = progress(folder, "coverage", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    for role in CATALOG["roles"]:
        assert role["id"] in done.stderr


def test_a_missing_roles_json_is_one_line_exit_2(tmp_path: Path):
    folder = make_starter(tmp_path)
    (folder / "roles.json").unlink()
    done = progress(folder, "coverage", "--role", "demo-route")
    assert done.returncode == 2 and "roles.json" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_help_and_the_readme_note_name_the_command(tmp_path: Path):
    folder = make_starter(tmp_path)
    done = progress(folder, "--help")
    assert done.returncode == 0 and "coverage --role" in done.stdout, done.stdout
    assert "progress.py coverage --role" in (folder / "README.md").read_text()
    assert "progress.py coverage --role" in NOTE
    page = REPO / "compiler/src/catalog_compiler/templates/project.html"
    assert "progress.py coverage --role" in page.read_text()


@pytest.fixture(scope="module")
def compiled():
    result = compile_catalog(REPO)
    assert result.ok
    return result


def repository_report(compiled, role: dict, folders: list[Path]) -> str:
    projects = {p["id"]: p for p in compiled.inputs["projects"]}
    lessons = {lesson["id"]: lesson for lesson in compiled.inputs["lessons"]}
    return text_report(role_coverage(role, lessons, projects, folders))


def test_repository_coverage_has_no_empty_section_on_any_route(compiled):
    for role in compiled.catalog["roles"]:
        assert_clean(repository_report(compiled, role, []))


def test_repository_coverage_names_evidence_of_a_project_the_route_does_not_cite(compiled):
    role = compiled.catalog["roles"][0]
    cited = {item["projectId"] for item in role["skillEvidence"]}
    other = next(p["id"] for p in compiled.inputs["projects"] if p["id"] not in cited)
    out = repository_report(compiled, role, [REPO / "projects" / other / "evidence"])
    assert f"evidence of {other} is not cited by route {role['id']}" in out, out
    mine = next(iter(sorted(cited)))
    out = repository_report(compiled, role, [REPO / "projects" / mine / "evidence"])
    assert "is not cited by route" not in out, out
