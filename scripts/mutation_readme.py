"""The README stage table of a project: per stage its deliverable, test files,
hardware, last accelerator run (`accelerator-report.json`) and mutation score
(`mutation-report.json`). `python scripts/mutate.py <id> --readme` rewrites it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mutants import REPORT


def accelerator_cell(summary: dict | None) -> str:
    """A stage's README cell for its last run on an accelerator, from
    `catalog_compiler.accelerator.stage_summaries`: the verdict, the device, the
    date and commit it ran at, and whether the stage's code has changed since."""
    if summary is None:
        return "not run"
    cell = f"{summary['verdict']} on {summary['device']} ({summary['ran_on']}, {summary['commit']})"
    return cell if summary["current"] else f"{cell}; code changed since"


def readme_table(project: Path) -> str:
    """The README stage table: an accelerator column from `accelerator-report.json`
    and a mutation-score column from the mutation report."""
    from catalog_compiler.accelerator import stage_summaries
    from scratch import manifest

    report = json.loads((project / REPORT).read_text(encoding="utf-8"))["stages"]
    chip = stage_summaries(project) or {}
    lines = [
        "| Stage | Deliverable | Test file | Hardware | Accelerator | Mutation score |",
        "|---|---|---|---|---|---|",
    ]
    for s in manifest(project)["stages"]:
        r = report.get(s["id"])
        score = (
            f"{r['score']:.2f} ({r['killed'] + r['timed_out']}/"
            f"{r['mutants_run'] - r['equivalent']})"
            if r
            else "not run"
        )
        tests = ", ".join(f"`{t}`" for t in s["tests"])
        lines.append(
            f"| {s['id']}. {s['title']} | {s['deliverable']} | {tests} | "
            f"{s.get('hardware', 'cpu')} | {accelerator_cell(chip.get(s['id']))} | {score} |"
        )
    return "\n".join(lines)


def rewrite_readme(project: Path) -> None:
    """Replace the README's stage table with `readme_table`'s."""
    readme = project / "README.md"
    text = readme.read_text(encoding="utf-8")
    table = re.compile(r"^\| Stage \| Deliverable \|.*?\n(?:\|.*\n)+", re.M)
    if not table.search(text):
        raise ValueError(f"{project.name}/README.md has no stage table")
    readme.write_text(table.sub(lambda _: readme_table(project) + "\n", text, count=1), "utf-8")
