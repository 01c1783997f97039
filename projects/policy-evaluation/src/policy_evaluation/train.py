"""PPO as one jitted function of a key, `make_train(config)(key)`, vmapped over
seeds; held-out evaluation on keys that training never sees.

Keys: the root key `key(config.seed)` is split once into a training root and an
evaluation root; seed i trains on `split(train_root, num_seeds)[i]` and is
evaluated on `split(eval_root, num_seeds)[i]`. Logs keep `train/...` (returns
of the episodes met while training) apart from `eval/...` (held-out episodes)
[claim:train-log-finished-episodes].
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from policy_evaluation import exact
from policy_evaluation.config import Config
from policy_evaluation.devices import jit_over_seeds, seed_sharding
from policy_evaluation.envs import GridWorld, make_env
from policy_evaluation.model import apply, init_params
from policy_evaluation.rollout import Carry, gae, reset_all, rollout


def clipped_surrogate(ratio: jax.Array, advantage: jax.Array, clip_eps: float) -> jax.Array:
    """PPO's per-sample objective min(r A, clip(r, 1 - eps, 1 + eps) A) (to maximize).

    Cases (eps = 0.2; the gradient with respect to r in brackets):
      r 0.5, A +2 -> 1.0 [2];  r 1.5, A +2 -> 2.4 (clipped) [0] [claim:clip-positive-advantage].
      r 0.5, A -2 -> -1.6 (clipped) [0];  r 1.5, A -2 -> -3.0 (unclipped) [-2]
        [claim:clip-negative-advantage].
      Where the clipped term is the minimum, the gradient is exactly 0
        [claim:clip-gradient-zero-where-clipped].
    """
    # --- exercise stage 3: The pessimistic min of r A and clip(r, 1 - eps, 1 + eps) A. ---
    return jnp.minimum(
        ratio * advantage, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantage
    )
    # --- end exercise ---


def sample_policy(params: dict):
    def policy_fn(obs: jax.Array, key: jax.Array):
        logits, value = apply(params, obs)
        action = jax.random.categorical(key, logits)
        log_prob = jax.nn.log_softmax(logits)[action]
        return action, log_prob, value

    return policy_fn


def greedy_policy(params: dict):
    def policy_fn(obs: jax.Array, key: jax.Array):
        del key
        logits, value = apply(params, obs)
        action = jnp.argmax(logits)
        return action, jax.nn.log_softmax(logits)[action], value

    return policy_fn


def ppo_loss(params: dict, batch: dict, config: Config) -> tuple[jax.Array, dict]:
    """PPO's minibatch loss (to minimize) and its parts.

    `batch`: `obs` `[B, obs]`, `action` int32 `[B]`, and the rollout's `log_prob`,
    `value`, `advantage`, `target`, each `[B]`.

    Cases:
      advantages -> normalised over this minibatch, `(A - mean) / (std + 1e-8)`,
        `std` with ddof 0 [claim:ppo-advantages-normalised].
      the value loss -> `0.5 mean(max((v - target)^2, (v_clip - target)^2))` with
        `v_clip = old value + clip(v - old value, -clip_eps, clip_eps)`
        [claim:ppo-value-loss-clipped].
      the entropy -> the mean over rows of `-sum_a p log p` [claim:ppo-entropy].
      loss -> `-policy_objective + vf_coef value_loss - ent_coef entropy`
        [claim:ppo-loss-combination].
      aux -> `{"policy_objective", "value_loss", "entropy"}`; all match a float64
        NumPy formula to 1e-5 [claim:ppo-aux-parts].
    """
    # --- exercise stage 3: Surrogate on normalized A, clipped value loss, minus entropy. ---
    logits, value = apply(params, batch["obs"])
    log_probs = jax.nn.log_softmax(logits)
    log_prob = jnp.take_along_axis(log_probs, batch["action"][:, None], axis=1)[:, 0]
    ratio = jnp.exp(log_prob - batch["log_prob"])
    adv = batch["advantage"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    policy_objective = clipped_surrogate(ratio, adv, config.clip_eps).mean()
    value_clipped = batch["value"] + jnp.clip(
        value - batch["value"], -config.clip_eps, config.clip_eps
    )
    value_loss = (
        0.5
        * jnp.maximum((value - batch["target"]) ** 2, (value_clipped - batch["target"]) ** 2).mean()
    )
    entropy = -(jnp.exp(log_probs) * log_probs).sum(axis=1).mean()
    loss = -policy_objective + config.vf_coef * value_loss - config.ent_coef * entropy
    return loss, {
        "policy_objective": policy_objective,
        "value_loss": value_loss,
        "entropy": entropy,
    }
    # --- end exercise ---


def make_optimizer(config: Config) -> optax.GradientTransformation:
    steps_per_run = config.num_updates * config.update_epochs * config.num_minibatches
    lr = (
        optax.linear_schedule(config.learning_rate, 0.0, steps_per_run)
        if config.anneal_lr
        else config.learning_rate
    )
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr, eps=1e-5))


def make_train(config: Config):
    """Returns `train(key) -> {"params", "metrics"}`; jit and vmap it freely.

    The minibatch step: the gradient of `ppo_loss` (which is minimised), `tx.update`
    and `optax.apply_updates`. Under the tests' strict dtype promotion optax's
    schedule and Adam mix an int step count with floats and raise: call `tx.update`
    inside `with jax.numpy_dtype_promotion("standard"):`, and only there.
    """
    env = make_env(config.env)
    tx = make_optimizer(config)
    n_mb = config.num_minibatches
    mb_size = config.batch_size // n_mb

    def train(key: jax.Array) -> dict[str, Any]:
        init_key, env_key, loop_key = jax.random.split(key, 3)
        params = init_params(init_key, env.obs_size, env.num_actions, config.hidden_size)
        opt_state = tx.init(params)
        carry = reset_all(env, env_key, config.num_envs)

        # Keys ride in scan carries (split each iteration), not as scanned inputs:
        # the key-reuse checker handles that form under vmap.
        def update(state, _):
            params, opt_state, carry, key = state
            key, roll_key, perm_key = jax.random.split(key, 3)
            carry, traj = rollout(
                env, sample_policy(params), carry, roll_key, config.num_steps, auto_reset=True
            )
            _, last_value = apply(params, carry.obs)
            adv, target = gae(
                traj.reward,
                traj.value,
                traj.done,
                traj.mask,
                last_value,
                config.gamma,
                config.gae_lambda,
            )
            flat = {
                "obs": traj.obs.reshape(config.batch_size, -1),
                "action": traj.action.reshape(-1),
                "log_prob": traj.log_prob.reshape(-1),
                "value": traj.value.reshape(-1),
                "advantage": adv.reshape(-1),
                "target": target.reshape(-1),
            }

            def epoch(state, _):
                params, opt_state, key = state
                key, epoch_key = jax.random.split(key)
                perm = jax.random.permutation(epoch_key, config.batch_size)
                shuffled = jax.tree.map(
                    lambda x: x[perm].reshape(n_mb, mb_size, *x.shape[1:]), flat
                )

                def minibatch(state, batch):
                    """One step down `ppo_loss`'s gradient: `tx.update` (standard
                    dtype promotion) and `optax.apply_updates` [claim:ppo-minibatch-descends]."""
                    params, opt_state = state
                    # --- exercise stage 4: Descend ppo_loss's gradient with the optax chain. ---
                    grads, aux = jax.grad(ppo_loss, has_aux=True)(params, batch, config)
                    # optax mixes its int step count with float schedules: exempt from strict mode.
                    with jax.numpy_dtype_promotion("standard"):
                        updates, opt_state = tx.update(grads, opt_state, params)
                    return (optax.apply_updates(params, updates), opt_state), aux
                    # --- end exercise ---

                (params, opt_state), aux = jax.lax.scan(minibatch, (params, opt_state), shuffled)
                return (params, opt_state, key), aux

            (params, opt_state, _), aux = jax.lax.scan(
                epoch, (params, opt_state, perm_key), None, length=config.update_epochs
            )
            episodes = traj.done.sum()
            metrics = {
                "train/episode_return": traj.finished_return.sum()
                / jnp.maximum(episodes, 1).astype(jnp.float32),
                "train/episodes": episodes,
                "train/policy_objective": aux["policy_objective"].mean(),
                "train/value_loss": aux["value_loss"].mean(),
                "train/entropy": aux["entropy"].mean(),
            }
            return (params, opt_state, carry, key), metrics

        (params, _, _, _), metrics = jax.lax.scan(
            update, (params, opt_state, carry, loop_key), None, length=config.num_updates
        )
        return {"params": params, "metrics": metrics}

    return train


def seed_keys(config: Config) -> tuple[jax.Array, jax.Array]:
    """(training keys, evaluation keys), one per seed, from disjoint roots.

    Cases: `split(key(config.seed))` -> (training root, evaluation root), in that
    order; each root split into `num_seeds` keys, seed i taking entry i
    [claim:seed-keys-derivation]. No training key equals an evaluation key, and
    evaluation settings change no training key [claim:seed-keys-disjoint].
    """
    # --- exercise stage 4: Split the root into training and evaluation roots, then per seed. ---
    train_root, eval_root = jax.random.split(jax.random.key(config.seed))
    return jax.random.split(train_root, config.num_seeds), jax.random.split(
        eval_root, config.num_seeds
    )
    # --- end exercise ---


def make_evaluate(config: Config):
    """Returns `evaluate(params, key)`: `eval_episodes` held-out episodes, no
    auto-reset, horizon `eval_horizon`; undiscounted and discounted returns.

    Cases, per episode (arrays `[eval_episodes]`):
      `eval/episode_return` -> the sum of its rewards (padding adds 0)
        [claim:eval-episode-return].
      `eval/discounted_return` -> `sum_t gamma^t r_t`, t from 0 [claim:eval-discounted-return].
      `eval/episode_length` -> its active steps (the sum of its mask) [claim:eval-episode-length].
      `eval_greedy` -> `greedy_policy`, else `sample_policy` [claim:eval-greedy-switch].
    The `[T]` discounts times `[T, E]` rewards need an explicit `[:, None]`: the
    tests raise on implicit rank promotion.
    """
    env = make_env(config.env, max_steps=config.eval_horizon)

    def evaluate(params: dict, key: jax.Array) -> dict[str, jax.Array]:
        """The cases above, on episodes from `key` split into (reset, rollout) keys,
        without auto-reset [claim:eval-held-out-episodes]."""
        # --- exercise stage 4: Held-out episodes, no auto-reset; plain and discounted returns. ---
        reset_key, roll_key = jax.random.split(key)
        carry: Carry = reset_all(env, reset_key, config.eval_episodes)
        policy = greedy_policy(params) if config.eval_greedy else sample_policy(params)
        _, traj = rollout(env, policy, carry, roll_key, config.eval_horizon, auto_reset=False)
        discounts = config.gamma ** jnp.arange(config.eval_horizon, dtype=jnp.float32)
        return {
            "eval/episode_return": traj.reward.sum(axis=0),
            "eval/discounted_return": (discounts[:, None] * traj.reward).sum(axis=0),
            "eval/episode_length": traj.mask.sum(axis=0),
        }
        # --- end exercise ---

    return evaluate


def policy_table(params: dict, env: GridWorld, greedy: bool) -> np.ndarray:
    """pi[s, a] of the network on every grid cell (float64)."""
    logits, _ = apply(params, jnp.eye(env.num_states, dtype=jnp.float32))
    logits = np.asarray(logits, np.float64)
    if greedy:
        return np.eye(env.num_actions)[logits.argmax(axis=1)]
    return exact.softmax(logits)


def mean_ci(values: np.ndarray, z: float = 1.96) -> tuple[float, float]:
    """Mean and half-width of its normal 95% interval (standard error times z)
    [claim:mean-ci-normal-interval]."""
    values = np.asarray(values, np.float64)
    se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else float("nan")
    return float(values.mean()), float(z * se)


def summarize_seeds(config: Config, result: dict[str, Any]) -> dict[str, Any]:
    """The per-seed held-out figure (`eval/discounted_return` for the grid
    world, `eval/episode_return` for CartPole, averaged over each seed's
    evaluation episodes), their mean, 95% half-width and the worst seed
    [claim:summary-metric-by-env].

    Returns `{"metric": the eval/ key used, "per_seed": list of floats, "mean",
    "ci95_half_width": from `mean_ci`, "worst_seed": int index of the lowest}`
    [claim:summary-mean-interval-worst-seed].
    Only `result["eval"]` is read: `train/` figures never enter the summary
    [claim:summary-reads-eval-only].
    """
    # --- exercise stage 4: Per seed: the mean held-out eval/ return; mean +- 95% CI. ---
    per_seed_key = "eval/discounted_return" if config.env == "gridworld" else "eval/episode_return"
    per_seed = result["eval"][per_seed_key].mean(axis=1)
    mean, half = mean_ci(per_seed)
    return {
        "metric": per_seed_key,
        "per_seed": per_seed.tolist(),
        "mean": mean,
        "ci95_half_width": half,
        "worst_seed": int(per_seed.argmin()),
    }
    # --- end exercise ---


def run_experiment(config: Config, progress=None) -> dict[str, Any]:
    """Trains `num_seeds` seeds (vmapped), evaluates each on held-out keys and,
    for the grid world, with the exact evaluator against the baselines."""
    train_keys, eval_keys = seed_keys(config)
    train_fn = jit_over_seeds(make_train(config), config)
    eval_fn = jit_over_seeds(make_evaluate(config), config)
    sharding = seed_sharding(config)
    devices = len(sharding.device_set) if sharding else 1
    if progress:
        progress(
            f"training {config.num_seeds} seeds x {config.total_timesteps} steps "
            f"({config.num_updates} updates each), vmapped on {devices} device(s)"
        )
    out = jax.block_until_ready(train_fn(train_keys))
    if progress:
        progress("evaluating on held-out keys")
    ev = jax.device_get(eval_fn(out["params"], eval_keys))
    result: dict[str, Any] = {
        "config": config.model_dump(mode="json"),
        "train": {k: np.asarray(v) for k, v in jax.device_get(out["metrics"]).items()},
        "eval": {k: np.asarray(v) for k, v in ev.items()},
        "params": out["params"],
        "devices": devices,
    }
    result["summary"] = summarize_seeds(config, result)
    if config.env == "gridworld":
        env = GridWorld()
        P, R, terminal = env.transition_table()
        g = config.gamma
        exact_trained = []
        for i in range(config.num_seeds):
            params_i = jax.tree.map(lambda x, i=i: x[i], out["params"])
            pi = policy_table(params_i, env, config.eval_greedy)
            exact_trained.append(float(exact.evaluate_policy(P, R, terminal, pi, g)[env.start]))
        uniform = np.full((env.num_states, env.num_actions), 1.0 / env.num_actions)
        v_opt, _ = exact.value_iteration(P, R, terminal, g)
        result["exact"] = {
            "trained_per_seed": exact_trained,
            "uniform_random": float(exact.evaluate_policy(P, R, terminal, uniform, g)[env.start]),
            "optimal": float(v_opt[env.start]),
        }
    return result
