"""--check: compare a build folder with what the catalog compiles to (CHK rules)."""

from __future__ import annotations

import json
from pathlib import Path

from catalog_compiler.emit import first_difference
from conftest import run_cli, run_json


def _built(repo: Path) -> Path:
    assert run_cli("--root", repo).exit_code == 0
    return repo / "build"


def test_check_passes_on_a_fresh_build(valid_repo: Path) -> None:
    build = _built(valid_repo)
    before = {p: p.stat().st_mtime_ns for p in build.rglob("*")}
    result = run_cli("--root", valid_repo, "--check")
    assert result.exit_code == 0, result.output
    assert "is up to date" in result.output
    assert {p: p.stat().st_mtime_ns for p in build.rglob("*")} == before


def test_check_reports_a_changed_catalog_json_with_its_pointer(valid_repo: Path) -> None:
    build = _built(valid_repo)
    data = json.loads((build / "catalog.json").read_text(encoding="utf-8"))
    data["roles"][0]["skillEvidence"][1]["scope"] = "edited"
    (build / "catalog.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    exit_code, report = run_json(valid_repo, "--check")
    assert exit_code == 1
    [diagnostic] = report["diagnostics"]
    assert diagnostic["code"] == "CHK003"
    assert diagnostic["file"] == "build/catalog.json"
    assert diagnostic["pointer"] == "/roles/0/skillEvidence/1/scope"


def test_check_reports_missing_extra_and_changed_files(valid_repo: Path) -> None:
    build = _built(valid_repo)
    (build / "routes" / "demo-engineer.txt").unlink()
    (build / "routes" / "extra.txt").write_text("extra")
    (build / "site" / "index.html").write_text("changed")
    exit_code, report = run_json(valid_repo, "--check")
    assert exit_code == 1
    assert [(d["code"], d["file"]) for d in report["diagnostics"]] == [
        ("CHK001", "build/routes/demo-engineer.txt"),
        ("CHK002", "build/routes/extra.txt"),
        ("CHK003", "build/site/index.html"),
    ]
    assert not (build / "routes" / "demo-engineer.txt").exists()  # --check writes nothing.


def test_check_without_a_build_reports_every_file_missing(valid_repo: Path) -> None:
    exit_code, report = run_json(valid_repo, "--check")
    assert exit_code == 1
    assert {d["code"] for d in report["diagnostics"]} == {"CHK001"}
    assert not (valid_repo / "build").exists()


def test_first_difference() -> None:
    assert first_difference({"a": [1, 2]}, {"a": [1, 3]}) == "/a/1"
    assert first_difference({"a": 1}, {"a": 1, "b": 2}) == "/b"
    assert first_difference([1], [1, 2]) == "/1"
    assert first_difference({"a": 1, "b": 2}, {"b": 2, "a": 1}) == ""  # Key order differs.
    assert first_difference(1, True) == ""
    assert first_difference({"x": "y"}, {"x": "y"}) is None
