"""Print pip install arguments for every `ready` project: `-e projects/<id>[extras]`.

Used by the Makefile to install each ready project in editable mode with all
of its optional extras (test tooling, optional comparison back-ends). A
project counts as ready when its `project.toml` says `status = "ready"`.

Usage: python scripts/ready_projects.py [--ids]
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ready_projects() -> list[Path]:
    """Project folders whose manifest is `ready`, sorted by id."""
    folders = []
    for manifest in sorted(ROOT.glob("projects/*/project.toml")):
        with manifest.open("rb") as f:
            if tomllib.load(f).get("status") == "ready":
                folders.append(manifest.parent)
    return folders


def _listed(name: str) -> list[Path]:
    """Ready projects named in `scripts/<name>` (one id a line, `#` comments)."""
    listed = {
        line.strip()
        for line in (ROOT / "scripts" / name).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    return [p for p in ready_projects() if p.name in listed]


def learning_checked() -> list[Path]:
    """Ready projects listed in `scripts/learning_checked.txt`: those whose learner
    progression and seeded bugs the matrix checks."""
    return _listed("learning_checked.txt")


def reformulations_checked() -> list[Path]:
    """Ready projects listed in `scripts/reformulations_checked.txt`: those whose
    correct reformulations the matrix applies (each must pass its stage's tests)."""
    return _listed("reformulations_checked.txt")


def install_spec(folder: Path) -> str:
    """`projects/<id>[extra,...]` with every optional extra the project declares."""
    with (folder / "pyproject.toml").open("rb") as f:
        extras = sorted(tomllib.load(f)["project"].get("optional-dependencies", {}))
    rel = folder.relative_to(ROOT).as_posix()
    return f"{rel}[{','.join(extras)}]" if extras else rel


def main() -> None:
    folders = ready_projects()
    if "--ids" in sys.argv[1:]:
        print(" ".join(f.name for f in folders))
    else:
        print(" ".join(f"-e {install_spec(f)}" for f in folders))


if __name__ == "__main__":
    main()
