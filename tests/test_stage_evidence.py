"""A stage's evidence keeps the figures of every one of its test files.

Each project's `tests/conftest.py` gives stage tests an `evidence` fixture whose
records go to `evidence/stage_<n>.json`. Where a stage declares several test
files that keep records, the file written at the end must hold the records of
all of them, not only of the file that ran last. Checked for every ready project
with such a stage, by running that project's own conftest in a scratch folder on
three toy test files of one stage, each keeping one record (where a stage has one
file that keeps records, none can be lost to another, so only these projects
are run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from ready_projects import ready_projects  # noqa: E402

TOY_TEST = """
def test_keeps_one_record(evidence):
    assert evidence.record("{check}", "toy", {{"file": "{name}"}}, None, True)
"""
TOY_FILES = ("test_stage_1_first.py", "test_stage_1_second.py", "test_stage_1_third.py")
# A test function that takes the `evidence` fixture among its arguments.
USES_EVIDENCE = re.compile(r"^def test_\w+\([^)]*\bevidence\b", re.MULTILINE)


def _keeps_records(test_file: Path) -> bool:
    return test_file.is_file() and USES_EVIDENCE.search(test_file.read_text()) is not None


def _projects_with_a_stage_of_several_recording_files() -> list[Path]:
    found = []
    for project in ready_projects():
        with (project / "project.toml").open("rb") as f:
            stages = tomllib.load(f)["stages"]
        recording = [
            sum(_keeps_records(project / name) for name in stage.get("tests", []))
            for stage in stages
        ]
        if max(recording, default=0) > 1:
            found.append(project)
    return found


def test_the_detector_sees_a_test_that_takes_the_fixture():
    """The file filter above finds `evidence` among a test's arguments, on the
    first or a later line of the signature, and not in a test without it."""
    assert USES_EVIDENCE.search("def test_a(evidence):\n")
    assert USES_EVIDENCE.search("def test_b(tmp_path,\n    evidence, case):\n")
    assert not USES_EVIDENCE.search("def test_c(tmp_path):\n    evidence = 1\n")
    assert not USES_EVIDENCE.search("def test_d(evidence_dir):\n")


@pytest.mark.parametrize(
    "project", _projects_with_a_stage_of_several_recording_files(), ids=lambda p: p.name
)
def test_every_test_file_of_a_stage_keeps_its_records(project, tmp_path):
    """Three test files of one stage, run in one session by the project's own
    conftest, leave `stage_1.json` holding one record from each file (not only
    the last file's), and no partial file beside it."""
    (tmp_path / "tests").mkdir()
    shutil.copyfile(project / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    declared = ", ".join(f'"tests/{name}"' for name in TOY_FILES)
    (tmp_path / "project.toml").write_text(f'[[stages]]\nid = "1"\ntests = [{declared}]\n')
    for name in TOY_FILES:
        text = TOY_TEST.format(check=f"record of {name}", name=name)
        (tmp_path / "tests" / name).write_text(text)
    evidence_dir = tmp_path / "evidence"
    env = dict(os.environ, EVIDENCE_DIR=str(evidence_dir), JAX_PLATFORMS="cpu")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    written = json.loads((evidence_dir / "stage_1.json").read_text())
    checks = sorted(record["check"] for record in written["records"])
    assert checks == [f"record of {name}" for name in TOY_FILES], (project.name, checks)
    assert sorted(p.name for p in evidence_dir.iterdir()) == ["stage_1.json"]
