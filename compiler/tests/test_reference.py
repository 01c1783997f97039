"""The real catalog compiles to the published reference, exactly.

The reference lives in the workspace's ``shared/reference`` next to the
repository (``<repo>/../shared``); without it these tests are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, SHARED, run_cli

REFERENCE = SHARED / "reference"
pytestmark = pytest.mark.skipif(
    not (REFERENCE / "catalog.json").is_file(),
    reason=f"the reference outputs are not available at {REFERENCE}",
)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real") / "build"
    result = run_cli("--root", REPO, "--out", out)
    assert result.exit_code == 0, f"the real catalog does not compile:\n{result.output}"
    assert "Traceback" not in result.output
    return out


def test_catalog_json_equals_the_reference(build: Path) -> None:
    reference = json.loads((REFERENCE / "catalog.json").read_text(encoding="utf-8"))
    text = (build / "catalog.json").read_text(encoding="utf-8")
    assert json.loads(text) == reference
    # Same key order too: the serialisations agree once formatting is equalised.
    assert json.dumps(json.loads(text)) == json.dumps(reference)


def test_route_text_is_byte_identical(build: Path) -> None:
    expected = (REFERENCE / "route-training-engineer.txt").read_bytes()
    assert (build / "routes" / "training-engineer.txt").read_bytes() == expected


def test_check_passes_on_the_fresh_real_build(build: Path) -> None:
    assert run_cli("--root", REPO, "--out", build, "--check").exit_code == 0
