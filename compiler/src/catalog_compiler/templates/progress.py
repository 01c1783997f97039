"""Where you are in this project: each stage's tests, in order, and the next hints.

Run from the project folder, with the project installed (see README.md):

    python progress.py          # stages in order, stopping at the first that fails
    python progress.py --all    # run every stage's tests, passed ones included
    python progress.py dossier  # your evidence, as dossier/index.html and dossier.md

It runs each stage's test files (as `project.toml` declares them) with
pytest, prints a table (stage, title, exercises left, tests), and for the
first stage that does not pass, the file, line and hint of every exercise
region of that stage still to write. Exit status 0 when every stage passes.

After each stage's run it stamps `evidence/progress.json` with the result,
the code identity of the stage (a sha256 over the text of the stage's
exercise regions and its test files), the sha256 of the evidence file the
tests wrote (`evidence/stage_<id>.json`), the command and the environment.
A stage whose stamp says passed, with the same code and the same evidence,
is not run again (``--all`` runs it). The dossier (`dossier.py`) reads
those stamps: a stage is shown as demonstrated only when it passed and
neither its code nor its evidence changed since.
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPEN = re.compile(r"^\s*# --- exercise stage (?P<stage>[A-Za-z0-9_-]+): (?P<hint>.+?) ---\s*$")
CLOSE = re.compile(r"^\s*# --- end exercise ---\s*$")
UNWRITTEN = re.compile(r"^\s*raise NotImplementedError\(['\"]Stage [A-Za-z0-9_-]+ exercise: ")
STATE = Path("evidence") / "progress.json"


def manifest(folder: Path = HERE) -> dict:
    with (folder / "project.toml").open("rb") as f:
        return tomllib.load(f)


def unwritten_regions(folder: Path = HERE) -> dict[str, list[tuple[str, int, str]]]:
    """Per stage: (file, line, hint) of each region that still raises the starter's error."""
    found: dict[str, list[tuple[str, int, str]]] = {}
    for source in sorted((folder / "src").rglob("*.py")):
        lines = source.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            opening = OPEN.match(line)
            if opening and number < len(lines) and UNWRITTEN.match(lines[number]):
                rel = source.relative_to(folder).as_posix()
                found.setdefault(opening["stage"], []).append((rel, number, opening["hint"]))
    return found


def stage_code_hash(folder: Path, stage: str, tests: list[str]) -> str:
    """sha256 over, in order: every source file's regions of ``stage`` (the file's
    path, then the lines between the markers) and the stage's test files (path,
    then the code they run, :func:`code_identity`). Editing one of the stage's
    regions or what one of its tests runs changes it."""
    digest = hashlib.sha256()
    for source in sorted((folder / "src").rglob("*.py"), key=lambda p: p.as_posix()):
        rel = source.relative_to(folder).as_posix()
        inside = False
        for line in source.read_text(encoding="utf-8").splitlines():
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
        digest.update(code_identity(path.read_text(encoding="utf-8")) if path.is_file() else b"<absent>")
    return digest.hexdigest()


def code_identity(text: str) -> bytes:
    """What a test file runs: its syntax tree without comments or docstrings (so
    rewording a check's docstring keeps its stamp). Text that does not parse is
    taken as it is."""
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
    return ast.dump(tree).encode()


def file_sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def load_state(folder: Path = HERE) -> dict:
    """The stamps, or an empty state when there are none or they do not parse."""
    try:
        state = json.loads((folder / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"stages": {}}
    return state if isinstance(state.get("stages"), dict) else {"stages": {}}


def save_state(state: dict, folder: Path = HERE) -> None:
    path = folder / STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # A crash mid-write leaves the old stamps, never half a file.


def test_command(tests: list[str]) -> list[str]:
    return ["python", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]


def stamp(folder: Path, stage: dict, result: str, ran_at: str | None = None) -> dict:
    """The record of one stage's run (see the module docstring)."""
    evidence = folder / "evidence" / f"stage_{stage['id']}.json"
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu": cpu()}
    try:
        written = json.loads(evidence.read_text(encoding="utf-8"))
        env.update({k: written[k] for k in ("jax", "backend") if k in written})
    except (OSError, ValueError, TypeError):
        pass
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
    """Whether ``record`` (a stamp) still describes the code and evidence on disk."""
    if not record:
        return False
    evidence = folder / "evidence" / f"stage_{stage['id']}.json"
    return record.get("code_hash") == stage_code_hash(
        folder, stage["id"], stage["tests"]
    ) and record.get("evidence_sha256") == file_sha256(evidence)


def run_stage(tests: list[str]) -> tuple[str, str]:
    """Run one stage's tests; return its status and pytest's summary line."""
    done = subprocess.run(
        [sys.executable, *test_command(tests)[1:]], cwd=HERE, capture_output=True, text=True
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    summary = lines[-1].strip("= ") if lines else done.stderr.strip()[-200:]
    return ("passed" if done.returncode == 0 else "failed"), summary


def main(argv: list[str]) -> int:
    if argv[:1] == ["dossier"]:
        sys.path.insert(0, str(HERE))
        import dossier

        return dossier.main(argv[1:])
    run_all = "--all" in argv
    project = manifest()
    state = load_state()
    state["project"] = project["id"]
    left = unwritten_regions()
    rows, next_stage = [], None
    for stage in project["stages"]:
        sid = stage["id"]
        if next_stage is not None and not run_all:
            rows.append((sid, stage["title"], len(left.get(sid, [])), "not run yet", ""))
            continue
        record = state["stages"].get(sid)
        if not run_all and record and record.get("result") == "passed":
            if is_current(HERE, stage, record):
                summary = f"unchanged since {record['ran_at']}"
                rows.append((sid, stage["title"], len(left.get(sid, [])), "passed", summary))
                continue
        print(f"running stage {sid} tests ...", flush=True)
        status, summary = run_stage(stage["tests"])
        state["stages"][sid] = stamp(HERE, stage, status)
        save_state(state)
        rows.append((sid, stage["title"], len(left.get(sid, [])), status, summary))
        if status != "passed" and next_stage is None:
            next_stage = stage
    print(f"\n{project['title']}\n")
    print(f"{'stage':<6} {'title':<40} {'to write':>8}  tests")
    for sid, title, todo, status, summary in rows:
        print(f"{sid:<6} {title[:40]:<40} {todo:>8}  {status}  {summary}")
    if next_stage is None:
        print(
            "\nEvery stage passes. `python progress.py dossier` writes your evidence as a "
            "dossier; then try the seeded bugs in seeded_bugs.toml: each must make its "
            "stage fail."
        )
        return 0
    sid = next_stage["id"]
    print(f"\nNext: stage {sid}, {next_stage['title']}: {next_stage['deliverable']}.")
    for rel, number, hint in left.get(sid, []):
        print(f"  {rel}:{number}: {hint}")
    if not left.get(sid):
        print(
            "  Every region of this stage is written; its tests still fail: "
            f"run `pytest -m stage{sid}` and read the first failure."
        )
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
