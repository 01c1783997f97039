"""The CartPole sweep of `policy-evaluation bench` (environment counts) and
the bench's PNG (per-path times of the interleaved rounds; the sweep)."""

import time
from pathlib import Path
from typing import Any

import numpy as np

from policy_evaluation.bench_paths import env_scan, gym_run
from policy_evaluation.envs import CartPole

# gymnasium's SyncVectorEnv steps one Python CartPole per slot: past this count
# a sweep point would take minutes and say nothing new.
SYNC_MAX_ENVS = 256


def cartpole_sweep(
    env_counts, num_steps: int, rounds: int, keys, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """CartPole steps/s of JAX (with and without random draws), gymnasium's
    NumPy vector env and (up to `SYNC_MAX_ENVS`) its `SyncVectorEnv` at each
    environment count; medians of `rounds` interleaved rounds after one untimed
    call of each path."""
    import gymnasium as gym

    points = []
    for n in env_counts:
        jax_fn = env_scan(CartPole(), n, num_steps)
        no_draws_fn = env_scan(CartPole(), n, num_steps, draws=False)
        paths = {
            "jax": lambda jax_fn=jax_fn: jax_fn(next(keys)).block_until_ready(),
            "jax_no_draws": lambda fn=no_draws_fn: fn(next(keys)).block_until_ready(),
            "gym_vector": gym_run(
                gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point"),
                n,
                num_steps,
                rng,
            ),
        }
        if n <= SYNC_MAX_ENVS:
            paths["gym_sync"] = gym_run(
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


def plot(times: dict[str, list[float]], sweep: list[dict[str, Any]], path: Path) -> None:
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
