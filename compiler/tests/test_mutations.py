"""More ways to break the valid fixture, each with the codes it must yield.

A table in the style of optax's tests: (file, text to replace, replacement,
expected codes). Complements the one-fixture-per-rule tests with variants
(the same rule reached through other files and fields).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli, run_json

ROLE = "catalog/roles/demo-engineer.yaml"
CATALOG = "catalog/catalog.yaml"
LESSONS = "catalog/lessons.yaml"
MANIFEST = "projects/demo-project/project.toml"

CASES = {
    "role listed twice": (
        CATALOG,
        "  - demo-engineer\n",
        "  - demo-engineer\n  - demo-engineer\n",
        {"ID001"},
    ),
    "role id differs from file": (ROLE, "id: demo-engineer", "id: demo-engineers", {"ID004"}),
    "non-kebab role id": (
        CATALOG,
        "  - demo-engineer\n",
        "  - demo-engineer\n  - Demo_Engineer\n",
        {"ID002", "FIL002"},
    ),
    "lesson prefix of another phase": (
        LESSONS,
        "  - id: advanced-01\n",
        "  - id: basics-03\n",
        {"ID003", "REF006"},
    ),
    "duplicate stage id": (MANIFEST, 'id = "2"', 'id = "1"', {"ID001", "REF005"}),
    "unknown top-level key": (LESSONS, "lessons:\n", "lesson-list: []\nlessons:\n", {"SCH001"}),
    "unsupported schema version": (CATALOG, "schemaVersion: 1", "schemaVersion: 2", {"SCH004"}),
    "boolean schema version": (CATALOG, "schemaVersion: 1", "schemaVersion: true", {"SCH003"}),
    "yes as a title": (ROLE, "title: Demo engineer", "title: yes", {"YML004"}),
    "1.10 as a stage id": (ROLE, "      - '1'\n", "      - 1.10\n", {"YML004"}),
    "unknown preparation lesson": (MANIFEST, '"basics-02"]', '"basics-2"]', {"REF006"}),
    "unknown phase of a lesson": (
        LESSONS,
        "    phase: advanced\n",
        "    phase: advance\n",
        {"REF003", "ID003"},
    ),
    "domain default pathway unlisted": (
        "catalog/domains.yaml",
        "defaultPathwayId: basics",
        "defaultPathwayId: missing",
        {"REF001", "REF008"},
    ),
    "stage listed twice": (ROLE, "      - '2'\n", "      - '2'\n      - '2'\n", {"ID001"}),
    "missing defaults key": (
        CATALOG,
        "  scopeNote: This is a learning route, not a claim of job readiness.\n",
        "",
        {"SCH002"},
    ),
    "empty title": (ROLE, "title: Demo engineer", "title: ''", {"SCH004"}),
    "status not allowed": (MANIFEST, 'status = "ready"', 'status = "done"', {"SCH004"}),
}


@pytest.mark.parametrize("name", CASES)
def test_mutation_yields_its_codes(name: str, valid_repo: Path) -> None:
    file, old, new, expected = CASES[name]
    path = valid_repo / file
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{name}: the fixture no longer contains {old!r}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    exit_code, report = run_json(valid_repo)
    assert {d["code"] for d in report["diagnostics"]} == expected, report["diagnostics"]
    assert exit_code == 1
    assert "Traceback" not in run_cli("--root", valid_repo).output


def test_misspelled_role_in_catalog_suggests_the_role_file(valid_repo: Path) -> None:
    role = valid_repo / ROLE
    role.rename(role.with_name("demo-engineers.yaml"))
    (role.with_name("demo-engineers.yaml")).write_text(
        role.with_name("demo-engineers.yaml")
        .read_text()
        .replace("id: demo-engineer", "id: demo-engineers")
    )
    _, report = run_json(valid_repo)
    codes = sorted(d["code"] for d in report["diagnostics"])
    # The domain still names `demo-engineer`, which catalog.yaml lists: no REF007.
    assert codes == ["FIL002", "FIL003"]
    fil002 = next(d for d in report["diagnostics"] if d["code"] == "FIL002")
    assert "did you mean `demo-engineers`?" in fil002["message"]
