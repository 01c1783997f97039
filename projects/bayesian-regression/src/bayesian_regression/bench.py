"""`bayesian-regression bench`: two ratios, measured side by side.

  - `vmapped_chains_vs_sequential`: 8 HMC chains in one vmapped program vs the
    same 8 chains run one after another through the one-chain program (same
    iterations, same keys). Above 1: vmapping is faster.
  - `hmc_vs_nuts_ess_per_s`: effective draws per second (minimum bulk-ESS over
    the parameters / execution time) of the hand-built fixed-length HMC vs
    NumPyro NUTS on the stage-1 posterior, same chains and iterations.

Compilation is timed apart from execution (`lower().compile()` for our
programs; NumPyro's first run, which compiles, apart from its later runs,
which find their executables in JAX's persistent compilation cache).
Every timed call ends in `jax.block_until_ready`; A and B alternate
(A B A B ...), and an A/A ratio (the vmapped program against itself) shows
the noise of the machine.
"""

import hashlib
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from bayesian_regression import diagnostics, hmc, model, nuts, train
from bayesian_regression.config import Config

NUM_CHAINS = 8


def bench_config() -> Config:
    return Config(num_chains=NUM_CHAINS, num_warmup=500, num_samples=1000)


def _identity(config: Config) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else jax.__version__,
        "numpyro": nuts.numpyro.__version__,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": commit,
        "config_sha256": hashlib.sha256(config.to_json().encode()).hexdigest(),
    }


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def _stats(times: list[float], compile_s: float, first_call_s: float) -> dict[str, float]:
    return {
        "compile_s": compile_s,
        "first_call_s": first_call_s,
        "median_s": statistics.median(times),
        "p90_s": float(np.quantile(times, 0.9)),
        "min_s": min(times),
        "max_s": max(times),
        "n": len(times),
    }


def _compiled(fn, *args):
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return compiled, time.perf_counter() - start


def min_bulk_ess(positions) -> float:
    positions = np.asarray(positions, np.float64)
    return min(diagnostics.ess_bulk(positions[:, :, i]) for i in range(positions.shape[2]))


def _enable_compilation_cache(directory: Path) -> None:
    """NumPyro's `MCMC.run` traces and lowers its sampling loop again on every call
    (a fresh closure each time), so without a cache every rerun compiles anew.
    With JAX's persistent compilation cache a rerun finds the executable on disk:
    what is left (tracing, lowering, the cache lookup) is the per-run cost a
    NumPyro user pays, and counts as NUTS execution time here."""
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory.absolute()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def run(out: Path, repeats: int = 20, progress: Callable[[str], None] = print) -> dict[str, Any]:
    config = bench_config()
    _enable_compilation_cache(out.parent / "jax-cache")
    problem = train.make_problem(config)
    args = problem.args
    key = jax.random.key(config.seed)
    settings = (
        problem.dim,
        config.num_warmup,
        config.num_samples,
        config.num_leapfrog,
        config.target_accept,
    )
    dim, warm, draws, steps, accept = settings
    factor = jax.numpy.asarray(1.0, jax.numpy.float32)
    measurements: dict[str, Any] = {}

    # A: 8 chains vmapped.  B: the one-chain program, 8 times in a row.
    progress("compiling the vmapped and the one-chain programs ...")
    vmapped = hmc.make_sampler(
        model.regression_log_density, dim, NUM_CHAINS, warm, draws, steps, accept
    )
    single = hmc.make_sampler(model.regression_log_density, dim, 1, warm, draws, steps, accept)
    keys = jax.random.split(key, NUM_CHAINS)
    vm_c, vm_compile = _compiled(vmapped, key, args, factor)
    one_c, one_compile = _compiled(single, keys[0], args, factor)
    vm_first = _timed(lambda: vm_c(key, args, factor))
    seq_first = _timed(lambda: [one_c(k, args, factor) for k in keys])
    vm_times, seq_times, control_times = [], [], []
    progress(f"timing {repeats} interleaved repetitions ...")
    for _ in range(repeats):
        vm_times.append(_timed(lambda: vm_c(key, args, factor)))
        seq_times.append(_timed(lambda: [one_c(k, args, factor) for k in keys]))
        control_times.append(_timed(lambda: vm_c(key, args, factor)))
    measurements["hmc_8_chains_vmapped"] = _stats(vm_times, vm_compile, vm_first)
    measurements["hmc_8_chains_sequential"] = _stats(seq_times, one_compile, seq_first)
    measurements["hmc_8_chains_vmapped_control"] = _stats(control_times, vm_compile, vm_first)

    # ESS per second: the same vmapped HMC program against NumPyro NUTS.
    progress("NumPyro NUTS: first run (compiles) ...")
    mcmc = nuts.make_mcmc(NUM_CHAINS, warm, draws, accept)
    nuts_first = _timed(lambda: nuts.run_nuts(key, mcmc, *args).positions)
    nuts_repeats = max(3, repeats // 4)
    hmc_times, nuts_times = [], []
    progress(f"timing {nuts_repeats} interleaved HMC / NUTS runs ...")
    for _ in range(nuts_repeats):
        hmc_times.append(_timed(lambda: vm_c(key, args, factor)))
        nuts_times.append(_timed(lambda: nuts.run_nuts(key, mcmc, *args).positions))
    hmc_result = vm_c(key, args, factor)
    nuts_result = nuts.run_nuts(key, mcmc, *args)
    measurements["hmc_ess_run"] = _stats(hmc_times, vm_compile, vm_first)
    measurements["nuts_ess_run"] = _stats(nuts_times, float("nan"), nuts_first)
    measurements["nuts_ess_run"]["compile_s"] = None  # inside NumPyro's first run
    hmc_ess = min_bulk_ess(hmc_result.positions)
    nuts_ess = min_bulk_ess(nuts_result.positions)
    hmc_rate = hmc_ess / statistics.median(hmc_times)
    nuts_rate = nuts_ess / statistics.median(nuts_times)

    ratios = {
        "vmapped_chains_vs_sequential": statistics.median(seq_times) / statistics.median(vm_times),
        "vmapped_control_vs_vmapped": statistics.median(vm_times)
        / statistics.median(control_times),
        "hmc_vs_nuts_ess_per_s": hmc_rate / nuts_rate,
    }
    result = {
        "identity": _identity(config),
        "measurements": measurements,
        "ratios": ratios,
        "ess": {
            "hmc_min_bulk_ess": hmc_ess,
            "nuts_min_bulk_ess": nuts_ess,
            "hmc_ess_per_s": hmc_rate,
            "nuts_ess_per_s": nuts_rate,
            "hmc_leapfrog_per_draw": config.num_leapfrog,
            "nuts_mean_leapfrog_per_draw": float(np.mean(np.asarray(nuts_result.num_steps))),
        },
        "targets": {"vmapped_chains_vs_sequential": 3.0, "hmc_vs_nuts_ess_per_s": 1.0},
    }
    result["verdicts"] = {
        name: ("met" if ratios[name] >= target else "missed")
        for name, target in result["targets"].items()
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'path':32} {'compile_s':>10} {'first_s':>9} {'median_s':>9} {'p90_s':>9} {'n':>3}"]
    for name, m in result["measurements"].items():
        compile_s = "-" if m["compile_s"] is None else f"{m['compile_s']:.2f}"
        lines.append(
            f"{name:32} {compile_s:>10} {m['first_call_s']:9.3f} {m['median_s']:9.4f} "
            f"{m['p90_s']:9.4f} {m['n']:3d}"
        )
    for name, value in result["ratios"].items():
        target = result["targets"].get(name)
        verdict = "" if target is None else f"  (target >= {target}: {result['verdicts'][name]})"
        lines.append(f"{name}: {value:.2f}{verdict}")
    e = result["ess"]
    lines.append(
        f"min bulk-ESS: HMC {e['hmc_min_bulk_ess']:.0f}, NUTS {e['nuts_min_bulk_ess']:.0f}; "
        f"ESS/s: HMC {e['hmc_ess_per_s']:.0f}, NUTS {e['nuts_ess_per_s']:.0f}; leapfrog/draw: "
        f"HMC {e['hmc_leapfrog_per_draw']}, NUTS {e['nuts_mean_leapfrog_per_draw']:.1f}"
    )
    return "\n".join(lines)
