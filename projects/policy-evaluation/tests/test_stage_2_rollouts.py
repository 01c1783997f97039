"""Stage 2: scan rollouts with masks; returns and GAE by reverse scan.

- `gae` and `discounted_returns` against a plain Python loop on random
  trajectories with mid-episode terminations and padded steps, for several
  horizons, gamma, lambda and environment counts.
- Rollouts: without auto-reset, steps after an episode's end are padding
  (mask 0, reward 0, state frozen); with auto-reset, each finished episode's
  recorded return equals the sum of its rewards recomputed by a Python loop;
  every recorded field and the final carry equal a step-by-step reference
  written from the specification (owned key streams, Python bookkeeping),
  with terminations and truncations both occurring.
- Bad arguments: `discounted_returns` and `gae` raise a `ValueError` whose
  message starts with the damaged argument's name (shapes, NaN, non-flag
  dones, rates outside [0, 1]).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from policy_evaluation.envs import CartPole, EnvState, GridWorld
from policy_evaluation.model import init_params
from policy_evaluation.rollout import discounted_returns, gae, reset_all, rollout
from policy_evaluation.train import sample_policy


def _random_batch(rng, T, N):
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    dones = rng.random((T, N)) < 0.15
    masks = np.ones((T, N))
    # Padding: in half of the environments, everything after the first done is padding.
    for n in range(0, N, 2):
        idx = np.flatnonzero(dones[:, n])
        if len(idx):
            masks[idx[0] + 1 :, n] = 0.0
            dones[idx[0] + 1 :, n] = False
            rewards[idx[0] + 1 :, n] = 0.0
    last_value = rng.normal(size=N)
    return rewards, values, dones, masks, last_value


def _python_gae(rewards, values, dones, masks, last_value, gamma, lam):
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        a_next, v_next = 0.0, last_value[n]
        for t in reversed(range(T)):
            if masks[t, n] == 0.0:
                a, v_next, a_next = 0.0, values[t, n], 0.0
                adv[t, n] = a
                continue
            nonterminal = 0.0 if dones[t, n] else 1.0
            delta = rewards[t, n] + gamma * nonterminal * v_next - values[t, n]
            a = delta + gamma * lam * nonterminal * a_next
            adv[t, n] = a
            a_next, v_next = a, values[t, n]
    return adv


def _python_returns(rewards, dones, masks, last_value, gamma):
    T, N = rewards.shape
    out = np.zeros((T, N))
    for n in range(N):
        g = last_value[n]
        for t in reversed(range(T)):
            if masks[t, n] == 0.0:
                g = 0.0
                continue
            g = rewards[t, n] + (0.0 if dones[t, n] else gamma * g)
            out[t, n] = g
    return out


@pytest.mark.claims(
    "returns-and-gae-by-reverse-scan",
    "returns-reverse-recursion",
    "gae-reverse-recursion",
    "gae-value-target",
    "gae-lambda-limits",
    "bool-dones-accepted",
)
@pytest.mark.parametrize(
    "T,N,gamma,lam", [(5, 1, 0.9, 0.95), (32, 4, 0.99, 0.95), (64, 7, 0.5, 0.0), (17, 3, 0.97, 1.0)]
)
def test_gae_and_returns_match_python_loop(evidence, T, N, gamma, lam):
    """gae, value targets and discounted_returns equal a Python loop, 4 (T, N, gamma, lambda)."""
    rng = np.random.default_rng(T * 100 + N)
    rewards, values, dones, masks, last_value = _random_batch(rng, T, N)
    assert dones[: T - 1].any() and (masks == 0).any() or T < 10  # terminations and padding
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    adv, target = gae(
        f32(rewards), f32(values), jnp.asarray(dones), f32(masks), f32(last_value), gamma, lam
    )
    ref = _python_gae(rewards, values, dones, masks, last_value, gamma, lam)
    cond = f"T={T}, N={N}, gamma={gamma}, lambda={lam}"
    assert evidence.allclose("GAE vs Python loop", cond, adv, ref, rtol=1e-4, atol=1e-5)
    assert evidence.allclose(
        "value targets vs Python", cond, target, (ref + values) * masks, rtol=1e-4, atol=1e-5
    )
    ret = discounted_returns(f32(rewards), jnp.asarray(dones), f32(masks), f32(last_value), gamma)
    ref_ret = _python_returns(rewards, dones, masks, last_value, gamma)
    assert evidence.allclose(
        "discounted returns vs Python loop", cond, ret, ref_ret, rtol=1e-4, atol=1e-5
    )


@pytest.mark.claims("gae-lambda-limits")
def test_gae_with_lambda_one_equals_returns_minus_values(evidence):
    """With lambda = 1, GAE equals discounted returns minus values on valid steps."""
    rng = np.random.default_rng(5)
    rewards, values, dones, masks, last_value = _random_batch(rng, 40, 5)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    adv, _ = gae(
        f32(rewards), f32(values), jnp.asarray(dones), f32(masks), f32(last_value), 0.9, 1.0
    )
    ret = discounted_returns(f32(rewards), jnp.asarray(dones), f32(masks), f32(last_value), 0.9)
    assert evidence.allclose(
        "GAE(lambda=1) vs G - V",
        "T=40, N=5, gamma=0.9",
        adv,
        (np.asarray(ret) - values) * masks,
        rtol=1e-4,
        atol=1e-5,
    )


def _stepwise_reference(env, params, n, T, auto_reset, reset_key, key):
    """The rollout written from its specification, one step at a time: each
    step splits its key into (next, action, env, reset) keys and environment i
    gets entry i of `split(k, n)` of each; the bookkeeping (masks, freezing,
    resets, returns) is plain Python per environment."""
    policy = sample_policy(params)

    @jax.jit
    def draw(state, obs, key):
        key, act_key, env_key, reset_key = jax.random.split(key, 4)
        action, log_prob, value = jax.vmap(policy)(obs, jax.random.split(act_key, n))
        out = jax.vmap(env.step)(state, action, jax.random.split(env_key, n))
        fresh_state, fresh_obs = jax.vmap(env.reset)(jax.random.split(reset_key, n))
        return key, (action, log_prob, value), out, fresh_state, fresh_obs

    state, obs = jax.vmap(env.reset)(jax.random.split(reset_key, n))
    state = [np.asarray(x) for x in state]
    obs = np.asarray(obs)
    active, ret = [True] * n, [0.0] * n
    rec = {f: np.zeros((T, n), np.float64) for f in ("action", "log_prob", "value", "reward")}
    rec.update({f: np.zeros((T, n), bool) for f in ("done", "terminated")})
    rec["mask"], rec["finished_return"] = np.zeros((T, n)), np.zeros((T, n))
    rec["obs"] = np.zeros((T, *obs.shape))
    for t in range(T):
        key, policy_out, out, fresh_state, fresh_obs = draw(
            EnvState(*(jnp.asarray(x) for x in state)), jnp.asarray(obs), key
        )
        action, log_prob, value = (np.asarray(x) for x in policy_out)
        out, fresh_state, fresh_obs = jax.device_get((out, fresh_state, fresh_obs))
        rec["obs"][t] = obs
        new_obs = np.array(out.obs)
        new_state = [np.array(x) for x in out.state]
        for i in range(n):
            for f, x in (("action", action), ("log_prob", log_prob), ("value", value)):
                rec[f][t, i] = x[i]
            done = bool(out.terminated[i]) or bool(out.truncated[i])
            rec["mask"][t, i] = 1.0 if active[i] else 0.0
            if not active[i]:  # frozen: padding, nothing changes
                new_obs[i] = obs[i]
                for x_new, x_old in zip(new_state, state, strict=True):
                    x_new[i] = x_old[i]
                continue
            reward = float(out.reward[i])
            rec["reward"][t, i] = reward
            ret[i] += reward
            rec["terminated"][t, i] = bool(out.terminated[i])
            if done:
                rec["done"][t, i] = True
                rec["finished_return"][t, i] = ret[i]
                if auto_reset:
                    ret[i] = 0.0
                    new_obs[i] = fresh_obs[i]
                    for x_new, x_fresh in zip(new_state, fresh_state, strict=True):
                        x_new[i] = x_fresh[i]
                else:
                    active[i] = False
        obs, state = new_obs, new_state
    final = {"state": state, "obs": obs, "active": np.array(active), "return": np.array(ret)}
    return rec, final


def _check_against_stepwise_reference(env, params, n, T, auto_reset, k_reset, k_roll, tr, final):
    rec, ref_final = _stepwise_reference(env, params, n, T, auto_reset, k_reset, k_roll)
    for field in ("action", "done", "terminated", "mask"):
        np.testing.assert_array_equal(np.asarray(getattr(tr, field)), rec[field], err_msg=field)
    for field in ("obs", "log_prob", "value", "reward", "finished_return"):
        np.testing.assert_allclose(
            np.asarray(getattr(tr, field)), rec[field], rtol=1e-5, atol=1e-5, err_msg=field
        )
    for x, ref in zip(final.state, ref_final["state"], strict=True):
        np.testing.assert_allclose(np.asarray(x), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(final.obs), ref_final["obs"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(final.active), ref_final["active"])
    np.testing.assert_allclose(
        np.asarray(final.episode_return), ref_final["return"], rtol=1e-5, atol=1e-5
    )
    # The reference's episodes cover what the claim needs: terminations, and (for the
    # grid world's 12-step limit) truncations that are not terminations.
    assert rec["terminated"].any()
    if isinstance(env, GridWorld):
        assert (rec["done"] & ~rec["terminated"]).any()


ROLLOUT_STEPS = 80
# Environments per rollout: enough that the grid world's 12-step episodes, one
# per environment without auto-reset, include a truncation under any key.
ROLLOUT_ENVS = {"gridworld": 32, "cartpole": 4}


def _bookkeeping_rollout(env, n: int, auto_reset: bool, root: jax.Array):
    """The test's rollout: policy from `key(3)`, reset and rollout keys split
    from `root`. Returns (k_reset, k_roll, final carry, transitions)."""
    params = init_params(jax.random.key(3), env.obs_size, env.num_actions, 16)
    k_reset, k_roll = jax.random.split(root)
    carry = reset_all(env, jax.random.clone(k_reset), n)
    final, tr = jax.jit(
        lambda c, k: rollout(env, sample_policy(params), c, k, ROLLOUT_STEPS, auto_reset)
    )(carry, jax.random.clone(k_roll))
    return k_reset, k_roll, final, tr


@pytest.mark.claims(
    "scan-rollouts-with-masks",
    "rollout-obs-before-step",
    "rollout-inactive-steps-are-padding",
    "rollout-finished-return",
    "rollout-auto-reset",
    "rollout-frozen-without-reset",
    "rollout-owned-step-keys",
)
@pytest.mark.parametrize(
    "env,n",
    [(GridWorld(max_steps=12), ROLLOUT_ENVS["gridworld"]), (CartPole(), ROLLOUT_ENVS["cartpole"])],
    ids=["gridworld", "cartpole"],
)
def test_rollout_masks_and_episode_bookkeeping(evidence, env, n):
    """Every rollout field and final carry equal a step-by-step reference, reset on and off.

    The comparison is exact given the draws; the draws decide only whether the
    episodes cover the claim (a termination and, in the grid world, a
    truncation that is not one). A 12-step grid episode is truncated with
    chance 0.315 (exact, from the policy's table), so 32 environments without
    auto-reset all end otherwise with chance 0.685^32 = 5e-6 (6 environments:
    0.10). Swept over 256 keys (evidence/size_sweep.json, the `size_sweep`
    script beside the tests): none short with 32, 28 short with 6."""
    params = init_params(jax.random.key(3), env.obs_size, env.num_actions, 16)
    T = ROLLOUT_STEPS
    for auto_reset in (False, True):
        k_reset, k_roll, final, tr = _bookkeeping_rollout(
            env, n, auto_reset, jax.random.key(int(auto_reset))
        )
        _check_against_stepwise_reference(env, params, n, T, auto_reset, k_reset, k_roll, tr, final)
        reward, done, mask = (np.asarray(x, np.float64) for x in (tr.reward, tr.done, tr.mask))
        finished = np.asarray(tr.finished_return, np.float64)
        # Python bookkeeping: running sum since the last episode start.
        ref_finished = np.zeros_like(reward)
        violations = 0
        for i in range(n):
            running, alive = 0.0, True
            for t in range(T):
                if not auto_reset and not alive:
                    violations += int(mask[t, i] != 0.0 or reward[t, i] != 0.0)
                    continue
                violations += int(mask[t, i] != 1.0)
                running += reward[t, i]
                if done[t, i]:
                    ref_finished[t, i] = running
                    running = 0.0
                    alive = auto_reset
        cond = f"{type(env).__name__}, auto_reset={auto_reset}, N={n}, T={T}"
        assert evidence.record(
            "mask after termination",
            cond,
            {
                "mask_or_reward_violations": violations,
                "episodes_finished": int(done.sum()),
                "padded_steps": int((mask == 0).sum()),
            },
            {"violations": 0},
            violations == 0,
        )
        assert done.sum() >= 1  # at least one termination inside the window
        assert evidence.allclose(
            "finished-episode returns vs Python", cond, finished, ref_finished, rtol=1e-5, atol=1e-4
        )


def _good_series(T: int = 6, N: int = 3) -> dict:
    """Undamaged float32 inputs for `discounted_returns` and `gae`, `[T, N]` and `[N]`."""
    rng = np.random.default_rng(11)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return {
        "rewards": f32(rng.normal(size=(T, N))),
        "values": f32(rng.normal(size=(T, N))),
        "dones": jnp.asarray(rng.random((T, N)) < 0.3),
        "masks": f32(np.ones((T, N))),
        "last_value": f32(rng.normal(size=N)),
        "gamma": 0.9,
        "lam": 0.95,
    }


def _damaged(name: str, value) -> dict:
    return {**_good_series(), name: value}


# (label, argument the message must name, damaged inputs), shared by both functions.
DAMAGED_SERIES = [
    ("rewards not [T, N]", "rewards", _damaged("rewards", jnp.zeros(6, jnp.float32))),
    ("masks of another shape", "masks", _damaged("masks", jnp.ones((5, 3), jnp.float32))),
    ("dones 0.5", "dones", _damaged("dones", jnp.full((6, 3), 0.5, jnp.float32))),
    ("last_value not [N]", "last_value", _damaged("last_value", jnp.zeros(4, jnp.float32))),
    ("rewards hold NaN", "rewards", _damaged("rewards", jnp.full((6, 3), jnp.nan, jnp.float32))),
    ("gamma 1.5", "gamma", _damaged("gamma", 1.5)),
]


def _refusal(call) -> str | None:
    try:
        call()
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.claims("returns-refuse-bad-arguments")
def test_discounted_returns_names_the_bad_argument(evidence):
    """discounted_returns raises ValueError naming the bad argument, 6 damages.

    Shapes (`rewards` not 2-D, `masks` unlike `rewards`, `last_value` not `[N]`),
    values (`dones` 0.5, NaN rewards) and the rate (`gamma` 1.5), each alone: the
    message starts with that argument's name in backticks; the undamaged inputs
    give returns of shape `[T, N]`."""
    call = lambda a: discounted_returns(  # noqa: E731
        a["rewards"], a["dones"], a["masks"], a["last_value"], a["gamma"]
    )
    assert call(_good_series()).shape == (6, 3)
    for label, name, args in DAMAGED_SERIES:
        message = _refusal(lambda args=args: call(args))
        assert evidence.record(
            "discounted_returns refuses a bad argument",
            label,
            {"message": message},
            {"message_starts_with": f"`{name}`"},
            message is not None and message.startswith(f"`{name}`"),
        ), f"{label}: {message!r}"


@pytest.mark.claims("gae-refuses-bad-arguments")
def test_gae_names_the_bad_argument(evidence):
    """gae raises ValueError naming the bad argument, 8 damages.

    The 6 damages of `discounted_returns` plus gae's own: `values` of another
    shape and `lam` below 0, each alone: the message starts with that
    argument's name in backticks; the undamaged inputs give `[T, N]` advantages."""
    call = lambda a: gae(  # noqa: E731
        a["rewards"], a["values"], a["dones"], a["masks"], a["last_value"], a["gamma"], a["lam"]
    )
    assert call(_good_series())[0].shape == (6, 3)
    cases = DAMAGED_SERIES + [
        ("values of another shape", "values", _damaged("values", jnp.zeros((6, 2), jnp.float32))),
        ("lam -0.1", "lam", _damaged("lam", -0.1)),
    ]
    for label, name, args in cases:
        message = _refusal(lambda args=args: call(args))
        assert evidence.record(
            "gae refuses a bad argument",
            label,
            {"message": message},
            {"message_starts_with": f"`{name}`"},
            message is not None and message.startswith(f"`{name}`"),
        ), f"{label}: {message!r}"
