"""Each project's reference evidence, from a real run of its stage tests.

    python scripts/reference_evidence.py [--jobs N] [<id> ...]   (default: every ready project)

For each project: a scratch copy of the reference (every region written) gets
the starter's `progress.py` and `dossier.py`, `python progress.py --all` runs
every stage's tests there, and the `evidence/` it leaves (each stage's
`stage_<id>.json` and the stamps in `progress.json`) replaces the project's
`evidence/` stage files. So the stamps the site and `catalog-compile
coverage` read come from a run, never from a script that only says so; a
contract test fails when the reference code or tests move on without them.
Exit 1 when a stage of a project does not pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from catalog_compiler.starters import LEARNER_TOOLS, copy_project
from ready_projects import ready_projects
from scratch import ROOT


def refresh(project: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="reference-evidence-") as tmp:
        copy = copy_project(project, Path(tmp) / project.name)
        for name in LEARNER_TOOLS:
            source = resources.files("catalog_compiler").joinpath("templates", name)
            (copy / name).write_bytes(source.read_bytes())
        env = dict(os.environ, PYTHONPATH=str(copy / "src"), MPLBACKEND="Agg")
        env.pop("EVIDENCE_DIR", None)
        done = subprocess.run(
            [sys.executable, "progress.py", "--all"],
            cwd=copy,
            env=env,
            text=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-400:])
        state = json.loads((copy / "evidence" / "progress.json").read_text(encoding="utf-8"))
        failed = [s for s, r in state["stages"].items() if r["result"] != "passed"]
        if failed:
            print(
                f"{project.name}: stages {', '.join(failed)} did not pass; evidence kept as it was"
            )
            print(done.stdout[-2000:])
            return 1
        target = project / "evidence"
        target.mkdir(exist_ok=True)
        for stale in target.glob("stage_*"):
            stale.unlink()
        for path in (copy / "evidence").iterdir():
            if path.name.startswith("stage_") or path.name == "progress.json":
                shutil.copyfile(path, target / path.name)
        print(f"{project.name}: evidence of {len(state['stages'])} stages written to {target}")
    return 0


def main(argv: list[str]) -> int:
    from concurrent.futures import ThreadPoolExecutor

    jobs = 1
    if argv[:1] == ["--jobs"]:
        jobs, argv = int(argv[1]), argv[2:]
    projects = [ROOT / "projects" / n for n in argv] or ready_projects()
    for project in projects:
        if not (project / "project.toml").is_file():
            print(f"No project `{project.name}`.", file=sys.stderr)
            return 2
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return max(pool.map(refresh, projects), default=0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
