"""The timed paths of `policy-evaluation bench`.

- `env_scan`: the JAX side of the environment ratios, `vmap` over
  environments and `scan` over steps in one jitted call.
- `GridTables` + `python_grid_cdf`: the fastest plain Python loop over the
  enumerated grid world: per (state, action) the successors with non-zero
  probability and their cumulative thresholds, precomputed once, then per
  step one `random.random()` and a `bisect` (the `jax_vs_python` baseline).
- `python_grid_choice`: the same loop drawing every successor with NumPy's
  `Generator.choice(p=...)` and the action with `Generator.integers` (the
  `jax_vs_python_choice` baseline: the common, slower form).
- `gym_run`: a gymnasium vector environment stepped with random actions.
- `SequentialOverDevices`: one seed after another with `jit(make_train)`,
  the seeds split over the same CPU devices as the vmapped run (one Python
  thread per device, each running its seeds in turn), so both sides of
  `vmapped_seeds_vs_sequential` use the same devices.
- `rng_words`: 32-bit random words by Threefry (`jax.random.bits`) and by
  NumPy's PCG64 (`Generator.integers`), the cost behind the CartPole limit.
"""

import bisect
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from policy_evaluation.envs import GridWorld


def env_scan(env, num_envs: int, num_steps: int, draws: bool = True):
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


@dataclass(frozen=True)
class GridTables:
    """Per (s, a): `successors[s][a]` (states with P > 0, ascending),
    `thresholds[s][a]` (cumulative probabilities of all but the last
    successor, so `bisect_right(thresholds, u)` for u in [0, 1) indexes a
    successor with its probability) and `rewards[s][a]` (R of each successor).
    Plain tuples and floats: no NumPy scalar in the loop."""

    successors: tuple
    thresholds: tuple
    rewards: tuple
    terminal: tuple
    start: int
    max_steps: int
    num_actions: int

    @classmethod
    def of(cls, env: GridWorld) -> "GridTables":
        P, R, terminal = env.transition_table()
        succ, thr, rew = [], [], []
        for s in range(env.num_states):
            succ_s, thr_s, rew_s = [], [], []
            for a in range(env.num_actions):
                nz = [int(j) for j in np.flatnonzero(P[s, a] > 0)]
                cum = np.cumsum(P[s, a, nz])
                succ_s.append(tuple(nz))
                thr_s.append(tuple(float(c) for c in cum[:-1]))
                rew_s.append(tuple(float(R[s, a, j]) for j in nz))
            succ.append(tuple(succ_s))
            thr.append(tuple(thr_s))
            rew.append(tuple(rew_s))
        return cls(
            tuple(succ),
            tuple(thr),
            tuple(rew),
            tuple(bool(t) for t in terminal),
            env.start,
            env.max_steps,
            env.num_actions,
        )


def sample_successor(tables: GridTables, s: int, a: int, u: float) -> tuple[int, float]:
    """The successor of (s, a) for a uniform draw u in [0, 1), and its reward."""
    i = bisect.bisect_right(tables.thresholds[s][a], u)
    return tables.successors[s][a][i], tables.rewards[s][a][i]


def python_grid_cdf(tables: GridTables, num_steps: int, seed: int) -> float:
    """`num_steps` random-action steps with auto-reset; returns the summed
    reward. One `random.random()` for the action, one for the successor."""
    rng = random.Random(seed)
    draw, find = rng.random, bisect.bisect_right
    succ, thr, rew, terminal = tables.successors, tables.thresholds, tables.rewards, tables.terminal
    start, max_steps, num_actions = tables.start, tables.max_steps, tables.num_actions
    s, t, total = start, 0, 0.0
    for _ in range(num_steps):
        a = int(draw() * num_actions)
        i = find(thr[s][a], draw())
        total += rew[s][a][i]
        s = succ[s][a][i]
        t += 1
        if terminal[s] or t >= max_steps:
            s, t = start, 0
    return total


def python_grid_choice(env: GridWorld, tables, num_steps: int, seed: int) -> float:
    """The same loop with `Generator.integers` and `Generator.choice(p=P[s, a])`
    per step over the dense table `tables = env.transition_table()`."""
    P, R, terminal = tables
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


def gym_run(gym_env, num_envs: int, num_steps: int, rng: np.random.Generator) -> Callable:
    """A call that resets `gym_env` and steps it `num_steps` times with random actions."""

    def run():
        gym_env.reset(seed=int(rng.integers(2**31)))
        for _ in range(num_steps):
            gym_env.step(rng.integers(0, 2, size=num_envs))

    return run


class SequentialOverDevices:
    """`run()` trains every seed with the jitted single-seed `train`, one
    after another on each device, the devices side by side (one thread per
    device; the seeds split in contiguous blocks, as the vmapped run's
    sharding splits them). The keys are placed on their devices once, here."""

    def __init__(self, train: Callable, keys: jax.Array, devices: Sequence):
        blocks = np.array_split(np.arange(keys.shape[0]), len(devices))
        self.train = train
        self.devices = list(devices)
        self.groups = [
            [jax.device_put(keys[int(i)], d) for i in block]
            for block, d in zip(blocks, self.devices, strict=True)
        ]
        self.pool = ThreadPoolExecutor(max_workers=len(self.devices))

    def _group(self, keys) -> list:
        # Every call reuses the same keys on purpose (identical work per call);
        # JAX's configuration contexts are per thread, so the checker is
        # switched off here, in the worker thread, as the caller does for itself.
        with jax.debug_key_reuse(False):
            return [jax.block_until_ready(self.train(k)) for k in keys]

    def run(self) -> list:
        """Every seed's result, in seed order."""
        if len(self.groups) == 1:
            return self._group(self.groups[0])
        return [r for rs in self.pool.map(self._group, self.groups) for r in rs]

    def close(self) -> None:
        self.pool.shutdown()


def rng_words(num_words: int) -> dict[str, Callable]:
    """Calls that each produce `num_words` random 32-bit words: Threefry
    (jitted `jax.random.bits`, fresh key each call) and PCG64."""
    bits = jax.jit(lambda k: jax.random.bits(k, (num_words,), jnp.uint32))
    keys = iter(jax.random.split(jax.random.key(7), 100_000))
    gen = np.random.default_rng(7)
    return {
        "threefry": lambda: bits(next(keys)).block_until_ready(),
        "pcg64": lambda: gen.integers(0, 2**32, size=num_words, dtype=np.uint32),
    }
