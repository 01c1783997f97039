"""`policy-evaluation bench`: the project's speed ratios, timed side by side
(compile apart from execution, interleaved rounds, an A/A control per ratio).

Paths (each compiled or warmed up once, apart from the timed rounds; every
timed call ends with `block_until_ready` or is pure NumPy/Python; the code of
each is in `bench_paths`):
  `jax_grid`      grid world, `vmap` over environments and `scan` over steps,
                  random actions, one jitted call, one CPU device.
  `python_grid`   the same grid world as the fastest plain Python loop:
                  successors and cumulative thresholds per (state, action)
                  precomputed, one `random.random()` and a `bisect` per draw.
  `python_grid_choice` the same loop with NumPy's `Generator.choice(p=...)`
                  per step over the dense table.
  `jax_cartpole`  CartPole, `vmap` x `scan`, random actions, one jitted call.
  `jax_cartpole_no_draws` the same loop without random draws (fixed action
                  pattern, fixed restart states): an upper bound for JAX here.
  `gym_cartpole`  gymnasium's vector CartPole (`make_vec("CartPole-v1")`,
                  its NumPy-vectorized implementation), same env count/steps.
  `gym_cartpole_sync` gymnasium's generic `SyncVectorEnv` (one Python
                  CartPole per environment, stepped in a loop), same counts.
  `ppo_vmapped`   `jit(vmap(make_train))` over 8 seeds, the seed axis split
                  over the config's `seed_shards` CPU devices (as `train` runs).
  `ppo_sequential` `jit(make_train)` for the 8 seeds one after another on each
                  of the same `seed_shards` devices, the devices side by side.
  `ppo_vmapped_one_device`, `ppo_sequential_one_device`: both on one device.
  `rng_threefry`, `rng_pcg64`: 2^20 (default) random 32-bit words by
                  `jax.random.bits` and by NumPy's `Generator.integers`.
  `<path>_aa`     the measured path of a ratio timed a second time in the same
                  rounds: its A/A control.
Rounds run every path once in a shuffled order (interleaved), >= 20 rounds.
A ratio is the median of its per-round ratios (steps/s for the environments,
time for PPO and the random words), above 1 when the first-named side is
faster; `ratio_details` gives its baseline, the per-round spread and the A/A
control. Each path's CPU time over wall time (`cpu_per_wall`) shows how many
cores it kept busy. Identity: the vmapped and sequential PPO parameters are
compared. The CartPole sweep over environment counts is in `bench_sweep`.
Targets come from the project's issue; they are reported, never asserted.
"""

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from policy_evaluation.bench_paths import (
    GridTables,
    SequentialOverDevices,
    env_scan,
    gym_run,
    python_grid_cdf,
    python_grid_choice,
    rng_words,
)
from policy_evaluation.bench_stats import per_round, ratio_detail
from policy_evaluation.bench_sweep import cartpole_sweep, plot
from policy_evaluation.config import Config
from policy_evaluation.devices import jit_over_seeds, seed_sharding
from policy_evaluation.envs import CartPole, GridWorld
from policy_evaluation.train import make_train, seed_keys

TARGETS = {"jax_vs_python": 20.0, "jax_vs_gymnasium": 100.0, "vmapped_seeds_vs_sequential": 2.0}

SIZES = {
    # envs, steps for JAX paths; steps of the Python loops; PPO steps per seed;
    # random words per call; environment counts of the CartPole sweep
    # (SyncVectorEnv only up to 256).
    "default": {
        "envs": 256,
        "steps": 200,
        "python_steps": 20000,
        "ppo_steps": 8192,
        "rng_words": 1 << 20,
        "rounds": 20,
        "sweep_envs": (8, 64, 256, 1024, 4096),
        "sweep_rounds": 7,
    },
    "tiny": {
        "envs": 8,
        "steps": 10,
        "python_steps": 50,
        "ppo_steps": 512,
        "rng_words": 1 << 10,
        "rounds": 20,
        "sweep_envs": (4, 8),
        "sweep_rounds": 3,
    },
}

# name: (measured path, baseline path, "rate" (steps/s) or "time", baseline sentence).
# The A/A control of every ratio is its measured path timed again (`<measured>_aa`).
RATIOS = {
    "jax_vs_python": (
        "jax_grid",
        "python_grid",
        "rate",
        "the fastest plain Python loop over the enumerated grid world: successors and "
        "cumulative thresholds per (state, action) precomputed, one random.random() and a "
        "bisect per draw (one thread, the GIL)",
    ),
    "jax_vs_python_choice": (
        "jax_grid",
        "python_grid_choice",
        "rate",
        "the same Python loop with numpy Generator.choice(p=P[s, a]) and Generator.integers "
        "per step (one thread)",
    ),
    "jax_vs_gymnasium": (
        "jax_cartpole",
        "gym_cartpole",
        "rate",
        "gymnasium's own vector CartPole (NumPy-vectorized over environments, one thread), "
        "same environment count and steps",
    ),
    "jax_vs_gymnasium_sync": (
        "jax_cartpole",
        "gym_cartpole_sync",
        "rate",
        "gymnasium's generic SyncVectorEnv (one Python CartPole per environment, one thread)",
    ),
    "jax_no_draws_vs_gymnasium": (
        "jax_cartpole_no_draws",
        "gym_cartpole",
        "rate",
        "gymnasium's vector CartPole, against the JAX loop with no random draw (a bound)",
    ),
    "vmapped_seeds_vs_sequential": (
        "ppo_vmapped",
        "ppo_sequential",
        "time",
        "jit(make_train) per seed, the seeds one after another on each of the same "
        "seed_shards CPU devices, the devices side by side (one thread per device)",
    ),
    "vmapped_one_device_vs_sequential": (
        "ppo_vmapped_one_device",
        "ppo_sequential_one_device",
        "time",
        "jit(make_train) per seed, one after another; both sides on one CPU device",
    ),
    "vmapped_seeds_vs_sequential_one_device": (
        "ppo_vmapped",
        "ppo_sequential_one_device",
        "time",
        "jit(make_train) per seed on one CPU device, against the vmapped seeds split over "
        "seed_shards devices: batching and the device split together",
    ),
    "pcg64_vs_threefry": (
        "rng_pcg64",
        "rng_threefry",
        "time",
        "the same number of 32-bit words from jax.random.bits (Threefry, jitted, one device)",
    ),
}


def ppo_config(size: str) -> Config:
    """The PPO run of the `vmapped_seeds_vs_sequential` ratio: 8 CartPole seeds,
    4 environments x 64 steps per update, hidden size 32, two seed shards."""
    return Config.tiny("cartpole").replace(
        num_seeds=8,
        seed_shards=2,
        num_envs=4,
        num_steps=64,
        total_timesteps=SIZES[size]["ppo_steps"],
    )


def run_bench(size: str, out: Path, progress=print) -> dict[str, Any]:
    with jax.debug_key_reuse(False):
        return _run_bench(size, out, progress)


def _paths(size: str, keys, gym_rng) -> tuple[dict[str, Any], dict[str, int], list]:
    """Every timed path (a call), the steps of the environment paths, and the
    objects to close afterwards."""
    import gymnasium as gym  # test/bench dependency

    sz = SIZES[size]
    n, T = sz["envs"], sz["steps"]
    grid_fn = env_scan(GridWorld(), n, T)
    cart_fn = env_scan(CartPole(), n, T)
    cart_no_draws_fn = env_scan(CartPole(), n, T, draws=False)
    grid = GridWorld()
    tables = GridTables.of(grid)
    dense = grid.transition_table()
    config = ppo_config(size)
    # Every repetition deliberately reuses the same seed keys (identical work per
    # rep), so the key-reuse checker is switched off for the timed calls.
    train_keys, _ = seed_keys(config)
    vmapped = jit_over_seeds(make_train(config), config)
    vmapped_one_device = jax.jit(jax.vmap(make_train(config)))
    single = jax.jit(make_train(config))
    sharding = seed_sharding(config)
    devices = list(sharding.mesh.devices.flat) if sharding is not None else jax.devices()[:1]
    sequential = SequentialOverDevices(single, train_keys, devices)
    sequential_one = SequentialOverDevices(single, train_keys, jax.devices()[:1])
    words = rng_words(sz["rng_words"])
    paths = {
        "jax_grid": lambda: grid_fn(next(keys)).block_until_ready(),
        "python_grid": lambda: python_grid_cdf(tables, sz["python_steps"], 0),
        "python_grid_choice": lambda: python_grid_choice(grid, dense, sz["python_steps"], 0),
        "jax_cartpole": lambda: cart_fn(next(keys)).block_until_ready(),
        "jax_cartpole_no_draws": lambda: cart_no_draws_fn(next(keys)).block_until_ready(),
        "gym_cartpole": gym_run(
            gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point"),
            n,
            T,
            gym_rng,
        ),
        "gym_cartpole_sync": gym_run(
            gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync"), n, T, gym_rng
        ),
        "ppo_vmapped": lambda: jax.block_until_ready(vmapped(train_keys)),
        "ppo_sequential": sequential.run,
        "ppo_vmapped_one_device": lambda: jax.block_until_ready(vmapped_one_device(train_keys)),
        "ppo_sequential_one_device": sequential_one.run,
        "rng_threefry": words["threefry"],
        "rng_pcg64": words["pcg64"],
    }
    for measured, *_ in RATIOS.values():
        paths.setdefault(f"{measured}_aa", paths[measured])
    env_steps = {"jax_grid": n * T, "python_grid": sz["python_steps"]}
    env_steps["python_grid_choice"] = sz["python_steps"]
    for name in ("jax_cartpole", "jax_cartpole_no_draws", "gym_cartpole", "gym_cartpole_sync"):
        env_steps[name] = n * T
    for name in list(env_steps):
        if f"{name}_aa" in paths:
            env_steps[f"{name}_aa"] = env_steps[name]
    identity = {"vmapped": vmapped, "sequential": sequential, "sequential_one": sequential_one}
    return paths, env_steps, [identity, train_keys]


def _run_bench(size: str, out: Path, progress) -> dict[str, Any]:
    sz = SIZES[size]
    keys = iter(jax.random.split(jax.random.key(123), 10_000))
    gym_rng = np.random.default_rng(0)
    paths, steps, (ppo, train_keys) = _paths(size, keys, gym_rng)

    compile_s = {}
    for name, fn in paths.items():
        t0 = time.perf_counter()
        fn()
        compile_s[name] = time.perf_counter() - t0
    progress(f"warm-up/compile done: { {k: round(v, 2) for k, v in compile_s.items()} }")

    times: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    order_rng = np.random.default_rng(0)
    for r in range(sz["rounds"]):
        for name in order_rng.permutation(list(paths)):
            c0, t0 = time.process_time(), time.perf_counter()
            paths[name]()
            wall = time.perf_counter() - t0
            times[name].append(wall)
            cpu[name].append((time.process_time() - c0) / wall)
        progress(f"round {r + 1}/{sz['rounds']}")

    details = {}
    for name, (measured, baseline, kind, sentence) in RATIOS.items():
        scale = steps[measured] / steps[baseline] if kind == "rate" else 1.0
        rounds = [scale * x for x in per_round(times[baseline], times[measured])]
        aa = per_round(times[f"{measured}_aa"], times[measured])
        details[name] = ratio_detail(sentence, rounds, aa, measured, statistic=kind)
    ratios = {name: d["median"] for name, d in details.items()}
    ratios["aa_control"] = details["jax_vs_python"]["aa"]

    progress(f"CartPole sweep over {sz['sweep_envs']} environments")
    sweep = cartpole_sweep(sz["sweep_envs"], sz["steps"], sz["sweep_rounds"], keys, gym_rng)
    a = jax.device_get(ppo["vmapped"](train_keys)["params"])
    b = [jax.device_get(r["params"]) for r in ppo["sequential"].run()]
    b_one = [jax.device_get(r["params"]) for r in ppo["sequential_one"].run()]
    for s in (ppo["sequential"], ppo["sequential_one"]):
        s.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    report = {
        "size": size,
        "sizes": sz,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "jax_backend": jax.default_backend(),
            "jax": jax.__version__,
            "cpu_devices": len(jax.devices("cpu")),
        },
        "compile_or_warmup_s": compile_s,
        "paths": {
            k: {
                "median_s": med[k],
                "p90_s": float(np.percentile(v, 90)),
                "min_s": min(v),
                "reps": len(v),
                "cpu_per_wall": statistics.median(cpu[k]),
                **({"steps_per_s": steps[k] / med[k]} if k in steps else {}),
            }
            for k, v in times.items()
        },
        "ratios": ratios,
        "ratio_details": details,
        "targets": TARGETS,
        "rng_ns_per_word": {
            "threefry": med["rng_threefry"] / sz["rng_words"] * 1e9,
            "pcg64": med["rng_pcg64"] / sz["rng_words"] * 1e9,
        },
        "cartpole_sweep": sweep,
        "identity": {
            "ppo_vmapped_vs_sequential_max_abs_param_diff": _max_diff(a, b),
            "ppo_sequential_devices_vs_one_device_max_abs_param_diff": _max_diff_lists(b, b_one),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    plot(times, sweep, out.with_suffix(".png"))
    return report


def _max_diff(stacked, per_seed: list) -> float:
    """max |stacked[i] - per_seed[i]| over seeds i and parameter leaves."""
    return max(
        float(np.max(np.abs(np.asarray(x)[i] - np.asarray(y))))
        for i in range(len(per_seed))
        for x, y in zip(jax.tree.leaves(stacked), jax.tree.leaves(per_seed[i]), strict=True)
    )


def _max_diff_lists(a: list, b: list) -> float:
    """max |a[i] - b[i]| over seeds i and parameter leaves."""
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for p, q in zip(a, b, strict=True)
        for x, y in zip(jax.tree.leaves(p), jax.tree.leaves(q), strict=True)
    )
