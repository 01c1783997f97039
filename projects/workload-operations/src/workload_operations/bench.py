"""`workload-operations bench`: what observation costs, and how fast faults are seen.

1. Step time unobserved vs observed, in one process, the same compiled step and
   Grain pipeline, unpaced. Each round times four chunks of `chunk` steps, each
   ending in `block_until_ready`, in this order:
     A  `unobserved`: no `Observer` exists (no reporter thread, no metrics server);
     C  `observer_running`: an `Observer` is started (reporter thread emitting
        heartbeats, metrics endpoint up), the loop does not call it;
     B  `observed`: the same `Observer`, the loop calls `step_done` every step;
        the observer is closed after B;
     A' `unobserved_control`: A again, the A/A control.
   Starting and closing the observer happen outside the timed windows (a job pays
   them once, not per step). A fresh observer's heartbeats fall at whole intervals
   after its start, so after starting it the bench runs observed steps, untimed,
   on one fixed batch for a random time uniform over one interval (seeded, from
   a quarter of an interval on): B's window then lies at a uniform phase of the
   heartbeat clock and holds, on average, the heartbeats a running job emits in
   that time (`per_step` reports the count against that expectation), and C
   starts on a busy, not an idle, process. Compilation is timed apart; the XLA
   CPU runtime keeps its default thread pool on every side (the same in all four).
2. Detection of a hang and of a death (SIGKILL), from real supervised drills,
   in heartbeat intervals.

Ratios follow `<a>_vs_<b>` = time of b / time of a (above 1: a is faster):
  observed_vs_unobserved        B against A: the share of the truly unobserved
                                speed the observed job keeps (goal >= 0.98);
  unobserved_vs_observed        its inverse (<= 1.02);
  observed_vs_observer_running  B against C: the cost of the `step_done` calls
                                alone, the threads running on both sides;
  observer_running_vs_unobserved C against A: the cost of the reporter thread and
                                the metrics server alone;
  unobserved_vs_unobserved_control  A' against A: the A/A control.
`ratio_details` gives for each ratio the baseline it used, the per-round ratios
with their min, median and max, and the A/A control's per-round spread.
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


# ratio name -> (path b, path a, the baseline in a sentence): ratio = median(b) / median(a).
BASELINES = {
    "observed_vs_unobserved": (
        "unobserved",
        "observed",
        "the same loop with no Observer at all: no reporter thread, no metrics server, "
        "no step_done call",
    ),
    "unobserved_vs_observed": (
        "observed",
        "unobserved",
        "the inverse of observed_vs_unobserved: the observed loop's time over the "
        "truly unobserved one's (goal <= 1.02)",
    ),
    "observed_vs_observer_running": (
        "observer_running",
        "observed",
        "the same loop with the Observer's reporter thread and metrics server running "
        "but no step_done call (isolates the per-step call)",
    ),
    "observer_running_vs_unobserved": (
        "unobserved",
        "observer_running",
        "the same loop with no Observer at all (isolates the reporter thread and the "
        "metrics server)",
    ),
    "unobserved_vs_unobserved_control": (
        "unobserved_control",
        "unobserved",
        "the unobserved loop timed again in the same round (A/A control)",
    ),
}


def _spread(values: list[float]) -> dict:
    return {
        "rounds": [float(v) for v in values],
        "min": float(np.min(values)),
        "median": float(np.median(values)),
        "max": float(np.max(values)),
    }


def ratio_details(times: dict[str, list[float]]) -> dict:
    """Per ratio of `BASELINES`: its baseline sentence, the per-round ratios
    (time of b / time of a in the same round) and their min/median/max, and the
    A/A control's per-round ratios (`unobserved_control / unobserved`)."""
    aa = _spread(
        [c / u for c, u in zip(times["unobserved_control"], times["unobserved"], strict=True)]
    )
    details = {}
    for name, (base, side, sentence) in BASELINES.items():
        rounds = [t_base / t_side for t_base, t_side in zip(times[base], times[side], strict=True)]
        details[name] = {
            "a": side,
            "b": base,
            "baseline": sentence,
            "aa": aa,
            **_spread(rounds),
        }
    return details


def observation_cost(config: Config, *, reps: int = 20, chunk: int = 200) -> dict:
    """Median time of `chunk` steps: unobserved (twice, A/A), observer running, observed.

    Returns `{"measurements", "ratios", "ratio_details", "per_step"}`; every
    measurement has `n == reps`. See the module docstring for the four sides."""
    # Every timed chunk, the three warm-up chunks and the batch used to compile.
    config = config.replace(steps_per_second=0.0, num_steps=(4 * reps + 4) * chunk)
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

    phase = np.random.default_rng(0)
    lead_batch = batch

    def lead_in(obs: Observer, seconds: float) -> None:
        """Observed steps on one fixed batch (the iterator is left alone) for `seconds`."""
        nonlocal state
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            state, loss = compiled(state, lead_batch["x"], lead_batch["y"])
            obs.step_done(obs.step + 1, config.batch_size, loss)
            jax.block_until_ready(loss)

    def observer_round() -> tuple[float, float, int]:
        """(time of C, time of B, heartbeats emitted during B) with a fresh Observer."""
        observer = Observer(config.heartbeat_interval_s, out=io.StringIO())
        observer.start()
        try:
            lead_in(observer, config.heartbeat_interval_s * (0.25 + phase.uniform()))
            running = run(None)
            before = observer.seq
            observed = run(observer)
            return running, observed, observer.seq - before
        finally:
            observer.close()

    run(None)
    observer_round()  # Warm every path.
    names = ("unobserved", "observer_running", "observed", "unobserved_control")
    times: dict[str, list[float]] = {name: [] for name in names}
    heartbeats_in_observed = 0
    for _ in range(reps):
        times["unobserved"].append(run(None))
        running, observed, beats = observer_round()
        times["observer_running"].append(running)
        times["observed"].append(observed)
        heartbeats_in_observed += beats
        times["unobserved_control"].append(run(None))
    measurements = {
        f"{name}_{chunk}_steps": _stats(t, compile_s, first_s) for name, t in times.items()
    }
    med = {k: float(np.median(v)) for k, v in times.items()}
    ratios = {name: med[base] / med[side] for name, (base, side, _) in BASELINES.items()}
    per_step = {
        "unobserved_step_us": 1e6 * med["unobserved"] / chunk,
        "observer_running_step_us": 1e6 * med["observer_running"] / chunk,
        "observed_step_us": 1e6 * med["observed"] / chunk,
        "heartbeats_during_timed_observed_chunks": heartbeats_in_observed,
        "heartbeats_expected_at_the_running_rate": float(
            np.sum(times["observed"]) / config.heartbeat_interval_s
        ),
        "heartbeat_interval_s": config.heartbeat_interval_s,
    }
    return {
        "measurements": measurements,
        "ratios": ratios,
        "ratio_details": ratio_details(times),
        "per_step": per_step,
    }


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
    say(
        f"observation cost: {reps} rounds of 4 chunks of {chunk} steps "
        "(unobserved twice, observer running, observed)"
    )
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
        "ratio_details": cost["ratio_details"],
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
