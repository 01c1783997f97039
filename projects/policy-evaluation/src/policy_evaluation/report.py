"""The run report: metrics JSON (`train/` and `eval/` namespaces kept apart),
markdown, learning curves and per-seed evaluation PNGs, and a trajectory-level
look at the worst seed."""

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from policy_evaluation.config import Config  # noqa: E402
from policy_evaluation.envs import make_env  # noqa: E402
from policy_evaluation.model import apply  # noqa: E402


def worst_seed_trajectory(config: Config, params_i: dict, key: jax.Array) -> list[dict]:
    """One held-out episode of the given seed's policy, step by step."""
    env = make_env(config.env, max_steps=config.eval_horizon)
    reset_key, key = jax.random.split(key)
    state, obs = env.reset(reset_key)
    steps = []
    for t in range(config.eval_horizon):
        key, act_key, env_key = jax.random.split(key, 3)
        logits, value = apply(params_i, obs)
        if config.eval_greedy:
            action = jnp.argmax(logits)
        else:
            action = jax.random.categorical(act_key, logits)
        out = env.step(state, action, env_key)
        steps.append(
            {
                "t": t,
                "state": np.asarray(state.physics).tolist(),
                "action": int(action),
                "value": float(value),
                "reward": float(out.reward),
                "terminated": bool(out.terminated),
                "truncated": bool(out.truncated),
            }
        )
        state, obs = out.state, out.obs
        if bool(out.terminated | out.truncated):
            break
    return steps


def write_report(
    workdir: Path, config: Config, result: dict[str, Any], seconds: float, trajectory: list[dict]
) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    summary = result["summary"]
    metrics = {
        "config": result["config"],
        "train_seconds_including_compile": seconds,
        "devices": result["devices"],
        "train": {k: v.tolist() for k, v in result["train"].items()},
        "eval": {k: v.tolist() for k, v in result["eval"].items()},
        "eval/summary": summary,
        "exact": result.get("exact"),
        "worst_seed_trajectory": trajectory,
    }
    (workdir / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")

    # An update in which no episode ended has no return to show (the metric holds
    # 0 there): CartPole episodes of 500 steps outlast a 4 x 128-step rollout.
    curves = result["train"]["train/episode_return"]
    ended = result["train"]["train/episodes"] > 0
    steps = (np.arange(curves.shape[1]) + 1) * config.batch_size
    last_ended = [
        float(c[np.flatnonzero(e)[-1]]) if e.any() else float("nan")
        for c, e in zip(curves, ended, strict=True)
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (c, e) in enumerate(zip(curves, ended, strict=True)):
        ax.plot(steps[e], c[e], lw=1, label=f"seed {i}")
    ax.set_xlabel("environment steps per seed")
    ax.set_ylabel("train/episode_return")
    ax.set_title(f"PPO on {config.env}: training episodes (not held out)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(workdir / "learning_curves.png", dpi=100)
    plt.close(fig)

    per_seed = np.asarray(summary["per_seed"])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(np.arange(len(per_seed)), per_seed, color="tab:blue", label="held-out (sampled)")
    if "exact" in result:
        ax.scatter(
            np.arange(len(per_seed)),
            result["exact"]["trained_per_seed"],
            color="black",
            zorder=3,
            label="exact evaluator",
        )
        ax.axhline(result["exact"]["optimal"], color="green", ls="--", label="optimal (VI)")
        ax.axhline(result["exact"]["uniform_random"], color="red", ls="--", label="uniform random")
    ax.axhline(summary["mean"], color="gray", label="mean over seeds")
    ax.set_xlabel("seed")
    ax.set_ylabel(summary["metric"])
    ax.set_title("Held-out evaluation per seed")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(workdir / "eval_per_seed.png", dpi=100)
    plt.close(fig)

    lines = [
        f"# PPO on `{config.env}`",
        "",
        f"{config.num_seeds} seeds vmapped on {result['devices']} device(s), "
        f"{config.total_timesteps} environment steps each; "
        f"training took {seconds:.1f} s (compilation included).",
        "",
        "## Held-out evaluation (`eval/`, keys never used in training)",
        "",
        f"`{summary['metric']}`: mean {summary['mean']:.4f} +- {summary['ci95_half_width']:.4f} "
        f"(95% interval over seeds), {config.eval_episodes} episodes per seed.",
        "",
        "| Seed | held-out mean | last `train/episode_return` (update with an ended episode) |"
        + (" exact V(start) |" if "exact" in result else ""),
        "|---|---|---|" + ("---|" if "exact" in result else ""),
    ]
    for i, v in enumerate(per_seed):
        row = f"| {i} | {v:.4f} | {last_ended[i]:.4f} |"
        if "exact" in result:
            row += f" {result['exact']['trained_per_seed'][i]:.4f} |"
        lines.append(row)
    if "exact" in result:
        ex = result["exact"]
        lines += [
            "",
            "## Exact evaluator (linear solve) baselines",
            "",
            f"- optimal policy (value iteration): {ex['optimal']:.4f}",
            f"- uniform random policy: {ex['uniform_random']:.4f}",
        ]
    worst = summary["worst_seed"]
    lines += [
        "",
        f"## Worst seed ({worst}): one held-out episode",
        "",
        f"{len(trajectory)} steps, return {sum(s['reward'] for s in trajectory):.3f}, "
        f"ended by {'termination' if trajectory[-1]['terminated'] else 'time limit'}.",
        "",
        "| t | state | action | value | reward |",
        "|---|---|---|---|---|",
    ]
    for s in trajectory[:20]:
        state = ", ".join(f"{x:.3g}" for x in np.atleast_1d(s["state"]))
        lines.append(
            f"| {s['t']} | {state} | {s['action']} | {s['value']:.3f} | {s['reward']:.2f} |"
        )
    if len(trajectory) > 20:
        lines.append(f"| ... | ({len(trajectory) - 20} more steps in metrics.json) | | | |")
    lines += [
        "",
        "![learning curves](learning_curves.png)",
        "",
        "![per-seed evaluation](eval_per_seed.png)",
        "",
    ]
    (workdir / "report.md").write_text("\n".join(lines), encoding="utf-8")
