"""Claims traced to the stage tests that prove them.

A project states what it teaches in two places: the bullets of its README's
opening section (before the first `## ` heading) and the docstrings of its stage
functions (the functions that hold an exercise region), whose rules name the
modules, masks, window edges, fields and counts the code must get right. Each
such claim carries an id written in place, ``[claim:some-id]``: every opening
bullet carries at least one, and so does the docstring of every stage function.
A claim may also be stated elsewhere under `src/` (a case table in a module
docstring, a comment above a constant).

A stage test declares the claims it proves with a marker,
``@pytest.mark.claims("some-id", ...)`` (or a module's ``pytestmark``). The
marker only declares: it changes nothing a test runs, so the code identity that
stamps a stage's reports leaves it out.

`problems(project)` lists, in words, every claim that no stage test declares
(untraced), every marker that names no claim, every opening bullet and stage
function without a claim id. Ids are the only link, so a typo shows as one
untraced claim and one unknown marker.

    python scripts/claims.py PROJECT...      # claim -> tests, then the problems
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from catalog_compiler.exercises import find_regions, source_files
from catalog_compiler.portfolio import progress_module
from scratch import manifest

CLAIM = re.compile(r"\[claim:([a-z0-9][a-z0-9-]*)\]")
ROOT = Path(__file__).resolve().parent.parent
PENDING = ROOT / "scripts" / "claims_pending.txt"


@dataclass
class Claims:
    """What one project states and what its stage tests declare."""

    stated: dict[str, list[str]] = field(default_factory=dict)  # id -> where ("README.md:12")
    proved: dict[str, list[str]] = field(default_factory=dict)  # id -> test ("file::name")
    missing_ids: list[str] = field(default_factory=list)  # bullets, functions without one

    def untraced(self) -> list[str]:
        return sorted(set(self.stated) - set(self.proved))

    def unknown(self) -> list[str]:
        return sorted(set(self.proved) - set(self.stated))


def opening_bullets(readme: str) -> list[tuple[int, str]]:
    """The top-level bullets before the first `## ` heading: (first line, text).
    A bullet runs on over indented and blank lines; prose at the margin ends it."""
    bullets: list[tuple[int, list[str]]] = []
    inside = False
    for number, line in enumerate(readme.splitlines(), start=1):
        if line.startswith("## "):
            break
        if line.startswith("- "):
            bullets.append((number, [line]))
            inside = True
        elif inside and (line.startswith("  ") or not line.strip()):
            if line.strip():
                bullets[-1][1].append(line)
        else:
            inside = False
    return [(n, "\n".join(text)) for n, text in bullets]


def stage_functions(path: Path, text: str, rel: str) -> list[tuple[str, int, str]]:
    """(name, line, docstring) of each function holding an exercise region; a region
    outside any function stands for its module (name `<module>`)."""
    regions = find_regions(text, rel)
    if not regions:
        return []
    tree = ast.parse(text)
    functions = [
        n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    found: dict[tuple[str, int], str] = {}
    for region in regions:
        holders = [f for f in functions if f.lineno <= region.start <= (f.end_lineno or 0)]
        if holders:
            inner = max(holders, key=lambda f: f.lineno)
            found[(inner.name, inner.lineno)] = ast.get_docstring(inner) or ""
        else:
            found[("<module>", 1)] = ast.get_docstring(tree) or ""
    return [(name, line, doc) for (name, line), doc in sorted(found.items(), key=lambda x: x[0][1])]


# ``pytest.mark.claims(...)`` (or ``mark.claims(...)``): the learner tool's predicate,
# the one the code identity uses to leave the marker out.
_is_claims_mark = progress_module().claims_mark


def _ids(call: ast.Call, where: str) -> list[str]:
    ids = []
    for arg in call.args:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            raise ValueError(f"{where}: `claims` takes string ids, got `{ast.unparse(arg)}`")
        ids.append(arg.value)
    return ids


def declared_in_tests(text: str, rel: str) -> dict[str, list[str]]:
    """claim id -> the tests of one file (``rel::name``) that declare it."""
    tree = ast.parse(text)
    module_ids: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            marks = (
                node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            )
            for mark in marks:
                if _is_claims_mark(mark):
                    module_ids += _ids(mark, rel)
    proved: dict[str, list[str]] = {}

    def visit(body: list[ast.stmt], inherited: list[str], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own = [i for d in node.decorator_list if _is_claims_mark(d) for i in _ids(d, rel)]
                ids = inherited + own
                if isinstance(node, ast.ClassDef):
                    visit(node.body, ids, f"{prefix}{node.name}::")
                elif node.name.startswith("test"):
                    for claim in ids:
                        proved.setdefault(claim, []).append(f"{rel}::{prefix}{node.name}")

    visit(tree.body, module_ids, "")
    return proved


def project_claims(project: Path) -> Claims:
    claims = Claims()
    readme = (project / "README.md").read_text(encoding="utf-8")
    for line, text in opening_bullets(readme):
        ids = CLAIM.findall(text)
        if not ids:
            first = text.splitlines()[0][:70]
            claims.missing_ids.append(
                f"README.md:{line}: opening bullet without a claim id: {first}"
            )
        for claim in ids:
            claims.stated.setdefault(claim, []).append(f"README.md:{line}")
    for path in source_files(project):
        rel = path.relative_to(project).as_posix()
        text = path.read_text(encoding="utf-8")
        for match in CLAIM.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            claims.stated.setdefault(match.group(1), []).append(f"{rel}:{line}")
        for name, line, doc in stage_functions(path, text, rel):
            if not CLAIM.search(doc):
                claims.missing_ids.append(
                    f"{rel}:{line}: stage function `{name}` states no claim id in its docstring"
                )
    tests = sorted({t for s in manifest(project)["stages"] for t in s.get("tests", [])})
    for rel in tests:
        path = project / rel
        if path.is_file():
            for claim, names in declared_in_tests(path.read_text(encoding="utf-8"), rel).items():
                claims.proved.setdefault(claim, []).extend(names)
    return claims


def problems(project: Path) -> list[str]:
    """Everything that keeps ``project``'s claims from being traced, in words."""
    claims = project_claims(project)
    found = list(claims.missing_ids)
    for claim in claims.untraced():
        where = ", ".join(claims.stated[claim])
        found.append(f"claim `{claim}` ({where}) is declared by no stage test")
    for claim in claims.unknown():
        tests = ", ".join(claims.proved[claim])
        found.append(f"marker names `{claim}`, which no claim states ({tests})")
    return found


def pending() -> list[str]:
    """Projects whose claims are not yet traced, as `claims_pending.txt` lists them."""
    lines = PENDING.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("projects", nargs="+", help="project ids or folders")
    args = parser.parse_args(argv)
    status = 0
    for name in args.projects:
        project = Path(name) if Path(name).is_dir() else ROOT / "projects" / name
        claims = project_claims(project)
        print(f"== {project.name}: {len(claims.stated)} claims")
        for claim in sorted(claims.stated):
            tests = claims.proved.get(claim, [])
            print(f"  {claim}: {len(tests)} test(s)" + (f", first {tests[0]}" if tests else ""))
        found = problems(project)
        for problem in found:
            print(f"  PROBLEM {problem}")
        status |= bool(found)
    return status


if __name__ == "__main__":
    sys.exit(main())
