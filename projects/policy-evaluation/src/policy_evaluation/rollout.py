"""Rollouts as `lax.scan` over time and `vmap` over environments, and the
reverse scans for discounted returns and GAE.

Random streams are owned: each step splits its key into an action key, a
step key and a reset key, and environment i receives entry i of `split(key, num_envs)` of each,
so its stream does not depend on how many environments run beside it.

Two modes:
- `auto_reset=True` (training): a finished episode is replaced at once by a
  fresh one from its own reset key; every step is active (`mask = 1`).
- `auto_reset=False` (evaluation): an environment that finished stays frozen;
  its later steps are padding with `mask = 0` and reward 0.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from policy_evaluation.envs import EnvState

# policy_fn(obs, key) -> (action, log_prob, value) for ONE environment.
PolicyFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]


class Carry(NamedTuple):
    state: EnvState
    obs: jax.Array
    active: jax.Array  # bool [N]: still inside its (first) episode (no auto-reset)
    episode_return: jax.Array  # float [N]: undiscounted return so far this episode


class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    done: jax.Array  # terminated or truncated, on an active step
    terminated: jax.Array
    mask: jax.Array  # float 1.0 on active steps, 0.0 on padding
    value: jax.Array
    log_prob: jax.Array
    finished_return: jax.Array  # the episode's return on its last step, else 0


def per_env_keys(key: jax.Array, num_envs: int) -> jax.Array:
    """Key for environment i = `split(key, num_envs)[i]`; with the (default)
    partitionable threefry it does not depend on `num_envs` (stage 1 tests it)."""
    return jax.random.split(key, num_envs)


def reset_all(env, key: jax.Array, num_envs: int) -> Carry:
    state, obs = jax.vmap(env.reset)(per_env_keys(key, num_envs))
    return Carry(state, obs, jnp.ones((num_envs,), bool), jnp.zeros((num_envs,), jnp.float32))


def rollout(
    env, policy_fn: PolicyFn, carry: Carry, key: jax.Array, num_steps: int, auto_reset: bool
) -> tuple[Carry, Transition]:
    """Runs `num_steps` steps of every environment; returns the final carry and
    the stacked `Transition` with leading axes `[num_steps, num_envs]`.

    Cases, per step and environment i (`active` = the carry's flag before the step):
      `obs` -> the observation the action was chosen from (before the step)
        [claim:rollout-obs-before-step].
      `mask` -> 1.0 if active, else 0.0; `reward` -> the env's reward if active,
        else 0; `done`, `terminated` -> the env's flags, and only if active
        [claim:rollout-inactive-steps-are-padding].
      `finished_return` -> on a done step, the episode's undiscounted return (this
        reward included); 0 elsewhere. `episode_return` restarts at 0 after a reset
        [claim:rollout-finished-return].
      `auto_reset=True` -> a done env takes its fresh state and obs from entry i of
        `split(reset_key)`; `active` stays True [claim:rollout-auto-reset].
      `auto_reset=False` -> a done env is frozen (state and obs kept) and inactive
        [claim:rollout-frozen-without-reset].
    Under the tests' rank promotion "raise", a `[N]` flag does not broadcast against
    `[N, obs]` arrays: select per environment (`jax.vmap(jnp.where)`).
    """
    num_envs = carry.obs.shape[0]

    def one_step(scan_carry, _):
        """One step of every environment, by the cases above: the key splits into
        (next, action, env, reset) keys and environment i takes entry i of
        `split(k, num_envs)` of each [claim:rollout-owned-step-keys]."""
        carry, key = scan_carry
        key, act_key, env_key, reset_key = jax.random.split(key, 4)
        # --- exercise stage 2: Step all envs; reset the done ones, or freeze them (mask 0). ---
        action, log_prob, value = jax.vmap(policy_fn)(carry.obs, per_env_keys(act_key, num_envs))
        out = jax.vmap(env.step)(carry.state, action, per_env_keys(env_key, num_envs))
        done = out.terminated | out.truncated
        active = carry.active
        reward = jnp.where(active, out.reward, 0.0)
        ep_return = carry.episode_return + reward
        finished = done & active
        if auto_reset:
            reset_state, reset_obs = jax.vmap(env.reset)(per_env_keys(reset_key, num_envs))
            pick = lambda new, old: jax.vmap(jnp.where)(done, new, old)  # noqa: E731
            state = jax.tree.map(pick, reset_state, out.state)
            obs = pick(reset_obs, out.obs)
            next_active = active
            next_return = jnp.where(done, 0.0, ep_return)
        else:
            keep = lambda new, old: jax.vmap(jnp.where)(active, new, old)  # noqa: E731
            state = jax.tree.map(keep, out.state, carry.state)
            obs = keep(out.obs, carry.obs)
            next_active = active & ~done
            next_return = ep_return
        transition = Transition(
            obs=carry.obs,
            action=action,
            reward=reward,
            done=finished,
            terminated=out.terminated & active,
            mask=active.astype(jnp.float32),
            value=value,
            log_prob=log_prob,
            finished_return=jnp.where(finished, ep_return, 0.0),
        )
        # --- end exercise ---
        return (Carry(state, obs, next_active, next_return), key), transition

    (carry, _), traj = jax.lax.scan(one_step, (carry, key), None, length=num_steps)
    return carry, traj


def _check_series(last_value: jax.Array, series: dict[str, jax.Array], rates: dict) -> None:
    """Raises `ValueError` naming the argument unless every series is `[T, N]`,
    `last_value` is `[N]`, `dones` is bool or 0/1, the rates lie in [0, 1], and
    (for arrays that are not traced) every value is finite: a NaN here would
    come out as NaN returns, not as an error. Shapes are checked under `jit` too."""
    shape = jnp.shape(series["rewards"])
    if len(shape) != 2:
        raise ValueError(f"`rewards` must have shape [T, N], not {shape}.")
    for name, array in series.items():
        if jnp.shape(array) != shape:
            raise ValueError(
                f"`{name}` must have the shape of `rewards` {shape}, not {jnp.shape(array)}."
            )
    if jnp.shape(last_value) != shape[1:]:
        raise ValueError(f"`last_value` must have shape {shape[1:]}, not {jnp.shape(last_value)}.")
    for name, rate in rates.items():
        if isinstance(rate, jax.core.Tracer):
            continue
        try:
            value = float(rate) if np.ndim(rate) == 0 else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"`{name}` must be a number in [0, 1], not {rate!r}.")
    for name, array in {**series, "last_value": last_value}.items():
        if isinstance(array, jax.core.Tracer):
            continue
        values = np.asarray(array)
        if not np.isfinite(values.astype(np.float64)).all():
            raise ValueError(f"`{name}` holds NaN or infinite values.")
        if name == "dones" and values.dtype != bool and not np.isin(values, (0, 1)).all():
            raise ValueError("`dones` must be bool (or 0/1) flags.")


def discounted_returns(
    rewards: jax.Array, dones: jax.Array, masks: jax.Array, last_value: jax.Array, gamma: float
) -> jax.Array:
    """G_t = r_t + gamma (1 - done_t) G_{t+1}, G_T = last_value; 0 on padding
    [claim:returns-reverse-recursion].
    Inputs `[T, N]`, `last_value` `[N]`. Raises `ValueError` naming a bad argument
    [claim:returns-refuse-bad-arguments].

    `dones` is bool: under the tests' strict dtype promotion `1.0 - dones` raises,
    so cast it (`dones.astype(jnp.float32)`) before the arithmetic [claim:bool-dones-accepted].
    """
    _check_series(
        last_value, {"rewards": rewards, "dones": dones, "masks": masks}, {"gamma": gamma}
    )

    # --- exercise stage 2: Reverse scan: G_t = mask_t (r_t + gamma (1 - done_t) G_{t+1}). ---
    def back(g_next, xs):
        r, d, m = xs
        g = m * (r + gamma * (1.0 - d.astype(jnp.float32)) * g_next)
        return g, g

    _, returns = jax.lax.scan(back, last_value, (rewards, dones, masks), reverse=True)
    return returns
    # --- end exercise ---


def gae(
    rewards: jax.Array,
    values: jax.Array,
    dones: jax.Array,
    masks: jax.Array,
    last_value: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimates and value targets (advantage + value).

    delta_t = r_t + gamma (1 - done_t) V_{t+1} - V_t;
    A_t = mask_t (delta_t + gamma lam (1 - done_t) A_{t+1}); a done step
    (terminated or truncated) does not bootstrap, padded steps give 0
    [claim:gae-reverse-recursion]. Raises `ValueError` naming a bad argument
    [claim:gae-refuses-bad-arguments].

    Cases:
      the value target -> `A_t + V_t mask_t`: 0 on padding, like the advantage
        [claim:gae-value-target].
      `lam = 1` -> `A_t = G_t - V_t` on valid steps; `lam = 0` -> `A_t = delta_t`
        [claim:gae-lambda-limits].
      `dones` bool -> cast before arithmetic (strict dtype promotion in the tests)
        [claim:bool-dones-accepted].
    """
    _check_series(
        last_value,
        {"rewards": rewards, "values": values, "dones": dones, "masks": masks},
        {"gamma": gamma, "lam": lam},
    )

    # --- exercise stage 2: Reverse scan of delta_t + gamma lam (1 - done_t) A_{t+1}, masked. ---
    def back(carry, xs):
        a_next, v_next = carry
        r, v, d, m = xs
        not_done = 1.0 - d.astype(jnp.float32)
        delta = r + gamma * not_done * v_next - v
        a = m * (delta + gamma * lam * not_done * a_next)
        return (a, v), a

    init = (jnp.zeros_like(last_value), last_value)
    _, adv = jax.lax.scan(back, init, (rewards, values, dones, masks), reverse=True)
    return adv, adv + values * masks
    # --- end exercise ---
