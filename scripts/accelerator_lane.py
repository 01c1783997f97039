"""The accelerator lane: a project's stage tests and seeded bugs run on a lent accelerator.

It runs on the accelerator machine, which has the project's files but not this
repository's tooling (standard library and pytest only):

    python scripts/accelerator_lane.py run PROJECT --out DIR [--mode auto|interpret] [--stage K]
    python scripts/accelerator_lane.py bugs PROJECT --out DIR [--stage K ...] [--only ID ...]
        [--timeout S] [--budget S]

`run` runs every stage's declared test files in ONE pytest process (one program
holds the chip at a time, and opening it costs seconds), with JUnit XML so that
each test's outcome and skip reason are kept; `--mode interpret` sets
`<PROJECT>_MODE=interpret` (the project id upper-cased, `-` as `_`; kernel-audit
reads `KERNEL_AUDIT_MODE`). `bugs` applies each seeded bug
alone to a scratch copy and runs the tests it names with `-x`: exit 1 is caught,
0 survived, anything else broken. Both write JSON under DIR with the device
kind and the jax, jaxlib and libtpu versions; `scripts/accelerator_report.py`
turns them into the project's `accelerator-report.json`, and
`scripts/accelerator_survey.py` puts the failures of many runs in classes.

`run` keeps the evidence each test wrote (`DIR/evidence-<project>-<mode>/`),
stops at `--timeout` (SIGINT first, so the tests that finished are kept) and,
with `--test-timeout`, fails a single hanging test alone. The lane's pytest
plugin (`lane_plugin/lane_skips.py`) reports a test that fails only because the
machine refuses sockets as skipped, with that reason. Several projects in one
command, with the machine's set-up: `scripts/accelerator_batch.sh`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The chip's JAX warns at import about transparent hugepages, and the machine's
# packages are not the pinned ones (their deprecation warnings are not a stage's
# concern); the projects turn every warning into an error, so the lane ignores
# those two kinds (CPU runs keep them errors). `lane_skips` reports a test that
# fails only because the machine refuses sockets as skipped, with that reason.
PYTEST_ARGS = [
    "-q",
    "-p",
    "no:cacheprovider",
    "-p",
    "lane_skips",
    "-W",
    "ignore::UserWarning",
    "-W",
    "ignore::DeprecationWarning",
]
PLUGIN_DIR = ROOT / "scripts" / "lane_plugin"
GRACE_SECONDS = 20.0


def per_test_timeout(seconds: float | None) -> list[str]:
    """pytest-timeout arguments where that plugin is installed: one test that hangs
    on the chip fails alone instead of taking the whole run's time."""
    if not seconds or _version("pytest-timeout") is None:
        return []
    # The plugin registers itself through its entry point once installed.
    return [f"--timeout={seconds:g}"]


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """Device kind and library versions, read in a child process (so this one never
    holds the chip while pytest needs it)."""
    code = (
        "import jax, json; d = jax.devices()[0]; "
        "print(json.dumps({'backend': jax.default_backend(), 'device_kind': d.device_kind, "
        "'device_count': jax.device_count()}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    libtpu = _version("libtpu") or _version("libtpu-nightly")
    info.update(jax=_version("jax"), jaxlib=_version("jaxlib"), libtpu=libtpu)
    return info


def python_path(project: Path) -> str:
    """The project's own src/ first, so the lane runs the code in that folder, then
    the lane's pytest plugin, then what the machine already had."""
    return f"{project / 'src'}:{PLUGIN_DIR}:{os.environ.get('PYTHONPATH', '')}"


def stages_of(project: Path) -> list[dict]:
    with (project / "project.toml").open("rb") as f:
        return tomllib.load(f)["stages"]


def parse_junit(path: Path, stages: list[dict]) -> dict:
    """Per stage: passed, failed and skipped counts, seconds, and every skip and
    failure with its node id and message."""
    file_stage = {Path(t).name: s["id"] for s in stages for t in s["tests"]}
    result = {
        s["id"]: {
            "passed": 0,
            "failed": 0,
            "skipped": 0,
            "seconds": 0.0,
            "skips": [],
            "failures": [],
        }
        for s in stages
    }
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1] + ".py"
        stage = file_stage.get(module)
        if stage is None:
            continue
        entry = result[stage]
        entry["seconds"] += float(case.get("time", 0.0))
        node = f"{module}::{case.get('name')}"
        skipped = case.find("skipped")
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        if skipped is not None:
            entry["skipped"] += 1
            entry["skips"].append({"test": node, "reason": skipped.get("message", "")})
        elif failed is not None:
            entry["failed"] += 1
            entry["failures"].append({"test": node, "message": failed.get("message", "")[:400]})
        else:
            entry["passed"] += 1
    return result


def declared_skips(stages: list[dict], backend: str) -> dict[str, str]:
    """Test file name -> why its stage cannot run here, from the stage's declared
    hardware: a `cpu-multi-device` stage's claims are about several CPU devices
    simulated in one process (and processes talking over sockets), which a
    machine whose default backend is an accelerator does not give its tests."""
    skips = {}
    for stage in stages:
        if stage.get("hardware") == "cpu-multi-device" and backend != "cpu":
            reason = (
                f"stage {stage['id']} declares hardware `cpu-multi-device` (several CPU "
                f"devices simulated in one process); JAX's default backend here is `{backend}`"
            )
            skips.update({Path(t).name: reason for t in stage["tests"]})
    return skips


def run_stages(
    project: Path,
    out: Path,
    mode: str,
    only: list[str] | None = None,
    timeout: float = 540,
    keyword: str | None = None,
    test_timeout: float | None = None,
    backend: str = "cpu",
) -> dict:
    stages = [s for s in stages_of(project) if not only or s["id"] in only]
    files = [t for s in stages for t in s["tests"]]
    # The figures each test observed on the chip are kept beside the report.
    env = {
        **os.environ,
        "PYTHONPATH": python_path(project),
        "EVIDENCE_DIR": str(out / f"evidence-{project.name}-{mode}"),
        "LANE_SKIP_FILES": json.dumps(declared_skips(stages, backend)),
    }
    if mode != "auto":
        env[f"{project.name.replace('-', '_').upper()}_MODE"] = mode
    xml = out / f"junit-{project.name}-{mode}.xml"
    start = time.perf_counter()
    select = ["-k", keyword] if keyword else []
    code, output = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            *PYTEST_ARGS,
            *per_test_timeout(test_timeout),
            *select,
            f"--junitxml={xml}",
            *files,
        ],
        cwd=project,
        env=env,
        timeout=timeout,
    )
    seconds = time.perf_counter() - start
    sys.stdout.write(output[-4000:])
    if xml.exists():
        # Kept reports name files relative to the project, never this machine's paths.
        xml.write_text(xml.read_text().replace(f"{project}/", ""))
    parsed = parse_junit(xml, stages) if xml.exists() else {}
    return {"mode": mode, "exit_code": code, "wall_seconds": seconds, "stages": parsed}


def _run(argv: list[str], cwd: Path, env: dict, timeout: float) -> tuple[int | str, str]:
    """Runs `argv` in a process group of its own; past `timeout` the whole group is
    killed (a pytest left running would keep holding the chip)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        # SIGINT first: pytest then ends the session and still writes its JUnit
        # XML for the tests that ran; whatever is left after a grace period is killed.
        os.killpg(proc.pid, signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        return "timeout", output


def run_bugs(
    project: Path,
    stages: list[str] | None,
    timeout: float,
    only: list[str] | None = None,
    budget: float | None = None,
    keep=lambda results: None,
) -> list[dict]:
    """Each chosen seeded bug (by stage, or by id with `only`) applied alone to a
    scratch copy, its tests run with `-x`; no bug starts once `budget` seconds
    have passed, and none runs past what is left of it. `keep` is called with the
    results after every bug, so a run stopped from outside loses none."""
    with (project / "seeded_bugs.toml").open("rb") as f:
        bugs = tomllib.load(f)["bugs"]
    results: list[dict] = []
    began = time.perf_counter()
    for bug in bugs:
        if stages and bug["stage"] not in stages:
            continue
        if only and bug["id"] not in only:
            continue
        left = timeout if budget is None else min(timeout, budget - (time.perf_counter() - began))
        if left <= 5:
            print(f"{bug['id']}: not started, the budget is spent", flush=True)
            break
        with tempfile.TemporaryDirectory() as scratch:
            copy = Path(scratch) / project.name
            shutil.copytree(project, copy, ignore=shutil.ignore_patterns("evidence", "runs"))
            target = copy / bug["file"]
            text = target.read_text()
            if text.count(bug["find"]) != 1:
                results.append({"id": bug["id"], "stage": bug["stage"], "outcome": "stale"})
                continue
            target.write_text(text.replace(bug["find"], bug["replace"]))
            env = {
                **os.environ,
                "PYTHONPATH": python_path(copy),
                "EVIDENCE_DIR": str(Path(scratch) / "evidence"),
            }
            start = time.perf_counter()
            code, _ = _run(
                [sys.executable, "-m", "pytest", *PYTEST_ARGS, "-x", *bug["tests"]],
                cwd=copy,
                env=env,
                timeout=left,
            )
            outcome = {1: "caught", 0: "survived"}.get(code, "broken")
            results.append(
                {
                    "id": bug["id"],
                    "stage": bug["stage"],
                    "outcome": outcome,
                    "exit_code": code,
                    "seconds": time.perf_counter() - start,
                }
            )
            print(f"{bug['id']}: {outcome}", flush=True)
            keep(results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("project")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--mode", action="append", default=None)
    run.add_argument("--stage", action="append", default=None)
    run.add_argument("--timeout", type=float, default=540.0)
    run.add_argument("-k", dest="keyword", default=None)
    run.add_argument("--test-timeout", type=float, default=None, help="seconds per test")
    bug = sub.add_parser("bugs")
    bug.add_argument("project")
    bug.add_argument("--out", type=Path, required=True)
    bug.add_argument("--stage", action="append", default=None)
    bug.add_argument("--timeout", type=float, default=240.0, help="seconds per bug")
    bug.add_argument("--only", action="append", default=None, help="a seeded bug's id")
    bug.add_argument("--budget", type=float, default=None, help="seconds for all bugs")
    args = parser.parse_args()
    project = ROOT / "projects" / args.project
    args.out.mkdir(parents=True, exist_ok=True)
    # One reading per output folder: each reading opens the chip, which costs seconds.
    cached = args.out / "machine.json"
    if not cached.exists():
        cached.write_text(json.dumps(machine()) + "\n")
    info = json.loads(cached.read_text())
    payload = {"machine": info, "project": project.name, "written_at": int(time.time())}
    if args.command == "run":
        modes = args.mode or ["auto"]
        payload["runs"] = [
            run_stages(
                project,
                args.out,
                m,
                args.stage,
                args.timeout,
                args.keyword,
                args.test_timeout,
                info["backend"],
            )
            for m in modes
        ]
    name = f"lane-{args.command}-{project.name}-{int(time.time())}.json"

    def keep(results: list[dict]) -> None:
        payload["bugs"] = results
        (args.out / name).write_text(json.dumps(payload, indent=1) + "\n")

    if args.command == "bugs":
        payload["bugs"] = run_bugs(
            project, args.stage, args.timeout, args.only, args.budget, keep=keep
        )
    (args.out / name).write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
