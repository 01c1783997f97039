"""Writes `projects/<id>/accelerator-report.json` from the accelerator lane's JSON.

    python scripts/accelerator_report.py PROJECT --commit SHA --lane LANE.json [--lane ...]
        [--junit JUNIT.xml[.gz] ...] [--command TEXT]

`scripts/accelerator_lane.py` runs on the accelerator machine, which has the
project's files but not this repository's tooling, so it records what ran and
how it went but not the code hash; this script, run here, adds it. Each `--lane`
is a `lane-run-*.json` or `lane-bugs-*.json` (seeded bugs run on the chip); all
must name the same project and device. Several runs of one execution mode that
each ran other stages (`accelerator_lane.py run --stage K`, one command each,
where a whole project does not fit one command) become one run of that mode: a
stage may come from one of them only, and the joined run took as long as its
parts together and exited as the worst of them (a timeout over a failure over a
pass). The code
hashes are those of the commit that was sent to the machine (`--commit`), taken
from a `git archive` of it, so a report made after later edits still names what
ran; the report is validated (`catalog_compiler.accelerator`) before it is
written, atomically. With the run's JUnit files (`--junit`), a seeded bug that
survived only because every test it names was skipped there (each parameter; a
socket the machine refuses, say) is recorded `untestable`, with the skip's reason.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import mutants  # noqa: E402
import mutate  # noqa: E402
from catalog_compiler.accelerator import REPORT, AcceleratorReport  # noqa: E402
from scratch import stage_ids  # noqa: E402


def code_hashes_at(project: str, commit: str) -> dict[str, str]:
    """Stage id -> `mutants.stage_hash` of `projects/<project>` as it was at `commit`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, f"projects/{project}"],
        capture_output=True,
        check=True,
    ).stdout
    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(scratch, filter="data")
        folder = Path(scratch) / "projects" / project
        return {stage: mutants.project_stage_hash(folder, stage) for stage in stage_ids(folder)}


def join_by_mode(runs: list[dict]) -> list[dict]:
    """One run per mode from runs of disjoint stage sets (raises ValueError when two
    runs of one mode both ran a stage)."""
    joined: dict[str, dict] = {}
    for run in runs:
        into = joined.get(run["mode"])
        if into is None:
            joined[run["mode"]] = {**run, "stages": dict(run["stages"])}
            continue
        twice = sorted(set(into["stages"]) & set(run["stages"]))
        if twice:
            raise ValueError(f"two `{run['mode']}` runs both ran stages {twice}")
        into["stages"].update(run["stages"])
        into["wall_seconds"] += run["wall_seconds"]
        into["exit_code"] = max(
            into["exit_code"], run["exit_code"], key=lambda c: (c == "timeout", c != 0, c)
        )
    return list(joined.values())


def named_tests_at(project: str, commit: str) -> dict[str, list[str]]:
    """Seeded bug id -> the tests it names (`seeded_bugs.toml` at `commit`)."""
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:projects/{project}/seeded_bugs.toml"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {bug["id"]: bug.get("tests", []) for bug in tomllib.loads(text).get("bugs", [])}


def junit_cases(paths: list[Path]) -> dict[str, str | None]:
    """`file.py::test[params]` -> its skip reason, or None where the test ran, from
    the lane's JUnit files (`junit-<project>-<mode>.xml`, gzipped or not)."""
    cases: dict[str, str | None] = {}
    for path in paths:
        data = path.read_bytes()
        root = ET.fromstring(gzip.decompress(data) if path.suffix == ".gz" else data)
        for case in root.iter("testcase"):
            node = f"{case.get('classname', '').split('.')[-1]}.py::{case.get('name')}"
            skipped = case.find("skipped")
            reason = None if skipped is None else skipped.get("message", "") or "skipped"
            # A test that ran in any run counts as run.
            cases[node] = None if node in cases and cases[node] is None else reason
    return cases


def untestable_reason(named: list[str], cases: dict[str, str | None]) -> str | None:
    """The skip reasons when every test a seeded bug names (`tests/f.py::name`, all
    its parameters) was skipped in the run of the same commit; else None.

    A bug whose tests all skip on a machine (they need sockets, say) passes there
    whatever it breaks: its `survived` says nothing about the tests, so the report
    records it as `untestable` with the reason its tests gave."""
    reasons: set[str] = set()
    for test in named:
        wanted = test.rpartition("/")[2]
        found = [r for node, r in cases.items() if node.split("[")[0] == wanted]
        if not found or any(r is None for r in found):
            return None
        reasons.update(r for r in found if r is not None)
    return "; ".join(sorted(reasons)) if reasons else None


def build(
    project: str, commit: str, lanes: list[dict], command: str, junit: list[Path] = ()
) -> dict:
    """The report's JSON from the lane payloads (raises ValueError when they disagree)."""
    devices = {json.dumps(lane["machine"], sort_keys=True) for lane in lanes}
    names = {lane["project"] for lane in lanes}
    if names != {project} or len(devices) != 1:
        raise ValueError(f"lane files name projects {sorted(names)} and {len(devices)} devices")
    full = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    runs = join_by_mode([run for lane in lanes for run in lane.get("runs", [])])
    bugs = [
        {k: bug[k] for k in ("id", "stage", "outcome")} | {"seconds": bug.get("seconds", 0.0)}
        for lane in lanes
        for bug in lane.get("bugs", [])
    ]
    named = named_tests_at(project, full) if bugs and junit else {}
    cases = junit_cases(list(junit))
    for bug in bugs:
        reason = untestable_reason(named.get(bug["id"], []), cases)
        if bug["outcome"] == "survived" and reason is not None:
            bug.update(outcome="untestable", reason=reason)
    stamps = [lane["written_at"] for lane in lanes if "written_at" in lane]
    payload = {
        "schema_version": 1,
        "project": project,
        "device": lanes[0]["machine"],
        "commit": full,
        "ran_on": time.strftime("%Y-%m-%d", time.gmtime(max(stamps) if stamps else time.time())),
        "command": command,
        "code_hashes": code_hashes_at(project, full),
        "runs": runs,
        "seeded_bugs": bugs,
    }
    return AcceleratorReport.model_validate(payload).model_dump(mode="json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--lane", type=Path, action="append", required=True)
    parser.add_argument(
        "--command",
        default="python scripts/accelerator_lane.py run PROJECT --mode auto --mode interpret; "
        "python scripts/accelerator_lane.py bugs PROJECT",
    )
    parser.add_argument(
        "--junit",
        type=Path,
        action="append",
        default=[],
        help="the run's JUnit file(s): a seeded bug whose every named test skipped "
        "there is recorded `untestable`, with the reason",
    )
    args = parser.parse_args()
    lanes = []
    for path in args.lane:
        lane = json.loads(path.read_text(encoding="utf-8"))
        # The lane names its files `lane-<command>-[<project>-]<unix seconds>.json`.
        stamp = path.stem.rsplit("-", 1)[-1]
        if "written_at" not in lane and stamp.isdigit():
            lane["written_at"] = int(stamp)
        lanes.append(lane)
    try:
        report = build(args.project, args.commit, lanes, args.command, args.junit)
    except (ValueError, KeyError, subprocess.CalledProcessError) as err:
        sys.exit(f"accelerator_report: {err}")
    target = ROOT / "projects" / args.project / REPORT
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    print(f"wrote {target.relative_to(ROOT)}")
    # The README's stage table shows each stage's last run on an accelerator.
    mutate.rewrite_readme(target.parent)


if __name__ == "__main__":
    main()
