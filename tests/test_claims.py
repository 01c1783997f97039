"""Claims traced to tests: every claim a ready project states (its README's opening
bullets, its stage functions' docstrings, `[claim:ID]`) is declared by a stage test
(`@pytest.mark.claims`), and every marker names a stated claim.

Projects in `scripts/claims_pending.txt` are not yet traced; each must still have
something untraced (a traced project leaves the list). Negative controls: a small
project written here, sound and then damaged one way at a time, and a traced
project copied with every marker of one claim removed.
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import claims  # noqa: E402
from mutants import code_identity  # noqa: E402
from ready_projects import ready_projects  # noqa: E402

READY = {p.name: p for p in ready_projects()}
PENDING = claims.pending()
TRACED = [name for name in READY if name not in PENDING]


def test_the_pending_list_names_ready_projects_only():
    assert sorted(set(PENDING) - set(READY)) == []
    assert len(PENDING) == len(set(PENDING))


@pytest.mark.parametrize("name", TRACED)
def test_every_claim_is_traced(name: str):
    found = claims.problems(READY[name])
    assert found == [], "\n".join(found)
    assert claims.project_claims(READY[name]).stated, f"{name} states no claim"


@pytest.mark.parametrize("name", PENDING)
def test_a_pending_project_still_has_something_untraced(name: str):
    assert claims.problems(READY[name]), f"{name} is traced: remove it from claims_pending.txt"


SOUND = {
    "project.toml": """
        id = "tiny"
        status = "planned"
        [[stages]]
        id = "1"
        tests = ["tests/test_stage_1_sum.py"]
        [[stages]]
        id = "2"
        tests = ["tests/test_stage_2_mean.py"]
        """,
    "README.md": """
        # Tiny

        What it teaches:

        - **Sums** [claim:sum-is-a-loop]: a sum over
          every value.
        - **Means** [claim:mean-divides]: the sum over the count.

        A closing sentence.

        ## Commands

        - `pytest` (a bullet after the opening section states nothing)
        """,
    "src/tiny/__init__.py": '"""Tiny."""\n',
    "src/tiny/core.py": '''
        """Two stages. Empty lists are refused [claim:empty-refused]."""


        def total(values):
            """The sum of every value [claim:sum-is-a-loop]."""
            # --- exercise stage 1: Add the values up. ---
            return sum(values)
            # --- end exercise ---


        def mean(values):
            """The total over the count [claim:mean-divides]."""
            # --- exercise stage 2: Divide. ---
            return total(values) / len(values)
            # --- end exercise ---
        ''',
    "tests/test_stage_1_sum.py": """
        import pytest

        pytestmark = pytest.mark.claims("empty-refused")


        @pytest.mark.claims("sum-is-a-loop")
        def test_total():
            assert True
        """,
    "tests/test_stage_2_mean.py": """
        import pytest


        @pytest.mark.claims("mean-divides")
        class TestMean:
            def test_mean(self):
                assert True
        """,
}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    for rel, text in SOUND.items():
        path = tmp_path / "tiny" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return tmp_path / "tiny"


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_a_sound_project_is_traced_through_every_kind_of_marker(tiny: Path):
    assert claims.problems(tiny) == []
    traced = claims.project_claims(tiny)
    assert traced.proved == {
        "empty-refused": ["tests/test_stage_1_sum.py::test_total"],
        "sum-is-a-loop": ["tests/test_stage_1_sum.py::test_total"],
        "mean-divides": ["tests/test_stage_2_mean.py::TestMean::test_mean"],
    }
    assert traced.stated["sum-is-a-loop"] == ["README.md:5", "src/tiny/core.py:5"]


@pytest.mark.parametrize(
    "rel, old, new, problem",
    [
        (
            "tests/test_stage_2_mean.py",
            '@pytest.mark.claims("mean-divides")\n',
            "",
            r"claim `mean-divides` \(README.md:7, src/tiny/core.py:12\) is declared by no stage",
        ),
        (
            "tests/test_stage_1_sum.py",
            'pytestmark = pytest.mark.claims("empty-refused")',
            "",
            r"claim `empty-refused` \(src/tiny/core.py:1\) is declared by no stage test",
        ),
        (
            "tests/test_stage_1_sum.py",
            '"sum-is-a-loop"',
            '"sum-is-a-lop"',
            r"marker names `sum-is-a-lop`, which no claim states",
        ),
        (
            "README.md",
            "**Means** [claim:mean-divides]",
            "**Means**",
            r"README.md:7: opening bullet without a claim id: - \*\*Means\*\*",
        ),
        (
            "src/tiny/core.py",
            "over the count [claim:mean-divides]",
            "over the count",
            r"src/tiny/core.py:11: stage function `mean` states no claim id in its docstring",
        ),
    ],
    ids=["marker removed", "module marker removed", "marker typo", "bullet", "docstring"],
)
def test_each_gap_is_named(tiny: Path, rel: str, old: str, new: str, problem: str):
    edit(tiny / rel, old, new)
    found = claims.problems(tiny)
    assert any(re.search(problem, p) for p in found), found


def test_a_marker_in_a_file_no_stage_declares_traces_nothing(tiny: Path):
    shutil.move(tiny / "tests/test_stage_2_mean.py", tiny / "tests/test_extra.py")
    assert any("`mean-divides`" in p for p in claims.problems(tiny))


@pytest.mark.skipif(not TRACED, reason="no project is traced yet")
def test_removing_a_real_projects_markers_of_one_claim_fails_it(tmp_path: Path):
    name = TRACED[0]
    copy = Path(shutil.copytree(READY[name], tmp_path / name, ignore=shutil.ignore_patterns(".*")))
    traced = claims.project_claims(copy)
    claim = sorted(traced.proved)[0]
    for test_file in {t.split("::")[0] for t in traced.proved[claim]}:
        path = copy / test_file
        text = path.read_text(encoding="utf-8")
        path.write_text(text.replace(f'"{claim}"', '"removed-from-this-copy"'), encoding="utf-8")
    found = claims.problems(copy)
    assert any(f"claim `{claim}`" in p and "declared by no stage test" in p for p in found)


def test_a_claims_marker_leaves_the_code_identity_unchanged():
    plain = "import pytest\n\n\ndef test_x():\n    assert 1\n"
    named = (
        "import pytest\n\npytestmark = [pytest.mark.claims('m')]\n\n\n"
        "@pytest.mark.claims('a', 'b')\ndef test_x():\n    assert 1\n"
    )
    other = "import pytest\n\n\n@pytest.mark.skip\ndef test_x():\n    assert 1\n"
    assert code_identity(named) == code_identity(plain)
    assert code_identity(other) != code_identity(plain)
