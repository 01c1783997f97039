"""The report side of `kernel-audit bench`: the identity of a run, the chip's
nominal figures, each ratio's details (baseline, A/A, per-round spread), the PNG
and the printed table."""

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import jax
import numpy as np

from kernel_audit import kernels, targets


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


def package_version(*names: str) -> str | None:
    """The installed version of the first of `names` found, or None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def identity(size_name: str, size: Any, interpret: bool, seed: int = 0) -> dict[str, Any]:
    """What was measured and on what: versions (jax, jaxlib, libtpu: None when not
    installed), backend, device kind and count, the kernels' execution mode, the
    default matmul precision, XLA flags, commit, and a digest of the size and seed."""
    import jaxlib

    blob = json.dumps({"size": size_name, "seed": seed, **dataclasses.asdict(size)}, sort_keys=True)
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "libtpu": package_version("libtpu", "libtpu-nightly"),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "cpu_cores": len(os.sched_getaffinity(0)),
        "kernel_execution_mode": kernels.execution_mode(interpret),
        "jax_default_matmul_precision": str(jax.config.jax_default_matmul_precision),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "kernel_audit_mode_env": os.environ.get("KERNEL_AUDIT_MODE", ""),
        "bench_seed": seed,
        "commit": _git_commit(),
        "config_sha256": hashlib.sha256(blob.encode()).hexdigest(),
        "loadavg_at_end": list(os.getloadavg()),  # Written when the run ends.
    }


def nominal_chip() -> dict[str, Any] | None:
    """The chip's published peak FLOP/s and HBM bytes/s where the device is a TPU
    v5e (device kind `TPU v5 lite` or `TPU v5e`), else None."""
    if jax.default_backend() != "tpu":
        return None
    kind = jax.devices()[0].device_kind
    if "v5 lite" not in kind.lower() and "v5e" not in kind.lower():
        return None
    return {
        "device_kind": kind,
        "flops_per_s": targets.TPU_V5E_PEAK_BF16_FLOPS,
        "bytes_per_s": targets.TPU_V5E_HBM_BYTES_PER_S,
        "source": "TPU v5e published figures: 197 TFLOP/s bfloat16 peak, 819 GB/s HBM "
        "(nominal, not measured here)",
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
            "aa": ratios.get(f"{setting}/xla_vs_xla_aa"),
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


def _placement(entry: dict[str, Any]) -> str:
    """`1.23 TFLOP/s: 0.5 of the measured ceiling, 0.4 of the nominal chip`, in GB/s
    for a run limited by memory bandwidth."""
    if "vs_measured_ceilings" not in entry:
        return "not placed (no cost figures)"
    if entry["vs_measured_ceilings"]["limited_by"] == "compute":
        figure, key = f"{entry['achieved_flops_per_s'] / 1e12:.3g} TFLOP/s", "flops"
    else:
        figure, key = f"{entry['achieved_bytes_per_s'] / 1e9:.3g} GB/s", "bytes"
    fractions = [
        f"{entry[side][f'fraction_of_{key}_ceiling']:.3g} of the {label}"
        for side, label in (("vs_measured_ceilings", "measured"), ("vs_nominal_chip", "nominal"))
        if side in entry
    ]
    return f"{figure}: {', '.join(fractions)}"


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"{'path':<66}{'mode':<11}{'compile_s':>10}{'median_ms':>11}{'p90_ms':>10}{'bound':>8}"
    ]
    for name, m in report["measurements"].items():
        lines.append(
            f"{name:<66}{m['execution_mode']:<11}{m['compile_s']:>10.3f}"
            f"{m['median_s'] * 1e3:>11.3f}{m['p90_s'] * 1e3:>10.3f}"
            f"{m['bound_used_vs_f64']:>8.3f}"
        )
    lines.append("")
    for name, value in report["ratios"].items():
        lines.append(f"{name:<80}{value:>9.3f}")
    where = report["where_kernel_stops_helping"]
    if where["status"] == "measured":
        lines.append("")
        for setting, b in report["blocking"].items():
            if b["status"] != "measured":
                lines.append(f"{setting:<48} {b['status']}")
                continue
            lines.append(
                f"{setting:<48} best {b['best']:<22} {where['best_kernel_vs_xla'][setting]:>6.2f}x "
                f"XLA; best/worst block {b['best_vs_worst']:.2f}; "
                + _placement(report["roofline"][f"{setting}/{b['best']}"])
            )
        slower = [s["setting"] for s in where["settings_where_xla_is_faster"]]
        lines.append(f"kernel stops helping (best block slower than XLA): {slower or 'nowhere'}")
    failed = [
        f"{setting}/{path}: {error}"
        for setting, paths in report.get("failed_paths", {}).items()
        for path, error in paths.items()
    ]
    if failed:
        lines.append("\nfailed to compile or run, left out:")
        lines += [f"  {line}" for line in failed]
    lines.append(f"\nspeed claims: {report['speed_claims']}")
    return "\n".join(lines)
