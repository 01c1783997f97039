"""`workload-operations bench`: what observation costs, and how fast faults are seen.

1. Step time unobserved vs observed, in one process, interleaved A B A B:
   the same compiled step and Grain pipeline, unpaced; B also calls
   `Observer.step_done` every step while the reporter thread emits heartbeats
   and the metrics endpoint is up. An A/A pair measures the noise. Each timed
   repetition is `chunk` steps ending in `block_until_ready`; compilation is
   timed apart.
2. Detection of a hang and of a death (SIGKILL), from real supervised drills,
   in heartbeat intervals.

Ratios follow `<a>_vs_<b>` = time of b / time of a (above 1: a is faster), so
`observed_vs_unobserved` is the share of the unobserved speed the observed job
keeps (goal >= 0.98) and `unobserved_vs_observed` its inverse (<= 1.02).
"""

import io
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import jax
import numpy as np

from workload_operations import data, drill, train
from workload_operations.config import Config, ConfigError, check_output_path
from workload_operations.observe import Observer


def identity(config: Config) -> dict:
    import jaxlib

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": commit,
        "config_sha256": config.digest(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }


def _stats(times: list[float], compile_s: float, first_s: float) -> dict:
    return {
        "compile_s": compile_s,
        "first_call_s": first_s,
        "median_s": float(np.median(times)),
        "p90_s": float(np.percentile(times, 90)),
        "min_s": float(np.min(times)),
        "max_s": float(np.max(times)),
        "n": len(times),
    }


def observation_cost(config: Config, *, reps: int = 20, chunk: int = 200) -> dict:
    """Median time of `chunk` steps: unobserved (twice, A/A) and observed."""
    # Every chunk, the two warm-up chunks and the batch used to compile.
    config = config.replace(steps_per_second=0.0, num_steps=(3 * reps + 3) * chunk)
    dataset = data.make_dataset(config)
    state = train.create_train_state(config)
    iterator = data.iterator(config, dataset)
    step = train.make_train_step(config)
    batch = next(iterator)
    t0 = time.perf_counter()
    compiled = step.lower(state, batch["x"], batch["y"]).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    state, loss = compiled(state, batch["x"], batch["y"])
    jax.block_until_ready(loss)
    first_s = time.perf_counter() - t0
    observer = Observer(config.heartbeat_interval_s, out=io.StringIO())
    observer.start()

    def run(obs):
        nonlocal state
        start = time.perf_counter()
        for _ in range(chunk):
            b = next(iterator)
            state, loss = compiled(state, b["x"], b["y"])
            if obs is not None:
                obs.step_done(obs.step + 1, config.batch_size, loss)
        jax.block_until_ready(state)
        return time.perf_counter() - start

    run(None)
    run(observer)  # Warm both paths.
    times = {"unobserved": [], "unobserved_control": [], "observed": []}
    for _ in range(reps):
        times["unobserved"].append(run(None))
        times["observed"].append(run(observer))
        times["unobserved_control"].append(run(None))
    observer.close()
    measurements = {
        f"{name}_{chunk}_steps": _stats(t, compile_s, first_s) for name, t in times.items()
    }
    med = {k: float(np.median(v)) for k, v in times.items()}
    ratios = {
        "observed_vs_unobserved": med["unobserved"] / med["observed"],
        "unobserved_vs_observed": med["observed"] / med["unobserved"],
        "unobserved_vs_unobserved_control": med["unobserved_control"] / med["unobserved"],
    }
    per_step = {
        "unobserved_step_us": 1e6 * med["unobserved"] / chunk,
        "observed_step_us": 1e6 * med["observed"] / chunk,
        "heartbeats_emitted": observer.seq,
    }
    return {"measurements": measurements, "ratios": ratios, "per_step": per_step}


def detection_times(config: Config, out: Path, repeats: int, parallel: int, say=None) -> dict:
    summary = drill.run_drills(
        config, out, kinds=["hang", "kill"], repeats=repeats, parallel=parallel, say=say
    )
    result = {}
    for kind, f in summary["per_fault"].items():
        d = f["detection_intervals"]
        result[kind] = {
            "intervals_min": min(d) if d else None,
            "intervals_median": float(np.median(d)) if d else None,
            "intervals_max": max(d) if d else None,
            "bound_intervals": f["bound_intervals"],
            "grace_intervals": f["bound_intervals"] - 2 if f["bound_intervals"] else None,
            "correct": f"{f['correct']}/{f['runs']}",
        }
    return result


def bench(
    config: Config,
    out_json: Path,
    *,
    reps: int = 20,
    chunk: int = 200,
    detection_repeats: int = 3,
    parallel: int = 6,
    say=None,
) -> dict:
    say = say or (lambda _: None)
    if not isinstance(config, Config):
        raise ConfigError(f"`config` must be a `Config`, not a `{type(config).__name__}`.")
    out_json = Path(out_json)
    check_output_path(out_json, directory=False, what="The bench report")
    check_output_path(
        out_json.parent / (out_json.stem + "-drills"), directory=True, what="The bench drills"
    )
    say(f"observation cost: {reps} x (A, B, A') of {chunk} steps")
    cost = observation_cost(config, reps=reps, chunk=chunk)
    detection = {}
    if detection_repeats:
        say(f"detection: {detection_repeats} hang and {detection_repeats} kill drills")
        detection = detection_times(
            Config.tiny(),
            out_json.parent / (out_json.stem + "-drills"),
            detection_repeats,
            parallel,
            say,
        )
    report = {
        "identity": identity(config),
        "measurements": cost["measurements"],
        "ratios": cost["ratios"],
        "per_step": cost["per_step"],
        "detection_intervals": detection,
        "goals": {
            "observed_vs_unobserved": ">= 0.98",
            "detection": "<= 2 + grace intervals",
        },
        "verdict": _verdict(cost["ratios"], detection),
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


def _verdict(ratios: dict, detection: dict) -> str:
    r = ratios["observed_vs_unobserved"]
    noise = abs(1 - ratios["unobserved_vs_unobserved_control"])
    parts = [
        f"observed keeps {r:.3f} of the unobserved speed "
        f"({'meets' if r >= 0.98 else 'misses'} >= 0.98; A/A noise {noise:.3f})"
    ]
    for kind, d in detection.items():
        ok = d["intervals_max"] is not None and d["intervals_max"] <= d["bound_intervals"]
        parts.append(
            f"{kind} seen within {d['intervals_max']:.1f} intervals "
            f"({'within' if ok else 'beyond'} the bound {d['bound_intervals']:.1f})"
        )
    return "; ".join(parts) + "."
