"""The mutants of one project stage: which code is mutated, and how.

A stage's *targets* are every function (or method) that holds one of the
stage's exercise regions, plus the functions its `mutation.toml` names: the
identities, digests, tolerances, gates, detectors and diagnostics the stage's
tests exist to verify::

    [stages."1"]
    targets = ["src/pkg/module.py::function", "src/pkg/module.py::Class.method"]

    [[equivalent]]          # a mutant no test can tell apart, and why
    stage = "1"
    key = "src/pkg/module.py::function: `a < b` => `a <= b`"
    why = "a and b are never equal: a is drawn continuous and b is an integer"

Cosmic Ray (`cosmic_ray.commands.init`) enumerates every mutation of each
target's file; those whose position lies in a target are the stage's
mutants. Each mutant has a *key* that survives edits elsewhere in the file:
its file, function and changed line before and after (`mutant_key`). A
stage with more mutants than `SAMPLE` is scored on a random sample of
`SAMPLE`, drawn with a seed made from the project and stage ids.

The operators are Cosmic Ray's core ones, less those `EXCLUDED` names; a
project whose `mutation.toml` says `semantic_operators = true` meets the
repository's semantic operators too (`semantic_mutations`, the `semantic/`
provider: a keyword left out, a sibling string, a collapsed iterable, a
parent key reused, a digest entry dropped, a range bound shifted, an exact
comparison made approximate, two statements swapped, a sibling name).

`stage_hash` is the identity of what a report scored: the code of the
target files, the stage's test files, the project's `tests/conftest.py` and
the helper modules of `tests/` those reach (`helper_modules`: imported, or run
by file name, directly or through another helper), as syntax trees without
docstrings, so a comment or a docstring edit does not change it, while any
change to what runs does; and the stage's part of `mutation.toml` (its
targets and its declared equivalents). A report whose hash differs from the
code on disk is stale.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import random
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from catalog_compiler.exercises import find_regions, source_files
from catalog_compiler.portfolio import progress_module
from cosmic_ray.commands.init import _all_work_items
from cosmic_ray.mutating import mutate_code
from cosmic_ray.plugins import get_operator

SAMPLE = 50
CONFIG = "mutation.toml"
REPORT = "mutation-report.json"

_ARITHMETIC = "Add|Sub|Mul|Div|FloorDiv|Mod|Pow"
_BITWISE = "RShift|LShift|BitOr|BitAnd|BitXor"
_ORDERING = "Eq|NotEq|Lt|LtE|Gt|GtE"
# Operators left out, each with the reason it would only inflate or deflate a
# score without saying anything about the tests.
EXCLUDED = {
    rf"ReplaceBinaryOperator_({_ARITHMETIC})_({_BITWISE})$": (
        "an arithmetic operator made bitwise raises a TypeError on every float array"
    ),
    rf"ReplaceBinaryOperator_({_BITWISE})_({_ARITHMETIC})$": (
        "a bitwise operator made arithmetic raises on floats and, on boolean masks, "
        "`&`->`*` and `|`->`+` compute the same values"
    ),
    rf"ReplaceComparisonOperator_({_ORDERING})_(Is|IsNot)$": (
        "identity against a fresh array or number is a constant, never a plausible slip"
    ),
    rf"ReplaceComparisonOperator_(Is|IsNot)_({_ORDERING})$": (
        "`x is None` made an ordering raises a TypeError wherever it runs"
    ),
}
# Removing these decorators changes compilation or caching, never a value.
_NEUTRAL_DECORATORS = re.compile(r"\b(jit|cache|lru_cache|cached_property|wraps)\b")


def operator_excluded(name: str) -> bool:
    return any(re.search(pattern, name) for pattern in EXCLUDED)


# The repository's semantic operators (`semantic_mutations`, a Cosmic Ray
# provider): a project's stages meet them once its `mutation.toml` says
# `semantic_operators = true`, and its reports are rescored with them then.
SEMANTIC = "semantic/"


def semantic_enabled(project: Path) -> bool:
    return load_config(project).get("semantic_operators") is True


@dataclass(frozen=True)
class Target:
    """One mutated definition: ``path`` relative to the project, lines inclusive."""

    path: str
    name: str  # `function`, `Class.method` or `Class`
    first: int
    last: int


@dataclass(frozen=True)
class Mutant:
    key: str
    stage: str
    path: str
    function: str
    line: int
    operator: str
    occurrence: int
    before: str
    after: str


@dataclass
class StageMutants:
    stage: str
    targets: list[Target]
    total: int  # every mutant of the targets, before sampling
    mutants: list[Mutant] = field(default_factory=list)  # the sample that is run

    @property
    def sampled(self) -> bool:
        return self.total > len(self.mutants)


def load_config(project: Path) -> dict:
    path = project / CONFIG
    if not path.is_file():
        return {}
    with path.open("rb") as f:
        return tomllib.load(f)


def _definitions(tree: ast.Module) -> dict[str, tuple[int, int]]:
    """Top-level functions, classes and methods: name -> (first line, last line),
    decorators included."""
    spans: dict[str, tuple[int, int]] = {}

    def span(node: ast.AST) -> tuple[int, int]:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return first, node.end_lineno

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            spans[node.name] = span(node)
        elif isinstance(node, ast.ClassDef):
            spans[node.name] = span(node)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    spans[f"{node.name}.{item.name}"] = span(item)
    return spans


def stage_targets(project: Path, stage: str) -> list[Target]:
    """The definitions mutated for ``stage``: those holding its exercise regions,
    then those its `mutation.toml` lists. Raises ValueError on a name not found."""
    targets: dict[tuple[str, str], Target] = {}
    for path in source_files(project):
        rel = path.relative_to(project).as_posix()
        text = path.read_text(encoding="utf-8")
        regions = [r for r in find_regions(text, rel) if r.stage == stage]
        if not regions:
            continue
        spans = _definitions(ast.parse(text))
        for region in regions:
            # The innermost top-level definition or method that holds the region.
            holders = [(n, s) for n, s in spans.items() if s[0] <= region.start <= s[1]]
            if not holders:
                raise ValueError(f"{rel}:{region.start}: region outside any function")
            name, (first, last) = min(holders, key=lambda h: h[1][1] - h[1][0])
            targets[(rel, name)] = Target(rel, name, first, last)
    listed = load_config(project).get("stages", {}).get(stage, {}).get("targets", [])
    for entry in listed:
        rel, _, name = entry.partition("::")
        path = project / rel
        if not path.is_file() or not name:
            raise ValueError(f"{project.name}/{CONFIG}: stage {stage}: no file for `{entry}`")
        spans = _definitions(ast.parse(path.read_text(encoding="utf-8")))
        if name not in spans:
            raise ValueError(f"{project.name}/{CONFIG}: stage {stage}: `{entry}` not found")
        targets.setdefault((rel, name), Target(rel, name, *spans[name]))
    return list(targets.values())


def _changed_lines(original: str, mutated: str) -> tuple[int, str, str]:
    """(1-based line, old text, new text) of the first line the mutation changed."""
    old, new = original.splitlines(), mutated.splitlines()
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            before = " / ".join(s.strip() for s in old[i1:i2])
            after = " / ".join(s.strip() for s in new[j1:j2])
            return i1 + 1, before, after
    return 0, "", ""


def mutant_key(path: str, function: str, before: str, after: str) -> str:
    return f"{path}::{function}: `{before}` => `{after}`"


def mutated_source(project: Path, mutant: Mutant) -> str:
    """The target file's text with ``mutant`` applied (Cosmic Ray's own visitor)."""
    text = (project / mutant.path).read_text(encoding="utf-8")
    code = mutate_code(text, get_operator(mutant.operator)(), mutant.occurrence)
    if code is None:
        raise ValueError(f"{mutant.key}: Cosmic Ray no longer applies this mutation")
    return code


def _mutate(text: str, operator, occurrence: int) -> str | None:
    """``text`` with the ``occurrence``-th mutation of ``operator`` applied, or None
    where Cosmic Ray makes none."""
    try:
        return mutate_code(text, operator, occurrence)
    except AttributeError:
        # Cosmic Ray 8.7's ExceptionReplacer cannot rewrite a dotted exception name
        # (`except (module.Error, ...)`): that one mutant is not made, neither when a
        # stage is enumerated nor when a report row is looked up again.
        return None


def enumerate_mutants(project: Path, stage: str, targets: list[Target]) -> list[Mutant]:
    """Every mutant of ``targets``, in file and position order, keys made unique."""
    mutants: list[Mutant] = []
    seen: dict[str, int] = {}
    by_file: dict[str, list[Target]] = {}
    for t in targets:
        by_file.setdefault(t.path, []).append(t)
    semantic = semantic_enabled(project)
    for rel, file_targets in by_file.items():
        path = project / rel
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for item in _all_work_items([path], {}):
            spec = item.mutations[0]
            if operator_excluded(spec.operator_name):
                continue
            if spec.operator_name.startswith(SEMANTIC) and not semantic:
                continue
            line = spec.start_pos[0]
            holder = next((t for t in file_targets if t.first <= line <= t.last), None)
            if holder is None:
                continue
            if spec.operator_name.endswith("RemoveDecorator") and _NEUTRAL_DECORATORS.search(
                lines[line - 1]
            ):
                continue
            code = _mutate(text, get_operator(spec.operator_name)(), spec.occurrence)
            if code is None:
                continue
            changed, before, after = _changed_lines(text, code)
            key = mutant_key(rel, holder.name, before, after)
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > 1:
                key = f"{key} #{seen[key]}"
            mutants.append(
                Mutant(
                    key,
                    stage,
                    rel,
                    holder.name,
                    changed or line,
                    spec.operator_name,
                    spec.occurrence,
                    before,
                    after,
                )
            )
    return mutants


def find_mutant(project: Path, stage: str, key: str, operator: str, line: int) -> Mutant | None:
    """The mutant a report row names (its key, operator and changed line), found by
    trying only that operator's positions in the key's function: far cheaper than
    enumerating the stage. None when the code no longer has it."""
    from cosmic_ray.ast import ast_nodes, get_ast

    rel, _, rest = key.partition("::")
    function = rest.split(": `", 1)[0]
    base, _, nth = key.rpartition(" #")
    wanted, repeat = (base, int(nth)) if nth.isdigit() else (key, 1)
    path = project / rel
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    op = get_operator(operator)()
    positions = [
        start for node in ast_nodes(get_ast(text)) for start, _ in op.mutation_positions(node)
    ]
    first, last = _definitions(ast.parse(text)).get(function, (line, line))
    seen = 0
    for occurrence, start in enumerate(positions):
        # Anywhere within the function, in order: a key names its n-th occurrence
        # there, and the row's line only says where it was when scored (a
        # docstring added above it moves it without changing the stage's hash).
        if not first <= start[0] <= last:
            continue
        code = _mutate(text, op, occurrence)
        if code is None:
            continue
        changed, before, after = _changed_lines(text, code)
        if mutant_key(rel, function, before, after) == wanted:
            seen += 1
            if seen == repeat:
                return Mutant(
                    key, stage, rel, function, changed, operator, occurrence, before, after
                )
    return None


def stage_mutants(project: Path, stage: str, sample: int = SAMPLE) -> StageMutants:
    targets = stage_targets(project, stage)
    every = enumerate_mutants(project, stage, targets)
    chosen = every
    if len(every) > sample:
        rng = random.Random(f"{project.name}/stage {stage}")
        picked = set(rng.sample(range(len(every)), sample))
        chosen = [m for i, m in enumerate(every) if i in picked]
    return StageMutants(stage, targets, len(every), chosen)


def equivalents(project: Path, stage: str) -> dict[str, str]:
    """Declared equivalent mutants of ``stage``: key -> reason."""
    found = {}
    for entry in load_config(project).get("equivalent", []):
        if str(entry.get("stage")) == stage:
            found[entry["key"]] = entry["why"]
    return found


def code_identity(text: str) -> bytes:
    """What a Python file runs (its syntax tree without comments or docstrings): the
    identity the learner's `progress.py` stamps use too, so both agree on what counts
    as a change."""
    return progress_module().code_identity(text)


def stage_config(project: Path, stage: str) -> bytes:
    """The part of `mutation.toml` that bears on ``stage``: its targets and the
    equivalents declared for it (another stage's entries do not)."""
    config = load_config(project)
    mine = {
        "stage": config.get("stages", {}).get(stage, {}),
        "equivalent": [e for e in config.get("equivalent", []) if str(e.get("stage")) == stage],
    }
    if config.get("semantic_operators") is True:  # Absent: the hash of the core operators.
        mine["semantic_operators"] = True
    return json.dumps(mine, sort_keys=True).encode()


def _named_helpers(text: str, helpers: set[str]) -> set[str]:
    """The helper module names (stems of `tests/*.py`) a file imports as a top-level
    module or names as a file, `"<stem>.py"`, in a string (a script run in a subprocess)."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {h for h in helpers if f"{h}.py" in node.value}
    return found & helpers


def helper_modules(project: Path, roots: list[str]) -> set[str]:
    """The helper modules in `tests/` (files that are neither `test_*.py` nor
    `conftest.py`) that the files ``roots`` reach, transitively: a change to one
    changes what those tests check. Paths relative to ``project``."""
    folder = project / "tests"
    helpers = {p.stem for p in folder.glob("*.py") if not p.name.startswith("test_")} - {
        "conftest",
        "__init__",
    }
    reached: set[str] = set()
    pending = [project / r for r in roots]
    while pending:
        path = pending.pop()
        if not path.is_file():
            continue
        for name in _named_helpers(path.read_text(encoding="utf-8"), helpers) - reached:
            reached.add(name)
            pending.append(folder / f"{name}.py")
    return {f"tests/{name}.py" for name in reached}


def project_stage_hash(project: Path, stage: str) -> str:
    """`stage_hash` of ``stage`` with the tests its manifest declares and the targets
    its regions and `mutation.toml` name: what a fresh report of it must carry."""
    from scratch import stage_tests

    return stage_hash(project, stage, stage_tests(project, stage), stage_targets(project, stage))


def stage_hash(project: Path, stage: str, tests: list[str], targets: list[Target]) -> str:
    """sha256 over what the stage's score depends on (module docstring)."""
    roots = sorted(set(tests) | {"tests/conftest.py"})
    paths = sorted({t.path for t in targets} | set(roots) | helper_modules(project, roots))
    digest = hashlib.sha256(f"stage {stage}\n".encode())
    digest.update(b"config\n" + stage_config(project, stage))
    for rel in paths:
        path = project / rel
        digest.update(f"{rel}\n".encode())
        if not path.is_file():
            digest.update(b"<absent>")
        elif rel.endswith(".py"):
            digest.update(code_identity(path.read_text(encoding="utf-8")))
        else:
            digest.update(path.read_bytes())
    return digest.hexdigest()
