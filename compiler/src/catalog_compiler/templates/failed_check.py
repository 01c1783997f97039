"""The check that failed, in figures, and the mistakes known to fail a stage.

:func:`first_failure` reads a run's first failing test from pytest's JUnit XML
(its node id, its first assertion line, what its docstring says it proves).
Every stage test records what it compared (`check`, `condition`, `observed`,
`tolerance`, `passed`) in `evidence/stage_<id>.json` when its test module ends.
After a failing run, :func:`failed_record` finds the last record marked failed
in the file that run wrote, and :func:`decisive_line` puts it in one line: the
figure against its limit, so that a near miss reads differently from a broken
solution. :func:`known_mistakes` lists the reasons of the seeded mistakes
(`seeded_bugs.toml`) of the stage, those of one file first: the usual causes of
its checks failing. Every file is read as untrusted (`learner_files`); one that
cannot be used gives nothing here, since `progress.py` reports files itself.
"""

from __future__ import annotations

import ast
import re
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from learner_files import Unreadable, read_json, read_text

EVIDENCE = Path("evidence")
# The lines of a NumPy testing assertion that state its limit and what broke it.
NUMPY_FIGURES = re.compile(r"(Not equal to tolerance|Max (absolute|relative) difference)")
# Text that compares figures: a number beside a comparison, a limit or a difference.
COMPARES = r"(==|!=|<|>|±|[Ee]xpected|[Oo]btained|tolerance|difference)"
FIGURES = re.compile(rf"\d.*{COMPARES}|{COMPARES}.*\d")
# An error line of pytest's report (`E   ...`).
ERROR_LINE = re.compile(r"^E\s")
# A traceback frame of pytest's report: `src/pkg/module.py:123: ErrorType`.
FRAME = re.compile(r"^(?P<file>\S+\.py):(?P<line>\d+): ")
# A decisive line longer than this is cut: it must stay one readable line.
MAX_LINE = 300


@dataclass
class Failure:
    """The first failing test of a run: pytest's node id, its first assertion line
    (one line) and the first sentence of its docstring (what the check proves)."""

    test: str
    assertion: str
    proves: str
    figure: str = ""  # the first failed record of the run's evidence (decisive_line)


def first_failure(report: Path, tests: list[str], folder: Path) -> Failure | None:
    """The first failed or erroring test case of a JUnit XML report."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            continue
        classname, name = case.get("classname", ""), case.get("name", "")
        path, owner = test_file_of(classname, tests)
        message = problem.get("message") or (problem.text or "").strip()
        lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
        # The error's first line; then pytest's rewritten `assert ...` line, or, for
        # NumPy's testing assertions, the lines that hold the figures and the limit.
        shown = lines[:1] + [ln for ln in lines[1:] if ln.startswith("assert ")][:1]
        if len(shown) == 1:
            shown += [ln for ln in lines[1:] if NUMPY_FIGURES.match(ln)][:3]
        details = (problem.text or "").splitlines()
        if not any(FIGURES.search(line) for line in shown):
            # A group of failures (Hypothesis) or a bare error: the first error line
            # of the report's text that states figures.
            errors = [ln[1:].strip() for ln in details if ERROR_LINE.match(ln)]
            shown += [ln for ln in errors if FIGURES.search(ln)][:1]
        # Where in the learner's code an error was raised: the deepest frame, when
        # it lies in src/ (not in the test itself).
        frames = [m for m in (FRAME.match(ln) for ln in details) if m]
        if frames and frames[-1]["file"].startswith("src/"):
            shown.append(f"raised at {frames[-1]['file']}:{frames[-1]['line']}")
        assertion = " | ".join(dict.fromkeys(shown))
        where = f"{path}::{owner + '::' if owner else ''}{name}" if path else f"{classname}::{name}"
        proves = docstring_sentence(folder / path, owner, name) if path else ""
        return Failure(where, assertion[:300], proves)
    return None


def test_file_of(classname: str, tests: list[str]) -> tuple[str, str]:
    """(test file, class name or "") of a JUnit classname such as `tests.test_x.TestY`."""
    for test in tests:
        dotted = test.removesuffix(".py").replace("/", ".")
        if classname == dotted or classname.startswith(dotted + "."):
            return test, classname[len(dotted) + 1 :]
    return "", ""


def docstring_sentence(path: Path, owner: str, name: str) -> str:
    """The first sentence of test ``name``'s docstring (in class ``owner``), or ""."""
    try:
        tree = ast.parse(read_text(path) or "")
    except (OSError, SyntaxError, ValueError):
        return ""
    function = name.split("[", 1)[0]
    scope: list[ast.stmt] = tree.body
    if owner:
        scope = next(
            (n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner), []
        )
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            text = " ".join((ast.get_docstring(node) or "").split())
            return re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    return ""


def figures(value: object) -> str:
    """A record's observed or tolerance mapping, as `key = value` text."""
    if isinstance(value, dict):
        return "; ".join(f"{k} = {_number(v)}" for k, v in value.items())
    return _number(value)


def _number(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list) and len(v) > 8:
        return f"[{', '.join(_number(x) for x in v[:8])}, ... {len(v)} values]"
    if isinstance(v, dict):
        return "{" + figures(v) + "}"
    return str(v)


def failed_record(folder: Path, stage_id: str, since: float) -> dict | None:
    """The last record marked failed in `evidence/stage_<stage_id>.json`, when that
    file was written at or after ``since`` (a Unix time: the run that just ended);
    None when there is none, the file is older, or it cannot be used.

    The last, not the first: the run stops at its first failing test (`-x`), so
    the failing test recorded last, while a passing test before it may have
    recorded a negative control as failed on purpose (a bound that must break)."""
    path = folder / EVIDENCE / f"stage_{stage_id}.json"
    try:
        if path.stat().st_mtime < since:
            return None
        data = read_json(path)
    except (OSError, ValueError, Unreadable):
        return None
    records = data.get("records") if isinstance(data, dict) else None
    for record in reversed(records if isinstance(records, list) else []):
        if isinstance(record, dict) and record.get("passed") is False:
            return record
    return None


def decisive_line(record: dict) -> str:
    """`check (condition): observed ...; limit ...`, at most :data:`MAX_LINE` characters."""
    check = str(record.get("check", "a check"))
    condition = record.get("condition")
    head = f"{check} ({condition})" if condition else check
    line = f"{head}: observed {figures(record.get('observed'))}"
    limit = figures(record.get("tolerance")) if record.get("tolerance") is not None else ""
    if limit:
        line += f"; limit {limit}"
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


def known_mistakes(folder: Path, stage_id: str, path: str | None = None) -> list[str]:
    """The reasons (`why`) of the stage's seeded mistakes, those in ``path`` first;
    empty when `seeded_bugs.toml` is absent or unusable."""
    try:
        text = read_text(folder / "seeded_bugs.toml") or ""
        bugs = tomllib.loads(text).get("bugs", [])
    except (OSError, ValueError, Unreadable):
        return []
    mine = [
        b for b in bugs if isinstance(b, dict) and str(b.get("stage")) == stage_id and b.get("why")
    ]
    mine.sort(key=lambda b: b.get("file") != path)
    return [str(b["why"]) for b in mine]
