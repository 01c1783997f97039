"""The real catalog compiles, through the command as a maintainer runs it.

`catalog-compile` runs in a fresh interpreter on this repository. Its only
diagnostics are warnings that a referenced project is still `planned`, one
for each planned project (computed here from the manifests on disk, not
listed by hand); `--strict` turns exactly those into errors and exit 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compile_catalog(*args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "catalog_compiler.cli",
            "--root",
            str(ROOT),
            "--format",
            "json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def planned_projects() -> set[str]:
    planned = set()
    for manifest in ROOT.glob("projects/*/project.toml"):
        with manifest.open("rb") as f:
            data = tomllib.load(f)
        if data["status"] == "planned":
            planned.add(data["id"])
    return planned


def warned_projects(report: dict) -> set[str]:
    return {d["message"].split("`")[1] for d in report["diagnostics"]}


def test_real_catalog_compiles_with_only_planned_project_warnings(tmp_path: Path):
    code, report = compile_catalog("--out", str(tmp_path / "build"))
    assert code == 0
    assert {d["code"] for d in report["diagnostics"]} <= {"REF009"}
    assert {d["severity"] for d in report["diagnostics"]} <= {"warning"}
    assert warned_projects(report) == planned_projects()
    assert (tmp_path / "build" / "catalog.json").is_file()


def test_strict_turns_planned_project_warnings_into_errors(tmp_path: Path):
    code, report = compile_catalog("--out", str(tmp_path / "build"), "--strict")
    if not planned_projects():
        assert code == 0
        return
    assert code == 1
    assert {d["severity"] for d in report["diagnostics"]} == {"error"}
    assert warned_projects(report) == planned_projects()
    assert not (tmp_path / "build").exists(), "a failed run writes no build"
