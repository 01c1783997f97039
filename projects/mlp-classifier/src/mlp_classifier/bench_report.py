"""The report side of `mlp-classifier bench`: ratios and their details from the
timed rounds, the identity of what was measured, the printed table and the plot.

A ratio `<a>_vs_<b>` is the median time of path `b` over that of path `a`
(above 1: `a` is faster); its details give the baseline it used (a sentence),
the setting's A/A control (`scan_vs_scan_aa`) and the per-round ratios, each
from one round of the interleaved loop, with their min, median and max.
"""

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import optax

if TYPE_CHECKING:  # Only for annotations.
    from mlp_classifier.bench_settings import BenchSize


# The baseline of each ratio `<a>_vs_<b>`, named by its `b` path.
BASELINES = {
    "split_jit": "split_jit: the lean per-step loop a practitioner writes, nnx.split once, "
    "a Python loop over one jax.jit step on (graphdef, state) with the state donated, "
    "nnx.merge when the weights are read",
    "nnx_jit": "nnx_jit: a Python loop over an nnx.jit step, which walks the object graph "
    "in Python on every call (the slowest per-step loop, kept to show that cost)",
    "scan_aa": "scan_aa: a second copy of the scan path (same executable, own state), "
    "interleaved with it: the A/A control",
    "torch": "torch: the same MLP, loss, AdamW, weights and batches in PyTorch eager, "
    "a Python loop over optimizer steps",
    "train_step": "train_step: the project's own train.train_step (split + jax.jit, no "
    "donation) in a Python loop, what `mlp-classifier train` runs",
    "scan_partitionable_bits": "scan_partitionable_bits: the scan path built, compiled "
    "and run under JAX's default jax.threefry_partitionable(True), twice the threefry "
    "work per dropout bit (the setting itself runs with False)",
    "scan_original_bits": "scan_original_bits: the scan path under "
    "jax.threefry_partitionable(False), half the threefry work per dropout bit",
    "gemm_ceiling": "gemm_ceiling: one jitted f32 n x n @ n x n matmul timed in the same "
    "rounds; the ratio is the epoch's FLOP/s (cost analysis) over the GEMM's",
}


# The bounds timed in the large setting: what the epoch would cost if a part
# of its work were free. Their `*_vs_gemm_ceiling` ratios use the real
# model's epoch FLOPs, so they read "the fraction of the ceiling the epoch
# would reach without ...".
LIMIT_PATHS = {
    "scan_no_dropout": "the scan epoch with dropout_rate 0 (no random bits, no masks)",
    "scan_sgd_no_dropout": "also with optax.sgd (momentum 0.9) instead of AdamW",
    "matmul_floor": "the epoch's 8 matrix products per step alone (bench_paths.MatmulFloorPath)",
}


def limit_costs(measurements: dict[str, dict[str, Any]], steps: int) -> dict[str, float]:
    """Milliseconds per step, from the medians: `dropout` (scan minus
    scan_no_dropout), `adamw_over_sgd` (scan_no_dropout minus
    scan_sgd_no_dropout), `other_non_matmul` (scan_sgd_no_dropout minus
    matmul_floor: biases, relu, softmax cross-entropy, SGD, copies) and
    `matmuls` (matmul_floor). Differences of medians: noisy, can be negative."""
    med = {k: measurements[k]["median_s"] * 1e3 / steps for k in ("scan", *LIMIT_PATHS)}
    return {
        "dropout": med["scan"] - med["scan_no_dropout"],
        "adamw_over_sgd": med["scan_no_dropout"] - med["scan_sgd_no_dropout"],
        "other_non_matmul": med["scan_sgd_no_dropout"] - med["matmul_floor"],
        "matmuls": med["matmul_floor"],
        "step": med["scan"],
    }


def ratio(measurements: dict[str, dict[str, Any]], a: str, b: str) -> float:
    """`<a>_vs_<b>`: median time of b over median time of a; above 1, a is faster."""
    return measurements[b]["median_s"] / measurements[a]["median_s"]


def round_ratios(measurements: dict[str, dict[str, Any]], a: str, b: str) -> list[float]:
    """`<a>_vs_<b>` of each round: b's time over a's, both from the same round
    of the interleaved loop."""
    return [
        tb / ta
        for ta, tb in zip(measurements[a]["times_s"], measurements[b]["times_s"], strict=True)
    ]


def ratio_entry(baseline: str, aa: float, rounds: list[float]) -> dict[str, Any]:
    """One entry of `ratio_details`: the baseline, the setting's A/A control
    (`scan_vs_scan_aa`) and the spread of the per-round ratio."""
    return {
        "baseline": baseline,
        "aa": aa,
        "aa_ratio": "scan_vs_scan_aa",
        "rounds": rounds,
        "min": float(np.min(rounds)),
        "median": float(np.median(rounds)),
        "max": float(np.max(rounds)),
    }


def _git_commit() -> str:
    """`git rev-parse HEAD` of the checkout holding this file, or `unknown`."""
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


def identity(size: "BenchSize", size_name: str, torch_info: dict[str, Any]) -> dict[str, Any]:
    """What was measured and on what: versions, backend, devices, flags,
    commit, and the sha256 of the bench configuration."""
    import flax
    import jaxlib

    config_blob = json.dumps(
        {
            "size": size_name,
            "repeats": size.repeats,
            "gemm_n": size.gemm_n,
            "settings": {s.name: s.describe() for s in (size.small, size.large)},
        },
        sort_keys=True,
    )
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "numpy": np.__version__,
        "torch": torch_info.get("version"),
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "cpu_cores": len(os.sched_getaffinity(0)),
        # XLA's CPU client sizes its intra-op thread pool to the visible cores.
        "jax_threads": "XLA CPU default: one intra-op thread per visible core",
        # Chosen per setting by timing 1 and all cores: `measurements.*/torch.threads`.
        "torch_threads": torch_info.get("threads"),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": _git_commit(),
        "config_sha256": hashlib.sha256(config_blob.encode()).hexdigest(),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """Writes a PNG: one panel per setting, each path's timed epochs as a box
    plot with the points on top (log time axis, milliseconds)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    settings = ["small", "large"]
    fig = Figure(figsize=(9, 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(settings), 1)
    for ax, setting in zip(axes, settings, strict=True):
        names = [k for k in report["measurements"] if k.startswith(f"{setting}/")]
        values = [np.asarray(report["measurements"][k]["times_s"]) * 1e3 for k in names]
        ax.boxplot(values, orientation="horizontal", showfliers=False)
        for i, v in enumerate(values, start=1):
            jitter = np.random.default_rng(i).uniform(-0.15, 0.15, len(v))
            ax.scatter(v, np.full(len(v), i) + jitter, s=8, alpha=0.6)
        ax.set_yticks(range(1, len(names) + 1), [n.split("/", 1)[1] for n in names])
        ax.set_xscale("log")
        ax.set_xlabel("time per call (ms, log scale)")
        s = report["settings"][setting]
        hidden = tuple(s["config"]["hidden_sizes"])
        ax.set_title(
            f"{setting}: hidden {hidden}, batch {s['config']['batch_size']}, "
            f"{s['steps_per_epoch']} steps/epoch"
        )
    fig.suptitle(
        f"mlp-classifier bench ({report['identity']['backend']}): one call = one training "
        "epoch; gemm_ceiling = one matmul"
    )
    fig.savefig(path, dpi=110)


def table(report: dict[str, Any]) -> str:
    """The printed summary: one row per path, then one per ratio (median,
    per-round min-max, the A/A control, and the target where there is one)."""
    lines = [
        f"{'path':<22}{'compile_s':>10}{'first_s':>10}{'median_ms':>11}{'p90_ms':>10}{'n':>5}"
        f"{'compiles(timed)':>17}"
    ]
    for name, m in report["measurements"].items():
        lines.append(
            f"{name:<22}{m['compile_s']:>10.3f}{m['first_call_s']:>10.4f}"
            f"{m['median_s'] * 1e3:>11.3f}{m['p90_s'] * 1e3:>10.3f}{m['n']:>5}"
            f"{m['compiles']['timed']:>17}"
        )
    lines.append("")
    lines.append(f"{'ratio (medians)':<36}{'value':>9}{'rounds min-max':>18}{'A/A':>7}")
    for name, value in report["ratios"].items():
        target = report["targets"].get(name, {}).get("expected_at_least")
        d = report["ratio_details"][name]
        note = ""
        if target is not None:
            note = f"   (target >= {target}: {'met' if value >= target else 'NOT met'})"
        spread = f"{d['min']:.3f}-{d['max']:.3f}"
        lines.append(f"{name:<36}{value:>9.3f}{spread:>18}{d['aa']:>7.3f}{note}")
    return "\n".join(lines)
