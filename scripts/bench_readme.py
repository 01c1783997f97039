"""The README block of a project's bench runs.

    python scripts/bench_readme.py projects/<id>            # rewrite the README block
    python scripts/bench_readme.py projects/<id> --verify   # exit 1 if stale

A project keeps the reports its README quotes in `benchmarks/`:
`run-<n>.json` (the stated runs, at least three) and `rerun-<n>.json` (later
runs of the same command, each checked against the stated runs' expected
ranges). The block between `BEGIN` and `END` is rendered from those files
alone, so it can be checked against them at any time.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from bench_summary import cpu_label, fmt, ranges, read_ratios

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


def _cpu_groups(paths: list[Path]) -> dict[str, list[Path]]:
    """CPU label (`cpu_label` of each report's `host`) -> its reports, in order
    of first use."""
    groups: dict[str, list[Path]] = {}
    for path in paths:
        label = cpu_label(json.loads(path.read_text()).get("host"))
        groups.setdefault(label, []).append(path)
    return groups


def _names(paths: list[Path]) -> str:
    """`run-1.json` to `run-4.json` for consecutive numbers, else a list."""
    numbers = [_number(p) for p in paths]
    if len(paths) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"`{paths[0].name}` to `{paths[-1].name}`"
    return ", ".join(f"`{p.name}`" for p in paths)


def _unlabelled(label: str) -> str:
    return "not recorded" if label == cpu_label(None) else label


def _span(values: list[float] | tuple[float, ...]) -> str:
    low, high = min(values), max(values)
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
    run_ratios = {p: read_ratios(p)[0] for p in runs}
    rerun_ratios = [read_ratios(p)[0] for p in reruns]
    # Runs on different CPUs are pooled into one expected range: a rerun may
    # land on any CPU of the machine kind. Each CPU gets a letter, and the
    # Runs column gives each CPU's own span, so the two can be told apart.
    groups = _cpu_groups(runs)
    letter = {label: chr(ord("A") + i) for i, label in enumerate(groups)}
    lines = [
        BEGIN,
        "",
        f"Every ratio of `{command}` over the {len(runs)} runs kept in `benchmarks/`",
        f"(`run-1.json` to `run-{len(runs)}.json`; {_commits(runs)}), one at a time",
        "on 2-core machines of one kind, on "
        + "; ".join(f"CPU {letter[g]}: {_unlabelled(g)} ({_names(ps)})" for g, ps in groups.items())
        + ". *Expected in a rerun*: the wider of two ranges, over the runs of every CPU",
        "together, the 99% prediction interval for one more run (on the log scale, mean",
        "+- t(0.995, n-1) x sd x sqrt(1 + 1/n) over the n runs) and the range of the runs",
        "widened by the largest deviation of the ratio's A/A control from 1; a ratio",
        "without an A/A control is widened by the largest A/A deviation of the runs,",
        "unless it is the same in every run (a count, which must not move).",
    ]

    def cpu_of(path: Path) -> str:
        label = cpu_label(json.loads(path.read_text()).get("host"))
        known = label in letter and label != cpu_label(None)
        return f"CPU {letter[label]}" if known else label

    if reruns:
        described = [f"{p.name}: {_commits([p])}, {cpu_of(p)}" for p in reruns]
        lines.append(
            "Reruns of the same command, later (" + "; ".join(described) + "), against that range:"
        )
    lines += ["", "| Ratio | Baseline | Runs | A/A control | Expected in a rerun |"]
    lines[-1] += "".join(f" {p.stem} |" for p in reruns)
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
        if len(groups) == 1:
            spans = _span(r.values)
        else:
            spans = "; ".join(
                f"{letter[g]}: {_span(values)}"
                for g, ps in groups.items()
                if (values := [run_ratios[p][name] for p in ps if name in run_ratios[p]])
            )
        row = f"| `{name}` | {_baseline(project, runs, name)} | {spans} | {aa} | {expected} |"
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
                f"`python scripts/bench_readme.py projects/{project.name}`",
                file=sys.stderr,
            )
            return 1
        return 0
    if new != readme:
        readme_path.write_text(new)
        print(f"{project.name}: README bench block written")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project", type=Path, help="a project folder")
    parser.add_argument("--verify", action="store_true", help="only compare; exit 1 if stale")
    args = parser.parse_args(argv)
    return update_readme(args.project, verify=args.verify)


if __name__ == "__main__":
    sys.exit(main())
