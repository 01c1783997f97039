"""The command line: exit codes, formats, several problems at once, safe writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from catalog_compiler.cli import find_root
from conftest import materialize, run_cli, run_json


def test_one_run_reports_problems_from_several_files(tmp_path: Path) -> None:
    root = materialize(tmp_path / "repo", "YML001", "REF002", "TML001", "DSK001", "ID003")
    exit_code, report = run_json(root)
    assert exit_code == 1
    found = {(d["code"], d["file"]) for d in report["diagnostics"]}
    assert found == {
        ("YML001", "catalog/pathways.yaml"),
        ("REF002", "catalog/roles/demo-engineer.yaml"),
        ("TML001", "projects/demo-extension/project.toml"),
        ("DSK001", "projects/stray-folder/project.toml"),
        ("ID003", "catalog/lessons.yaml"),
    }
    assert report["errors"] == 5 and report["warnings"] == 0 and report["exitCode"] == 1


def test_text_report_is_sorted_with_hints_and_a_summary(tmp_path: Path) -> None:
    root = materialize(tmp_path / "repo", "REF002", "DSK001", "ID003")
    result = run_cli("--root", root)
    lines = result.output.splitlines()
    diagnostics = [line for line in lines if not line.startswith("  hint: ")][:-1]
    assert diagnostics == sorted(diagnostics)
    assert all(lines[i + 1].startswith("  hint: ") for i in range(0, len(lines) - 1, 2))
    assert lines[-1] == "3 errors, 0 warnings in 3 files. Nothing written."


def test_clean_run_prints_a_summary_and_writes_the_build(valid_repo: Path) -> None:
    result = run_cli("--root", valid_repo)
    assert result.exit_code == 0
    assert result.output == "0 errors, 0 warnings. Wrote `build` (1 route).\n"
    text = (valid_repo / "build" / "catalog.json").read_text(encoding="utf-8")
    assert text.endswith("}\n") and text.startswith('{\n  "schemaVersion": 1,')


def test_json_format_parses(valid_repo: Path) -> None:
    report = json.loads(run_cli("--root", valid_repo, "--format", "json").output)
    assert report == {
        "diagnostics": [],
        "errors": 0,
        "warnings": 0,
        "outcome": "Wrote `build` (1 route).",
        "exitCode": 0,
    }


def test_default_root_is_found_from_a_subfolder(valid_repo: Path, monkeypatch) -> None:
    monkeypatch.chdir(valid_repo / "projects" / "demo-project" / "tests")
    assert find_root(Path.cwd()) == valid_repo
    assert run_cli().exit_code == 0
    assert (valid_repo / "build" / "catalog.json").is_file()


@pytest.mark.parametrize(
    "args",
    [["--no-such-option"], ["--format", "xml"], ["--root", "{tmp}"], ["extra-argument"]],
)
def test_usage_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    result = run_cli(*[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_root_that_is_not_a_catalog_repository_says_so(tmp_path: Path) -> None:
    result = run_cli("--root", tmp_path)
    assert result.exit_code == 2
    assert "is not a catalog repository" in result.output


def test_no_repository_above_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli()
    assert result.exit_code == 2
    assert "No catalog repository contains" in result.output


def test_out_folder_with_foreign_files_is_refused(valid_repo: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "documents"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    result = run_cli("--root", valid_repo, "--out", foreign)
    assert result.exit_code == 2
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_failed_run_leaves_the_previous_build_untouched(valid_repo: Path) -> None:
    assert run_cli("--root", valid_repo).exit_code == 0
    before = (valid_repo / "build" / "catalog.json").read_bytes()
    role = valid_repo / "catalog" / "roles" / "demo-engineer.yaml"
    role.write_text(role.read_text().replace("title: Demo engineer", "title: Changed"))
    (valid_repo / "catalog" / "tracks.yaml").unlink()  # Now an error: FIL001.
    assert run_cli("--root", valid_repo).exit_code == 1
    assert (valid_repo / "build" / "catalog.json").read_bytes() == before
    leftovers = [p.name for p in valid_repo.iterdir() if p.name.startswith(".build")]
    assert leftovers == []


def test_rebuild_replaces_stale_files(valid_repo: Path) -> None:
    assert run_cli("--root", valid_repo).exit_code == 0
    stale = valid_repo / "build" / "routes" / "old-role.txt"
    stale.write_text("stale")
    assert run_cli("--root", valid_repo).exit_code == 0
    assert not stale.exists()
