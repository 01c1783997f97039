"""Shared helpers for the compiler tests.

Fixtures: ``fixtures/valid`` is a small complete catalog repository (one
role, two ready projects) that compiles without a single diagnostic.
``fixtures/invalid/<CODE>`` holds only the files that differ from it (and an
optional ``DELETE`` file listing paths to remove); :func:`materialize` lays
it over a copy of ``valid`` so that the result triggers exactly rule CODE.
Its ``expect.json`` gives the file, line, column and pointer of the first
diagnostic.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from catalog_compiler.cli import main
from click.testing import CliRunner, Result

# The stage test files inside the fixture projects are data, not tests.
collect_ignore_glob = ["fixtures/*"]

FIXTURES = Path(__file__).parent / "fixtures"
VALID = FIXTURES / "valid"
INVALID = FIXTURES / "invalid"
REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
DELETE = "DELETE"
EXPECT = "expect.json"  # Where the first diagnostic of an invalid fixture must be.


def materialize(dest: Path, *codes: str) -> Path:
    """Copy ``valid`` to ``dest`` and lay the overlays of ``codes`` over it."""
    shutil.copytree(VALID, dest)
    for code in codes:
        overlay = INVALID / code
        for file in sorted(overlay.rglob("*")):
            if file.is_file() and file.name not in (DELETE, EXPECT):
                target = dest / file.relative_to(overlay)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(file, target)
        if (overlay / DELETE).is_file():
            for line in (overlay / DELETE).read_text().split():
                (dest / line).unlink()
    return dest


def run_cli(*args: str | Path) -> Result:
    """Invoke ``catalog-compile`` in-process with ``args``."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def run_json(root: Path, *args: str | Path) -> tuple[int, dict]:
    """Run with ``--format json`` on ``root`` (output in ``root/build``)."""
    result = run_cli("--root", root, "--format", "json", *args)
    return result.exit_code, json.loads(result.output)


@pytest.fixture
def valid_repo(tmp_path: Path) -> Path:
    """A fresh copy of the valid fixture repository."""
    return materialize(tmp_path / "repo")
