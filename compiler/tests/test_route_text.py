"""route_text: the published route text, byte for byte, and its structure."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from catalog_compiler.route_text import route_lines, route_text

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO.parent / "shared" / "reference"
REFERENCE_CATALOG = REFERENCE / "catalog.json"
REFERENCE_ROUTE = REFERENCE / "route-training-engineer.txt"


def _reference_catalog() -> dict:
    if not REFERENCE_CATALOG.is_file():
        pytest.skip(f"reference catalog not present at {REFERENCE_CATALOG}")
    return json.loads(REFERENCE_CATALOG.read_text(encoding="utf-8"))


def _minimal_role() -> dict:
    """A small role, independent of the reference files."""
    return {
        "id": "example-role",
        "title": "Example <role> & “quotes”",
        "description": "Describes the role.",
        "workExample": "Does the work.",
        "background": "Prepares like this.",
        "portfolio": "Shows this.",
        "skillEvidence": [
            {
                "skill": "Skill A",
                "scope": "Required route practice",
                "evidence": "Evidence A.",
                "reviewCriterion": "Criterion.",
                "projectId": "proj",
                "stageIds": ["2"],
                "lessonIds": [],
            },
            {
                "skill": "Skill B",
                "scope": "Optional project extension; 1 project preparation lessons lie outside "
                "the required route",
                "evidence": "Evidence B.",
                "reviewCriterion": "Criterion.",
                "projectId": "proj",
                "stageIds": ["1", "3"],
                "lessonIds": [],
            },
        ],
        "milestones": [{"title": "First", "deliverable": "A thing", "phaseIds": ["a"]}],
        "readiness": "Ready when.",
        "reviewQuestions": ["Why?"],
        "scopeNote": "A reviewer’s note.",
    }


def _field_values(role: dict) -> list[str]:
    """Every string the route page shows from the role, in page order."""
    values = [role["title"], role["description"], role["workExample"], role["background"]]
    values.append(role["portfolio"])
    for item in role["skillEvidence"]:
        values += [item["skill"], item["scope"], item["evidence"], item["reviewCriterion"]]
    for milestone in role["milestones"]:
        values += [milestone["title"], milestone["deliverable"]]
    values.append(role["readiness"])
    values += ["- " + question for question in role["reviewQuestions"]]
    values.append(role["scopeNote"])
    return values


def _assert_structure(role: dict) -> None:
    text = route_text(role)
    lines = text.split("\n")
    assert not text.endswith("\n")
    assert lines[0] == "JAX PathwaysAll career routesCareer learning guide"
    assert lines[-1] == role["scopeNote"]
    # Header and six section headings; five lines per skill (the last one the
    # practice project line); two per milestone; readiness and one line per
    # question; title, description, three section bodies and the scope note.
    expected = 7 + 5 * len(role["skillEvidence"]) + 2 * len(role["milestones"])
    expected += 1 + len(role["reviewQuestions"]) + 6
    assert len(lines) == expected
    # Every field value is a whole line, and they appear in page order.
    position = 0
    for value in _field_values(role):
        assert value in lines[position:], f"{value!r} missing or out of order"
        position = lines.index(value, position) + 1
    for heading in (
        "The work",
        "Preparation",
        "Your portfolio",
        "Skills and evidence",
        "Milestones",
        "Review your readiness",
    ):
        assert lines.count(heading) >= 1
    practice = [line for line in lines if line.startswith("Practice project: stages ")]
    assert practice == [
        "Practice project: stages " + ", ".join(item["stageIds"]) + "."
        for item in role["skillEvidence"]
    ]
    assert lines == route_lines(role)


def test_reference_route_is_byte_identical() -> None:
    catalog = _reference_catalog()
    if not REFERENCE_ROUTE.is_file():
        pytest.skip(f"reference route text not present at {REFERENCE_ROUTE}")
    role = next(r for r in catalog["roles"] if r["id"] == "training-engineer")
    assert route_text(role).encode("utf-8") == REFERENCE_ROUTE.read_bytes()


def test_every_reference_role_has_the_route_structure() -> None:
    catalog = _reference_catalog()
    assert catalog["roles"]
    for role in catalog["roles"]:
        _assert_structure(role)


def test_minimal_role_structure_and_exact_text() -> None:
    role = _minimal_role()
    _assert_structure(role)
    assert route_text(role) == "\n".join(
        [
            "JAX PathwaysAll career routesCareer learning guide",
            "Example <role> & “quotes”",
            "Describes the role.",
            "The work",
            "Does the work.",
            "Preparation",
            "Prepares like this.",
            "Your portfolio",
            "Shows this.",
            "Skills and evidence",
            "Skill A",
            "Required route practice",
            "Evidence A.",
            "Criterion.",
            "Practice project: stages 2.",
            "Skill B",
            "Optional project extension; 1 project preparation lessons lie outside the "
            "required route",
            "Evidence B.",
            "Criterion.",
            "Practice project: stages 1, 3.",
            "Milestones",
            "First",
            "A thing",
            "Review your readiness",
            "Ready when.",
            "- Why?",
            "A reviewer’s note.",
        ]
    )


def test_text_is_plain_not_escaped() -> None:
    """The text is the catalog's strings as they are; escaping is the site's job."""
    role = _minimal_role()
    role["skillEvidence"][0]["evidence"] = "<script>alert(1)</script>"
    assert "<script>alert(1)</script>" in route_text(role).split("\n")


def test_roles_without_optional_lists_still_render() -> None:
    role = copy.deepcopy(_minimal_role())
    role["skillEvidence"] = []
    role["milestones"] = []
    role["reviewQuestions"] = []
    _assert_structure(role)
