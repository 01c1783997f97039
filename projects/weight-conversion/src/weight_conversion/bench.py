"""`weight-conversion bench`: peak memory and throughput of converting a
200 MB source, eager vs streaming, against a plain file copy.

Run: `weight-conversion bench [--out runs/bench.json] [--layers 48 --width 1024]`
(about 40 s on a 2-core CPU). The source is `synthetic.linear_stack`
(48 x 1024 x 1024 float32 = 201.5 MB), written once under the report's folder.
Each measurement is a fresh process (`bench_child`) so that peak resident
memory (`VmHWM`) belongs to that conversion alone; the three modes run
interleaved (eager, streaming, copy, eager, ...) for `--rounds` rounds, all
reading the same file from the same disk (the page cache warms in round 1,
for all three alike). Nothing here is jitted, so there is no compile time to
separate; the seconds are the conversion call alone, imports excluded.

Ratios (`<a>_vs_<b>`):
  eager_vs_streaming_peak_memory = eager's added peak / streaming's (target >= 2:
      how many times less memory streaming needs);
  streaming_vs_copy_throughput = streaming MB/s / copy MB/s (the cost of the
      transforms and checks over moving the bytes; below 1);
  eager_vs_copy_throughput, streaming_vs_eager_throughput likewise.
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

MODES = ("eager", "streaming", "copy")
TARGETS = {"eager_vs_streaming_peak_memory": 2.0}


def _child(mode: str, src: Path, dst: Path, layers: int, width: int) -> dict:
    env = dict(os.environ)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "weight_conversion.bench_child",
            mode,
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
        for mode in MODES:
            result = _child(mode, src, work / f"out-{mode}.safetensors", layers, width)
            runs[mode].append(result)
            say(
                f"round {r + 1}/{rounds} {mode:>9}: {result['seconds']:.2f} s, "
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
            "n": s["n"],
            "seconds": seconds,
            "peak_added_mb": _summary(peak),
            "throughput_mb_s": size / 1e6 / s["median"],
        }
    peak = {m: measurements[m]["peak_added_mb"]["median"] for m in MODES}
    tput = {m: measurements[m]["throughput_mb_s"] for m in MODES}
    ratios = {
        "eager_vs_streaming_peak_memory": peak["eager"] / max(peak["streaming"], 1e-9),
        "streaming_vs_copy_throughput": tput["streaming"] / tput["copy"],
        "eager_vs_copy_throughput": tput["eager"] / tput["copy"],
        "streaming_vs_eager_throughput": tput["streaming"] / tput["eager"],
    }
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
        "targets": verdicts,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def table(report: dict) -> str:
    """The short table `bench` prints."""
    lines = [f"{'mode':>10} {'median s':>9} {'MB/s':>8} {'peak +MB':>9}"]
    for mode, m in report["measurements"].items():
        lines.append(
            f"{mode:>10} {m['median_s']:>9.3f} {m['throughput_mb_s']:>8.1f} "
            f"{m['peak_added_mb']['median']:>9.1f}"
        )
    for name, value in report["ratios"].items():
        lines.append(f"{name}: {value:.3f}")
    for name, v in report["targets"].items():
        lines.append(
            f"target {name} >= {v['target']}: {'met' if v['met'] else 'NOT met'} "
            f"({v['observed']:.2f})"
        )
    return "\n".join(lines)
