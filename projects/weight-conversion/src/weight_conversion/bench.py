"""`weight-conversion bench`: peak memory and throughput of converting a
200 MB source, eager vs streaming, against a plain file copy.

Run: `weight-conversion bench [--out runs/bench.json] [--layers 48 --width 1024]
[--rounds 3]`; each round runs four child processes (about 4 s a round when
the source sits in the page cache, 30 s and more on a loaded machine). The source is
`synthetic.linear_stack` (48 x 1024 x 1024 float32 = 201.5 MB), written once
under the report's folder. Each measurement is a fresh process
(`bench_child`) so that peak resident memory (`VmHWM`) belongs to that
conversion alone. Four modes run interleaved for `--rounds` rounds, all
reading the same file from the same disk (the page cache warms in round 1,
for all alike): eager, streaming, copy, and `streaming_aa`, a second
streaming child (the A/A control: the same code timed twice in every round).
The order is reversed on every other round (eager, streaming, copy,
streaming_aa, then streaming_aa, copy, streaming, eager), so no mode always
follows the same neighbour. Nothing here is jitted, so there is no compile
time to separate; the seconds are the conversion call alone, imports excluded.

Ratios (`<a>_vs_<b>`, above 1 means `a` is smaller or faster):
  eager_vs_streaming_peak_memory = eager's added peak / streaming's (target >= 2:
      how many times less memory streaming needs);
  streaming_vs_copy_throughput = streaming MB/s / copy MB/s (the cost of the
      transforms and checks over moving the bytes; below 1);
  eager_vs_copy_throughput, streaming_vs_eager_throughput likewise;
  streaming_vs_streaming_aa_throughput, _peak_memory: the A/A controls (~1).
`ratio_details` gives each ratio's baseline (a sentence), its A/A control and
the per-round ratios with their min, median and max (both modes of a round
ran back to back, so a round's ratio shares that round's load).
"""

import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from weight_conversion import synthetic

MODES = ("eager", "streaming", "copy", "streaming_aa")
TARGETS = {"eager_vs_streaming_peak_memory": 2.0}

# What each mode is, as a baseline a practitioner would recognize.
BASELINES = {
    "eager": "eager conversion: safetensors.numpy.load_file of the whole source, every "
    "rule applied in memory, safetensors.numpy.save_file; the plain way to convert a file",
    "copy": "shutil.copyfile of the same source on the same disk (sendfile, no Python "
    "touches the bytes): the floor for moving 201.5 MB, not a conversion",
    "streaming_aa": "a second streaming child in every round: streaming timed twice, "
    "interleaved; its ratio to streaming shows the noise",
}

# name -> (kind, a, b): kind `peak` compares added peak memory (b's / a's
# reversed: a_vs_b = a's peak / b's peak, above 1 when b needs less), kind
# `throughput` compares MB/s (a's / b's, i.e. b's seconds / a's seconds).
RATIOS = {
    "eager_vs_streaming_peak_memory": ("peak", "eager", "streaming"),
    "streaming_vs_copy_throughput": ("throughput", "streaming", "copy"),
    "eager_vs_copy_throughput": ("throughput", "eager", "copy"),
    "streaming_vs_eager_throughput": ("throughput", "streaming", "eager"),
    "streaming_vs_streaming_aa_throughput": ("throughput", "streaming", "streaming_aa"),
    "streaming_vs_streaming_aa_peak_memory": ("peak", "streaming_aa", "streaming"),
}


def _child(mode: str, src: Path, dst: Path, layers: int, width: int) -> dict:
    child_mode = "streaming" if mode == "streaming_aa" else mode
    env = dict(os.environ)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "weight_conversion.bench_child",
            child_mode,
            str(src),
            str(dst),
            str(layers),
            str(width),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"bench child `{mode}` failed:\n{out.stderr[-2000:]}")
    dst.unlink(missing_ok=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _identity(config: dict) -> dict:
    import jax
    import safetensors

    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip()
            or None
        )
    except OSError:
        commit = None
    return {
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else jax.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "backend": "cpu (NumPy conversion; JAX not involved)",
        "devices": 1,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "threads": "each child is one Python process; NumPy's transposes and the "
        "safetensors reads and writes run on one thread, the copy in the kernel",
        "commit": commit,
        "config_sha256": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(),
    }


def _summary(values: list[float]) -> dict:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {
        "median": statistics.median(values),
        "p90": p90,
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(values),
        "values": values,
    }


def round_ratios(runs: dict[str, list[dict]], kind: str, a: str, b: str) -> list[float]:
    """The ratio `a_vs_b` of each round: for `peak`, a's added peak bytes over
    b's (b floored at 1 byte); for `throughput`, b's seconds over a's."""
    pairs = zip(runs[a], runs[b], strict=True)
    if kind == "peak":
        return [x["added_bytes"] / max(y["added_bytes"], 1) for x, y in pairs]
    return [y["seconds"] / x["seconds"] for x, y in pairs]


def ratio_details(runs: dict[str, list[dict]], ratios: dict[str, float]) -> dict[str, dict]:
    """Per ratio: the baseline (the `b` mode, or `a` for the peak ratios whose
    baseline is the larger side), the A/A control of the same kind (its value
    in `ratios`, a ratio of medians like the ratio itself), and the per-round
    ratios with min, median and max."""
    details = {}
    for name, (kind, a, b) in RATIOS.items():
        rounds = round_ratios(runs, kind, a, b)
        aa_name = (
            "streaming_vs_streaming_aa_peak_memory"
            if kind == "peak"
            else "streaming_vs_streaming_aa_throughput"
        )
        baseline_mode = a if kind == "peak" else b
        details[name] = {
            "baseline": BASELINES[baseline_mode],
            "baseline_mode": baseline_mode,
            "aa": ratios[aa_name],
            "aa_ratio": aa_name,
            "rounds": rounds,
            "min": min(rounds),
            "median": statistics.median(rounds),
            "max": max(rounds),
        }
    return details


def bench(
    out: str | Path,
    layers: int = 48,
    width: int = 1024,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Runs the bench; writes the JSON report to `out` and returns it."""
    say = progress or (lambda _m: None)
    out = Path(out)
    work = out.parent / (out.stem + "-files")
    work.mkdir(parents=True, exist_ok=True)
    src = work / "source.safetensors"
    size = synthetic.write_source(src, layers, width)
    say(f"source: {size / 1e6:.1f} MB ({layers} x {width}x{width} float32) at {src}")
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            result = _child(mode, src, work / f"out-{mode}.safetensors", layers, width)
            runs[mode].append(result)
            say(
                f"round {r + 1}/{rounds} {mode:>12}: {result['seconds']:.2f} s, "
                f"+{result['added_bytes'] / 1e6:.1f} MB peak"
            )
    src.unlink(missing_ok=True)
    measurements = {}
    for mode in MODES:
        seconds = [x["seconds"] for x in runs[mode]]
        peak = [x["added_bytes"] / 1e6 for x in runs[mode]]
        s = _summary(seconds)
        measurements[mode] = {
            "compile_s": 0.0,
            "first_call_s": seconds[0],
            "median_s": s["median"],
            "p90_s": s["p90"],
            "min_s": s["min"],
            "max_s": s["max"],
            "n": s["n"],
            "seconds": seconds,
            "peak_added_mb": _summary(peak),
            "throughput_mb_s": size / 1e6 / s["median"],
        }
    peak = {m: measurements[m]["peak_added_mb"]["median"] for m in MODES}
    tput = {m: measurements[m]["throughput_mb_s"] for m in MODES}
    ratios = {}
    for name, (kind, a, b) in RATIOS.items():
        if kind == "peak":
            ratios[name] = peak[a] / max(peak[b], 1e-9)
        else:
            ratios[name] = tput[a] / tput[b]
    config = {"layers": layers, "width": width, "rounds": rounds, "source_bytes": size}
    verdicts = {
        name: {"target": target, "observed": ratios[name], "met": ratios[name] >= target}
        for name, target in TARGETS.items()
    }
    report = {
        "identity": _identity(config),
        "config": config,
        "measurements": measurements,
        "ratios": ratios,
        "ratio_details": ratio_details(runs, ratios),
        "targets": verdicts,
        "notes": [
            "ratios use the medians over rounds; ratio_details.*.rounds are per-round "
            "ratios (both modes from the same round).",
            "order of the modes reversed on every other round.",
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def table(report: dict) -> str:
    """The short table `bench` prints."""
    lines = [f"{'mode':>12} {'median s':>9} {'MB/s':>8} {'peak +MB':>9}"]
    for mode, m in report["measurements"].items():
        lines.append(
            f"{mode:>12} {m['median_s']:>9.3f} {m['throughput_mb_s']:>8.1f} "
            f"{m['peak_added_mb']['median']:>9.1f}"
        )
    lines.append(f"{'ratio':<40} {'median':>8} {'rounds min-max':>16} {'A/A':>6}")
    for name, value in report["ratios"].items():
        d = report["ratio_details"][name]
        lines.append(f"{name:<40} {value:>8.3f} {d['min']:>7.3f}-{d['max']:<8.3f} {d['aa']:>6.3f}")
    for name, v in report["targets"].items():
        lines.append(
            f"target {name} >= {v['target']}: {'met' if v['met'] else 'NOT met'} "
            f"({v['observed']:.2f})"
        )
    return "\n".join(lines)
