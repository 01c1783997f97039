"""Fault drills: every fault kind, repeated, each in its own supervised job.

`run_drills(config, out)` starts `repeats` jobs per fault kind, `parallel` at
a time (each job is one process group of its own, so concurrent drills cannot
disturb each other's evidence), and compares each diagnosis with the fault
that was injected. The summary (`summary.json`, `detection.png`) holds, per
fault: the classifications, the detection time in heartbeat intervals against
its bound, and whether any process of the group was left behind.
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workload_operations import diagnose, faults
from workload_operations.config import Config, ConfigError, check_output_path
from workload_operations.supervisor import Supervisor


def drill_one(config: Config, workdir: Path, fault: faults.Fault, cache: Path) -> dict:
    outcome = Supervisor(config, workdir, fault=str(fault), compilation_cache=cache).run()
    incident = outcome.incident or {}
    detection = incident.get("detection", {})
    termination = outcome.termination or {}
    return {
        "fault": fault.kind,
        "workdir": str(workdir),
        "expected": diagnose.EXPECTED[fault.kind],
        "classification": outcome.status,
        "correct": outcome.status == diagnose.EXPECTED[fault.kind],
        "intervals_since_fault": detection.get("intervals_since_fault"),
        "bound_intervals": detection.get("bound_intervals"),
        "within_bound": detection.get("within_bound"),
        "stack_dumped": termination.get("stack_dumped"),
        "members_before": termination.get("members_before"),
        "left": termination.get("left"),
        "zombies": termination.get("zombies"),
        "incident": outcome.incident_path,
        "returncode": outcome.returncode,
    }


def summarize(results: list[dict], kinds: list[str]) -> dict:
    per_fault = {}
    for kind in kinds:
        rows = [r for r in results if r["fault"] == kind]
        intervals = [
            r["intervals_since_fault"] for r in rows if r["intervals_since_fault"] is not None
        ]
        per_fault[kind] = {
            "runs": len(rows),
            "correct": sum(r["correct"] for r in rows),
            "classifications": [r["classification"] for r in rows],
            "detection_intervals": intervals,
            "bound_intervals": rows[0]["bound_intervals"] if rows else None,
            "all_within_bound": all(r["within_bound"] for r in rows),
            "processes_left": sum(len(r["left"] or []) for r in rows),
        }
    total = len(results)
    correct = sum(r["correct"] for r in results)
    within = all(f["all_within_bound"] for f in per_fault.values())
    left = sum(f["processes_left"] for f in per_fault.values())
    verdict = (
        f"{correct} of {total} classifications correct; detection "
        f"{'within' if within else 'NOT within'} its bound in every run; "
        f"{left} process(es) left behind."
    )
    return {
        "runs": total,
        "correct": correct,
        "all_within_bound": within,
        "processes_left": left,
        "verdict": verdict,
        "per_fault": per_fault,
    }


def run_drills(
    config: Config,
    out: str | Path,
    *,
    kinds: list[str] | None = None,
    repeats: int = 5,
    parallel: int = 6,
    at_step: int = 24,
    compilation_cache: str | Path | None = None,
    say=None,
) -> dict:
    """Runs the drills and writes `summary.json` into `out`. Repetition `r` injects
    its faults after step `at_step + 2 r`: the same fault at another point of the run."""
    say = say or (lambda _: None)
    if not isinstance(config, Config):
        raise ConfigError(f"`config` must be a `Config`, not a `{type(config).__name__}`.")
    kinds = list(kinds or faults.DRILL_FAULTS)
    for kind in kinds:
        if kind not in faults.DRILL_FAULTS:
            raise faults.FaultError(
                f"Unknown drill fault `{kind}`; choose from {', '.join(faults.DRILL_FAULTS)}."
            )
    for name, value in (("repeats", repeats), ("parallel", parallel), ("at_step", at_step)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise faults.FaultError(f"`{name}` must be a positive integer, not `{value}`.")
    config = config.replace(sidecar=True, checkpoint_every=0)
    plan = [faults.Fault(kind, at_step + 2 * rep) for rep in range(repeats) for kind in kinds]
    for fault in plan:  # Every fault is checked before anything is written or started.
        faults.check(fault, config)
    out = check_output_path(out, directory=True, what="The drill folder").absolute()
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(compilation_cache) if compilation_cache else out / "jax-cache"
    started = time.monotonic()
    results = []
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [
            pool.submit(drill_one, config, out / f"{f.kind}-{i // len(kinds)}", f, cache)
            for i, f in enumerate(plan)
        ]
        for number, future in enumerate(futures, 1):
            result = future.result()
            results.append(result)
            say(
                f"[{number:>2}/{len(plan)}] {result['fault']:<10} -> {result['classification']:<10}"
                f" {'ok' if result['correct'] else 'WRONG'}  detection "
                f"{_fmt(result['intervals_since_fault'])} / "
                f"{_fmt(result['bound_intervals'])} intervals"
            )
    summary = summarize(results, kinds)
    summary.update(
        config=config.model_dump(mode="json"),
        wall_s=time.monotonic() - started,
        results=results,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1f}"
