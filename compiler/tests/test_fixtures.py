"""One failing fixture per rule, one passing fixture (see conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from catalog_compiler.rules import REGISTRY
from conftest import EXPECT, INVALID, materialize, run_cli, run_json

# Rules that a fixture folder cannot carry, and the test that covers each:
# CHK rules compare a build folder (test_check.py); LIM004 needs a file of
# more than 1 MiB and INT001 a failing compiler (test_hostile_input.py); COV
# rules judge evidence folders given to `coverage`, not a catalog
# (tests/test_portfolio.py at the repository root).
NOT_FIXTURES = {"LIM004", "INT001"}
FIXTURE_CODES = sorted(
    code for code in REGISTRY if not code.startswith(("CHK", "COV")) and code not in NOT_FIXTURES
)
WARNINGS = {code for code, rule in REGISTRY.items() if rule.severity.value == "warning"}


def test_every_rule_has_a_fixture_and_every_fixture_a_rule() -> None:
    assert sorted(p.name for p in INVALID.iterdir()) == FIXTURE_CODES


def test_valid_fixture_is_clean_and_builds(valid_repo: Path) -> None:
    code, report = run_json(valid_repo)
    assert (code, report["diagnostics"]) == (0, [])
    catalog = json.loads((valid_repo / "build" / "catalog.json").read_text(encoding="utf-8"))
    evidence = catalog["roles"][0]["skillEvidence"]
    assert [e["scope"] for e in evidence] == [
        "Required route practice",
        "Required route practice",
        # demo-extension prepares with advanced-01, off the role's `basics` route.
        "Optional project extension; 1 project preparation lessons lie outside the required route",
    ]
    assert evidence[2]["reviewCriterion"] == "A criterion of its own."
    assert evidence[0]["reviewCriterion"].startswith("Explain the independent check")
    assert (valid_repo / "build" / "routes" / "demo-engineer.txt").is_file()
    assert (valid_repo / "build" / "site" / "index.html").is_file()


@pytest.mark.parametrize("code", FIXTURE_CODES)
def test_invalid_fixture_yields_exactly_its_rule(code: str, tmp_path: Path) -> None:
    root = materialize(tmp_path / "repo", code)
    exit_code, report = run_json(root)
    found = report["diagnostics"]
    assert found, f"{code}: no diagnostic"
    assert {d["code"] for d in found} == {code}, found
    expected = json.loads((INVALID / code / EXPECT).read_text())
    assert {k: found[0][k] for k in expected} == expected
    for d in found:
        assert d["line"] >= 1 and d["column"] >= 1
        assert d["message"].endswith((".", "?")) and "`" in d["message"]
        assert d["hint"]
    assert exit_code == (0 if code in WARNINGS else 1)
    assert (root / "build").exists() == (code in WARNINGS), "errors must block the outputs"
    text = run_cli("--root", root, "--strict").output
    assert "Traceback" not in text
    first = f"{expected['file']}:{expected['line']}:{expected['column']}: error[{code}] "
    assert first in text


def test_warning_fixture_fails_only_with_strict(tmp_path: Path) -> None:
    root = materialize(tmp_path / "repo", "REF009")
    assert run_cli("--root", root).exit_code == 0
    result = run_cli("--root", root, "--strict", "--out", tmp_path / "strict-build")
    assert result.exit_code == 1
    assert "error[REF009]" in result.output
    assert not (tmp_path / "strict-build").exists()
