"""The project contract (DESIGN.md, "The project contract"), checked for every
folder under `projects/`.

Every folder carries a valid manifest; a `ready` project is a standalone
package: its own pinned pyproject with a console script named after the
project and a `test` extra, a README with a stage table naming every stage's
test file, every declared test file on disk, the shared module layout, a
bad-input suite over its command line, and no import of another project or
of the compiler.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = sorted(p for p in (ROOT / "projects").iterdir() if p.is_dir())
HARDWARE = {"cpu", "cpu-multi-device", "tpu", "gpu"}
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
# The file roles every project shares (STYLE.md, "One structure for every project").
SHARED_MODULES = ["config.py", "data.py", "model.py", "train.py", "checkpoint.py", "cli.py"]
DATA_ALTERNATIVES = {"env.py", "envs.py"}


def manifest(project: Path) -> dict:
    with (project / "project.toml").open("rb") as f:
        return tomllib.load(f)


def ready(project: Path) -> bool:
    return (project / "project.toml").exists() and manifest(project).get("status") == "ready"


READY = [p for p in PROJECTS if ready(p)]


def test_there_are_projects_and_one_is_ready():
    assert len(PROJECTS) >= 13, [p.name for p in PROJECTS]
    assert READY, "no project is `ready`; the matrix would test no project code"


@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name)
def test_manifest_is_valid(project: Path):
    assert (project / "project.toml").is_file(), f"{project.name} has no project.toml"
    m = manifest(project)
    assert m["id"] == project.name
    assert KEBAB.match(m["id"])
    assert m["status"] in {"planned", "ready"}
    assert isinstance(m["title"], str) and m["title"].strip()
    assert m["preparation"] and all(isinstance(x, str) for x in m["preparation"])
    stages = m["stages"]
    assert stages, f"{project.name} declares no stage"
    ids = [s["id"] for s in stages]
    assert len(ids) == len(set(ids)), f"duplicate stage ids in {project.name}: {ids}"
    for stage in stages:
        assert set(stage) <= {"id", "title", "deliverable", "tests", "hardware"}, stage
        assert stage["title"].strip() and stage["deliverable"].strip()
        assert stage["hardware"] in HARDWARE, stage["hardware"]
        for test in stage.get("tests", []):
            assert re.fullmatch(r"tests/test_stage_\d+_[a-z0-9_]+\.py", test), test
    assert (project / "README.md").is_file(), f"{project.name} has no README.md"


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_declares_and_ships_every_stage_test(project: Path):
    for stage in manifest(project)["stages"]:
        assert stage.get("tests"), f"stage {stage['id']} of {project.name} declares no test"
        for test in stage["tests"]:
            assert (project / test).is_file(), f"{project.name}: {test} is missing"
    declared = {t for s in manifest(project)["stages"] for t in s["tests"]}
    on_disk = {p.relative_to(project).as_posix() for p in project.glob("tests/test_stage_*.py")}
    assert on_disk <= declared, f"stage test files no stage declares: {sorted(on_disk - declared)}"


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_is_a_pinned_standalone_package(project: Path):
    with (project / "pyproject.toml").open("rb") as f:
        pyproject = tomllib.load(f)["project"]
    assert pyproject["name"] == project.name
    assert project.name in pyproject.get("scripts", {}), "the CLI is named after the project"
    extras = pyproject.get("optional-dependencies", {})
    assert "test" in extras, "a `test` extra installs the test tooling"
    for req in pyproject["dependencies"] + [r for deps in extras.values() for r in deps]:
        assert "==" in req, f"{project.name}: `{req}` is not pinned to an exact version"


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_has_the_shared_layout(project: Path):
    packages = [p for p in (project / "src").iterdir() if (p / "__init__.py").is_file()]
    assert len(packages) == 1, f"{project.name}/src should hold exactly one package"
    present = {p.name for p in packages[0].glob("*.py")}
    # Where the data come from an environment (RL), its module takes data.py's role.
    if present & DATA_ALTERNATIVES:
        present.add("data.py")
    missing = [m for m in SHARED_MODULES if m not in present]
    assert not missing, f"{project.name} lacks the shared modules {missing}"


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_has_a_bad_input_suite_over_its_cli(project: Path):
    """Every command refuses damaged input in one line, never a traceback: the
    suite `tests/test_bad_input.py` drives the project's click group and counts
    its cases in `evidence/bad_input.json` (the matrix adds them up)."""
    suite = project / "tests" / "test_bad_input.py"
    assert suite.is_file(), f"{project.name} has no tests/test_bad_input.py"
    text = suite.read_text(encoding="utf-8")
    assert "CliRunner" in text and "bad_input.json" in text and "hypothesis" in text


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_readme_has_a_stage_table(project: Path):
    text = (project / "README.md").read_text(encoding="utf-8")
    header = re.search(r"^\|\s*Stage\s*\|.*Deliverable.*\|.*Test.*\|.*Hardware.*\|\s*$", text, re.M)
    assert header, (
        f"{project.name}/README.md has no `| Stage | Deliverable | Test file | Hardware |` table"
    )
    for stage in manifest(project)["stages"]:
        for test in stage["tests"]:
            assert test in text, f"{project.name}/README.md does not name {test}"
    assert re.search(r"pip install (-c constraints\.txt )?-e", text), (
        "README gives the install command"
    )
    assert "pytest" in text, "README gives the test command"


def imported_modules(source: Path) -> set[str]:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_ready_project_imports_no_other_project_nor_the_compiler(project: Path):
    own = {p.name for p in (project / "src").iterdir() if p.is_dir()}
    others = {"catalog_compiler", "compiler"}
    for other in PROJECTS:
        if other != project and (other / "src").is_dir():
            others |= {p.name for p in (other / "src").iterdir() if p.is_dir()} - own
    for source in list(project.glob("src/**/*.py")) + list(project.glob("tests/**/*.py")):
        bad = imported_modules(source) & others
        assert not bad, f"{source.relative_to(ROOT)} imports {sorted(bad)}"


def test_import_scan_would_catch_a_cross_import(tmp_path: Path):
    """The scan above can fail: a file importing the compiler is flagged."""
    source = tmp_path / "bad.py"
    source.write_text("import os\nfrom catalog_compiler.cli import main\n")
    assert "catalog_compiler" in imported_modules(source)


def test_root_readme_lists_every_project_with_its_status():
    """The project table in the root README agrees with the manifests on disk."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = dict(
        re.findall(r"^\| \[`([a-z0-9-]+)`\]\(projects/[a-z0-9-]+\) \| (\w+) \|", text, re.M)
    )
    on_disk = {p.name: manifest(p)["status"] for p in PROJECTS}
    assert listed == on_disk
