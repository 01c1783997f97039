"""Where you are in this project: the current stage's tests, its failing check, the hints.

Run from the project folder, with the project's environment active (README.md):

    python progress.py               # the current stage (the first not yet passed)
    python progress.py --all         # every stage's tests, passed ones included
    python progress.py hint [STAGE]  # the next hint for the stage's first region to write
    python progress.py watch         # rerun the current stage whenever a file is saved
    python progress.py dossier       # your evidence, as dossier/index.html and dossier.md
    python progress.py coverage --role ID  # what your stages evidence for a route (roles.json)
    python progress.py --help        # this list (`watch --runs N`, `dossier --out DIR`)

A run starts at the first stage that is not passed and stops at the first
that fails; the stages after it are not run. When a stage fails, it shows
the first failing test's name, its first failing assertion in one line, the
first check the run's evidence records as failed with its observed figures
against its limit (`failed_check`), the sentence saying what that check
proves (the test's docstring) and the file and line of the stage's first
region still to write.

After each stage's run it stamps `evidence/progress.json` with the result,
the code identity of the stage (a sha256 over the text of the stage's
exercise regions and the code of its test files), the sha256 of the evidence
file the tests wrote (`evidence/stage_<id>.json`), the command and the
environment. A stage whose stamp says passed, with the same code and the same
evidence, is not run again (``--all`` runs it). The dossier (`dossier.py`)
reads those stamps: a stage is shown as demonstrated only when it passed and
neither its code nor its evidence changed since.

Every file these commands read is taken as untrusted (:func:`read_bytes`):
one that is a symbolic link, a folder, a FIFO or another special file, over
:data:`MAX_BYTES`, or unreadable stops the command with one line naming it and
what to do; stamps that are not valid JSON, or not of the shape written here,
are set aside with one line and written afresh. Nothing is written through a
link (:func:`write_atomic`), and a stage does not run while its evidence file
is one (:func:`check_evidence`): the tests would write through it.

Exit status: 0 when every stage passes, 1 when one fails, 2 when this Python
cannot run the project (it is not the project's environment) or a file it
needs is unusable. `coverage` runs no test (any Python runs it): 0 when every
stage the route cites is demonstrated, 1 when one remains, 2 as above.
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

# hints.py and dossier.py use these as progress.*.
from failed_check import (  # noqa: F401
    Failure,
    decisive_line,
    docstring_sentence,
    failed_record,
    first_failure,
    test_file_of,
)
from learner_files import (  # noqa: F401
    AFRESH,
    MAX_BYTES,
    RESTORE,
    Unreadable,
    check_evidence,
    read_bytes,
    read_json,
    read_text,
    regular_file,
    shown,
    write_atomic,
)

HERE = Path(__file__).resolve().parent
OPEN = re.compile(r"^\s*# --- exercise stage (?P<stage>[A-Za-z0-9_-]+): (?P<hint>.+?) ---\s*$")
CLOSE = re.compile(r"^\s*# --- end exercise ---\s*$")
UNWRITTEN = re.compile(r"^\s*raise NotImplementedError\(['\"]Stage [A-Za-z0-9_-]+ exercise: ")
STATE = Path("evidence") / "progress.json"


@dataclass
class StageRun:
    status: str  # "passed" or "failed"
    summary: str  # pytest's last line, e.g. "1 failed, 3 passed in 4.61s"
    failure: Failure | None = None
    seconds: float = 0.0  # the pytest process's wall time


def manifest(folder: Path = HERE) -> dict:
    path = folder / "project.toml"
    text = read_text(path)
    if text is None:
        raise Unreadable(f"{shown(path)} is missing: {RESTORE}.")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise Unreadable(f"{shown(path)} is not valid TOML ({error}): {RESTORE}.") from None


def unwritten_regions(folder: Path = HERE) -> dict[str, list[tuple[str, int, str]]]:
    """Per stage: (file, line, hint) of each region that still raises the starter's error."""
    found: dict[str, list[tuple[str, int, str]]] = {}
    for source in sorted((folder / "src").rglob("*.py")):
        lines = (read_text(source) or "").splitlines()
        for number, line in enumerate(lines, start=1):
            opening = OPEN.match(line)
            if opening and number < len(lines) and UNWRITTEN.match(lines[number]):
                rel = source.relative_to(folder).as_posix()
                found.setdefault(opening["stage"], []).append((rel, number, opening["hint"]))
    return found


def claims_mark(node: ast.AST) -> bool:
    """``pytest.mark.claims(...)``: a test's declaration of what it proves."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "claims"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "mark"
    )


def code_identity(text: str) -> bytes:
    """What a test file runs: its syntax tree without comments, docstrings or
    `claims` markers (so rewording a check's docstring, or naming the claims it
    proves, keeps its stamp). Text that does not parse is taken as it is."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text.encode()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            node.decorator_list = [d for d in node.decorator_list if not claims_mark(d)]
        if isinstance(node, (ast.List, ast.Tuple)):
            node.elts = [e for e in node.elts if not claims_mark(e)]
    tree.body = [
        n
        for n in tree.body
        if not (isinstance(n, ast.Assign) and claims_mark(n.value))
        and not (
            isinstance(n, ast.Assign)
            and isinstance(n.value, (ast.List, ast.Tuple))
            and not n.value.elts
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        )
    ]
    return ast.dump(tree).encode()


def test_harness(folder: Path) -> list[str]:
    """The files under ``tests/`` that every stage's tests can run besides their
    own: ``conftest.py`` and each helper module (a ``.py`` file not named
    ``test_*``), as paths relative to ``folder``, sorted."""
    return sorted(
        path.relative_to(folder).as_posix()
        for path in (folder / "tests").rglob("*.py")
        if not path.name.startswith("test_")
    )


def stage_code_hash(folder: Path, stage: str, tests: list[str]) -> str:
    """sha256 over, in order: every source file's regions of ``stage`` (the file's
    path, then the lines between the markers), the stage's test files and then the
    test harness, :func:`test_harness` (each file's path, then the code it runs,
    :func:`code_identity`). Editing one of the stage's regions or what one of its
    tests runs changes it, a fixture or helper in ``conftest.py`` or a helper
    module included: a stage that passed under another harness is not current."""
    digest = hashlib.sha256()
    for source in sorted((folder / "src").rglob("*.py"), key=lambda p: p.as_posix()):
        rel = source.relative_to(folder).as_posix()
        inside = False
        for line in (read_text(source) or "").splitlines():
            opening = OPEN.match(line)
            if opening:
                inside = opening["stage"] == stage
                if inside:
                    digest.update(f"region {rel}\n".encode())
                continue
            if CLOSE.match(line):
                inside = False
            elif inside:
                digest.update(f"{line}\n".encode())
    for test in tests:
        path = folder / test
        digest.update(f"test {test}\n".encode())
        text = read_text(path)
        digest.update(b"<absent>" if text is None else code_identity(text))
    for helper in test_harness(folder):
        digest.update(f"harness {helper}\n".encode())
        digest.update(code_identity(read_text(folder / helper) or ""))
    return digest.hexdigest()


def file_sha256(path: Path) -> str | None:
    """sha256 of an evidence file, None when there is none (:func:`read_bytes`)."""
    data = read_bytes(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


# The type of each field of a stamp that the tools read; one of another type is dropped.
RECORD_FIELDS = {
    "result": str,
    "code_hash": str,
    "evidence_sha256": str,
    "command": str,
    "ran_at": str,
    "environment": dict,
    "failure": dict,
}
_warned: set[Path] = set()


def load_state(folder: Path = HERE) -> dict:
    """The stamps: empty when there are none; when they are not JSON or not of the
    shape :func:`save_state` writes, empty too, said once on stderr (the next save
    replaces them). :class:`Unreadable` when the file itself is unusable."""
    path = folder / STATE
    try:
        state = read_json(path)
        if state is None:
            return {"stages": {}}
        problem = _state_problem(state)
    except ValueError as error:
        problem = f"is not valid JSON ({error})"
    if problem is None:
        for record in state["stages"].values():
            for key, kind in RECORD_FIELDS.items():
                if key in record and not isinstance(record[key], kind):
                    del record[key]
            failure = record.get("failure", {})
            if not all(isinstance(failure.get(k), str) for k in ("test", "assertion")):
                record.pop("failure", None)
        return state
    if path not in _warned:
        _warned.add(path)
        print(
            f"progress.py: {shown(path)} {problem}: its stamps are set aside and written "
            "afresh (stamped stages run again).",
            file=sys.stderr,
        )
    return {"stages": {}}


def _state_problem(state: object) -> str | None:
    """Why ``state`` is not stamps as :func:`save_state` writes them, or None."""
    if not isinstance(state, dict):
        return f"holds a JSON {type(state).__name__}, not an object of stamps"
    if not isinstance(state.get("stages"), dict):
        return "has no `stages` object"
    if not all(isinstance(record, dict) for record in state["stages"].values()):
        return "has a stage stamp that is not an object"
    hints = state.get("hints", {})
    if not isinstance(hints, dict) or not all(isinstance(level, int) for level in hints.values()):
        return "has a `hints` entry that is not a level number"
    return None


def save_state(state: dict, folder: Path = HERE) -> None:
    write_atomic(folder / STATE, json.dumps(state, indent=1, sort_keys=True) + "\n")


def test_command(tests: list[str]) -> list[str]:
    return ["python", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]


def stamp(folder: Path, stage: dict, result: str, ran_at: str | None = None) -> dict:
    """The record of one stage's run (see the module docstring)."""
    evidence = folder / "evidence" / f"stage_{stage['id']}.json"
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu": cpu()}
    try:
        written = read_json(evidence)
    except ValueError:
        written = None
    if isinstance(written, dict):
        env.update({k: str(written[k]) for k in ("jax", "backend") if k in written})
    return {
        "result": result,
        "code_hash": stage_code_hash(folder, stage["id"], stage["tests"]),
        "evidence_sha256": file_sha256(evidence),
        "command": " ".join(test_command(stage["tests"])),
        "ran_at": ran_at or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": env,
    }


def cpu() -> str:
    """The processor's model name (Linux), else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.machine()} x{os.cpu_count()}"


def is_current(folder: Path, stage: dict, record: dict | None) -> bool:
    """Whether ``record`` (a stamp) still describes the code and evidence on disk. A
    stage whose regions still raise the starter's error is never current, whatever
    its stamp says: the regions themselves are read, not only the stamp's hash."""
    if not record or stage["id"] in unwritten_regions(folder):
        return False
    evidence = folder / "evidence" / f"stage_{stage['id']}.json"
    return record.get("code_hash") == stage_code_hash(
        folder, stage["id"], stage["tests"]
    ) and record.get("evidence_sha256") == file_sha256(evidence)


def environment_problem(folder: Path = HERE) -> str | None:
    """Why this Python cannot run the project's tests (one line), or None: pytest
    and the project's package must import, the package from this folder's src/."""
    packages = sorted(p.parent.name for p in (folder / "src").glob("*/__init__.py"))
    fix = (
        "activate the project's environment (`. .venv/bin/activate`, after installing "
        "as README.md says) and run `python progress.py` again"
    )
    for name in ["pytest", *packages]:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return f"progress.py: {sys.executable} cannot import `{name}`: {fix}."
        if name in packages and spec.origin:
            source = Path(spec.origin).resolve().parent.parent
            if source != (folder / "src").resolve():
                return (
                    f"progress.py: this Python imports `{name}` from {source}, not from "
                    f"{folder / 'src'}: install this folder (`pip install -e '.[test]'`)."
                )
    return None


def run_stage(tests: list[str], folder: Path = HERE, stage_id: str | None = None) -> StageRun:
    """Run one stage's tests (:func:`test_command`, with a JUnit report to read the
    first failure from); return its status, pytest's summary line and that failure,
    with the first failed record of the evidence the run wrote (``stage_id``'s)."""
    with tempfile.TemporaryDirectory(prefix="progress-") as tmp:
        report = Path(tmp) / "junit.xml"
        wall_start = time.time()
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *test_command(tests)[1:], f"--junitxml={report}"],
            cwd=folder,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        failure = first_failure(report, tests, folder) if done.returncode else None
    if failure is not None and stage_id is not None:
        record = failed_record(folder, stage_id, wall_start)
        failure.figure = decisive_line(record) if record else ""
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    summary = lines[-1].strip("= ") if lines else done.stderr.strip()[-200:]
    status = "passed" if done.returncode == 0 else "failed"
    return StageRun(status, summary, failure, seconds)


def run_stages(run_all: bool = False, folder: Path = HERE) -> int:
    """The progress run (module docstring); prints the table and what to do next,
    then its own time apart from the tests' (pytest's start-up counts as the tests')."""
    started, in_tests = time.perf_counter(), 0.0
    status = _run_stages(run_all, folder)
    for run in status.runs:
        in_tests += run.seconds
    own = time.perf_counter() - started - in_tests
    print(f"\n(tests {in_tests:.1f} s; progress.py itself {own:.2f} s)")
    return status.code


@dataclass
class Outcome:
    code: int
    runs: list[StageRun]


def _run_stages(run_all: bool, folder: Path) -> Outcome:
    project = manifest(folder)
    state = load_state(folder)
    state["project"] = project["id"]
    left = unwritten_regions(folder)
    rows, current, failure, runs = [], None, None, []
    for stage in project["stages"]:
        sid, todo = stage["id"], len(left.get(stage["id"], []))
        if current is not None and not run_all:
            rows.append((sid, stage["title"], todo, "not run yet", ""))
            continue
        record = state["stages"].get(sid)
        if not run_all and record and record.get("result") == "passed":
            if is_current(folder, stage, record):
                rows.append(
                    (sid, stage["title"], todo, "passed", f"unchanged since {record.get('ran_at')}")
                )
                continue
        check_evidence(folder, sid)
        print(f"running stage {sid} tests ...", flush=True)
        run = run_stage(stage["tests"], folder, sid)
        runs.append(run)
        state["stages"][sid] = stamp(folder, stage, run.status)
        if run.failure is not None:  # `hint` starts from the region this failure names.
            state["stages"][sid]["failure"] = {
                "test": run.failure.test,
                "assertion": run.failure.assertion,
                "figure": run.failure.figure,
            }
        save_state(state, folder)
        rows.append((sid, stage["title"], todo, run.status, run.summary))
        if run.status != "passed" and current is None:
            current, failure = stage, run.failure
    print(f"\n{project['title']}\n")
    print(f"{'stage':<6} {'title':<40} {'to write':>8}  tests")
    for sid, title, todo, status, summary in rows:
        print(f"{sid:<6} {title[:40]:<40} {todo:>8}  {status}  {summary}")
    if current is None:
        print(
            "\nEvery stage passes. `python progress.py dossier` writes your evidence as a "
            "dossier; then try the mistakes in seeded_bugs.toml: write each into your code, "
            "and its stage's tests must fail."
        )
        return Outcome(0, runs)
    report_failure(current, failure, left.get(current["id"], []))
    return Outcome(1, runs)


def report_failure(stage: dict, failure: Failure | None, todo: list[tuple[str, int, str]]) -> None:
    sid = stage["id"]
    print(f"\nNext: stage {sid}, {stage['title']}: {stage['deliverable']}.")
    if failure is not None:
        print(f"  failing: {failure.test}")
        print(f"  {failure.assertion}")
        if failure.figure:
            print(f"  failed check: {failure.figure}")
        if failure.proves:
            print(f"  it proves: {failure.proves}")
    if todo:
        todo = failing_region_first(todo, failure)
        rel, number, hint = todo[0]
        print(f"  write: {rel}:{number}: {hint}")
        for rel, number, hint in todo[1:]:
            print(f"  then:  {rel}:{number}: {hint}")
        print(f"  more help: `python progress.py hint {sid}` (asked again, it says more)")
    else:
        print(
            "  Every region of this stage is written; its tests still fail: "
            f"run `pytest -m stage{sid}` and read the first failure."
        )


def failing_region_first(
    todo: list[tuple[str, int, str]], failure: Failure | None
) -> list[tuple[str, int, str]]:
    """``todo`` with the region the failure names (its starter error quotes the
    region's hint) moved to the front; otherwise in file order."""
    if failure is None:
        return todo
    named = [r for r in todo if f"exercise: {r[2]}" in failure.assertion]
    return named[:1] + [r for r in todo if r not in named[:1]]


def usage() -> str:
    """The commands, as the module docstring lists them, and the exit statuses."""
    paragraphs = __doc__.split("\n\n")
    return "\n\n".join([paragraphs[1], paragraphs[2], paragraphs[-1].strip()])


def main(argv: list[str]) -> int:
    if argv[:1] in (["--help"], ["-h"], ["help"]):
        print(usage())
        return 0
    command = argv[0] if argv and not argv[0].startswith("-") else ""
    problem = None if command == "coverage" else environment_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE))
    try:
        if command == "coverage":
            import route_coverage

            return route_coverage.main(argv[1:])
        if command == "dossier":
            import dossier

            return dossier.main(argv[1:])
        if command in ("hint", "watch"):
            import hints

            return hints.main(argv)
        if command or any(a not in ("--all",) for a in argv):
            print(usage(), file=sys.stderr)
            return 2
        return run_stages(run_all="--all" in argv)
    except Unreadable as problem:
        print(f"progress.py: {problem}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # `hints` and `dossier` import `progress`: let them find this module, not a second copy.
    sys.modules.setdefault("progress", sys.modules[__name__])
    sys.exit(main(sys.argv[1:]))
