"""`policy-evaluation bench`: three speed ratios timed side by side
(compile apart from execution, interleaved rounds, an A/A control).

Paths (each compiled or warmed up once, apart from the timed rounds; every
timed call ends with `block_until_ready` or is pure NumPy/Python):
  `jax_grid`      grid world, `vmap` over environments and `scan` over steps,
                  random actions, one jitted call.
  `jax_grid_aa`   the same executable on another key: the A/A control.
  `python_grid`   the same grid world as a plain Python loop over the
                  enumerated table (`GridWorld.transition_table`), NumPy RNG.
  `jax_cartpole`  CartPole, `vmap` x `scan`, random actions, one jitted call.
  `jax_cartpole_no_draws` the same loop without random draws (fixed action
                  pattern, fixed restart states): an upper bound for JAX here.
  `gym_cartpole`  gymnasium's vector CartPole (`make_vec("CartPole-v1")`,
                  its NumPy-vectorized implementation), same env count/steps.
  `gym_cartpole_sync` gymnasium's generic `SyncVectorEnv` (one Python
                  CartPole per environment, stepped in a loop), same counts.
  `ppo_vmapped`   `jit(vmap(make_train))` over 8 seeds, the seed axis split
                  over the config's `seed_shards` CPU devices (as `train` runs).
  `ppo_vmapped_one_device` the same on one device: what batching alone gives.
  `ppo_sequential` `jit(make_train)` called for the 8 seeds one after another.
Rounds run every path once in a shuffled order (interleaved), >= 20 rounds.
Ratios: throughput (steps/s) ratios for the environments, time ratio for PPO;
medians. Identity: the vmapped and sequential PPO parameters are compared.
A sweep over environment counts (`cartpole_sweep` in the report, right panel
of the PNG) shows how the CartPole ratios move with the batch: the NumPy
environment pays Python overhead once per step for all environments, so its
gap to JAX closes as the count grows.
Targets come from the project's issue; they are reported, never asserted.
"""

import json
import platform
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from policy_evaluation.config import Config
from policy_evaluation.devices import jit_over_seeds
from policy_evaluation.envs import CartPole, GridWorld
from policy_evaluation.train import make_train, seed_keys

TARGETS = {"jax_vs_python": 20.0, "jax_vs_gymnasium": 100.0, "vmapped_seeds_vs_sequential": 2.0}

SIZES = {
    # envs, steps for JAX paths; steps of the Python loop; PPO steps per seed;
    # environment counts of the CartPole sweep (SyncVectorEnv only up to 256).
    "default": {
        "envs": 256,
        "steps": 200,
        "python_steps": 4000,
        "ppo_steps": 8192,
        "rounds": 20,
        "sweep_envs": (8, 64, 256, 1024, 4096),
        "sweep_rounds": 7,
    },
    "tiny": {
        "envs": 8,
        "steps": 10,
        "python_steps": 50,
        "ppo_steps": 512,
        "rounds": 20,
        "sweep_envs": (4, 8),
        "sweep_rounds": 3,
    },
}
SYNC_MAX_ENVS = 256


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


def _env_scan(env, num_envs: int, num_steps: int, draws: bool = True):
    """`jit` of key -> a scalar that depends on every step: `vmap` over
    environments, `scan` over `num_steps` steps, auto-reset. With `draws`, every
    step draws random actions, step keys and fresh start states, as a rollout
    does; without, actions follow a fixed pattern and a finished environment
    restarts from its first start state: the loop makes no random draw, which
    bounds what faster random numbers could gain."""

    def run(key):
        reset_key, key = jax.random.split(key)
        start, _ = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))

        def body(carry, t):
            state, key, total = carry
            if draws:
                key, a_key, s_key, r_key = jax.random.split(key, 4)
                action = jax.random.randint(a_key, (num_envs,), 0, env.num_actions, jnp.int32)
                step_keys = jax.random.split(s_key, num_envs)
                fresh, _ = jax.vmap(env.reset)(jax.random.split(r_key, num_envs))
            else:
                action = (t + jnp.arange(num_envs, dtype=jnp.int32)) % env.num_actions
                step_keys = jax.random.split(jax.random.key(0), num_envs)  # unused by CartPole
                fresh = start
            out = jax.vmap(env.step)(state, action, step_keys)
            done = out.terminated | out.truncated
            state = jax.tree.map(lambda n, o: jax.vmap(jnp.where)(done, n, o), fresh, out.state)
            return (state, key, total + out.reward.sum()), None

        (state, _, total), _ = jax.lax.scan(
            body, (start, key, jnp.float32(0.0)), jnp.arange(num_steps, dtype=jnp.int32)
        )
        # Depend on the final states too: CartPole's reward is a constant 1, and
        # XLA would otherwise drop the dynamics as dead code.
        return total + jnp.sum(state.physics).astype(jnp.float32)

    return jax.jit(run)


def _python_grid(num_steps: int, seed: int) -> float:
    env = GridWorld()
    P, R, terminal = env.transition_table()
    rng = np.random.default_rng(seed)
    s, t, total = env.start, 0, 0.0
    for _ in range(num_steps):
        a = int(rng.integers(env.num_actions))
        s2 = int(rng.choice(env.num_states, p=P[s, a]))
        total += R[s, a, s2]
        t += 1
        s = s2
        if terminal[s] or t >= env.max_steps:
            s, t = env.start, 0
    return total


def run_bench(size: str, out: Path, progress=print) -> dict[str, Any]:
    with jax.debug_key_reuse(False):
        return _run_bench(size, out, progress)


def _run_bench(size: str, out: Path, progress) -> dict[str, Any]:
    import gymnasium as gym  # test/bench dependency

    sz = SIZES[size]
    n, T = sz["envs"], sz["steps"]
    grid_fn = _env_scan(GridWorld(), n, T)
    cart_fn = _env_scan(CartPole(), n, T)
    cart_no_draws_fn = _env_scan(CartPole(), n, T, draws=False)
    gym_env = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    gym_rng = np.random.default_rng(0)

    config = ppo_config(size)
    # Every repetition deliberately reuses the same seed keys (identical work per
    # rep), so the key-reuse checker is switched off for the timed calls below.
    seed_train_keys, _ = seed_keys(config)

    def train_keys():
        return seed_train_keys

    vmapped = jit_over_seeds(make_train(config), config)
    vmapped_one_device = jax.jit(jax.vmap(make_train(config)))
    single = jax.jit(make_train(config))

    keys = iter(jax.random.split(jax.random.key(123), 10_000))

    gym_run = _gym_run(gym_env, n, T, gym_rng)
    gym_sync_run = _gym_run(
        gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync"), n, T, gym_rng
    )

    paths = {
        "jax_grid": lambda: grid_fn(next(keys)).block_until_ready(),
        "jax_grid_aa": lambda: grid_fn(next(keys)).block_until_ready(),
        "python_grid": lambda: _python_grid(sz["python_steps"], 0),
        "jax_cartpole": lambda: cart_fn(next(keys)).block_until_ready(),
        "jax_cartpole_no_draws": lambda: cart_no_draws_fn(next(keys)).block_until_ready(),
        "gym_cartpole": gym_run,
        "gym_cartpole_sync": gym_sync_run,
        "ppo_vmapped": lambda: jax.block_until_ready(vmapped(train_keys())),
        "ppo_vmapped_one_device": lambda: jax.block_until_ready(vmapped_one_device(train_keys())),
        "ppo_sequential": lambda: [jax.block_until_ready(single(k)) for k in train_keys()],
    }
    steps = {
        "jax_grid": n * T,
        "jax_grid_aa": n * T,
        "python_grid": sz["python_steps"],
        "jax_cartpole": n * T,
        "jax_cartpole_no_draws": n * T,
        "gym_cartpole": n * T,
        "gym_cartpole_sync": n * T,
    }
    compile_s = {}
    for name, fn in paths.items():
        t0 = time.perf_counter()
        fn()
        compile_s[name] = time.perf_counter() - t0
    progress(f"warm-up/compile done: { {k: round(v, 2) for k, v in compile_s.items()} }")

    times: dict[str, list[float]] = {name: [] for name in paths}
    order_rng = np.random.default_rng(0)
    for r in range(sz["rounds"]):
        for name in order_rng.permutation(list(paths)):
            t0 = time.perf_counter()
            paths[name]()
            times[name].append(time.perf_counter() - t0)
        progress(f"round {r + 1}/{sz['rounds']}")

    med = {k: float(np.median(v)) for k, v in times.items()}
    rate = {k: steps[k] / med[k] for k in steps}
    ratios = {
        "jax_vs_python": rate["jax_grid"] / rate["python_grid"],
        "jax_vs_gymnasium": rate["jax_cartpole"] / rate["gym_cartpole"],
        "jax_vs_gymnasium_sync": rate["jax_cartpole"] / rate["gym_cartpole_sync"],
        "jax_no_draws_vs_gymnasium": rate["jax_cartpole_no_draws"] / rate["gym_cartpole"],
        "vmapped_seeds_vs_sequential": med["ppo_sequential"] / med["ppo_vmapped"],
        "vmapped_one_device_vs_sequential": med["ppo_sequential"] / med["ppo_vmapped_one_device"],
        "aa_control": med["jax_grid_aa"] / med["jax_grid"],
    }
    progress(f"CartPole sweep over {sz['sweep_envs']} environments")
    sweep = _cartpole_sweep(sz["sweep_envs"], T, sz["sweep_rounds"], keys, gym_rng)
    a = jax.device_get(vmapped(train_keys())["params"])
    b = [jax.device_get(single(k)["params"]) for k in train_keys()]
    diff = max(
        float(np.max(np.abs(np.asarray(x)[i] - np.asarray(y))))
        for i in range(len(b))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b[i]), strict=True)
    )
    report = {
        "size": size,
        "sizes": sz,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "jax_backend": jax.default_backend(),
            "jax": jax.__version__,
        },
        "compile_or_warmup_s": compile_s,
        "paths": {
            k: {
                "median_s": med[k],
                "p90_s": float(np.percentile(v, 90)),
                "reps": len(v),
                **({"steps_per_s": rate[k]} if k in rate else {}),
            }
            for k, v in times.items()
        },
        "ratios": ratios,
        "targets": TARGETS,
        "cartpole_sweep": sweep,
        "identity": {"ppo_vmapped_vs_sequential_max_abs_param_diff": diff},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    _plot(times, sweep, out.with_suffix(".png"))
    return report


def _gym_run(gym_env, num_envs: int, num_steps: int, rng: np.random.Generator):
    def run():
        gym_env.reset(seed=int(rng.integers(2**31)))
        for _ in range(num_steps):
            gym_env.step(rng.integers(0, 2, size=num_envs))

    return run


def _cartpole_sweep(
    env_counts, num_steps: int, rounds: int, keys, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """CartPole steps/s of JAX (with and without random draws), gymnasium's
    NumPy vector env and (up to `SYNC_MAX_ENVS`) its `SyncVectorEnv` at each
    environment count; medians of `rounds` interleaved rounds after one untimed
    call of each path."""
    import gymnasium as gym

    points = []
    for n in env_counts:
        jax_fn = _env_scan(CartPole(), n, num_steps)
        no_draws_fn = _env_scan(CartPole(), n, num_steps, draws=False)
        paths = {
            "jax": lambda jax_fn=jax_fn: jax_fn(next(keys)).block_until_ready(),
            "jax_no_draws": lambda fn=no_draws_fn: fn(next(keys)).block_until_ready(),
            "gym_vector": _gym_run(
                gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point"),
                n,
                num_steps,
                rng,
            ),
        }
        if n <= SYNC_MAX_ENVS:
            paths["gym_sync"] = _gym_run(
                gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync"),
                n,
                num_steps,
                rng,
            )
        for fn in paths.values():
            fn()
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(rounds):
            for name, fn in paths.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        rate = {name: n * num_steps / float(np.median(t)) for name, t in times.items()}
        point: dict[str, Any] = {"envs": n, **{f"{k}_steps_per_s": v for k, v in rate.items()}}
        point["jax_vs_gymnasium"] = rate["jax"] / rate["gym_vector"]
        point["jax_no_draws_vs_gymnasium"] = rate["jax_no_draws"] / rate["gym_vector"]
        if "gym_sync" in rate:
            point["jax_vs_gymnasium_sync"] = rate["jax"] / rate["gym_sync"]
        points.append(point)
    return points


def _plot(times: dict[str, list[float]], sweep: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_sweep) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(times)
    ax.boxplot([np.asarray(times[k]) * 1e3 for k in names], tick_labels=names)
    ax.set_yscale("log")
    ax.set_ylabel("ms per call (log)")
    ax.set_title("policy-evaluation bench: interleaved rounds")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=8)
    for key, label in (
        ("jax_steps_per_s", "JAX (vmap x scan)"),
        ("jax_no_draws_steps_per_s", "JAX without random draws (bound)"),
        ("gym_vector_steps_per_s", "gymnasium NumPy vector env"),
        ("gym_sync_steps_per_s", "gymnasium SyncVectorEnv"),
    ):
        pts = [(p["envs"], p[key]) for p in sweep if key in p]
        ax_sweep.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax_sweep.set(
        xscale="log",
        yscale="log",
        xlabel="environments",
        ylabel="CartPole steps/s (median)",
        title="CartPole throughput vs environment count",
    )
    ax_sweep.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
