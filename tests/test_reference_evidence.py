"""Each ready project's committed evidence is the reference's own, and current.

`scripts/reference_evidence.py` writes `projects/<id>/evidence/` from a real
run of every stage's tests on the reference (`progress.py --all` in a
scratch copy). The project pages and `catalog-compile coverage` read those
stamps, so for every stage this checks that the stamp says passed, that its
code hash is the hash of the reference's regions and tests now, that the
evidence file is the one stamped, and that it holds the checks' records.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from catalog_compiler.portfolio import progress_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from ready_projects import ready_projects  # noqa: E402

READY = ready_projects()


@pytest.mark.parametrize("project", READY, ids=lambda p: p.name)
def test_reference_evidence_is_stamped_current_and_passing(project: Path):
    progress = progress_module()
    fix = f"run `python scripts/reference_evidence.py {project.name}`"
    stamps_path = project / "evidence" / "progress.json"
    assert stamps_path.is_file(), f"{project.name} has no evidence/progress.json; {fix}"
    stamps = json.loads(stamps_path.read_text(encoding="utf-8"))
    assert stamps["project"] == project.name
    for stage in progress.manifest(project)["stages"]:
        sid = stage["id"]
        record = stamps["stages"].get(sid)
        where = f"{project.name} stage {sid}"
        assert record and record["result"] == "passed", f"{where}: no passing stamp; {fix}"
        assert record["code_hash"] == progress.stage_code_hash(project, sid, stage["tests"]), (
            f"{where}: the reference's regions or tests changed since its evidence; {fix}"
        )
        evidence = project / "evidence" / f"stage_{sid}.json"
        assert record["evidence_sha256"] == progress.file_sha256(evidence), (
            f"{where}: evidence/stage_{sid}.json is not the file its run wrote; {fix}"
        )
        # Records keep each check's own verdict (a negative control records the
        # fault it must see), so the stage's verdict is its tests' result above.
        assert json.loads(evidence.read_text(encoding="utf-8"))["records"], f"{where}: no records"


def test_the_stage_hash_sees_regions_tests_and_harness_and_nothing_else(tmp_path: Path):
    """The identity the stamps rest on, against edits made here by hand: a stage's
    regions, its own test files and the harness every stage runs (conftest and
    helper modules), never another stage's tests, a comment or a docstring."""
    progress = progress_module()
    src = tmp_path / "src" / "pkg"
    src.mkdir(parents=True)
    body = (
        "def f(x):\n"
        "    # --- exercise stage 1: Double it. ---\n"
        "    return 2 * x\n"
        "    # --- end exercise ---\n"
        "\n"
        "def g(x):\n"
        "    # --- exercise stage 2: Halve it. ---\n"
        "    return x / 2\n"
        "    # --- end exercise ---\n"
    )
    (src / "core.py").write_text(body, encoding="utf-8")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_1.py").write_text("def test(): pass\n", encoding="utf-8")

    def hashes() -> tuple[str, str]:
        return (
            progress.stage_code_hash(tmp_path, "1", ["tests/test_1.py"]),
            progress.stage_code_hash(tmp_path, "2", []),
        )

    first = hashes()
    assert first[0] != first[1]
    (src / "core.py").write_text("# a comment outside\n" + body, encoding="utf-8")
    assert hashes() == first, "code outside every region is no stage's identity"
    (src / "core.py").write_text(body.replace("2 * x", "x + x"), encoding="utf-8")
    changed = hashes()
    assert changed[0] != first[0] and changed[1] == first[1]
    (tmp_path / "tests" / "test_1.py").write_text(
        'def test():\n    """Proves nothing yet."""  # a docstring and a comment\n    pass\n',
        encoding="utf-8",
    )
    assert hashes() == changed, "a docstring or a comment changes nothing a test runs"
    (tmp_path / "tests" / "test_1.py").write_text("def test(): assert 1\n", encoding="utf-8")
    assert hashes()[0] != changed[0] and hashes()[1] == first[1]
    before = hashes()
    (tmp_path / "tests" / "test_2_other.py").write_text("def test(): pass\n", encoding="utf-8")
    assert hashes() == before, "a test file the stage does not declare is not its identity"

    # The harness: a conftest and a helper module, added then edited, each change
    # every stage's identity; a docstring or comment in them changes nothing.
    for name in ("conftest.py", "shared_checks.py"):
        helper = tmp_path / "tests" / name
        start = hashes()
        helper.write_text("def tolerance():\n    return 1e-6\n", encoding="utf-8")
        added = hashes()
        assert added[0] != start[0] and added[1] != start[1], f"{name} added"
        helper.write_text(
            '"""Shared."""\n\ndef tolerance():  # why\n    return 1e-6\n', encoding="utf-8"
        )
        assert hashes() == added, f"{name}: a docstring or a comment changes nothing it runs"
        helper.write_text("def tolerance():\n    return 1e-3\n", encoding="utf-8")
        loosened = hashes()
        assert loosened[0] != added[0] and loosened[1] != added[1], f"{name} edited"
