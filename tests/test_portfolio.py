"""A learner's own evidence becomes a dossier and a route's milestone coverage.

Dossier (`progress.py dossier` in a starter): for training-methods and
engineering-release, a starter with stages 1 and 2 written runs
`python progress.py` (stages 1 and 2 pass, stage 3 fails unwritten), then
`progress.py dossier`. The written regions carry one line of the learner's own
(the reference's code line for line is a run of the reference, not a
demonstration: `compiler/tests/test_route_coverage.py`). Stages 1-2 must show
as demonstrated with every figure
their evidence files hold (read here straight from the JSON and formatted
here), the rest as not yet; after one stage-2 region is edited, stage 2 shows
as stale and stage 1 stays demonstrated. Editing code outside every region
changes no stage.

Coverage (`catalog-compile coverage`): over the reference evidence of the
training-engineer route's projects every required skill is covered; without
mlp-classifier's evidence its two skills are remaining and nothing else
changes; a tampered evidence file, a stamp of code that has changed, and
evidence that does not parse or names an unknown project or stage are each
reported as such (COV001-COV003, exit 1); the reference's evidence copied into
a folder with no code beside it demonstrates nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from catalog_compiler.cli import main as cli
from catalog_compiler.portfolio import progress_module
from catalog_compiler.starters import write_starter
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = ROOT / "projects"
TRAINING_ENGINEER = [
    "mlp-classifier",
    "reproducible-experiments",
    "sharded-training",
    "training-methods",
]

pytestmark = pytest.mark.portfolio


def run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(folder / "src"), MPLBACKEND="Agg")
    env.pop("EVIDENCE_DIR", None)  # The starter's own evidence/, as a learner has it.
    return subprocess.run(
        [sys.executable, "progress.py", *args],
        cwd=folder,
        env=env,
        text=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )


def stage_rows(markdown: str) -> dict[str, str]:
    """Stage id -> status word, from the dossier's summary table."""
    rows = re.findall(r"^\| (\S+) \| .*? \| \*\*([a-z ]+)\*\*:", markdown, re.M)
    return dict(rows)


def formatted(value: object) -> list[str]:
    """The texts a figure must appear as (formatted here, not by the dossier)."""
    if isinstance(value, bool) or value is None:
        return [str(value)]
    if isinstance(value, float):
        return [f"{value:.6g}"]
    if isinstance(value, int | str):
        return [str(value)]
    return []


@pytest.fixture(scope="module", params=["training-methods", "engineering-release"])
def worked(request, tmp_path_factory) -> Path:
    """A starter of the project with stages 1 and 2 written, after `progress.py`."""
    name = request.param
    folder = write_starter(
        PROJECTS / name,
        tmp_path_factory.mktemp(name) / name,
        {"1", "2"},
        roles=json.dumps({"project": name, "scopeNote": "Self-run.", "roles": []}).encode(),
    )
    written_own_way(folder, {"1", "2"})
    done = run(folder)
    assert done.returncode == 1, done.stdout + done.stderr  # Stage 3 is still to write.
    assert "Next: stage 3" in done.stdout, done.stdout
    return folder


def written_own_way(folder: Path, stages: set[str]) -> None:
    """One line of the learner's own at the top of every region of ``stages``."""
    for source in sorted((folder / "src").rglob("*.py")):
        lines = source.read_text("utf-8").splitlines()
        out = []
        for number, line in enumerate(lines):
            out.append(line)
            opening = re.match(r"^\s*# --- exercise stage (\S+): ", line)
            if opening and opening.group(1) in stages:
                indent = re.match(r"\s*", lines[number + 1]).group(0)
                out.append(f"{indent}pass  # the learner's own line")
        source.write_text("\n".join(out) + "\n", "utf-8")


def test_dossier_shows_written_stages_demonstrated_with_their_figures(worked: Path):
    done = run(worked, "dossier")
    assert done.returncode == 0, done.stderr
    markdown = (worked / "dossier" / "dossier.md").read_text(encoding="utf-8")
    page = (worked / "dossier" / "index.html").read_text(encoding="utf-8")
    rows = stage_rows(markdown)
    stages = progress_module().manifest(worked)["stages"]
    assert rows["1"] == rows["2"] == "demonstrated", rows
    assert all(rows[s["id"]] == "not yet" for s in stages[2:]), rows
    assert "self-run evidence" in markdown and "not independent" in markdown
    for sid in ("1", "2"):
        evidence = json.loads((worked / "evidence" / f"stage_{sid}.json").read_text("utf-8"))
        assert evidence["records"], f"stage {sid} kept no records"
        section = markdown.split(f"## Stage {sid}:")[1].split("\n## ")[0]
        rows = [ln for ln in section.splitlines() if ln.startswith("| ")][1:]  # No header.
        assert len(rows) == len(evidence["records"]), (sid, len(rows))
        for record, line in zip(evidence["records"], rows, strict=True):
            cells = [c.strip().replace("\\|", "|") for c in line.split(" | ")]
            assert cells[0].removeprefix("| ") == record["check"], (cells[0], record)
            assert cells[1] == str(record.get("condition", "")), (cells[1], record)
            for key, value in (record.get("observed") or {}).items():
                for text in formatted(value):
                    assert f"{key} = {text}" in cells[2], (sid, key, text, line)
            assert cells[-1].rstrip(" |") == ("passed" if record["passed"] else "FAILED")
        assert "python -m pytest -q -x -p no:cacheprovider" in section
    # The HTML escapes what it shows: no raw `<` from any record text.
    assert "<script" not in page and page.count("<table>") >= 3


def test_editing_a_region_makes_only_its_stage_stale(worked: Path, tmp_path: Path):
    copy = Path(shutil.copytree(worked, tmp_path / worked.name))
    progress = progress_module()
    left = progress.unwritten_regions(copy)
    assert "2" not in left and "3" in left
    # Outside every region: no stage changes.
    init = next((copy / "src").glob("*/__init__.py"))
    init.write_text(init.read_text("utf-8") + "\n# a learner's note\n", "utf-8")
    assert stage_rows(dossier_text(copy)).get("2") == "demonstrated"
    # Inside a stage-2 region: stage 2 is stale, stage 1 still demonstrated.
    source, line = region_line(copy, "2")
    lines = source.read_text("utf-8").splitlines()
    indent = re.match(r"\s*", lines[line]).group(0)
    lines.insert(line, f"{indent}pass  # edited")
    source.write_text("\n".join(lines) + "\n", "utf-8")
    rows = stage_rows(dossier_text(copy))
    assert rows["2"] == "stale" and rows["1"] == "demonstrated", rows


def dossier_text(folder: Path) -> str:
    done = run(folder, "dossier")
    assert done.returncode == 0, done.stderr
    return (folder / "dossier" / "dossier.md").read_text(encoding="utf-8")


def region_line(folder: Path, stage: str) -> tuple[Path, int]:
    """A source file and the 0-based index of the line after a stage's opening marker."""
    pattern = re.compile(rf"^\s*# --- exercise stage {stage}: ")
    for source in sorted((folder / "src").rglob("*.py")):
        for number, text in enumerate(source.read_text("utf-8").splitlines()):
            if pattern.match(text):
                return source, number + 1
    raise AssertionError(f"no stage-{stage} region")


def coverage(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["coverage", "--root", str(ROOT), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def evidence_dirs(names: list[str]) -> list[str]:
    return [str(PROJECTS / n / "evidence") for n in names]


def skill_lines(output: str) -> dict[str, str]:
    return dict(
        (m.group(2), m.group(1))
        for m in re.finditer(r"^\s+- \[(covered|remaining)\] (.+) \(", output, re.M)
    )


def test_reference_evidence_covers_every_required_skill_of_the_training_route():
    code, out = coverage("--role", "training-engineer", *evidence_dirs(TRAINING_ENGINEER))
    assert code == 0, out
    required = required_skills()
    shown = skill_lines(out)
    assert len(required) >= 3 and all(shown[s] == "covered" for s in required), (shown, out)
    assert f"Required skills covered: {len(required)} of {len(required)}" in out


def required_skills() -> list[str]:
    """The route's required skills, as the published catalog scopes them."""
    from catalog_compiler.pipeline import compile_catalog

    roles = {r["id"]: r for r in compile_catalog(ROOT).catalog["roles"]}
    return [
        e["skill"]
        for e in roles["training-engineer"]["skillEvidence"]
        if e["scope"] == "Required route practice"
    ]


def test_without_one_projects_evidence_its_skills_remain():
    names = [n for n in TRAINING_ENGINEER if n != "mlp-classifier"]
    code, out = coverage("--role", "training-engineer", *evidence_dirs(names))
    assert code == 0, out
    shown = skill_lines(out)
    assert shown["Flax NNX and explicit state"] == "remaining"
    assert shown["Optax and train/eval steps"] == "remaining"
    assert shown["MLflow experiment provenance"] == "covered"
    assert "remaining: stage 1 (no evidence given)" in out


def copy_evidence(tmp_path: Path, name: str) -> Path:
    """A copy of a project (code and evidence), so the stamps can be checked against it."""
    dest = tmp_path / name
    shutil.copytree(PROJECTS / name, dest, ignore=shutil.ignore_patterns(".venv", "__pycache__"))
    return dest


def test_tampered_evidence_and_changed_code_are_not_demonstrated(tmp_path: Path):
    project = copy_evidence(tmp_path, "mlp-classifier")
    stage_1 = project / "evidence" / "stage_1.json"
    stage_1.write_text(stage_1.read_text("utf-8").replace('"passed": true', '"passed": true ', 1))
    source, line = region_line(project, "2")
    text = source.read_text("utf-8").splitlines()
    text.insert(line, re.match(r"\s*", text[line]).group(0) + "pass  # changed")
    source.write_text("\n".join(text) + "\n", "utf-8")
    code, out = coverage("--role", "training-engineer", str(project / "evidence"))
    assert code == 0, out
    assert "remaining: stage 1 (its evidence changed since the stamp)" in out
    assert "remaining: stage 2 (its code changed since the run that passed)" in out
    assert "demonstrated: stage 3" in out


def test_reference_evidence_with_no_code_beside_it_demonstrates_nothing(tmp_path: Path):
    folder = Path(shutil.copytree(PROJECTS / "mlp-classifier" / "evidence", tmp_path / "evidence"))
    code, out = coverage("--role", "training-engineer", str(folder))
    assert code == 0, out
    assert "demonstrated: stage" not in out, out
    for stage in ("1", "2", "3"):
        assert f"remaining: stage {stage} (no code beside this evidence" in out, out


@pytest.mark.parametrize(
    ("stamps", "rule"),
    [
        ("not json", "COV001"),
        (json.dumps({"stages": {}}), "COV001"),
        (json.dumps({"project": "no-such-project", "stages": {}}), "COV002"),
        (
            json.dumps({"project": "mlp-classifier", "stages": {"9": {"result": "passed"}}}),
            "COV003",
        ),
    ],
)
def test_bad_evidence_is_a_diagnostic_never_a_traceback(tmp_path: Path, stamps: str, rule: str):
    folder = tmp_path / "evidence"
    folder.mkdir()
    (folder / "progress.json").write_text(stamps, encoding="utf-8")
    code, out = coverage("--role", "training-engineer", str(folder))
    assert code == 1 and f"[{rule}]" in out and "Traceback" not in out, out


def test_coverage_page_links_resolve_and_text_is_escaped(tmp_path: Path):
    out_dir = tmp_path / "coverage"
    code, out = coverage(
        "--role",
        "training-engineer",
        "--format",
        "html",
        "--out",
        str(out_dir),
        *evidence_dirs(TRAINING_ENGINEER),
    )
    assert code == 0, out
    page = (out_dir / "coverage-training-engineer.html").read_text("utf-8")
    hrefs = re.findall(r'href="([^"]+)"', page)
    assert hrefs, "the page links its evidence"
    for href in hrefs:
        if href.startswith("data:"):
            continue
        assert (out_dir / href).resolve().is_file(), href
    assert "ML &amp; training engineer" in page and "ML & training" not in page
    # No heading over nothing and no count of nothing, as in the text report.
    assert "0 of 0" not in page
    sections = re.findall(r"<h2>([^<]*)</h2>\s*(.*?)</section>", page, re.S)
    assert sections and all(body.strip() for _, body in sections), sections
