"""A survey of what the accelerator lane found: every failure put in a class.

    python scripts/accelerator_survey.py DIR [--markdown OUT.md]

DIR holds `lane-run-*.json` files (and, optionally, the JUnit XML beside them,
plain or gzipped) from `scripts/accelerator_batch.sh`. Each failure is put in
the first class whose pattern its message matches (`CLASSES`, in order), so a
reader sees at once which failures are the machine's (no sockets, one device,
a package not installed there) and which are the tests' (a tolerance that does
not hold at the chip's arithmetic); runs cut short by their time share are
named, with the tests that took longest.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (class, pattern over the failure message): first match wins.
CLASSES = [
    ("sockets refused by the machine", r"Errno 97|Address family not supported"),
    (
        "package or metadata missing on the machine",
        r"ImportError|ModuleNotFoundError|PackageNotFoundError|Please install|"
        r"No such file or directory: '[^']*/bin/",
    ),
    ("more devices than the machine has", r"needs \d+ devices|device_count"),
    # click answers the lane's SIGINT at a run's time limit with "Aborted!" and
    # exit 1, so a CLI fixture running then fails instead of stopping the run.
    ("stopped by the lane's time limit inside a command", r"Aborted!"),
    (
        "a child process or command ended early",
        r"'exited'|StopIteration|IndexError|NoneType|KeyError|JSONDecodeError|"
        r"did not start listening|'killed': False",
    ),
    ("slow input generation (Hypothesis health check)", r"FailedHealthCheck"),
    (
        "a numerical comparison at the chip's arithmetic",
        r"allclose|Not equal to tolerance|record\(|all\(\[|assert False|assert \(|Regex",
    ),
]
OTHER = "other"


def classify(message: str) -> str:
    for name, pattern in CLASSES:
        if re.search(pattern, message):
            return name
    return OTHER


def test_times(folder: Path, project: str) -> list[tuple[float, str]]:
    """(seconds, test) for every test in the project's JUnit XML, slowest first."""
    times = []
    # `junit-<project>-auto.xml[.gz]`, or several runs' as `junit-<project>-auto-<part>...`.
    for path in sorted(folder.glob(f"junit-{project}-auto*.xml*")):
        data = path.read_bytes()
        root = ET.fromstring(gzip.decompress(data) if path.suffix == ".gz" else data)
        times += [(float(c.get("time", 0.0)), c.get("name", "")) for c in root.iter("testcase")]
    return sorted(times, reverse=True)


def manifest_stages(project: str) -> list[str]:
    """The stage ids `projects/<project>/project.toml` declares (a run of some
    stages alone is "3 of 3", not "3 of 1"); empty where there is no manifest."""
    manifest = ROOT / "projects" / project / "project.toml"
    if not manifest.is_file():
        return []
    return [s["id"] for s in tomllib.loads(manifest.read_text(encoding="utf-8"))["stages"]]


def survey(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("lane-run-*.json")):
        lane = json.loads(path.read_text(encoding="utf-8"))
        for run in lane["runs"]:
            classes: Counter[str] = Counter()
            passed = failed = skipped = 0
            reached = []
            for stage, entry in run["stages"].items():
                passed += entry["passed"]
                failed += entry["failed"]
                skipped += entry["skipped"]
                if entry["passed"] + entry["failed"] + entry["skipped"]:
                    reached.append(stage)
                classes.update(classify(f["message"]) for f in entry["failures"])
            rows.append(
                {
                    "project": lane["project"],
                    "mode": run["mode"],
                    "exit_code": run["exit_code"],
                    "seconds": run["wall_seconds"],
                    "stages": manifest_stages(lane["project"]) or list(run["stages"]),
                    "reached": reached,
                    "passed": passed,
                    "failed": failed,
                    "skipped": skipped,
                    "classes": dict(classes),
                    "slowest": test_times(folder, lane["project"])[:3],
                }
            )
    return rows


def markdown(rows: list[dict], machine: dict) -> str:
    lines = [
        f"Device: {machine.get('device_kind')} (jax {machine.get('jax')}, "
        f"libtpu {machine.get('libtpu')}).",
        "",
        "| project | ran | passed | failed | skipped | seconds | stages reached "
        "| failures by class |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        # pytest's 0 and 1 are a whole run; a timeout was cut short; anything else
        # (an internal error, a collection error) stopped pytest itself.
        code = r["exit_code"]
        ran = {0: "all", 1: "all", "timeout": "cut short"}.get(code, f"stopped (exit {code})")
        reached = f"{', '.join(r['reached']) or 'none'} of {len(r['stages'])}"
        by_count = sorted(r["classes"].items(), key=lambda item: -item[1])
        classes = "; ".join(f"{n} {c}" for c, n in by_count)
        lines.append(
            f"| {r['project']} | {ran} | {r['passed']} | {r['failed']} | {r['skipped']} | "
            f"{r['seconds']:.0f} | {reached} | {classes or '-'} |"
        )
    total = Counter()
    for r in rows:
        total.update(r["classes"])
    lines += ["", "Failures by class, all projects:", ""]
    lines += [f"- {c}: {n}" for c, n in total.most_common()]
    lines += ["", "Slowest tests on the chip:", ""]
    for r in rows:
        slow = ", ".join(f"`{name}` {sec:.0f} s" for sec, name in r["slowest"])
        lines.append(f"- {r['project']}: {slow or 'no timings kept'}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    rows = survey(args.folder)
    if not rows:
        raise SystemExit(f"accelerator_survey: no lane-run-*.json in {args.folder}")
    machine_file = args.folder / "machine.json"
    machine = json.loads(machine_file.read_text()) if machine_file.is_file() else {}
    text = markdown(rows, machine)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
