"""Pure functional environments: `reset(key)` and `step(state, action, key)`.

Both environments are frozen dataclasses (hashable, so they can be static
arguments of `jax.jit`) whose methods are pure functions of their inputs; every
random draw comes from the key passed in. Vectorize with `jax.vmap`.

- `GridWorld`: a 4x4 stochastic grid ("slippery" moves) with a goal and a pit.
  It is small enough to enumerate: `transition_table()` gives the explicit
  P[s, a, s'] and r(s, a, s') the exact evaluator solves with.
- `CartPole`: the classic-control cart-pole with gymnasium's CartPole-v1
  constants, Euler integration and 500-step time limit.
"""

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class EnvState(NamedTuple):
    """Environment state: `physics` (cell index for the grid, the 4 cart-pole
    variables for CartPole) and `t`, the number of steps taken this episode."""

    physics: jax.Array
    t: jax.Array


class StepOut(NamedTuple):
    state: EnvState
    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array


def _check_fields(env: object, positive: tuple[str, ...], nonnegative: tuple[str, ...]) -> None:
    """Raises `ValueError` naming the first parameter that is not a finite number in
    its range (`positive`: > 0, `nonnegative`: >= 0)."""
    for name in positive + nonnegative:
        value = getattr(env, name)
        low_ok = value > 0 if name in positive else value >= 0
        if not (isinstance(value, int | float) and math.isfinite(value) and low_ok):
            bound = "> 0" if name in positive else ">= 0"
            raise ValueError(
                f"`{type(env).__name__}.{name}` must be a finite number {bound}, not {value!r}."
            )


def _check_int(env: object, name: str, low: int, high: int | None = None) -> None:
    value = getattr(env, name)
    if type(value) is not int or value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ValueError(
            f"`{type(env).__name__}.{name}` must be a whole number {span}, not {value!r}."
        )


# Grid moves: up, right, down, left as (row, column) offsets.
MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))


@dataclasses.dataclass(frozen=True)
class GridWorld:
    """4x4 grid, start in cell 0 (top left), goal in cell 15 (+1), pit in cell 5 (-1).

    Each move costs `step_reward`; with probability `slip` the chosen action is
    replaced by one drawn uniformly from the four (possibly the same one).
    Moves into a wall leave the agent in place. The goal and the pit end the
    episode (terminated); `max_steps` steps end it by time limit (truncated).
    """

    size: int = 4
    goal: int = 15
    pit: int = 5
    start: int = 0
    slip: float = 0.2
    step_reward: float = -0.01
    max_steps: int = 50

    num_actions: int = 4

    def __post_init__(self) -> None:
        _check_int(self, "size", 2, 64)
        for name in ("goal", "pit", "start"):
            _check_int(self, name, 0, self.size * self.size - 1)
        if len({self.goal, self.pit, self.start}) != 3:
            raise ValueError(
                f"`GridWorld.start`, `goal` and `pit` must be three different cells, not "
                f"{self.start}, {self.goal} and {self.pit}."
            )
        if not (isinstance(self.slip, int | float) and 0.0 <= self.slip <= 1.0):
            raise ValueError(
                f"`GridWorld.slip` must be a probability in [0, 1], not {self.slip!r}."
            )
        if not (isinstance(self.step_reward, int | float) and math.isfinite(self.step_reward)):
            raise ValueError(f"`GridWorld.step_reward` must be finite, not {self.step_reward!r}.")
        _check_int(self, "max_steps", 1)
        _check_int(self, "num_actions", len(MOVES), len(MOVES))

    @property
    def num_states(self) -> int:
        return self.size * self.size

    @property
    def obs_size(self) -> int:
        return self.num_states

    def obs(self, cell: jax.Array) -> jax.Array:
        return jax.nn.one_hot(cell, self.num_states, dtype=jnp.float32)

    def reset(self, key: jax.Array) -> tuple[EnvState, jax.Array]:
        del key  # the start cell is fixed; the key is accepted for a uniform API
        cell = jnp.asarray(self.start, jnp.int32)
        return EnvState(cell, jnp.asarray(0, jnp.int32)), self.obs(cell)

    def move(self, cell: jax.Array, action: jax.Array) -> jax.Array:
        """Deterministic move of `action` from `cell` (walls stop the move)."""
        row, col = cell // self.size, cell % self.size
        d_row = jnp.asarray([m[0] for m in MOVES], jnp.int32)[action]
        d_col = jnp.asarray([m[1] for m in MOVES], jnp.int32)[action]
        row = jnp.clip(row + d_row, 0, self.size - 1)
        col = jnp.clip(col + d_col, 0, self.size - 1)
        return row * self.size + col

    def step(self, state: EnvState, action: jax.Array, key: jax.Array) -> StepOut:
        """One step of one environment from `state` (vmap it over environments).

        Cases:
          slip -> with probability `slip` the action is replaced by one drawn uniformly
            from all four (the chosen one included); `slip = 0` never draws another
            [claim:grid-slip-uniform-over-four].
          reward -> +1 if the NEW cell is the goal, -1 if it is the pit, 0 otherwise,
            plus `step_reward` on every step, the ending one included; float32
            [claim:grid-reward-goal-pit-step-cost].
          terminated -> the new cell is the goal or the pit [claim:grid-terminates-at-goal-or-pit].
          `t` -> `state.t + 1`; truncated -> `t + 1 >= max_steps` and not terminated
            [claim:truncated-at-max-steps].
          obs -> the one-hot float32 of the new cell (`self.obs`) [claim:grid-obs-one-hot].
        """
        # --- exercise stage 1: Slip to a uniform action w.p. slip; +1 goal, -1 pit, step cost. ---
        slip_key, action_key = jax.random.split(key)
        slipped = jax.random.bernoulli(slip_key, self.slip)
        random_action = jax.random.randint(action_key, (), 0, self.num_actions, jnp.int32)
        taken = jnp.where(slipped, random_action, jnp.asarray(action, jnp.int32))
        cell = self.move(state.physics, taken)
        reward = jnp.where(
            cell == self.goal, 1.0, jnp.where(cell == self.pit, -1.0, 0.0)
        ) + jnp.float32(self.step_reward)
        terminated = (cell == self.goal) | (cell == self.pit)
        t = state.t + 1
        truncated = (t >= self.max_steps) & ~terminated
        return StepOut(
            EnvState(cell, t), self.obs(cell), reward.astype(jnp.float32), terminated, truncated
        )
        # --- end exercise ---

    def transition_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The enumerated MDP in float64, written without JAX: `P[s, a, s']`,
        `R[s, a, s']` and the boolean `terminal[s]` (absorbing, no further reward).

        Cases:
          `P[s, a]` -> `1 - slip` on the cell action a reaches, plus `slip / 4` on the
            cell each of the four moves reaches (walls keep s; shares add up)
            [claim:table-slip-shares].
          `R[s, a, s']` -> `+1` if s' is the goal, `-1` if it is the pit, else 0, plus
            `step_reward`: the same for every s and a [claim:table-rewards-by-next-cell].
          terminal cells s -> their rows of P and R are filled like any other cell's;
            only `terminal` marks them (the exact evaluator zeroes them, stage 3)
            [claim:table-terminal-rows-filled].
        """
        # --- exercise stage 1: Enumerate P[s, a, s'] (slip over all 4 moves) and R[s, a, s']. ---
        n, size = self.num_states, self.size
        P = np.zeros((n, self.num_actions, n))
        R = np.zeros((n, self.num_actions, n))
        terminal = np.zeros(n, dtype=bool)
        terminal[[self.goal, self.pit]] = True
        for s in range(n):
            for a in range(self.num_actions):
                for taken in range(self.num_actions):
                    prob = (1.0 - self.slip) * (taken == a) + self.slip / self.num_actions
                    r, c = divmod(s, size)
                    r2 = min(max(r + MOVES[taken][0], 0), size - 1)
                    c2 = min(max(c + MOVES[taken][1], 0), size - 1)
                    P[s, a, r2 * size + c2] += prob
                for s2 in range(n):
                    bonus = 1.0 if s2 == self.goal else (-1.0 if s2 == self.pit else 0.0)
                    R[s, a, s2] = bonus + self.step_reward
        return P, R, terminal
        # --- end exercise ---


@dataclasses.dataclass(frozen=True)
class CartPole:
    """Cart-pole balancing with gymnasium CartPole-v1's constants and Euler steps.

    Reward 1 per step (the terminating step included). Terminated when |x| > 2.4
    or |theta| > 12 degrees; truncated after `max_steps` steps.
    """

    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5
    force_mag: float = 10.0
    tau: float = 0.02
    theta_threshold: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4
    max_steps: int = 500

    num_actions: int = 2
    obs_size: int = 4

    def __post_init__(self) -> None:
        _check_fields(
            self,
            ("masscart", "masspole", "length", "force_mag", "tau", "theta_threshold"),
            ("gravity", "x_threshold"),
        )
        _check_int(self, "max_steps", 1)
        _check_int(self, "num_actions", 2, 2)
        _check_int(self, "obs_size", 4, 4)

    def reset(self, key: jax.Array) -> tuple[EnvState, jax.Array]:
        physics = jax.random.uniform(key, (4,), jnp.float32, -0.05, 0.05)
        return EnvState(physics, jnp.asarray(0, jnp.int32)), physics

    def step(self, state: EnvState, action: jax.Array, key: jax.Array) -> StepOut:
        """One step of gymnasium CartPole-v1's dynamics (the key is unused).

        Cases:
          action 1 -> force `+force_mag`; action 0 -> `-force_mag` [claim:cartpole-force-by-action].
          integration -> explicit Euler, gymnasium's "euler": `x` and `theta` advance
            with the OLD velocities, the velocities with the new accelerations; the
            states match gymnasium's to rtol 1e-4, in float32 [claim:cartpole-euler-like-gymnasium].
          terminated -> on the NEW state, `|x| > x_threshold` or `|theta| >
            theta_threshold` (strictly greater) [claim:cartpole-terminates-past-thresholds].
          reward -> 1.0 (float32) on every step, the terminating one included
            [claim:cartpole-reward-every-step].
          `t` -> `state.t + 1`; truncated -> `t + 1 >= max_steps` and not terminated
            [claim:truncated-at-max-steps].
          obs -> the new physics state itself [claim:cartpole-obs-is-state].
        """
        # --- exercise stage 1: CartPole-v1's Euler step; end at |x| > 2.4 or |theta| > 12 deg. ---
        del key  # the dynamics are deterministic
        x, x_dot, theta, theta_dot = state.physics
        total_mass = self.masspole + self.masscart
        polemass_length = self.masspole * self.length
        force = jnp.where(action == 1, self.force_mag, -self.force_mag)
        costheta, sintheta = jnp.cos(theta), jnp.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta**2 / total_mass)
        )
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        physics = jnp.stack(
            [
                x + self.tau * x_dot,
                x_dot + self.tau * xacc,
                theta + self.tau * theta_dot,
                theta_dot + self.tau * thetaacc,
            ]
        ).astype(jnp.float32)
        terminated = (jnp.abs(physics[0]) > self.x_threshold) | (
            jnp.abs(physics[2]) > self.theta_threshold
        )
        t = state.t + 1
        truncated = (t >= self.max_steps) & ~terminated
        return StepOut(EnvState(physics, t), physics, jnp.float32(1.0), terminated, truncated)
        # --- end exercise ---


def make_env(name: str, **overrides) -> GridWorld | CartPole:
    """The environment `name` with parameters `overrides`; raises `ValueError` naming
    an unknown environment, an unknown parameter or a value out of its range."""
    kinds = {"gridworld": GridWorld, "cartpole": CartPole}
    if name not in kinds:
        raise ValueError(f"Unknown environment `{name}`; expected `gridworld` or `cartpole`.")
    known = {f.name for f in dataclasses.fields(kinds[name])}
    for key in overrides:
        if key not in known:
            raise ValueError(
                f"`{key}` is not a parameter of `{name}`; known: {', '.join(sorted(known))}."
            )
    return kinds[name](**overrides)
