"""`sharded-training bench`: the profile's optimization timed at the default
batch and at batch 16, and checkpoint blocking, each ratio with its baseline,
A/A control and per-round spread.

What runs (8 simulated CPU devices, the (4, 2) mesh, the default model):
1. The trace-backed profile (`profile.run_profile`) at the DEFAULT batch (96),
   written to `<out stem>-profile/` (report.json, report.md, the trace).
2. Interleaved timing, outside the trace, of six paths (`profile.Variant`):
   `before` (one training step per compiled call), `after` (8 steps per call,
   `lax.scan`) and `before_aa` (a second copy of `before`: the A/A control), at
   batch 96 and again at batch 16 (suffix `_b16`). One round runs every path
   for `BLOCK_STEPS` training steps, in an order shuffled each round (seeded);
   a path's value for the round is seconds per training step. Compile
   (`lower().compile()`) is timed apart; every call ends in
   `block_until_ready`; every path reads the training pipeline with the same
   prefetch depth in steps.
3. Checkpoint blocking: how long `CheckpointManager.save` blocks the loop,
   async against sync saves, with a second sync manager as the A/A control,
   interleaved per round (order rotated), every earlier save (of any manager)
   waited for outside the timed call.

Ratios (`<a>_vs_<b>`: above 1, `a` takes less time):
  `after_vs_before`                      batch 96: t(before) / t(after)
  `before_vs_before_aa`                  batch 96 A/A: t(before_aa) / t(before)
  `after_vs_before_batch16`              batch 16: t(before_b16) / t(after_b16)
  `before_vs_before_aa_batch16`          batch 16 A/A
  `async_vs_sync_checkpoint_blocking`    t(sync save) / t(async save)
  `sync_vs_sync_aa_checkpoint_blocking`  checkpoint A/A
each from the medians of its paths; `ratio_details` adds the baseline (a
sentence), the A/A, the per-round ratios and their min, median and max.
"""

import json
import os
import random
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from sharded_training import checkpoint, profile, sharding, train
from sharded_training.config import Config

BLOCK_STEPS = profile.BLOCK_STEPS
BASELINE_STEP = (
    "One training step per compiled call (`jax.jit` of `train_step`, compiled ahead of "
    "time), fed by the same Grain pipeline with the same prefetch depth in steps: the "
    "plain training loop."
)
BASELINE_SYNC = (
    "`CheckpointManager.save` with synchronous saves (Orbax, the same state and "
    "manager options): the loop waits for the write."
)


def bench_config(batch_size: int | None = None) -> Config:
    """The profile's config (default model and mesh, no dropout, a long data stream) at
    `batch_size`, by default the default config's batch."""
    batch = Config.default().batch_size if batch_size is None else batch_size
    return profile.profile_config().model_copy(update={"batch_size": batch})


def _details(baseline: str, value: float, aa: float, rounds: list[float]) -> dict[str, Any]:
    """A ratio's record; `min <= median <= max` of the per-round ratios."""
    return {
        "baseline": baseline,
        "value": value,
        "aa": aa,
        "rounds": rounds,
        "min": min(rounds),
        "median": statistics.median(rounds),
        "max": max(rounds),
    }


def _summary(times: list[float], compile_s: float, unit: str) -> dict[str, Any]:
    return {
        "compile_s": compile_s,
        "median_s": statistics.median(times),
        "p90_s": float(np.percentile(times, 90)),
        "min_s": min(times),
        "max_s": max(times),
        "n": len(times),
        "unit": unit,
        "times_s": times,
    }


def time_steps(batches: dict[str, Config], rounds: int, say) -> dict[str, dict[str, Any]]:
    """Per path (`before`, `after`, `before_aa`, each with the batch's suffix): seconds
    per training step in each of `rounds` interleaved rounds, and its compile time."""
    paths: dict[str, profile.Variant] = {}
    for suffix, config in batches.items():
        mesh = sharding.make_mesh(config.mesh_shape)
        for name, k in (("before", 1), ("after", profile.STEPS_PER_CALL), ("before_aa", 1)):
            paths[name + suffix] = profile.Variant(name + suffix, config, mesh, k)
    for v in paths.values():  # Warm-up: first calls, Grain threads started.
        for i in range(2):
            v.iteration(i)
    names = list(paths)
    per_step: dict[str, list[float]] = {n: [] for n in names}
    order = random.Random(0)
    for r in range(rounds):
        # A seeded shuffle, not a rotation: a rotation keeps each path's predecessor
        # fixed, and a predecessor's Grain reader refilling its prefetch in the
        # background (more work at batch 96) would then always slow the same path.
        for name in order.sample(names, len(names)):
            v = paths[name]
            start = time.perf_counter()
            for i in range(BLOCK_STEPS // v.k):
                v.iteration(i)
            per_step[name].append((time.perf_counter() - start) / BLOCK_STEPS)
        if (r + 1) % 10 == 0:
            say(f"  timing round {r + 1}/{rounds}")
    return {
        name: {
            **_summary(per_step[name], paths[name].compile_s, "seconds per training step"),
            "batch_size": paths[name].config.batch_size,
            "steps_per_call": paths[name].k,
        }
        for name in names
    }


def checkpoint_blocking(config: Config, workdir: Path, reps: int) -> dict[str, dict[str, Any]]:
    """Seconds `save` blocks the caller, per manager: `async`, `sync`, `sync_aa`."""
    mesh = sharding.make_mesh(config.mesh_shape)
    arrays = checkpoint.to_arrays(train.init_state(config, mesh))
    jax.block_until_ready(arrays)
    meta = {"step": 0, "config_sha256": config.digest(), "process_count": 1}
    kinds = {"async": True, "sync": False, "sync_aa": False}
    managers = {}
    for name, async_save in kinds.items():
        shutil.rmtree(workdir / f"ckpt_{name}", ignore_errors=True)  # Orbax skips old steps.
        managers[name] = checkpoint.manager(workdir / f"ckpt_{name}", config, async_save=async_save)
    times: dict[str, list[float]] = {n: [] for n in managers}
    names = list(managers)
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            manager = managers[name]
            for other in managers.values():  # No earlier save, of any manager, counts here.
                other.wait_until_finished()
            start = time.perf_counter()
            manager.save(
                rep + 1, args=checkpoint.save_args(arrays, None, {**meta, "step": rep + 1})
            )
            times[name].append(time.perf_counter() - start)
    for manager in managers.values():
        manager.wait_until_finished()
        manager.close()
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(arrays))
    return {
        name: {**_summary(t, 0.0, "seconds save() blocks"), "state_bytes": state_bytes}
        for name, t in times.items()
    }


def ratios_of(m: dict[str, dict[str, Any]]) -> tuple[dict[str, float], dict[str, Any]]:
    """The ratios and their details from the measurements' medians and rounds."""

    def med(name: str) -> float:
        return m[name]["median_s"]

    def rounds(fast: str, base: str) -> list[float]:
        return [b / f for f, b in zip(m[fast]["times_s"], m[base]["times_s"], strict=True)]

    ratios, details = {}, {}
    for suffix, tag in (("", ""), ("_b16", "_batch16")):
        batch = m["before" + suffix]["batch_size"]
        aa = med("before_aa" + suffix) / med("before" + suffix)
        ratios["after_vs_before" + tag] = med("before" + suffix) / med("after" + suffix)
        ratios["before_vs_before_aa" + tag] = aa
        details["after_vs_before" + tag] = _details(
            f"{BASELINE_STEP} Batch {batch}.",
            ratios["after_vs_before" + tag],
            aa,
            rounds("after" + suffix, "before" + suffix),
        )
        details["before_vs_before_aa" + tag] = _details(
            f"A/A: the baseline (batch {batch}) against a second copy of itself.",
            aa,
            aa,
            rounds("before" + suffix, "before_aa" + suffix),
        )
    aa = med("checkpoint/sync_aa") / med("checkpoint/sync")
    ratios["async_vs_sync_checkpoint_blocking"] = med("checkpoint/sync") / med("checkpoint/async")
    ratios["sync_vs_sync_aa_checkpoint_blocking"] = aa
    details["async_vs_sync_checkpoint_blocking"] = _details(
        BASELINE_SYNC,
        ratios["async_vs_sync_checkpoint_blocking"],
        aa,
        rounds("checkpoint/async", "checkpoint/sync"),
    )
    details["sync_vs_sync_aa_checkpoint_blocking"] = _details(
        "A/A: synchronous saves against a second synchronous manager.",
        aa,
        aa,
        rounds("checkpoint/sync", "checkpoint/sync_aa"),
    )
    return ratios, details


def run_bench(
    out: Path, *, steps: int = 40, rounds: int = 20, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """Profile at the default batch, time both batches and checkpoint blocking, write
    `out` (JSON) and `out` with `.png` (the profile's step breakdown)."""
    profile_dir = out.parent / (out.stem + "-profile")
    config = bench_config()
    progress(f"profile at batch {config.batch_size} into {profile_dir}")
    report = profile.run_profile(config, profile_dir, steps=steps, rounds=rounds, progress=progress)
    progress(f"timing at batch {config.batch_size} and 16, {rounds} interleaved rounds")
    measurements = time_steps({"": config, "_b16": bench_config(16)}, rounds, progress)
    progress("timing checkpoint blocking")
    ckpt = checkpoint_blocking(config, profile_dir, reps=max(rounds // 2, 3))
    measurements.update({f"checkpoint/{k}": v for k, v in ckpt.items()})
    ratios, details = ratios_of(measurements)
    identity = profile.identity(config)
    identity["loadavg_at_end"] = list(os.getloadavg())
    bench = {
        "identity": identity,
        "measurements": measurements,
        "ratios": ratios,
        "ratio_details": details,
        "trace": report["trace"],
        "roofline": report["roofline"],
        "losses": report["losses"],
        "profile": {
            # Relative to the report, so a kept report names no path of the machine.
            "directory": profile_dir.name,
            "batch_size": config.batch_size,
            "ratios_from_its_own_timing": report["ratios"],
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(bench, indent=1) + "\n")
    (profile_dir / "step_breakdown.png").replace(out.with_suffix(".png"))
    return bench


def summary_text(bench: dict[str, Any]) -> str:
    lines = []
    for name, value in bench["ratios"].items():
        d = bench["ratio_details"][name]
        lines.append(
            f"{name:<38} {value:6.2f}  rounds {d['min']:.2f}-{d['max']:.2f}  A/A {d['aa']:.2f}"
        )
    lines.append(f"losses bitwise equal: {bench['losses']['bitwise_equal']}")
    return "\n".join(lines)
