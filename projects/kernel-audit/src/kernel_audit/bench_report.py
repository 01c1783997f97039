"""The report side of `kernel-audit bench`: the identity of a run, each ratio's
details (baseline, A/A, per-round spread), the PNG and the printed table."""

import dataclasses
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import jax
import numpy as np

from kernel_audit import kernels


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def identity(size_name: str, size: Any, interpret: bool) -> dict[str, Any]:
    """What was measured and on what."""
    import jaxlib

    blob = json.dumps({"size": size_name, **dataclasses.asdict(size)}, sort_keys=True)
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "cpu_cores": len(os.sched_getaffinity(0)),
        "kernel_execution_mode": kernels.execution_mode(interpret),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": _git_commit(),
        "config_sha256": hashlib.sha256(blob.encode()).hexdigest(),
        "loadavg_at_end": list(os.getloadavg()),  # Written when the run ends.
    }


def ratio_details(ratios: dict[str, float], measurements: dict[str, Any]) -> dict[str, Any]:
    """Per ratio `<setting>/<a>_vs_<b>`: its baseline `b` (a sentence), the setting's
    A/A control (`xla_vs_xla_aa`), and the per-round ratio `t_b / t_a` (the paths are
    timed in the same interleaved rounds) with its min, median and max."""
    out = {}
    for name, value in ratios.items():
        setting, pair = name.split("/", 1)
        a, b = pair.split("_vs_")
        ta, tb = (
            measurements[f"{setting}/{a}"]["times_s"],
            measurements[f"{setting}/{b}"]["times_s"],
        )
        rounds = [y / x for x, y in zip(ta, tb, strict=True)]
        if b == "xla_aa":
            baseline = "A/A: XLA's compilation of the jax.numpy reference against a second one."
        elif b == "xla":
            baseline = (
                "XLA's own fusion of the same jax.numpy code (jax.jit, compiled ahead of "
                "time, bias and activation fused by XLA), same operands and device."
            )
        else:
            baseline = (
                f"The same kernel (`{b}`) without its fused epilogue: bias and gelu left to XLA."
            )
        out[name] = {
            "baseline": baseline,
            "value": value,
            "aa": ratios[f"{setting}/xla_vs_xla_aa"],
            "rounds": rounds,
            "min": min(rounds),
            "median": float(np.median(rounds)),
            "max": max(rounds),
        }
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    """PNG: every path's timed calls as a box plot, labelled with its mode."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(report["measurements"])
    fig = Figure(figsize=(9, max(3.0, 0.3 * len(names) + 1.5)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    values = [np.asarray(report["measurements"][n]["times_s"]) * 1e3 for n in names]
    ax.boxplot(values, orientation="horizontal", showfliers=False)
    labels = [f"{n} [{report['measurements'][n]['execution_mode']}]" for n in names]
    ax.set_yticks(range(1, len(names) + 1), labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("time per call (ms, log scale)")
    mode = report["kernel_execution_mode"]
    title = f"kernel-audit bench ({report['identity']['backend']}, kernels: {mode})"
    if mode == "interpret":
        title += "\ninterpret-mode timings are correctness-only: no speed claim"
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110)


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"{'path':<44}{'mode':<11}{'compile_s':>10}{'median_ms':>11}{'p90_ms':>10}{'bound':>8}"
    ]
    for name, m in report["measurements"].items():
        lines.append(
            f"{name:<44}{m['execution_mode']:<11}{m['compile_s']:>10.3f}"
            f"{m['median_s'] * 1e3:>11.3f}{m['p90_s'] * 1e3:>10.3f}"
            f"{m['bound_used_vs_f64']:>8.3f}"
        )
    lines.append("")
    for name, value in report["ratios"].items():
        lines.append(f"{name:<60}{value:>9.3f}")
    lines.append(f"\nspeed claims: {report['speed_claims']}")
    return "\n".join(lines)
