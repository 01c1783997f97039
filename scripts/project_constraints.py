"""Write each ready project's own `constraints.txt`: the repository's pins it needs.

A project copied out of the repository must resolve the versions the matrix
tested, so its README installs with `pip install -c constraints.txt -e '.[test]'`.
Its constraints file holds the root `constraints.txt` pin of every package in
the project's dependency closure (its requirements and every extra, followed
through the installed distributions' metadata), and nothing else.

Usage: python scripts/project_constraints.py [--check] [<id> ...]
  --check   write nothing; exit 1 if any project's file differs from what
            would be written
Run it in the environment `make venv` builds (it reads installed metadata).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from ready_projects import ready_projects

ROOT = Path(__file__).resolve().parent.parent
HEADER = (
    "# Exact versions this project's tests and README figures were produced with.\n"
    "# Install with: pip install -c constraints.txt -e '.[test]'\n"
    "# Generated from the repository's constraints.txt; do not edit by hand.\n"
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def root_pins() -> dict[str, str]:
    """Canonical name -> the pin line of the root constraints file."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pins[canonical(Requirement(line).name)] = line
    return pins


def closure(name: str, extras: set[str]) -> set[str]:
    """Canonical names of ``name`` and everything it needs (with ``extras``), installed."""
    visited: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(name, frozenset(extras))]
    while todo:
        dist_name, wanted = todo.pop()
        key = canonical(dist_name)
        if (key, wanted) in visited:
            continue
        visited.add((key, wanted))
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue  # Not installed here (e.g. a platform-specific dependency).
        names.add(key)
        envs = [{"extra": e} for e in wanted] + [{"extra": ""}]
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, frozenset(req.extras)))
    return names


def project_constraints(project: Path, pins: dict[str, str]) -> str:
    dist = metadata.distribution(project.name)
    extras = set(dist.metadata.get_all("Provides-Extra") or [])
    needed = closure(project.name, extras) - {canonical(project.name)}
    lines = sorted((pins[n] for n in needed if n in pins), key=str.lower)
    return HEADER + "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    names = [a for a in argv if not a.startswith("--")]
    projects = [ROOT / "projects" / n for n in names] or ready_projects()
    pins = root_pins()
    stale = []
    for project in projects:
        text = project_constraints(project, pins)
        target = project / "constraints.txt"
        if check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(project.name)
        else:
            target.write_text(text, encoding="utf-8")
            print(f"{target.relative_to(ROOT)}: {text.count(chr(10)) - 3} pins")
    if stale:
        print(
            f"Stale constraints.txt in: {', '.join(stale)}. "
            "Run `python scripts/project_constraints.py`.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
