"""Stage 1: functional environments and owned randomness.

- Grid world: every (state, action) deterministic move against the enumerated
  table (exhaustive, slip = 0), and the slippery transition frequencies against
  the table's probabilities (per-cell z-test, stated below), for two slip values.
- CartPole: states, rewards and termination against gymnasium's CartPole-v1,
  step for step, from the same start state and action sequence (several starts).
- Owned streams: runs under `jax_debug_key_reuse`; environment i's trajectory
  is bit-identical whether 3 or 11 environments run beside it.
"""

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from policy_evaluation.envs import CartPole, EnvState, GridWorld
from policy_evaluation.model import init_params
from policy_evaluation.rollout import reset_all, rollout
from policy_evaluation.train import sample_policy


def test_gridworld_deterministic_moves_match_table_exhaustively(evidence):
    for step_reward in (-0.01, -0.1):
        env = GridWorld(slip=0.0, step_reward=step_reward)
        P, R, terminal = env.transition_table()
        S, A = env.num_states, env.num_actions
        s_grid, a_grid = np.meshgrid(np.arange(S), np.arange(A), indexing="ij")
        states = EnvState(jnp.asarray(s_grid.ravel(), jnp.int32), jnp.zeros(S * A, jnp.int32))
        keys = jax.random.split(jax.random.key(0), S * A)
        out = jax.vmap(env.step)(states, jnp.asarray(a_grid.ravel(), jnp.int32), keys)
        nxt = np.asarray(out.state.physics).reshape(S, A)
        expected_next = P.argmax(axis=2)
        assert np.all(P.max(axis=2) == 1.0)  # slip = 0: the table is deterministic
        reward_ref = R[s_grid, a_grid, expected_next]
        mismatches = int((nxt != expected_next).sum())
        ok = evidence.record(
            "deterministic grid moves vs enumerated table",
            f"slip=0, step_reward={step_reward}",
            {"cells_checked": S * A, "mismatched_next_states": mismatches},
            {"mismatches": 0},
            mismatches == 0,
        )
        assert ok
        assert evidence.allclose(
            "grid reward vs table",
            f"step_reward={step_reward}",
            np.asarray(out.reward).reshape(S, A),
            reward_ref,
            rtol=1e-6,
            atol=1e-7,
        )
        term_ref = terminal[expected_next]
        assert np.array_equal(np.asarray(out.terminated).reshape(S, A), term_ref)


@pytest.mark.parametrize("slip", [0.2, 0.5])
def test_gridworld_slip_frequencies_match_table(evidence, slip):
    """Each (s, a) stepped n times; each next-state frequency f must satisfy
    |f - p| <= 5 sqrt(p (1 - p) / n) + 1e-9 (a 5-sigma normal bound per cell;
    with 256 (s, a, s') cells with p > 0 the family-wise false-alarm rate is
    below 2e-4, and the test is deterministic given its key)."""
    env = GridWorld(slip=slip)
    P, _, _ = env.transition_table()
    S, A, n = env.num_states, env.num_actions, 4000
    s_grid, a_grid = np.meshgrid(np.arange(S), np.arange(A), indexing="ij")
    s_rep = jnp.asarray(np.repeat(s_grid.ravel(), n), jnp.int32)
    a_rep = jnp.asarray(np.repeat(a_grid.ravel(), n), jnp.int32)
    keys = jax.random.split(jax.random.key(1), S * A * n)
    out = jax.jit(jax.vmap(env.step))(EnvState(s_rep, jnp.zeros_like(s_rep)), a_rep, keys)
    nxt = np.asarray(out.state.physics).reshape(S, A, n)
    freq = np.stack([(nxt == s2).mean(axis=2) for s2 in range(S)], axis=2)
    bound = 5.0 * np.sqrt(P * (1.0 - P) / n) + 1e-9
    worst_z = float(np.max(np.abs(freq - P) / np.sqrt(np.maximum(P * (1 - P), 1e-12) / n)))
    ok = evidence.record(
        "slippery transition frequencies vs table",
        f"slip={slip}, n={n} per (s, a)",
        {
            "max_abs_freq_error": float(np.abs(freq - P).max()),
            "max_z": worst_z,
            "impossible_transitions_seen": int(((P == 0) & (freq > 0)).sum()),
        },
        {"z_per_cell": 5.0},
        bool(np.all(np.abs(freq - P) <= bound)),
    )
    assert ok


def _gym_rollout(start: np.ndarray, actions: list[int]):
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    env.unwrapped.state = start.astype(np.float64)
    states, rewards, terms = [], [], []
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        states.append(obs)
        rewards.append(r)
        terms.append(term)
        if term or trunc:
            break
    env.close()
    return np.array(states), np.array(rewards), np.array(terms)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cartpole_matches_gymnasium_step_for_step(evidence, seed):
    rng = np.random.default_rng(seed)
    start = rng.uniform(-0.05, 0.05, 4).astype(np.float32)
    # Random actions, or a constant push (which ends by the angle limit quickly).
    actions = [int(a) for a in rng.integers(0, 2, 200)] if seed != 2 else [1] * 200
    ref_states, ref_rewards, ref_terms = _gym_rollout(start, actions)
    env = CartPole()
    state = EnvState(jnp.asarray(start), jnp.asarray(0, jnp.int32))
    step = jax.jit(env.step)
    states, rewards, terms = [], [], []
    key = jax.random.key(seed)
    for a in actions[: len(ref_states)]:
        key, sub = jax.random.split(key)
        out = step(state, jnp.asarray(a, jnp.int32), sub)
        state = out.state
        states.append(np.asarray(out.obs))
        rewards.append(float(out.reward))
        terms.append(bool(out.terminated))
    assert evidence.allclose(
        "CartPole states vs gymnasium",
        f"seed={seed}, {len(states)} steps",
        np.array(states),
        ref_states,
        rtol=1e-4,
        atol=1e-5,
    )
    assert np.array_equal(np.array(rewards), ref_rewards)
    ok = evidence.record(
        "CartPole termination flags vs gymnasium",
        f"seed={seed}",
        {
            "steps": len(terms),
            "ours_terminated_at": int(np.argmax(terms)) if any(terms) else None,
            "gym_terminated_at": int(np.argmax(ref_terms)) if ref_terms.any() else None,
        },
        None,
        np.array_equal(np.array(terms), ref_terms),
    )
    assert ok
    assert ref_terms[-1]  # the episode ended by termination, so the flag was checked


@pytest.mark.parametrize("env", [GridWorld(), CartPole()], ids=["gridworld", "cartpole"])
def test_env_trajectory_does_not_depend_on_env_count(evidence, env):
    params = init_params(jax.random.key(7), env.obs_size, env.num_actions, 16)
    key = jax.random.key(11)
    trajs = {}
    for n in (3, 11):
        k_reset, k_roll = jax.random.split(jax.random.clone(key))
        carry = reset_all(env, k_reset, n)
        _, traj = jax.jit(
            lambda c, k: rollout(env, sample_policy(params), c, k, 40, True)  # noqa: B023
        )(carry, k_roll)
        trajs[n] = traj
    # Discrete outcomes bit for bit; the network's float outputs (value,
    # log-prob) may differ in the last bits because the matmul's batch size differs.
    exact_fields = ("obs", "action", "reward", "done", "terminated", "mask")
    same = all(
        np.array_equal(np.asarray(getattr(trajs[3], f)), np.asarray(getattr(trajs[11], f))[:, :3])
        for f in exact_fields
    )
    close = all(
        np.allclose(
            np.asarray(getattr(trajs[3], f)),
            np.asarray(getattr(trajs[11], f))[:, :3],
            rtol=1e-5,
            atol=1e-6,
        )
        for f in ("value", "log_prob")
    )
    differ = not np.array_equal(
        np.asarray(trajs[11].action)[:, 0], np.asarray(trajs[11].action)[:, 1]
    )
    ok = evidence.record(
        "env i's trajectory independent of env count",
        type(env).__name__,
        {
            "bit_identical_first_3_envs": same,
            "values_close": close,
            "env0_differs_from_env1": differ,
        },
        {"value_rtol": 1e-5},
        same and close and differ,
    )
    assert ok


def test_key_reuse_is_detected():
    """The suite's `jax_debug_key_reuse` is live: reusing a key raises."""
    key = jax.random.key(0)
    jax.random.uniform(key)
    with pytest.raises(jax.errors.KeyReuseError):
        jax.random.uniform(key)
