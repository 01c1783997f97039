"""The semantic mutation operators (`compiler/src/semantic_mutations`), on their own
and on the toy project made for them (`fixtures/toy-semantic`).

- Each operator's own examples (Cosmic Ray's `Example`s) apply exactly as written.
- Every operator walks statements it does not mutate (annotated, augmented and
  chained assignments, `del`, decorators, async code) without an error, leaving
  them as they are.
- The provider is registered: Cosmic Ray names all of them `semantic/<Operator>`.
- On the toy, whose `mutation.toml` asks for them, the stage enumeration holds at
  least one mutant of every semantic operator; each is applied alone to a copy
  and the toy's stage test, which states the rule the mutant breaks, fails on
  every one of them (a pytest process per mutant).
- Without `semantic_operators = true` no semantic mutant is enumerated and the
  stage's `mutation.toml` part says nothing of them, so the code hashes of
  projects that have not opted in stay those their reports were scored under.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cosmic_ray.mutating import mutate_code
from cosmic_ray.plugins import get_operator, operator_names
from semantic_mutations.operators import OPERATORS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import mutants  # noqa: E402

TOY = Path(__file__).resolve().parent / "fixtures" / "toy-semantic"


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda op: op.__name__)
def test_each_example_applies_exactly(operator):
    examples = operator.examples()
    assert examples
    for example in examples:
        got = mutate_code(example.pre_mutation_code, operator(), example.occurrence)
        assert got == example.post_mutation_code, (example.pre_mutation_code, got)


OTHER_STATEMENTS = """\
import jax

limit: int = 3
count: float
total = 0
total += limit
a = b = limit
del a


@jax.jit
def f(x: float) -> float:
    y: float = x * 2
    y **= 2
    return y


async def g(xs):
    async for x in xs:
        yield x
"""


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda op: op.__name__)
def test_statements_an_operator_does_not_mutate_are_walked_without_error(operator):
    """Enumerating a file of such statements raises nothing, and any mutant made of
    it still parses (the swap of `total = 0` and `total += limit` is a real one)."""
    import ast

    found = 0
    for occurrence in range(50):
        got = mutate_code(OTHER_STATEMENTS, operator(), occurrence)
        if got is None:
            break
        ast.parse(got)
        found += 1
    assert found < 50


def test_the_provider_is_registered_under_semantic():
    names = set(operator_names())
    assert {f"semantic/{op.__name__}" for op in OPERATORS} <= names
    assert get_operator("semantic/SwapAnyAll") is next(
        op for op in OPERATORS if op.__name__ == "SwapAnyAll"
    )


def _semantic_mutants(project: Path) -> list:
    targets = mutants.stage_targets(project, "1")
    every = mutants.enumerate_mutants(project, "1", targets)
    return [m for m in every if m.operator.startswith(mutants.SEMANTIC)]


def _run_mutant(mutant, folder: Path) -> tuple[str, int]:
    """(key, exit status) of the toy's stage test on a copy with ``mutant`` applied."""
    copy = Path(shutil.copytree(TOY, folder))
    source = copy / mutant.path
    text = source.read_text(encoding="utf-8")
    changed = mutate_code(text, get_operator(mutant.operator)(), mutant.occurrence)
    assert changed is not None and changed != text, mutant.key
    source.write_text(changed, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests"],
        cwd=copy,
        env={"PYTHONPATH": str(copy / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    return mutant.key, done.returncode


def test_every_semantic_mutant_of_the_toy_fails_its_stage_test(tmp_path: Path):
    found = _semantic_mutants(TOY)
    counts = Counter(m.operator.split("/", 1)[1] for m in found)
    assert set(counts) == {op.__name__ for op in OPERATORS}, counts
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(_run_mutant, found, [tmp_path / str(i) for i in range(len(found))]))
    survivors = [(key, code) for key, code in results if code != 1]
    assert not survivors, survivors


def test_projects_that_have_not_opted_in_meet_no_semantic_mutant(tmp_path: Path):
    copy = Path(shutil.copytree(TOY, tmp_path / "toy"))
    config = copy / "mutation.toml"
    config.write_text(
        config.read_text(encoding="utf-8").replace("semantic_operators = true\n", ""),
        encoding="utf-8",
    )
    assert _semantic_mutants(copy) == []
    assert b"semantic_operators" not in mutants.stage_config(copy, "1")
    assert b"semantic_operators" in mutants.stage_config(TOY, "1")
