"""Where you are in this project: each stage's tests, in order, and the next hints.

Run from the project folder, with the project installed (see README.md):

    python progress.py          # stages in order, stopping at the first that fails
    python progress.py --all    # run every stage's tests

It runs each stage's test files (as `project.toml` declares them) with
pytest, prints a table (stage, title, exercises left, tests), and for the
first stage that does not pass, the file, line and hint of every exercise
region of that stage still to write. Exit status 0 when every stage passes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPEN = re.compile(r"^\s*# --- exercise stage (?P<stage>[A-Za-z0-9_-]+): (?P<hint>.+?) ---\s*$")
UNWRITTEN = re.compile(r"^\s*raise NotImplementedError\(['\"]Stage [A-Za-z0-9_-]+ exercise: ")


def unwritten_regions() -> dict[str, list[tuple[str, int, str]]]:
    """Per stage: (file, line, hint) of each region that still raises the starter's error."""
    found: dict[str, list[tuple[str, int, str]]] = {}
    for source in sorted((HERE / "src").rglob("*.py")):
        lines = source.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            opening = OPEN.match(line)
            if opening and number < len(lines) and UNWRITTEN.match(lines[number]):
                rel = source.relative_to(HERE).as_posix()
                found.setdefault(opening["stage"], []).append((rel, number, opening["hint"]))
    return found


def run_stage(tests: list[str]) -> tuple[str, str]:
    """Run one stage's tests; return its status and pytest's summary line."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
        cwd=HERE,
        capture_output=True,
        text=True,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    summary = lines[-1].strip("= ") if lines else done.stderr.strip()[-200:]
    return ("passed" if done.returncode == 0 else "failed"), summary


def main(argv: list[str]) -> int:
    run_all = "--all" in argv
    with (HERE / "project.toml").open("rb") as f:
        manifest = tomllib.load(f)
    left = unwritten_regions()
    rows, next_stage = [], None
    for stage in manifest["stages"]:
        sid = stage["id"]
        if next_stage is not None and not run_all:
            rows.append((sid, stage["title"], len(left.get(sid, [])), "not run yet", ""))
            continue
        print(f"running stage {sid} tests ...", flush=True)
        status, summary = run_stage(stage["tests"])
        rows.append((sid, stage["title"], len(left.get(sid, [])), status, summary))
        if status != "passed" and next_stage is None:
            next_stage = stage
    print(f"\n{manifest['title']}\n")
    print(f"{'stage':<6} {'title':<40} {'to write':>8}  tests")
    for sid, title, todo, status, summary in rows:
        print(f"{sid:<6} {title[:40]:<40} {todo:>8}  {status}  {summary}")
    if next_stage is None:
        print(
            "\nEvery stage passes. Compare your code with the reference, then try the seeded "
            "bugs in seeded_bugs.toml: each must make its stage fail."
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
