"""compiler/RULES.md documents exactly the registered rules."""

from __future__ import annotations

import re
from pathlib import Path

from catalog_compiler.rules import REGISTRY, rules_markdown

RULES_MD = Path(__file__).resolve().parents[1] / "RULES.md"
BULLET = re.compile(r"^- \*\*([A-Z]+\d{3})\*\* `([a-z0-9-]+)` \((error|warning)\): ", re.M)


def test_rules_md_lists_exactly_the_registered_codes() -> None:
    text = RULES_MD.read_text(encoding="utf-8")
    listed = {code: severity for code, _, severity in BULLET.findall(text)}
    assert listed == {code: rule.severity.value for code, rule in REGISTRY.items()}


def test_rules_md_is_up_to_date() -> None:
    # Regenerate with: python -m catalog_compiler.rules > compiler/RULES.md
    assert RULES_MD.read_text(encoding="utf-8") == rules_markdown()


def test_codes_are_stable_shaped_and_documented() -> None:
    for code, rule in REGISTRY.items():
        assert re.fullmatch(r"(YML|TML|SCH|FIL|ID|REF|DSK|LIM|CHK|COV|INT)\d{3}", code)
        assert rule.summary.endswith(".") and rule.hint
