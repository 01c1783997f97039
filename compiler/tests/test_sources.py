"""Loading sources: positions, YAML 1.1 surprises, malformed files without tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from catalog_compiler.models import Phase
from catalog_compiler.schema import validate
from catalog_compiler.toml_source import load_toml
from catalog_compiler.yaml_source import load_yaml
from conftest import run_json


def _yaml(tmp_path: Path, text: str | bytes):
    file = tmp_path / "x.yaml"
    file.write_bytes(text if isinstance(text, bytes) else text.encode())
    return load_yaml(file, "x.yaml")


def test_positions_are_one_based_for_values_and_keys(tmp_path: Path) -> None:
    doc, found = _yaml(tmp_path, "a:\n  - b: 1\n    c: [x, y]\n")
    assert found == []
    assert doc.pos("/a/0/c/1") == (doc.positions["/a/0/c/1"])
    assert (doc.pos("/a/0/c/1").line, doc.pos("/a/0/c/1").column) == (3, 12)
    assert (doc.key_pos("/a/0/c").line, doc.key_pos("/a/0/c").column) == (3, 5)
    assert doc.pos("/a/0/missing").line == 2  # Falls back to the nearest ancestor.


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("NO", "the boolean false"),
        ("yes", "the boolean true"),
        ("1.10", "the number 1.1"),
        ("1", "the number 1"),
        ("null", "null"),
    ],
)
def test_yaml_11_surprises_where_text_is_expected(tmp_path: Path, raw: str, kind: str) -> None:
    doc, _ = _yaml(tmp_path, f"id: basics\ntitle: {raw}\n")
    obj, found = validate(Phase, doc.data, doc)
    assert obj is None
    [d] = found
    assert (d.code, d.line, d.column, d.pointer) == ("YML004", 2, 8, "/title")
    assert f"`{raw}`" in d.message and kind in d.message
    assert f"'{raw}'" in d.hint


def test_quoted_values_stay_text(tmp_path: Path) -> None:
    doc, _ = _yaml(tmp_path, "id: basics\ntitle: 'NO'\n")
    obj, found = validate(Phase, doc.data, doc)
    assert found == [] and obj.title == "NO"


def test_nested_duplicate_key_keeps_the_first_value(tmp_path: Path) -> None:
    doc, [d] = _yaml(tmp_path, "a:\n  b: 1\n  b: 2\n")
    assert doc.data == {"a": {"b": 1}}
    assert (d.code, d.line, d.column, d.pointer) == ("YML002", 3, 3, "/a/b")


@pytest.mark.parametrize(
    "text",
    [b"a: [1, 2\n", b"a: 1\n---\nb: 2\n", b"a: *unknown\n", b"a: 'x\n"],
)
def test_unparseable_yaml_is_one_diagnostic(tmp_path: Path, text: bytes) -> None:
    doc, [d] = _yaml(tmp_path, text)
    assert doc is None and d.code == "YML001" and "`x.yaml`" in d.message


def test_empty_or_wrongly_shaped_role_files_are_diagnosed(valid_repo: Path) -> None:
    roles = valid_repo / "catalog" / "roles"
    (roles / "demo-engineer.yaml").write_text("")
    exit_code, report = run_json(valid_repo)
    assert exit_code == 1
    [d] = report["diagnostics"]
    assert d["code"] == "SCH003" and "mapping" in d["message"]


def test_a_number_where_a_list_belongs(valid_repo: Path) -> None:
    role = valid_repo / "catalog" / "roles" / "demo-engineer.yaml"
    role.write_text(
        role.read_text().replace("modalityTrackIds:\n  - text\n", "modalityTrackIds: 7\n")
    )
    _, report = run_json(valid_repo)
    [d] = report["diagnostics"]
    assert (d["code"], d["pointer"]) == ("SCH003", "/modalityTrackIds")
    assert "`7`" in d["message"]


def test_misspelled_key_suggests_the_known_one(valid_repo: Path) -> None:
    role = valid_repo / "catalog" / "roles" / "demo-engineer.yaml"
    role.write_text(role.read_text().replace("workExample:", "workExampel:"))
    _, report = run_json(valid_repo)
    codes = sorted((d["code"], d["pointer"]) for d in report["diagnostics"])
    assert codes == [("SCH001", "/workExampel"), ("SCH002", "/workExample")]
    assert (
        "did you mean `workExample`?"
        in report["diagnostics"][0]["message"] + (report["diagnostics"][1]["message"])
    )


def test_toml_positions_for_tables_and_arrays(tmp_path: Path) -> None:
    file = tmp_path / "project.toml"
    file.write_text(
        'id = "p"\npreparation = ["a", "b"]\n\n[[stages]]\nid = "1"\n'
        '[[stages]]\nid = "2"\ntests = [\n  "t1.py",\n  "t2.py",\n]\n'
    )
    doc, found = load_toml(file, "project.toml")
    assert found == []
    assert (doc.pos("/preparation/1").line, doc.pos("/preparation/1").column) == (2, 21)
    assert doc.pos("/stages/1/id").line == 7
    assert (doc.pos("/stages/1/tests/1").line, doc.pos("/stages/1/tests/1").column) == (10, 3)


def test_stage_id_as_toml_number_is_a_wrong_type(valid_repo: Path) -> None:
    manifest = valid_repo / "projects" / "demo-extension" / "project.toml"
    manifest.write_text(manifest.read_text().replace('id = "1"', "id = 1"))
    _, report = run_json(valid_repo)
    [d] = report["diagnostics"]
    assert (d["code"], d["pointer"], d["line"]) == ("SCH003", "/stages/0/id", 7)
    assert "Quote" in d["hint"]
