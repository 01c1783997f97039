"""`bayesian-regression bench`: ratios measured side by side, with their baselines.

  - `vmapped_chains_vs_sequential`: 8 HMC chains in one vmapped program vs the
    same 8 chains run one after another through the one-chain program (same
    iterations, same keys). Above 1: vmapping is faster.
  - `hmc_vs_nuts_ess_per_s`: effective draws per second (minimum bulk-ESS over
    the parameters / execution time) of the hand-built fixed-length HMC vs
    NumPyro NUTS on the stage-1 posterior, same chains and iterations, compile
    excluded on BOTH sides: NumPyro's `MCMC.run` is traced once inside
    `jax.jit(...).lower().compile()` and its executable is timed, as ours is.
    The executable is checked against a plain `MCMC.run` on the same key: the
    two compilations round float32 differently, so on a short run the draws
    agree to rounding and on a long one a flipped tree decision parts the
    chains; their ESS and mean tree size are recorded side by side.
  - `hmc_vs_nuts_ess_per_s_numpyro_run`: the same, NUTS timed per `MCMC.run`
    call, which traces and lowers its sampling loop again on every call and
    loads the executable from JAX's persistent compilation cache: the per-run
    cost a NumPyro user pays; the tracing, lowering and cache-load seconds
    inside those calls are recorded (`numpyro_run_overhead`).
  - `hmc_vs_nuts_ess_per_grad`: ESS per gradient evaluation, warm-up and draws
    counted (HMC: `num_leapfrog` per transition, one at each chain's start;
    NUTS: its leapfrog steps per tree, warm-up counted by `MCMC.warmup` on the
    same key); `_sampling` counts the draws only. Counts, not times: the same
    in every run on one CPU, but Monte Carlo figures all the same, so their A/A
    control is the ratio on a second key (another CPU's rounding parts the
    chains as another key does).
  - `vmapped_control_vs_vmapped`, `hmc_control_vs_hmc`: A/A controls.

Every timed call ends in `jax.block_until_ready`; sides alternate within each
round (A B A' and HMC, NUTS compiled, NUTS run, HMC'); compiles and cache loads
inside each timed call are counted through `jax.monitoring`, so a path that
recompiles shows it. `ratio_details` holds per ratio its baseline sentence, the
per-round ratios (min, median, max) and the A/A control's per-round spread.
The XLA CPU runtime keeps its default thread pool on every side (one process,
the same for all paths).
"""

import collections
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
import jax.numpy as jnp
import numpy as np

from bayesian_regression import diagnostics, hmc, model, nuts, train
from bayesian_regression.config import Config

NUM_CHAINS = 8
# jax.monitoring events that mean "this call compiled, or looked an executable up".
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"
# Durations that make up NumPyro's per-run overhead (tracing, lowering, compiling
# or loading from the persistent cache).
OVERHEAD_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    BACKEND_COMPILE,
    "/jax/compilation_cache/cache_retrieval_time_sec",
)


class _Events:
    """Counts and summed durations of `jax.monitoring` events (one listener per process)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)

    def on_event(self, event: str, **kwargs: Any) -> None:
        del kwargs
        self.counts[event] += 1

    def on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        del kwargs
        self.counts[event] += 1
        self.seconds[event] += duration

    def snapshot(self) -> tuple[dict[str, int], dict[str, float]]:
        return dict(self.counts), dict(self.seconds)


_EVENTS = _Events()
jax.monitoring.register_event_listener(_EVENTS.on_event)
jax.monitoring.register_event_duration_secs_listener(_EVENTS.on_duration)


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


class _Path:
    """One timed path: its times and what compiled or loaded during its timed calls."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.times: list[float] = []
        self.compiles = 0
        self.cache_hits = 0
        self.overhead_s: collections.defaultdict[str, float] = collections.defaultdict(float)

    def __call__(self) -> Any:
        counts0, seconds0 = _EVENTS.snapshot()
        start = time.perf_counter()
        out = jax.block_until_ready(self.fn())
        self.times.append(time.perf_counter() - start)
        counts1, seconds1 = _EVENTS.snapshot()
        self.compiles += counts1.get(BACKEND_COMPILE, 0) - counts0.get(BACKEND_COMPILE, 0)
        self.cache_hits += counts1.get(CACHE_HIT, 0) - counts0.get(CACHE_HIT, 0)
        for event in OVERHEAD_EVENTS:
            self.overhead_s[event] += seconds1.get(event, 0.0) - seconds0.get(event, 0.0)
        return out


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def _stats(path: _Path, compile_s: float | None, first_call_s: float) -> dict[str, Any]:
    times = path.times
    return {
        "compile_s": compile_s,
        "first_call_s": first_call_s,
        "median_s": statistics.median(times),
        "p90_s": float(np.quantile(times, 0.9)),
        "min_s": min(times),
        "max_s": max(times),
        "n": len(times),
        "compiles_in_timed_calls": path.compiles,
        "cache_hits_in_timed_calls": path.cache_hits,
    }


def _compiled(fn, *args):
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return compiled, time.perf_counter() - start


def min_bulk_ess(positions) -> float:
    positions = np.asarray(positions, np.float64)
    return min(diagnostics.ess_bulk(positions[:, :, i]) for i in range(positions.shape[2]))


def spread(values: list[float]) -> dict[str, Any]:
    """`{"rounds", "min", "median", "max"}` of per-round ratios."""
    return {
        "rounds": [float(v) for v in values],
        "min": float(min(values)),
        "median": float(statistics.median(values)),
        "max": float(max(values)),
    }


def _enable_compilation_cache(directory: Path) -> None:
    """NumPyro's `MCMC.run` traces and lowers its sampling loop again on every call
    (a fresh closure each time), so without a cache every rerun compiles anew.
    With JAX's persistent compilation cache a rerun finds the executable on disk:
    what is left (tracing, lowering, the cache lookup) is the per-run cost a
    NumPyro user pays, measured by the `_numpyro_run` ratio."""
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory.absolute()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def nuts_program(num_warmup: int, num_samples: int, target_accept: float):
    """`(key, x, y, prior) -> (positions, num_steps, diverging)`: one `MCMC.run` of
    NumPyro NUTS (8 vectorized chains), traceable, so that `jax.jit` compiles it once."""

    def program(key, x, y, prior):
        mcmc = nuts.make_mcmc(NUM_CHAINS, num_warmup, num_samples, target_accept)
        with nuts.library_numerics():
            mcmc.run(key, x, y, prior, extra_fields=("num_steps", "diverging"))
            samples = mcmc.get_samples(group_by_chain=True)
            extra = mcmc.get_extra_fields(group_by_chain=True)
            positions = jnp.concatenate(
                [samples["w"], jnp.log(samples["sigma2"])[..., None]], axis=-1
            )
        return positions, extra["num_steps"], extra["diverging"]

    return program


def nuts_warmup_steps(key, mcmc, args) -> int:
    """Leapfrog steps of NUTS's warm-up on `key` (the warm-up `MCMC.run(key)` does)."""
    with nuts.library_numerics():
        mcmc.warmup(key, *args, extra_fields=("num_steps",), collect_warmup=True)
        steps = mcmc.get_extra_fields(group_by_chain=True)["num_steps"]
    return int(np.asarray(steps, np.int64).sum())


BASELINES = {
    "vmapped_chains_vs_sequential": "the one-chain HMC program (compiled once) called 8 times "
    "in a row, same keys and iterations",
    "vmapped_control_vs_vmapped": "A/A control: the vmapped HMC program timed twice per round",
    "hmc_vs_nuts_ess_per_s": "NumPyro NUTS (8 vectorized chains, same warm-up and draws), its "
    "MCMC.run compiled once with jax.jit and the executable timed: compile excluded on both "
    "sides",
    "hmc_vs_nuts_ess_per_s_numpyro_run": "NumPyro NUTS timed per MCMC.run call: each call "
    "traces and lowers its loop again and loads the executable from JAX's persistent cache "
    "(the per-run cost a NumPyro user pays)",
    "hmc_vs_nuts_ess_per_grad": "NumPyro NUTS, ESS per gradient evaluation over warm-up and "
    "draws (counts, the same in every run on one CPU; A/A: the same ratio on a second key)",
    "hmc_vs_nuts_ess_per_grad_sampling": "NumPyro NUTS, ESS per gradient evaluation over the "
    "kept draws only (counts, the same in every run on one CPU; A/A: the same ratio on a "
    "second key)",
    "hmc_control_vs_hmc": "A/A control: the vmapped HMC program timed twice per round of the "
    "HMC / NUTS comparison",
}


def run(
    out: Path,
    repeats: int = 20,
    progress: Callable[[str], None] = print,
    config: Config | None = None,
) -> dict[str, Any]:
    """Runs the bench on `config` (default `bench_config()`, `NUM_CHAINS` chains),
    writes the JSON report to `out` and returns it. `repeats` rounds of the
    vmapped/sequential comparison, `max(3, repeats // 2)` of HMC / NUTS."""
    config = bench_config() if config is None else config.replace(num_chains=NUM_CHAINS)
    _enable_compilation_cache(out.parent / "jax-cache")
    # The same key is reused on purpose: every rerun must give the same draws.
    with jax.debug_key_reuse(False):
        result = _run(config, repeats, progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def _run(config: Config, repeats: int, progress: Callable[[str], None]) -> dict[str, Any]:
    problem = train.make_problem(config)
    args = problem.args
    key = jax.random.key(config.seed)
    dim = problem.dim
    warm, draws, steps = config.num_warmup, config.num_samples, config.num_leapfrog
    accept = config.target_accept
    factor = jnp.asarray(1.0, jnp.float32)
    measurements: dict[str, Any] = {}

    # A: 8 chains vmapped.  B: the one-chain program, 8 times in a row.  A': A again.
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
    vm = _Path(lambda: vm_c(key, args, factor))
    seq = _Path(lambda: [one_c(k, args, factor) for k in keys])
    vm_aa = _Path(lambda: vm_c(key, args, factor))
    progress(f"timing {repeats} rounds: vmapped, sequential, vmapped again ...")
    for _ in range(repeats):
        vm(), seq(), vm_aa()
    measurements["hmc_8_chains_vmapped"] = _stats(vm, vm_compile, vm_first)
    measurements["hmc_8_chains_sequential"] = _stats(seq, one_compile, seq_first)
    measurements["hmc_8_chains_vmapped_control"] = _stats(vm_aa, vm_compile, vm_first)

    # ESS per second: the vmapped HMC program against NUTS, compiled and per MCMC.run.
    progress("NumPyro NUTS: compiling MCMC.run under jax.jit ...")
    start = time.perf_counter()
    with nuts.library_numerics():
        lowered = jax.jit(nuts_program(warm, draws, accept)).lower(key, *args)
    nuts_lower = time.perf_counter() - start
    start = time.perf_counter()
    nuts_c = lowered.compile()
    nuts_compile = time.perf_counter() - start
    nuts_jit_first = _timed(lambda: nuts_c(key, *args))
    progress("NumPyro NUTS: first MCMC.run (compiles, or loads from the cache) ...")
    mcmc = nuts.make_mcmc(NUM_CHAINS, warm, draws, accept)
    nuts_run_first = _timed(lambda: nuts.run_nuts(key, mcmc, *args).positions)
    hmc_path = _Path(lambda: vm_c(key, args, factor))
    nuts_jit = _Path(lambda: nuts_c(key, *args))
    nuts_run = _Path(lambda: nuts.run_nuts(key, mcmc, *args).positions)
    hmc_aa = _Path(lambda: vm_c(key, args, factor))
    nuts_rounds = max(3, repeats // 2)
    progress(f"timing {nuts_rounds} rounds: HMC, NUTS compiled, NUTS MCMC.run, HMC again ...")
    for _ in range(nuts_rounds):
        hmc_path(), nuts_jit(), nuts_run(), hmc_aa()
    measurements["hmc_ess_run"] = _stats(hmc_path, vm_compile, vm_first)
    measurements["nuts_compiled_run"] = _stats(nuts_jit, nuts_compile, nuts_jit_first)
    measurements["nuts_compiled_run"]["lower_s"] = nuts_lower
    measurements["nuts_mcmc_run"] = _stats(nuts_run, None, nuts_run_first)  # compiles inside
    measurements["hmc_ess_run_control"] = _stats(hmc_aa, vm_compile, vm_first)

    hmc_result = vm_c(key, args, factor)
    nuts_positions, nuts_steps, nuts_diverging = nuts_c(key, *args)
    reference = nuts.run_nuts(key, mcmc, *args)
    warmup_steps = nuts_warmup_steps(key, nuts.make_mcmc(NUM_CHAINS, warm, draws, accept), args)
    hmc_ess = min_bulk_ess(hmc_result.positions)
    nuts_ess = min_bulk_ess(nuts_positions)
    reference_ess = min_bulk_ess(reference.positions)
    sampling_steps = int(np.asarray(nuts_steps, np.int64).sum())
    hmc_grads_sampling = NUM_CHAINS * draws * steps
    hmc_grads = NUM_CHAINS * ((warm + draws) * steps + 1)
    nuts_grads = warmup_steps + sampling_steps
    gain = hmc_ess / nuts_ess

    def ess_and_steps(on_key) -> dict[str, float]:
        """HMC's and NUTS's minimum bulk-ESS and NUTS's leapfrog steps on one key."""
        positions, tree_steps, _ = nuts_c(on_key, *args)
        mcmc_b = nuts.make_mcmc(NUM_CHAINS, warm, draws, accept)
        return {
            "hmc_min_bulk_ess": min_bulk_ess(vm_c(on_key, args, factor).positions),
            "nuts_min_bulk_ess": min_bulk_ess(positions),
            "nuts_gradient_evaluations_sampling": int(np.asarray(tree_steps, np.int64).sum()),
            "nuts_gradient_evaluations_warmup": nuts_warmup_steps(on_key, mcmc_b, args),
        }

    # The per-gradient ratios are counts: the same in every run on one CPU. But
    # the draws behind them are Monte Carlo, and another CPU rounds float32
    # differently, which parts the chains as another key would. Their A/A
    # control is the same ratio on a second key: the noise a rerun elsewhere sees.
    progress("ESS per gradient on a second key (the per-gradient ratios' A/A) ...")
    second = ess_and_steps(jax.random.fold_in(key, 1))
    second_sampled = second["nuts_gradient_evaluations_sampling"]
    second_grads = second["nuts_gradient_evaluations_warmup"] + second_sampled
    second_per_grad = (second["hmc_min_bulk_ess"] / hmc_grads) / (
        second["nuts_min_bulk_ess"] / second_grads
    )
    second_per_grad_sampling = (second["hmc_min_bulk_ess"] / hmc_grads_sampling) / (
        second["nuts_min_bulk_ess"] / second_sampled
    )

    def per_round(nuts_path: _Path, gain: float) -> list[float]:
        return [gain * b / a for a, b in zip(hmc_path.times, nuts_path.times, strict=True)]

    med = {name: m["median_s"] for name, m in measurements.items()}
    per_grad = (hmc_ess / hmc_grads) / (nuts_ess / nuts_grads)
    per_grad_sampling = (hmc_ess / hmc_grads_sampling) / (nuts_ess / sampling_steps)
    ratios = {
        "vmapped_chains_vs_sequential": med["hmc_8_chains_sequential"]
        / med["hmc_8_chains_vmapped"],
        "vmapped_control_vs_vmapped": med["hmc_8_chains_vmapped"]
        / med["hmc_8_chains_vmapped_control"],
        "hmc_vs_nuts_ess_per_s": gain * med["nuts_compiled_run"] / med["hmc_ess_run"],
        "hmc_vs_nuts_ess_per_s_numpyro_run": (hmc_ess / reference_ess)
        * med["nuts_mcmc_run"]
        / med["hmc_ess_run"],
        "hmc_vs_nuts_ess_per_grad": per_grad,
        "hmc_vs_nuts_ess_per_grad_sampling": per_grad_sampling,
        "hmc_control_vs_hmc": med["hmc_ess_run"] / med["hmc_ess_run_control"],
    }

    def aa_of(a: _Path, a_again: _Path) -> dict[str, Any]:
        return spread([x / y for x, y in zip(a.times, a_again.times, strict=True)])

    vm_aa_spread, hmc_aa_spread = aa_of(vm, vm_aa), aa_of(hmc_path, hmc_aa)
    rounds = {
        "vmapped_chains_vs_sequential": (
            [b / a for a, b in zip(vm.times, seq.times, strict=True)],
            vm_aa_spread,
        ),
        "vmapped_control_vs_vmapped": (vm_aa_spread["rounds"], vm_aa_spread),
        "hmc_vs_nuts_ess_per_s": (per_round(nuts_jit, gain), hmc_aa_spread),
        "hmc_vs_nuts_ess_per_s_numpyro_run": (
            per_round(nuts_run, hmc_ess / reference_ess),
            hmc_aa_spread,
        ),
        "hmc_vs_nuts_ess_per_grad": ([per_grad], spread([second_per_grad / per_grad])),
        "hmc_vs_nuts_ess_per_grad_sampling": (
            [per_grad_sampling],
            spread([second_per_grad_sampling / per_grad_sampling]),
        ),
        "hmc_control_vs_hmc": (hmc_aa_spread["rounds"], hmc_aa_spread),
    }
    ratio_details = {
        name: {"baseline": BASELINES[name], "aa": aa, **spread(values)}
        for name, (values, aa) in rounds.items()
    }
    overhead = {
        event.rsplit("/", 1)[-1]: seconds / len(nuts_run.times)
        for event, seconds in nuts_run.overhead_s.items()
    }
    result = {
        "identity": _identity(config),
        "measurements": measurements,
        "ratios": ratios,
        "ratio_details": ratio_details,
        "ess": {
            "hmc_min_bulk_ess": hmc_ess,
            "nuts_min_bulk_ess": nuts_ess,
            "hmc_ess_per_s": hmc_ess / med["hmc_ess_run"],
            "nuts_ess_per_s": nuts_ess / med["nuts_compiled_run"],
            "nuts_ess_per_s_numpyro_run": reference_ess / med["nuts_mcmc_run"],
            "hmc_leapfrog_per_draw": steps,
            "nuts_mean_leapfrog_per_draw": sampling_steps / (NUM_CHAINS * draws),
            "hmc_gradient_evaluations": hmc_grads,
            "hmc_gradient_evaluations_sampling": hmc_grads_sampling,
            "nuts_gradient_evaluations": nuts_grads,
            "nuts_gradient_evaluations_sampling": sampling_steps,
            "nuts_gradient_evaluations_warmup": warmup_steps,
            "gradient_count_note": "one per leapfrog step; HMC adds one per chain at its "
            "start; NumPyro's initial step-size search is not counted",
            "second_key": second,
        },
        "nuts_compiled_vs_mcmc_run": {
            "max_abs_draw_difference": float(
                np.abs(np.asarray(nuts_positions) - np.asarray(reference.positions)).max()
            ),
            "same_tree_sizes": bool(
                np.array_equal(np.asarray(nuts_steps), np.asarray(reference.num_steps))
            ),
            "min_bulk_ess": {"compiled": nuts_ess, "mcmc_run": reference_ess},
            "mean_leapfrog_per_draw": {
                "compiled": sampling_steps / (NUM_CHAINS * draws),
                "mcmc_run": float(np.mean(np.asarray(reference.num_steps))),
            },
            "divergences": {
                "compiled": int(np.asarray(nuts_diverging).sum()),
                "mcmc_run": int(np.asarray(reference.is_divergent).sum()),
            },
        },
        "numpyro_run_overhead": {
            "seconds_per_run": overhead,
            "cache_hits_per_run": nuts_run.cache_hits / len(nuts_run.times),
            "compiles_per_run": nuts_run.compiles / len(nuts_run.times),
        },
        "targets": {"vmapped_chains_vs_sequential": 3.0, "hmc_vs_nuts_ess_per_s": 1.0},
    }
    result["verdicts"] = {
        name: ("met" if ratios[name] >= target else "missed")
        for name, target in result["targets"].items()
    }
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"{'path':30} {'compile_s':>10} {'first_s':>9} {'median_s':>9} {'p90_s':>9} "
        f"{'n':>3} {'compiles':>8}"
    ]
    for name, m in result["measurements"].items():
        compile_s = "-" if m["compile_s"] is None else f"{m['compile_s']:.2f}"
        lines.append(
            f"{name:30} {compile_s:>10} {m['first_call_s']:9.3f} {m['median_s']:9.4f} "
            f"{m['p90_s']:9.4f} {m['n']:3d} {m['compiles_in_timed_calls']:8d}"
        )
    for name, value in result["ratios"].items():
        target = result["targets"].get(name)
        verdict = "" if target is None else f"  (target >= {target}: {result['verdicts'][name]})"
        d = result["ratio_details"][name]
        rounds = f" rounds {d['min']:.2f}..{d['max']:.2f}"
        aa = "" if d["aa"] is None else f", A/A {d['aa']['min']:.2f}..{d['aa']['max']:.2f}"
        lines.append(f"{name}: {value:.2f}{verdict}{rounds}{aa}")
    e = result["ess"]
    lines.append(
        f"min bulk-ESS: HMC {e['hmc_min_bulk_ess']:.0f}, NUTS {e['nuts_min_bulk_ess']:.0f}; "
        f"ESS/s: HMC {e['hmc_ess_per_s']:.0f}, NUTS {e['nuts_ess_per_s']:.0f} (per MCMC.run "
        f"{e['nuts_ess_per_s_numpyro_run']:.0f}); gradients: HMC {e['hmc_gradient_evaluations']}"
        f", NUTS {e['nuts_gradient_evaluations']}; leapfrog/draw: HMC "
        f"{e['hmc_leapfrog_per_draw']}, NUTS {e['nuts_mean_leapfrog_per_draw']:.1f}"
    )
    o = result["numpyro_run_overhead"]
    lines.append(
        "per MCMC.run overhead (s): "
        + ", ".join(f"{k} {v:.3f}" for k, v in o["seconds_per_run"].items())
        + f"; cache hits/run {o['cache_hits_per_run']:.1f}"
    )
    return "\n".join(lines)
