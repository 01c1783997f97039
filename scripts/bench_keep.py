"""Run a project's stated bench command on a quiet machine and keep its report.

    .venv/bin/python scripts/bench_keep.py <project-id> [--as rerun|run] [--max-busy F]

Runs `<project-id> bench --out runs/bench.json` in the project's folder (the
command its README's bench block names), then copies the report into the
project's `benchmarks/` as the next `rerun-<n>.json` (or `run-<n>.json`) with
a `host` record added, and rewrites the README block from the kept files.

`host` says where the figures were taken, which the benches' own `identity`
(versions, backend, commit) does not: the CPU's vendor, model name, family,
model and stepping, its vector extensions (AVX2, AVX-512, AMX: XLA's CPU code
and oneDNN take different kernels on each), the core count, the load average
before and after, and the UTC time. A ratio such as JAX-vs-PyTorch can move
between two CPUs of one machine kind by more than any within-run A/A control
shows, so a rerun is only comparable with runs whose CPU it names.

The bench is refused (exit 3) when, over a 3-second sample of `/proc/stat`
just before it starts, more than `--max-busy` of the CPU time (default 0.2)
went to other work: a stated range is a quiet machine's, and a bench beside
other work would be checked against it. (The load average lags by a minute,
so it is recorded but does not decide.) Exit 2
on a bench that fails or writes no report; nothing is kept then.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench_readme import bench_files, update_readme
from bench_summary import cpu_label

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ("bench", "--out", "runs/bench.json")
# The extensions that decide which kernels XLA and oneDNN pick on x86.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")


def cpu_record(cpuinfo: str) -> dict:
    """The first processor's identity from the text of `/proc/cpuinfo`:
    vendor, model name, family, model, stepping and which of `VECTOR_FLAGS`
    it has. Fields the text lacks are absent (other architectures)."""
    first = cpuinfo.split("\n\n", 1)[0]
    fields = {}
    for line in first.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    names = {
        "vendor_id": "vendor",
        "model name": "model_name",
        "cpu family": "family",
        "model": "model",
        "stepping": "stepping",
    }
    record = {ours: fields[theirs] for theirs, ours in names.items() if theirs in fields}
    flags = set(fields.get("flags", "").split())
    record["vector_flags"] = [f for f in VECTOR_FLAGS if f in flags]
    return record


def busy_fraction(seconds: float = 3.0) -> float | None:
    """The share of all cores' time not idle over `seconds`, from two reads of
    `/proc/stat`'s `cpu` line; None where that file does not exist."""

    def times() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = times()
        time.sleep(seconds)
        total1, idle1 = times()
    except OSError:
        return None
    elapsed = total1 - total0
    return 1.0 - (idle1 - idle0) / elapsed if elapsed > 0 else 0.0


def host_record(load_before: tuple[float, float, float], busy_before: float | None) -> dict:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return {
        "cpu": cpu_record(cpuinfo) | ({} if cpuinfo else {"model_name": platform.processor()}),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "busy_before": busy_before,
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
        "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def keep(project: Path, report: Path, host: dict, kind: str) -> Path:
    """Copies `report` into `project/benchmarks/<kind>-<n>.json` (n one past
    the highest kept) with `host` added; written to a temporary name first
    and renamed, so a crash never leaves half a report among the kept ones.
    Raises ValueError on a file that is not a bench report."""
    try:
        data = json.loads(report.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the bench report {report}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("ratios"), dict):
        raise ValueError(f"{report} has no `ratios` object; is it a bench report?")
    data["host"] = host
    runs, reruns = bench_files(project)
    kept = runs if kind == "run" else reruns
    number = 1 + max((int(p.stem.rsplit("-", 1)[1]) for p in kept), default=0)
    target = project / "benchmarks" / f"{kind}-{number}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".json.partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(partial, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project", help="a project id under projects/")
    parser.add_argument("--as", dest="kind", choices=("rerun", "run"), default="rerun")
    parser.add_argument("--max-busy", type=float, default=0.2)
    args = parser.parse_args(argv)
    project = ROOT / "projects" / args.project
    if not (project / "pyproject.toml").is_file():
        print(f"error: no project {args.project!r} under projects/", file=sys.stderr)
        return 2
    executable = shutil.which(args.project, path=str(Path(sys.executable).parent))
    if executable is None:
        print(f"error: `{args.project}` is not installed beside {sys.executable}", file=sys.stderr)
        return 2
    load = os.getloadavg()
    busy = busy_fraction()
    if busy is not None and busy > args.max_busy:
        print(
            f"error: {busy:.0%} of the CPU went to other work in the last 3 s "
            f"(--max-busy {args.max_busy:.0%}); a bench kept as evidence must run "
            "on a quiet machine",
            file=sys.stderr,
        )
        return 3
    out = project / "runs" / "bench.json"
    out.unlink(missing_ok=True)
    print(f"{args.project}: {args.project} {' '.join(COMMAND)}", flush=True)
    started = time.monotonic()
    result = subprocess.run([executable, *COMMAND], cwd=project)
    if result.returncode != 0 or not out.is_file():
        print(f"error: the bench exited {result.returncode} without a report", file=sys.stderr)
        return 2
    host = host_record(load, busy)
    try:
        target = keep(project, out, host, args.kind)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(
        f"{args.project}: kept {target.relative_to(ROOT)} after "
        f"{time.monotonic() - started:.0f} s on {cpu_label(host)}"
    )
    return update_readme(project)


if __name__ == "__main__":
    sys.exit(main())
