"""One linter and formatter for the whole repository: ruff, as configured in
the root `pyproject.toml` (each project's own pyproject carries the same
settings, so a project checked alone agrees)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module", autouse=True)
def ruff_installed():
    if ruff("--version").returncode != 0 and not shutil.which("ruff"):
        pytest.skip("ruff is not installed; `pip install -e '.[dev]'` brings it")


def test_ruff_check_passes():
    proc = ruff("check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_check_passes():
    proc = ruff("format", "--check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr
