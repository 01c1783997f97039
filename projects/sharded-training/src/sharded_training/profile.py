"""A trace-backed before-and-after report: `sharded-training profile`.

1. Trace: both variants train under `jax.profiler.trace`; the `.xplane.pb` is
   read back in code (`jax.profiler.ProfileData`) and every step is split into
   the trace's own events: `input_wait` (Grain `next`), `host_to_device`
   (`make_array_from_process_local_data`), `dispatch` (the jitted call),
   `device_sync` (waiting for the loss), and on the device threads
   `ThunkExecutor::Execute` (device work) and `Rendezvous` (devices waiting for
   each other inside collectives). The compile is annotated `compile` and kept
   apart from the steady steps.
2. Roofline: FLOPs and bytes per step from `compiled.cost_analysis()`, against
   a GEMM FLOP/s and a copy bytes/s ceiling measured in the same run.
3. The optimization: the baseline trace shows a step spent mostly on host-side
   work per call (input fetch, transfer, dispatch, sync) around a short device
   execution. `K` training steps per compiled call (`lax.scan` over K batches
   that Grain stacks into one item) pays those per-call costs once per K steps.
   Same updates in the same order: the losses must not change.
4. Timing apart from the trace: the variants run interleaved (A B A' ...) for
   >= 20 rounds with an A/A control (a second copy of the baseline), every
   round ends in `block_until_ready`; median and p90 per step.
5. Checkpoint blocking: how long `CheckpointManager.save` blocks the training
   loop with async saves vs synchronous ones, interleaved, same state.
"""

import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sharded_training import checkpoint, data, plots, sharding, train
from sharded_training.config import Config

STEPS_PER_CALL = 8
PREFETCH_STEPS = 16
BLOCK_STEPS = 64  # Steps per variant per timing round: 8 calls of the optimized variant.
CATEGORIES = ("input_wait", "host_to_device", "dispatch", "device_sync")


def profile_config() -> Config:
    """The default model (32-256-8 MLP, (4, 2) mesh) at batch 16, with a long data stream.

    At batch 16 the work per step is small and the per-call costs dominate; at the
    default batch 96, Grain's per-example shuffle makes `input_wait` the largest
    event instead (run `profile --config` with such a config to see the trace say so)."""
    return Config.default().model_copy(
        update={"num_steps": 100_000, "dropout_rate": 0.0, "batch_size": 16}
    )


# ---------------------------------------------------------------- the two variants


def make_multi_step_fn(config: Config, mesh, like: train.TrainState, k: int):
    """K training steps in one compiled call: `lax.scan` of `train_step` over a
    stack of K batches `(K, batch, ...)`; returns the state and the K losses."""
    shardings = train.state_shardings(like)
    stacked = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "data"))
    rep = sharding.replicated(mesh)
    optimizer = train.make_optimizer(config)

    def steps(state, batches):
        def body(state, batch):
            state, metrics = train.train_step(state, batch, optimizer, config.dropout_rate)
            return state, metrics["loss"]

        return jax.lax.scan(body, state, batches)

    abstract = {
        "x": jax.ShapeDtypeStruct(
            (k, config.batch_size, config.num_features), jnp.float32, sharding=stacked
        ),
        "y": jax.ShapeDtypeStruct((k, config.batch_size), jnp.int32, sharding=stacked),
        "mask": jax.ShapeDtypeStruct((k, config.batch_size), jnp.float32, sharding=stacked),
    }
    fn = jax.jit(
        steps,
        in_shardings=(shardings, {n: stacked for n in abstract}),
        out_shardings=(shardings, rep),
    )
    return fn.lower(like, abstract).compile(), stacked


class Variant:
    """A training loop that advances `steps_per_call` steps per iteration."""

    def __init__(self, name: str, config: Config, mesh, steps_per_call: int):
        self.name, self.config, self.mesh, self.k = name, config, mesh, steps_per_call
        self.state = train.init_state(config, mesh)
        # The training pipeline (one Grain reader thread), with the same prefetch depth
        # in STEPS for every variant, so that interleaved timing cannot hand one variant
        # more input made in the background while the others ran.
        self.iterator = data.local_iterator(
            config, steps_per_item=steps_per_call, prefetch_steps=PREFETCH_STEPS
        )
        start = time.perf_counter()
        with jax.profiler.TraceAnnotation("compile"):
            if steps_per_call == 1:
                self.fn, _, _ = train.compile_step(config, mesh, self.state)
                self.sharding = sharding.batch_sharding(mesh)
            else:
                self.fn, self.sharding = make_multi_step_fn(
                    config, mesh, self.state, steps_per_call
                )
        self.compile_s = time.perf_counter() - start
        self.losses: list[float] = []
        self.wall_s: list[float] = []  # perf_counter duration of every iteration.

    def iteration(self, step_num: int) -> None:
        """One call: fetch input, move it to the devices, run, wait for the losses."""
        start = time.perf_counter()
        with jax.profiler.StepTraceAnnotation("train_iteration", step_num=step_num):
            with jax.profiler.TraceAnnotation("input_wait"):
                batch = next(self.iterator)
            with jax.profiler.TraceAnnotation("host_to_device"):
                arrays = {n: jax.device_put(batch[n], self.sharding) for n in ("x", "y", "mask")}
            with jax.profiler.TraceAnnotation("dispatch"):
                self.state, out = self.fn(self.state, arrays)
            with jax.profiler.TraceAnnotation("device_sync"):
                loss = out if self.k > 1 else out["loss"]
                values = np.asarray(jax.block_until_ready(loss)).reshape(-1)
        self.wall_s.append(time.perf_counter() - start)
        self.losses.extend(float(v) for v in values)


# ---------------------------------------------------------------- reading the trace


def _intervals_union(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def read_trace(logdir: Path) -> dict[str, Any]:
    """Per variant and iteration: the duration of each annotated category and of
    the device events inside it, from the `.xplane.pb` that `jax.profiler.trace` wrote."""
    paths = sorted(glob.glob(str(logdir / "**" / "*.xplane.pb"), recursive=True))
    if not paths:
        raise RuntimeError(f"No `.xplane.pb` under `{logdir}`: the trace was not written.")
    profile = jax.profiler.ProfileData.from_file(paths[-1])
    host, device_busy, rendezvous, compiler_spans, collective_ops = [], [], [], [], []
    for plane in profile.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            events = [(e.name, e.start_ns, e.start_ns + e.duration_ns) for e in line.events]
            # Our annotations sit on the main thread's line (named after the process).
            host.extend(
                e for e in events if e[0] in (*CATEGORIES, "train_iteration", "compile", "variant")
            )
            if "XLAEigen" in line.name or "PjRtCpuClient" in line.name:
                device_busy.extend((s, e) for n, s, e in events if n == "ThunkExecutor::Execute")
                rendezvous.extend((s, e) for n, s, e in events if n == "Rendezvous")
                collective_ops.extend(
                    (n, s, e)
                    for n, s, e in events
                    if n.startswith(("all-reduce", "all-gather", "reduce-scatter"))
                )
            elif "Compiler" in line.name or "codegen" in line.name:
                compiler_spans.extend(
                    (s, e) for n, s, e in events if not n.startswith("Threadpool")
                )
    return {
        "path": paths[-1],
        "host": host,
        "device_busy": device_busy,
        "rendezvous": rendezvous,
        "collective_ops": collective_ops,
        "compiler_thread_ns": _intervals_union(compiler_spans),
    }


def breakdown(
    trace: dict[str, Any], window: tuple[int, int], steps_per_call: int, skip: int = 2
) -> dict[str, Any]:
    """Median per-STEP seconds of each category over the steady iterations inside
    `window` (the variant's annotated span); the first `skip` iterations are warm-up
    [claim:breakdown-skips-warm-up].

    Cases, for each steady iteration `[s, e)` (nanoseconds):
      `iteration` -> `e - s` [claim:breakdown-iteration-duration].
      a category of `CATEGORIES` -> the full durations of its host events whose START
        lies in `[s, e)`: one starting at `e`, or before `s`, belongs to no step
        [claim:breakdown-host-events-by-start].
      `device_busy`, `collective_wait`, `all_reduce` -> the device, `rendezvous` and
        `collective_ops` intervals clipped to `[s, e)` and unioned (`_intervals_union`):
        overlaps count once, an interval ending at `s` or starting at `e` counts 0
        [claim:breakdown-intervals-clipped-unioned].
      `per_step_s[c]` -> the median of `per[c]` / 1e9 / `steps_per_call`; 0.0 if empty
        [claim:breakdown-median-per-step].
    The lists in `per` are read again after the region (fractions, excess).
    """
    iterations = sorted(
        (s, e)
        for n, s, e in trace["host"]
        if n == "train_iteration" and window[0] <= s <= window[1]
    )[skip:]
    per = {
        c: [] for c in (*CATEGORIES, "iteration", "device_busy", "collective_wait", "all_reduce")
    }
    # --- exercise stage 4: Per step: its own events; union the overlapping thread intervals. ---
    for s, e in iterations:
        per["iteration"].append(e - s)
        for c in CATEGORIES:
            per[c].append(sum(ee - ss for n, ss, ee in trace["host"] if n == c and s <= ss < e))
        inside = [(max(ss, s), min(ee, e)) for ss, ee in trace["device_busy"] if ee > s and ss < e]
        per["device_busy"].append(_intervals_union(inside))
        inside = [(max(ss, s), min(ee, e)) for ss, ee in trace["rendezvous"] if ee > s and ss < e]
        per["collective_wait"].append(_intervals_union(inside))
        inside = [
            (max(ss, s), min(ee, e)) for _, ss, ee in trace["collective_ops"] if ee > s and ss < e
        ]
        per["all_reduce"].append(_intervals_union(inside))
    median = {c: statistics.median(v) / 1e9 / steps_per_call if v else 0.0 for c, v in per.items()}
    # --- end exercise ---
    compile_events = [
        (e - s) / 1e9 for n, s, e in trace["host"] if n == "compile" and window[0] <= s <= window[1]
    ]
    excess = [
        sum(per[c][i] for c in CATEGORIES) - per["iteration"][i] for i in range(len(iterations))
    ]
    fractions = {
        "host_side": [
            sum(per[c][i] for c in CATEGORIES) / per["iteration"][i] for i in range(len(iterations))
        ],
        "device_busy": [
            per["device_busy"][i] / per["iteration"][i] for i in range(len(iterations))
        ],
    }
    return {
        "iterations": len(iterations),
        "per_step_s": median,
        "parts_minus_step_max_s": max(excess, default=0) / 1e9,
        "fraction_of_step": {k: statistics.median(v) if v else 0.0 for k, v in fractions.items()},
        "iteration_s": [(e - s) / 1e9 for s, e in iterations],
        "compile_s_from_trace": sum(compile_events),
    }


# ---------------------------------------------------------------- ceilings and timing


def _time(fn: Callable[[], Any], reps: int) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ceilings() -> dict[str, float]:
    """GEMM FLOP/s and copy bytes/s on ONE device (one core's share), measured now."""
    device = jax.devices()[0]
    n = 512
    a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
    gemm = jax.jit(lambda x: x @ x)
    gemm_s = _time(lambda: gemm(a), 10)
    big = jax.device_put(jnp.ones((4 * 1024 * 1024,), jnp.float32), device)  # 16 MiB
    copy = jax.jit(lambda x: x * 1.0001)
    copy_s = _time(lambda: copy(big), 10)
    return {"gemm_flops_per_s": 2 * n**3 / gemm_s, "copy_bytes_per_s": 2 * big.nbytes / copy_s}


def cost(compiled) -> dict[str, float]:
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else {}
    return {
        "flops": float(analysis.get("flops", 0.0)),
        "bytes_accessed": float(analysis.get("bytes accessed", 0.0)),
    }


def checkpoint_blocking(config: Config, mesh, workdir: Path, reps: int) -> dict[str, Any]:
    """Seconds `save` blocks the caller: async vs sync Orbax managers, interleaved."""
    state = train.init_state(config, mesh)
    arrays = checkpoint.to_arrays(state)
    jax.block_until_ready(arrays)
    meta = {"step": 0, "config_sha256": config.digest(), "process_count": 1}
    for name in ("ckpt_async", "ckpt_sync"):  # Orbax skips steps that already exist.
        shutil.rmtree(workdir / name, ignore_errors=True)
    managers = {
        "async": checkpoint.manager(workdir / "ckpt_async", config, async_save=True),
        "sync": checkpoint.manager(workdir / "ckpt_sync", config, async_save=False),
    }
    times: dict[str, list[float]] = {"async": [], "sync": []}
    for rep in range(reps):
        for name, manager in managers.items():
            manager.wait_until_finished()  # The previous save must not count here.
            meta = {**meta, "step": rep + 1}
            start = time.perf_counter()
            manager.save(rep + 1, args=checkpoint.save_args(arrays, None, meta))
            times[name].append(time.perf_counter() - start)
    for manager in managers.values():
        manager.wait_until_finished()
        manager.close()
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(arrays))
    return {
        "state_bytes": state_bytes,
        "async_median_s": statistics.median(times["async"]),
        "sync_median_s": statistics.median(times["sync"]),
        "async_p90_s": float(np.percentile(times["async"], 90)),
        "sync_p90_s": float(np.percentile(times["sync"], 90)),
        "n": reps,
    }


def identity(config: Config) -> dict[str, Any]:
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        commit = "unknown"
    import jaxlib

    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "commit": commit,
        "config_sha256": config.digest(),
        "mesh_shape": list(config.mesh_shape),
    }


# ---------------------------------------------------------------- the report


def run_profile(
    config: Config,
    out: Path,
    *,
    steps: int = 40,
    rounds: int = 20,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Trace, optimize, time, and write `report.json`, `report.md`, `step_breakdown.png`."""
    say = progress or (lambda _: None)
    out.mkdir(parents=True, exist_ok=True)
    mesh = sharding.make_mesh(config.mesh_shape)
    k = STEPS_PER_CALL
    steps = max(k * 3, steps - steps % k)
    logdir = out / "trace"
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # Our annotations and JAX's events; no Python calls.
    windows: dict[str, tuple[int, int]] = {}
    variants: dict[str, Variant] = {}
    say(f"tracing {steps} steps per variant into {logdir}")
    with jax.profiler.trace(str(logdir), profiler_options=options):
        for name, per_call in (("before", 1), ("after", k)):
            start = time.perf_counter_ns()
            with jax.profiler.TraceAnnotation("variant"):
                variants[name] = variant = Variant(name, config, mesh, per_call)
                # At least 8 calls each, so that the steady median has samples.
                for i in range(max(steps // per_call, 8)):
                    variant.iteration(i)
            windows[name] = (start, time.perf_counter_ns())
    trace = read_trace(logdir)
    # The trace's clock and perf_counter_ns differ by an offset: take each variant's
    # window from its own top-level `variant` event instead.
    spans = sorted((s, e) for n, s, e in trace["host"] if n == "variant")
    windows = dict(zip(("before", "after"), spans, strict=True))
    found = {name: breakdown(trace, windows[name], v.k) for name, v in variants.items()}
    compared = min(len(variants["before"].losses), len(variants["after"].losses))
    losses_before = np.array(variants["before"].losses[:compared])
    losses_after = np.array(variants["after"].losses[:compared])
    traced_wall_s = {n: list(v.wall_s) for n, v in variants.items()}
    say("trace read; timing the variants interleaved")

    # Timing apart from the trace: A B A' rounds, one call of K steps per variant each.
    timers = {
        "before": variants["before"],
        "after": variants["after"],
        "before_aa": Variant("before_aa", config, mesh, 1),
    }
    for v in timers.values():  # Warm-up: first calls, Grain threads started.
        for i in range(2):
            v.iteration(i)
    per_step: dict[str, list[float]] = {n: [] for n in timers}
    for _ in range(rounds):
        for name, v in timers.items():
            start = time.perf_counter()
            for i in range(BLOCK_STEPS // v.k):
                v.iteration(i)
            per_step[name].append((time.perf_counter() - start) / BLOCK_STEPS)
    measurements = {
        name: {
            "compile_s": timers[name].compile_s,
            "median_s": statistics.median(t),
            "p90_s": float(np.percentile(t, 90)),
            "n": len(t),
            "unit": "seconds per training step",
        }
        for name, t in per_step.items()
    }
    say("measuring ceilings and checkpoint blocking")
    roof = ceilings()
    costs = cost(train.compile_step(config, mesh, variants["before"].state)[0])
    step_s = measurements["before"]["median_s"]
    n_devices = jax.device_count()
    ckpt = checkpoint_blocking(config, mesh, out, reps=max(rounds // 2, 6))
    ratios = {
        "after_vs_before": measurements["before"]["median_s"] / measurements["after"]["median_s"],
        "before_vs_before_aa": measurements["before_aa"]["median_s"]
        / measurements["before"]["median_s"],
        "async_vs_sync_checkpoint_blocking": ckpt["sync_median_s"] / ckpt["async_median_s"],
    }
    before = found["before"]["per_step_s"]
    report = {
        "identity": identity(config),
        "measurements": measurements,
        "ratios": ratios,
        "trace": {
            "file": str(Path(trace["path"]).relative_to(out)),
            "events_read": {
                "host": len(trace["host"]),
                "device_busy": len(trace["device_busy"]),
                "rendezvous": len(trace["rendezvous"]),
            },
            "per_step_s": {n: f["per_step_s"] for n, f in found.items()},
            "compile_s_from_trace": {n: f["compile_s_from_trace"] for n, f in found.items()},
            "parts_minus_step_max_s": {n: f["parts_minus_step_max_s"] for n, f in found.items()},
            "compiler_thread_s": trace["compiler_thread_ns"] / 1e9,
            "iteration_s_all": {
                n: [
                    (e - s) / 1e9
                    for s, e in sorted(
                        (s, e)
                        for nm, s, e in trace["host"]
                        if nm == "train_iteration" and windows[n][0] <= s <= windows[n][1]
                    )
                ]
                for n in found
            },
            "timer_iteration_s_all": traced_wall_s,
            "timer_compile_s": {n: v.compile_s for n, v in variants.items()},
            "bottleneck": max(CATEGORIES, key=lambda c: before[c]),
            "per_call_s_before": before["host_to_device"]
            + before["dispatch"]
            + before["device_sync"],
            "bottleneck_after": max(CATEGORIES, key=lambda c: found["after"]["per_step_s"][c]),
            "host_side_fraction_before": found["before"]["fraction_of_step"]["host_side"],
            "device_busy_fraction_before": found["before"]["fraction_of_step"]["device_busy"],
        },
        "roofline": {
            **costs,
            **roof,
            "note": "cost_analysis() counts one device's partitioned program; the ceilings "
            "are one device's GEMM and copy rates, measured in this run.",
            "flops_per_s_per_device": costs["flops"] / step_s,
            "fraction_of_gemm_ceiling": costs["flops"] / step_s / roof["gemm_flops_per_s"],
            "bytes_per_s_per_device": costs["bytes_accessed"] / step_s,
            "fraction_of_copy_ceiling": costs["bytes_accessed"] / step_s / roof["copy_bytes_per_s"],
            "arithmetic_intensity": costs["flops"] / max(costs["bytes_accessed"], 1.0),
            "devices": n_devices,
        },
        "checkpoint": ckpt,
        "losses": {
            "steps_compared": int(len(losses_before)),
            "max_abs_difference": float(np.max(np.abs(losses_before - losses_after))),
            "bitwise_equal": bool(
                np.array_equal(losses_before.astype(np.float32), losses_after.astype(np.float32))
            ),
            "first": float(losses_before[0]),
            "last": float(losses_before[-1]),
        },
        "optimization": {
            "name": f"{k} training steps per compiled call (lax.scan over {k} stacked batches)",
            "steps_per_call": k,
        },
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    plots.step_breakdown(
        {
            name: {c: f["per_step_s"][c] for c in (*CATEGORIES, "iteration", "device_busy")}
            for name, f in found.items()
        },
        out / "step_breakdown.png",
        CATEGORIES,
    )
    (out / "report.md").write_text(markdown(report))
    return report


def summary_text(report: dict[str, Any]) -> str:
    r = report["ratios"]
    m = report["measurements"]
    return (
        f"steady step: before {m['before']['median_s'] * 1e3:.2f} ms, after "
        f"{m['after']['median_s'] * 1e3:.2f} ms per step; after_vs_before "
        f"{r['after_vs_before']:.2f} (A/A {r['before_vs_before_aa']:.2f}); "
        f"async_vs_sync_checkpoint_blocking {r['async_vs_sync_checkpoint_blocking']:.2f}; "
        f"losses bitwise equal: {report['losses']['bitwise_equal']}"
    )


def markdown(report: dict[str, Any]) -> str:
    t = report["trace"]
    m = report["measurements"]
    lines = [
        "# Trace-backed before-and-after report",
        "",
        f"Identity: `{json.dumps(report['identity'])}`",
        "",
        "## What the trace shows (median per training step, ms)",
        "",
        "| Event (from the trace) | before | after |",
        "|---|---|---|",
    ]
    for c in (*CATEGORIES, "device_busy", "collective_wait", "all_reduce", "iteration"):
        event = {
            "device_busy": "`ThunkExecutor::Execute` (device threads, union)",
            "collective_wait": "`Rendezvous` (device threads, union)",
            "all_reduce": "`all-reduce*` thunks (device threads, union)",
            "iteration": "`train_iteration` (whole step)",
        }.get(c, f"`{c}`")
        lines.append(
            f"| {event} | {t['per_step_s']['before'][c] * 1e3:.3f} | "
            f"{t['per_step_s']['after'][c] * 1e3:.3f} |"
        )
    lines += [
        "",
        f"Compile, kept apart (`compile` events): before "
        f"{t['compile_s_from_trace']['before']:.2f} s, after "
        f"{t['compile_s_from_trace']['after']:.2f} s; compiler threads busy "
        f"{t['compiler_thread_s']:.2f} s (union of their events). Steady steps exclude the "
        f"first 2 calls of each variant.",
        "",
        f"Baseline: host-side events (`input_wait`, `host_to_device`, `dispatch`, "
        f"`device_sync`) take {t['host_side_fraction_before']:.0%} of a step, the device "
        f"threads are busy {t['device_busy_fraction_before']:.0%} of it; the largest "
        f"host-side event is `{t['bottleneck']}`. The per-call events (`host_to_device` + "
        f"`dispatch` + `device_sync`) take {t['per_call_s_before'] * 1e3:.2f} ms per step "
        f"against {t['per_step_s']['before']['input_wait'] * 1e3:.2f} ms of `input_wait`: "
        + (
            "the per-call costs are the bottleneck, and they are paid once per call, so the "
            if t["per_call_s_before"] >= t["per_step_s"]["before"]["input_wait"]
            else "here the INPUT PIPELINE is the bottleneck, and fewer calls can only help "
            "a little; the "
        )
        + f"optimization is: {report['optimization']['name']}. On the device "
        f"threads, `Rendezvous` (devices of one collective waiting for each other) takes "
        f"{t['per_step_s']['before']['collective_wait'] * 1e3:.2f} ms of the "
        f"{t['per_step_s']['before']['device_busy'] * 1e3:.2f} ms of device work per step. "
        f"After the change the largest host-side event is `{t['bottleneck_after']}`: the "
        f"next candidate.",
        "",
        "## Timing (interleaved, outside the trace)",
        "",
        "| Path | compile s | median ms/step | p90 ms/step | n |",
        "|---|---|---|---|---|",
    ]
    for name, v in m.items():
        lines.append(
            f"| {name} | {v['compile_s']:.2f} | {v['median_s'] * 1e3:.3f} | "
            f"{v['p90_s'] * 1e3:.3f} | {v['n']} |"
        )
    lines += ["", "| Ratio | Value |", "|---|---|"]
    lines += [f"| `{k}` | {v:.2f} |" for k, v in report["ratios"].items()]
    roof = report["roofline"]
    ck = report["checkpoint"]
    lines += [
        "",
        "## Roofline position (one device)",
        "",
        f"{roof['flops']:.3g} FLOPs and {roof['bytes_accessed']:.3g} bytes per step "
        f"(`cost_analysis()`), intensity {roof['arithmetic_intensity']:.2f} FLOP/byte; "
        f"{roof['flops_per_s_per_device']:.3g} FLOP/s = {roof['fraction_of_gemm_ceiling']:.2%}"
        f" of the GEMM ceiling ({roof['gemm_flops_per_s']:.3g} FLOP/s), "
        f"{roof['bytes_per_s_per_device']:.3g} B/s = {roof['fraction_of_copy_ceiling']:.2%} of"
        f" the copy ceiling ({roof['copy_bytes_per_s']:.3g} B/s): far below both, as the "
        f"trace says: the step is bound by per-call overhead, not by arithmetic or memory.",
        "",
        "## Checkpoint blocking",
        "",
        f"State {ck['state_bytes']} bytes: `save` blocks {ck['async_median_s'] * 1e3:.1f} ms "
        f"(async) vs {ck['sync_median_s'] * 1e3:.1f} ms (sync), median of {ck['n']}.",
        "",
        "## Losses",
        "",
        f"{report['losses']['steps_compared']} steps compared: max |difference| "
        f"{report['losses']['max_abs_difference']:.3g}, bitwise equal: "
        f"{report['losses']['bitwise_equal']}.",
        "",
    ]
    return "\n".join(lines)


def bench_view(report: dict[str, Any]) -> dict[str, Any]:
    """The report in three parts: identity, measurements, ratios."""
    return {
        "identity": report["identity"],
        "measurements": report["measurements"],
        "ratios": report["ratios"],
        "trace": report["trace"],
        "roofline": report["roofline"],
        "checkpoint": report["checkpoint"],
    }
