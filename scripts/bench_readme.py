"""The README block of a project's bench runs (`bench_summary.py --readme`).

A project keeps the reports its README quotes in `benchmarks/`:
`run-<n>.json` (the stated runs, at least three) and `rerun-<n>.json` (later
runs of the same command, each checked against the stated runs' expected
ranges). The block between `BEGIN` and `END` is rendered from those files
alone, so it can be checked against them at any time.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from bench_summary import Range, fmt, ranges, read_ratios

BEGIN = "<!-- bench-runs:begin -->"
END = "<!-- bench-runs:end -->"
MIN_RUNS = 3


class BlockError(Exception):
    """A project whose runs or README cannot give a block; the message says why."""


def _number(path: Path) -> int:
    return int(re.search(r"-(\d+)\.json$", path.name).group(1))


def bench_files(project: Path) -> tuple[list[Path], list[Path]]:
    """(stated runs, reruns) in `project/benchmarks`, each in number order."""
    folder = project / "benchmarks"
    runs = sorted(folder.glob("run-*.json"), key=_number)
    reruns = sorted(folder.glob("rerun-*.json"), key=_number)
    return runs, reruns


def _baseline(project: Path, runs: list[Path], name: str) -> str:
    """The baseline sentence the newest run's `ratio_details` gives `name`."""
    for path in reversed(runs):
        details = json.loads(path.read_text()).get("ratio_details") or {}
        entry = details.get(name)
        if isinstance(entry, dict) and isinstance(entry.get("baseline"), str):
            return " ".join(entry["baseline"].split()).replace("|", "/")
    return ""


def _commits(paths: list[Path]) -> str:
    shorts = []
    for path in paths:
        commit = (json.loads(path.read_text()).get("identity") or {}).get("commit")
        if isinstance(commit, str) and commit:
            shorts.append(commit[:7])
    if not shorts:
        return "the reports do not record the commit"
    return "code at " + ", ".join(sorted(set(shorts)))


def _span(r: Range) -> str:
    low, high = min(r.values), max(r.values)
    return fmt(low) if fmt(low) == fmt(high) else f"{fmt(low)} to {fmt(high)}"


def render(project: Path) -> str:
    """The block (markers included) for `project`; BlockError if it has
    fewer than `MIN_RUNS` stated runs."""
    runs, reruns = bench_files(project)
    if len(runs) < MIN_RUNS:
        raise BlockError(
            f"{project.name}: benchmarks/ holds {len(runs)} run-<n>.json; "
            f"a README range needs at least {MIN_RUNS}"
        )
    command = f"{project.name} bench --out runs/bench.json"
    table = ranges([read_ratios(p) for p in runs])
    rerun_ratios = [read_ratios(p)[0] for p in reruns]
    lines = [
        BEGIN,
        "",
        f"Every ratio of `{command}` over the {len(runs)} runs kept in `benchmarks/`",
        f"(`run-1.json` to `run-{len(runs)}.json`; {_commits(runs)}), one at a time",
        "on one 2-core CPU. *Expected in a rerun*: the wider of two ranges, the 99%",
        "prediction interval for one more run (on the log scale, mean +- t(0.995, n-1)",
        "x sd x sqrt(1 + 1/n) over the n runs) and the range of the runs widened by the",
        "largest deviation of the ratio's A/A control from 1; a ratio without an A/A",
        "control is widened by the largest A/A deviation of the runs, unless it is the",
        "same in every run (a count, which must not move).",
    ]
    if reruns:
        lines.append(
            f"Reruns of the same command, later ({', '.join(p.name for p in reruns)}, "
            f"{_commits(reruns)}), against that range:"
        )
    lines += ["", "| Ratio | Baseline | Runs | A/A control | Expected in a rerun |"]
    lines[-1] += " Rerun |" * len(reruns)
    lines.append("|---" * (5 + len(reruns)) + "|")
    outside = 0
    for name, r in table.items():
        if r.aas:
            aa = f"{fmt(min(r.aas))} to {fmt(max(r.aas))}"
        else:
            aa = "none (a count)" if len(set(r.values)) == 1 else "none"
        expected = f"{fmt(r.low)} to {fmt(r.high)}"
        if len(r.values) < len(runs):
            expected += f" (in {len(r.values)} of {len(runs)} runs)"
        row = f"| `{name}` | {_baseline(project, runs, name)} | {_span(r)} | {aa} | {expected} |"
        for ratios in rerun_ratios:
            if name not in ratios:
                row += " absent |"
                continue
            inside = r.holds(ratios[name])
            outside += not inside
            row += f" {fmt(ratios[name])} {'inside' if inside else '**outside**'} |"
        lines.append(row)
    if reruns:
        lines += ["", f"Ratios outside their expected range in the reruns: {outside}."]
    lines += ["", END]
    return "\n".join(lines)


def _place(readme: str, block: str, name: str) -> str:
    """`readme` with `block` in place of the old one, or, the first time, at
    the end of its `## Performance` section."""
    if BEGIN in readme:
        start, end = readme.index(BEGIN), readme.index(END) + len(END)
        return readme[:start] + block + readme[end:]
    heading = re.search(r"^## Performance.*$", readme, re.MULTILINE)
    if heading is None:
        raise BlockError(f"{name}: README.md has no `## Performance` section for the block")
    following = re.search(r"^## ", readme[heading.end() :], re.MULTILINE)
    at = heading.end() + following.start() if following else len(readme)
    return readme[:at].rstrip("\n") + "\n\n" + block + "\n\n" + readme[at:]


def update_readme(project: Path, verify: bool = False) -> int:
    """Writes (or with `verify`, compares) the block; 0 when current, 1 when
    stale under `verify`, 2 when no block can be made."""
    readme_path = project / "README.md"
    try:
        readme = readme_path.read_text()
        new = _place(readme, render(project), project.name)
    except (BlockError, OSError, json.JSONDecodeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if verify:
        if new != readme:
            print(
                f"{project.name}: README bench block is stale; run "
                f"`python scripts/bench_summary.py --readme projects/{project.name}`",
                file=sys.stderr,
            )
            return 1
        return 0
    if new != readme:
        readme_path.write_text(new)
        print(f"{project.name}: README bench block written")
    return 0
