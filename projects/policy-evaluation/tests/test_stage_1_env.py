"""Stage 1: functional environments and owned randomness.

- Grid world: every (state, action) deterministic move, reward and termination
  against the specification's table written out by hand in this file (not
  derived from the code's constants); the enumerated MDP `transition_table()`
  against the same specification; the slippery transition frequencies against
  its probabilities (per-cell z-test at 5.5, stated below), for two slip values.
- Time limit: truncated exactly at `max_steps`, never on a terminating step.
- CartPole: states, rewards and termination against gymnasium's CartPole-v1,
  step for step, from the same start state and action sequence (several starts).
- Any board: on drawn sizes, start, goal and pit cells, step costs, slips and
  time limits, `step` (every cell and action, both sides of the time limit),
  `reset` and `transition_table()` against a plain-Python reading of the
  specification; CartPole's resets are uniform on [-0.05, 0.05] per variable.
- Statistical tests state their size (how often correct code fails them, over
  keys) and power; the `size_sweep` script beside the tests records the sweeps behind them in
  `evidence/size_sweep.json`.
- Owned streams: runs under `jax_debug_key_reuse`; environment i's trajectory
  is bit-identical whether 3 or 11 environments run beside it.
"""

import functools

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_evaluation.envs import CartPole, EnvState, GridWorld

# The grid world's specification, written out by hand (not from the code's
# constants): cells numbered row by row on a 4 x 4 board,
#    0  1  2  3
#    4 [5] 6  7        5 = pit (-1, ends the episode)
#    8  9 10 11       15 = goal (+1, ends the episode)
#   12 13 14 [15]      every step also costs `step_reward`.
# NEXT[s] = the cell reached from s by (up, right, down, left); a wall keeps the agent in place.
NEXT = np.array(
    [
        [0, 1, 4, 0],
        [1, 2, 5, 0],
        [2, 3, 6, 1],
        [3, 3, 7, 2],
        [0, 5, 8, 4],
        [1, 6, 9, 4],
        [2, 7, 10, 5],
        [3, 7, 11, 6],
        [4, 9, 12, 8],
        [5, 10, 13, 8],
        [6, 11, 14, 9],
        [7, 11, 15, 10],
        [8, 13, 12, 12],
        [9, 14, 13, 12],
        [10, 15, 14, 13],
        [11, 15, 15, 14],
    ]
)
PIT, GOAL = 5, 15


def _spec_table(slip: float, step_reward: float):
    """P[s, a, s'], R[s, a, s'] and terminal[s] from the hand-written NEXT: the
    chosen move with probability 1 - slip, and with probability slip one of
    the four moves drawn uniformly (the chosen one included)."""
    S, A = NEXT.shape
    P = np.zeros((S, A, S))
    for s in range(S):
        for a in range(A):
            P[s, a, NEXT[s, a]] += 1.0 - slip
            for b in range(A):
                P[s, a, NEXT[s, b]] += slip / A
    bonus = np.zeros(S)
    bonus[GOAL], bonus[PIT] = 1.0, -1.0
    R = np.broadcast_to(bonus + step_reward, (S, A, S)).copy()
    terminal = np.zeros(S, bool)
    terminal[[PIT, GOAL]] = True
    return P, R, terminal


@pytest.mark.claims(
    "pure-functional-envs",
    "grid-slip-uniform-over-four",
    "grid-reward-goal-pit-step-cost",
    "grid-terminates-at-goal-or-pit",
)
def test_gridworld_deterministic_moves_match_the_specification(evidence):
    """With slip 0, every grid move, reward and ending equals a hand-written table, 2 step costs."""
    for step_reward in (-0.01, -0.1):
        env = GridWorld(slip=0.0, step_reward=step_reward)
        S, A = env.num_states, env.num_actions
        s_grid, a_grid = np.meshgrid(np.arange(S), np.arange(A), indexing="ij")
        states = EnvState(jnp.asarray(s_grid.ravel(), jnp.int32), jnp.zeros(S * A, jnp.int32))
        keys = jax.random.split(jax.random.key(0), S * A)
        out = jax.vmap(env.step)(states, jnp.asarray(a_grid.ravel(), jnp.int32), keys)
        nxt = np.asarray(out.state.physics).reshape(S, A)
        mismatches = int((nxt != NEXT).sum())
        ok = evidence.record(
            "deterministic grid moves vs the hand-written table",
            f"slip=0, step_reward={step_reward}",
            {"cells_checked": S * A, "mismatched_next_states": mismatches},
            {"mismatches": 0},
            mismatches == 0,
        )
        assert ok
        reward_ref = np.where(NEXT == GOAL, 1.0, np.where(NEXT == PIT, -1.0, 0.0)) + step_reward
        assert evidence.allclose(
            "grid reward vs the specification",
            f"step_reward={step_reward}",
            np.asarray(out.reward).reshape(S, A),
            reward_ref,
            rtol=1e-6,
            atol=1e-7,
        )
        assert np.array_equal(np.asarray(out.terminated).reshape(S, A), np.isin(NEXT, [PIT, GOAL]))
        assert not np.asarray(out.truncated).any()  # t = 1 of 50


@pytest.mark.claims("table-slip-shares", "table-rewards-by-next-cell", "table-terminal-rows-filled")
@pytest.mark.parametrize("slip,step_reward", [(0.2, -0.01), (0.5, -0.1)])
def test_gridworld_transition_table_matches_the_specification(evidence, slip, step_reward):
    """transition_table's P, R and terminal equal the specification's table, for 2 slips.

    The enumerated MDP the exact evaluator solves with, against the
    specification's table (two slip probabilities and step costs)."""
    P, R, terminal = GridWorld(slip=slip, step_reward=step_reward).transition_table()
    P_ref, R_ref, terminal_ref = _spec_table(slip, step_reward)
    cond = f"slip={slip}, step_reward={step_reward}"
    assert evidence.allclose("P[s, a, s'] vs specification", cond, P, P_ref, rtol=0, atol=1e-12)
    assert evidence.allclose("R[s, a, s'] vs specification", cond, R, R_ref, rtol=0, atol=1e-12)
    assert np.array_equal(terminal, terminal_ref)


# Per-cell limit of the slip-frequency test, in binomial standard deviations.
SLIP_Z_LIMIT = 5.5
SLIP_STEPS = 4000  # steps from each (s, a)


@functools.partial(jax.jit, static_argnums=0)
def _vmapped_step(env, state, action, keys):
    return jax.vmap(env.step)(state, action, keys)


def _slip_frequencies(slip: float, key: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """(freq, P): each (s, a) stepped SLIP_STEPS times from `split(key, S * A * n)`;
    freq[s, a, s'] the fraction that reached s', P the specification's table."""
    env = GridWorld(slip=slip)
    P, _, _ = _spec_table(slip, env.step_reward)
    S, A, n = env.num_states, env.num_actions, SLIP_STEPS
    s_grid, a_grid = np.meshgrid(np.arange(S), np.arange(A), indexing="ij")
    s_rep = jnp.asarray(np.repeat(s_grid.ravel(), n), jnp.int32)
    a_rep = jnp.asarray(np.repeat(a_grid.ravel(), n), jnp.int32)
    keys = jax.random.split(key, S * A * n)
    out = _vmapped_step(env, EnvState(s_rep, jnp.zeros_like(s_rep)), a_rep, keys)
    nxt = np.asarray(out.state.physics).reshape(S, A, n)
    freq = np.stack([(nxt == s2).mean(axis=2) for s2 in range(S)], axis=2)
    return freq, P


@pytest.mark.claims("grid-slip-uniform-over-four")
@pytest.mark.parametrize("slip", [0.2, 0.5])
def test_gridworld_slip_frequencies_match_the_specification(evidence, slip):
    """Slippery next-state frequencies match the specified probabilities within 5.5 sigma per cell.

    Each (s, a) stepped n = 4000 times; each next-state frequency f must satisfy
    |f - p| <= SLIP_Z_LIMIT sqrt(p (1 - p) / n) + 1e-9 with p from the
    specification, and a cell with p = 0 is never reached. Size: exact binomial
    tails summed over the 240 cells with 0 < p < 1: 2.0e-5 (slip 0.2) and
    1.1e-5 (slip 0.5). Swept over 256 keys per slip (evidence/size_sweep.json,
    the `size_sweep` script beside the tests): none past the limit, the largest |z| 4.5 and
    4.6. Power: a cell probability off by 5.5 sd fails with chance 1/2 (0.019
    at p = 0.05 to 0.042 at p = 0.625); slips drawn from 3 actions instead of
    4 leave a p = slip / 4 cell at 0, |z| 14.5 (slip 0.2) and 23.9 (slip 0.5)."""
    freq, P = _slip_frequencies(slip, jax.random.key(1))
    n = SLIP_STEPS
    bound = SLIP_Z_LIMIT * np.sqrt(P * (1.0 - P) / n) + 1e-9
    worst_z = float(np.max(np.abs(freq - P) / np.sqrt(np.maximum(P * (1 - P), 1e-12) / n)))
    ok = evidence.record(
        "slippery transition frequencies vs specification",
        f"slip={slip}, n={n} per (s, a)",
        {
            "max_abs_freq_error": float(np.abs(freq - P).max()),
            "max_z": worst_z,
            "impossible_transitions_seen": int(((P == 0) & (freq > 0)).sum()),
        },
        {"z_per_cell": SLIP_Z_LIMIT},
        bool(np.all(np.abs(freq - P) <= bound)),
    )
    assert ok


@pytest.mark.claims("truncated-at-max-steps", "cartpole-terminates-past-thresholds")
@pytest.mark.parametrize(
    "env", [GridWorld(slip=0.0, max_steps=7), CartPole(max_steps=7)], ids=["gridworld", "cartpole"]
)
def test_time_limit_truncates_exactly_at_max_steps(evidence, env):
    """Both envs truncate exactly when t + 1 reaches max_steps, never on a terminating step.

    Steps taken t -> t + 1: truncated exactly when t + 1 reaches max_steps
    and the step did not terminate (a terminating last step is terminated only)."""
    if isinstance(env, GridWorld):
        # From cell 0 moving right (no termination) and from cell 14 moving right (goal).
        physics = jnp.asarray([0, 0, 0, 14], jnp.int32)
    else:
        upright = [0.0, 0.0, 0.0, 0.0]
        # The last one leans past 12 degrees (0.21 rad) already.
        physics = jnp.asarray([upright, upright, upright, [0.0, 0.0, 0.25, 0.0]], jnp.float32)
    actions = jnp.asarray([1, 1, 1, 1], jnp.int32)
    t = jnp.asarray([5, 6, 7, 6], jnp.int32)  # the last one terminates at its last step
    keys = jax.random.split(jax.random.key(2), 4)
    out = jax.vmap(env.step)(EnvState(physics, t), actions, keys)
    truncated = np.asarray(out.truncated).tolist()
    terminated = np.asarray(out.terminated).tolist()
    ok = evidence.record(
        "time limit",
        f"{type(env).__name__}, max_steps=7, steps taken before: 5, 6, 7, 6 (last terminates)",
        {"truncated": truncated, "terminated": terminated, "t_after": np.asarray(out.state.t)},
        {"truncated": [False, True, True, False], "terminated": [False, False, False, True]},
        truncated == [False, True, True, False] and terminated == [False, False, False, True],
    )
    assert ok
    assert np.array_equal(np.asarray(out.state.t), [6, 7, 8, 7])


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


@pytest.mark.claims(
    "cartpole-force-by-action",
    "cartpole-euler-like-gymnasium",
    "cartpole-terminates-past-thresholds",
    "cartpole-reward-every-step",
    "cartpole-obs-is-state",
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cartpole_matches_gymnasium_step_for_step(evidence, seed):
    """CartPole states, rewards and termination equal gymnasium's CartPole-v1, 3 starts."""
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


def _random_trajectories(env, key, n: int, steps: int):
    """`steps` steps of `n` environments under uniformly random actions, with
    auto-reset; environment i draws only from entry i of each `split(key, n)`."""
    reset_key, key = jax.random.split(key)
    state, obs = jax.vmap(env.reset)(jax.random.split(reset_key, n))

    def one(carry, _):
        state, obs, key = carry
        key, act_key, env_key, reset_key = jax.random.split(key, 4)
        action = jax.vmap(lambda k: jax.random.randint(k, (), 0, env.num_actions, jnp.int32))(
            jax.random.split(act_key, n)
        )
        out = jax.vmap(env.step)(state, action, jax.random.split(env_key, n))
        fresh_state, fresh_obs = jax.vmap(env.reset)(jax.random.split(reset_key, n))
        done = out.terminated | out.truncated
        pick = lambda new, old: jax.vmap(jnp.where)(done, new, old)  # noqa: E731
        state = jax.tree.map(pick, fresh_state, out.state)
        record = (obs, action, out.reward, out.terminated, out.truncated)
        return (state, pick(fresh_obs, out.obs), key), record

    _, records = jax.lax.scan(one, (state, obs, key), None, length=steps)
    return records


@pytest.mark.claims("pure-functional-envs", "owned-random-streams")
@pytest.mark.parametrize("env", [GridWorld(), CartPole()], ids=["gridworld", "cartpole"])
def test_env_trajectory_does_not_depend_on_env_count(evidence, env):
    """Env i's random trajectory is bit-identical with 3 or 11 envs beside it, both envs."""
    key = jax.random.key(11)
    trajs = {
        n: jax.jit(_random_trajectories, static_argnums=(0, 2, 3))(
            env, jax.random.clone(key), n, 60
        )
        for n in (3, 11)
    }
    same = all(
        np.array_equal(np.asarray(a), np.asarray(b)[:, :3])
        for a, b in zip(trajs[3], trajs[11], strict=True)
    )
    obs = np.asarray(trajs[11][0])
    differ = not np.array_equal(obs[:, 0], obs[:, 1])
    episodes = int(np.asarray(trajs[11][3]).sum() + np.asarray(trajs[11][4]).sum())
    ok = evidence.record(
        "env i's trajectory independent of env count",
        f"{type(env).__name__}, 60 random steps, 3 vs 11 envs",
        {
            "bit_identical_first_3_envs": same,
            "env0_differs_from_env1": differ,
            "episodes": episodes,
        },
        None,
        same and differ and episodes > 0,
    )
    assert ok


@pytest.mark.claims("owned-random-streams")
def test_key_reuse_is_detected():
    """The suite's jax_debug_key_reuse is live: drawing twice from one key raises."""
    key = jax.random.key(0)
    jax.random.uniform(key)
    with pytest.raises(jax.errors.KeyReuseError):
        jax.random.uniform(key)


# The specification's moves, by action: up, right, down, left as (row, column) steps.
SPEC_MOVES = {0: (-1, 0), 1: (0, 1), 2: (1, 0), 3: (0, -1)}


def _spec_next(size: int, s: int, a: int) -> int:
    r, c = divmod(s, size)
    dr, dc = SPEC_MOVES[a]
    r, c = r + dr, c + dc
    if not (0 <= r < size and 0 <= c < size):
        return s  # a wall keeps the agent in place
    return r * size + c


@st.composite
def _boards(draw):
    size = draw(st.integers(2, 6))
    start, goal, pit = draw(
        st.lists(st.integers(0, size * size - 1), min_size=3, max_size=3, unique=True)
    )
    return {
        "size": size,
        "start": start,
        "goal": goal,
        "pit": pit,
        "step_reward": draw(st.sampled_from([0.0, -0.01, -0.25, 0.5])),
        "max_steps": draw(st.integers(1, 6)),
        "slip": draw(st.sampled_from([0.0, 0.2, 1.0])),
    }


@pytest.mark.claims(
    "pure-functional-envs",
    "grid-slip-uniform-over-four",
    "grid-reward-goal-pit-step-cost",
    "grid-terminates-at-goal-or-pit",
    "truncated-at-max-steps",
    "grid-obs-one-hot",
    "table-slip-shares",
    "table-rewards-by-next-cell",
    "table-terminal-rows-filled",
)
@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(_boards())
def test_gridworld_on_any_board_matches_a_python_reading_of_the_specification(board):
    """On drawn boards step, reset and transition_table equal a plain-Python reading of the spec.

    Boards of 2 to 6 cells a side with the goal, pit and start anywhere
    (not only in the default corners), against plain Python: the deterministic
    step from every cell by every action, one step before and at the time
    limit; the reset; and the enumerated table at the drawn slip."""
    size, goal, pit = board["size"], board["goal"], board["pit"]
    env = GridWorld(**{**board, "slip": 0.0})
    S = size * size
    # Every (cell, action, t) triple, repeated to one fixed length so that the
    # eager JAX operations compile once for all drawn boards.
    cells, actions, t_before = (
        np.resize(g.ravel(), 6 * 6 * 4 * 2)
        for g in np.meshgrid(np.arange(S), np.arange(4), [0, board["max_steps"] - 1])
    )
    keys = jax.random.split(jax.random.key(3), len(cells))
    state = EnvState(jnp.asarray(cells, jnp.int32), jnp.asarray(t_before, jnp.int32))
    out = jax.vmap(env.step)(state, jnp.asarray(actions, jnp.int32), keys)
    nxt = np.array([_spec_next(size, s, a) for s, a in zip(cells, actions, strict=True)])
    bonus = np.where(nxt == goal, 1.0, np.where(nxt == pit, -1.0, 0.0))
    ends = (nxt == goal) | (nxt == pit)
    np.testing.assert_array_equal(np.asarray(out.state.physics), nxt)
    np.testing.assert_allclose(np.asarray(out.reward), bonus + board["step_reward"], atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.terminated), ends)
    np.testing.assert_array_equal(
        np.asarray(out.truncated), (t_before + 1 >= board["max_steps"]) & ~ends
    )
    np.testing.assert_array_equal(np.asarray(out.state.t), t_before + 1)
    assert np.array_equal(np.asarray(out.obs), np.eye(S)[nxt])
    state0, obs0 = env.reset(jax.random.key(4))
    assert int(state0.physics) == board["start"] and int(state0.t) == 0
    np.testing.assert_array_equal(np.asarray(obs0), np.eye(S)[board["start"]])

    slip = board["slip"]
    P, R, terminal = GridWorld(**board).transition_table()
    P_ref = np.zeros((S, 4, S))
    for s in range(S):
        for a in range(4):
            P_ref[s, a, _spec_next(size, s, a)] += 1.0 - slip
            for b in range(4):
                P_ref[s, a, _spec_next(size, s, b)] += slip / 4
    s2_bonus = np.where(np.arange(S) == goal, 1.0, np.where(np.arange(S) == pit, -1.0, 0.0))
    np.testing.assert_allclose(P, P_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        R, np.broadcast_to(s2_bonus + board["step_reward"], (S, 4, S)), rtol=0, atol=1e-12
    )
    np.testing.assert_array_equal(terminal, np.isin(np.arange(S), [goal, pit]))


RESET_N = 4000  # resets drawn
RESET_MEAN_Z = 5.0  # |mean| limit per variable, in standard errors of U[-0.05, 0.05]
RESET_END_GAP = 0.002  # each variable's min and max within this of the interval's ends


def _reset_figures(key: jax.Array) -> dict:
    """RESET_N CartPole resets from `split(key, RESET_N)`: the states, the
    observations, each variable's mean in standard errors and whether the
    test's conditions hold."""
    state, obs = jax.jit(jax.vmap(CartPole().reset))(jax.random.split(key, RESET_N))
    x = np.asarray(state.physics, np.float64)
    se = 0.1 / np.sqrt(12.0 * RESET_N)
    edge = 0.05 - RESET_END_GAP
    return {
        "state": state,
        "obs": obs,
        "x": x,
        "mean_z": x.mean(axis=0) / se,
        "passed": bool(
            (x >= -0.05).all()
            and (x <= 0.05).all()
            and (x.min(axis=0) < -edge).all()
            and (x.max(axis=0) > edge).all()
            and (np.abs(x.mean(axis=0)) <= RESET_MEAN_Z * se).all()
        ),
    }


def test_cartpole_resets_are_uniform_on_the_specified_interval(evidence):
    """4000 CartPole resets are uniform on [-0.05, 0.05] per variable, and the obs is the state.

    gymnasium's CartPole-v1 starts each of the 4 variables uniformly on
    [-0.05, 0.05]: 4000 resets from 4000 keys stay inside, reach within 0.002
    of both ends, have a mean within 5 standard errors of 0, and the
    observation is the state. Size: 2.3e-6 for the means (normal tails over 4
    variables; a mean of uniforms has lighter ones), 6e-35 for the 8 ends
    (0.98^4000 each). Swept over 256 keys (evidence/size_sweep.json, the `size_sweep`
    script beside the tests): none failed, the largest |mean| 3.4 se, the widest
    end gap 4e-5. Power: a mean shifted by 5 se = 0.0023 fails with chance
    1/2; an interval narrower than [-0.048, 0.048] or wider than [-0.05, 0.05]
    fails."""
    figures = _reset_figures(jax.random.key(9))
    x, state, obs = figures["x"], figures["state"], figures["obs"]
    ok = evidence.record(
        "CartPole resets vs U[-0.05, 0.05] per variable",
        f"{RESET_N} keys",
        {"min": x.min(axis=0), "max": x.max(axis=0), "mean": x.mean(axis=0)},
        {"inside": [-0.05, 0.05], "end_gap": RESET_END_GAP, "mean_z": RESET_MEAN_Z},
        figures["passed"],
    )
    assert ok
    np.testing.assert_array_equal(np.asarray(obs), np.asarray(state.physics))
    assert not np.asarray(state.t).any()
