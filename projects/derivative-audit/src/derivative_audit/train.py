"""The training demo: implicit gradients in use.

The implicit layer (model.py) is fitted to a smooth regression target twice,
from the same initial weights on the same data, once with gradients by
implicit differentiation (`rules.fixed_point_implicit`) and once with reverse
mode through 100 unrolled iterations (`model.solve_unrolled`). In float64 the
two loss curves must agree to many digits: the implicit gradient is the
gradient, not an approximation of it.

Run: `derivative-audit report` (its "training" section).
Reads top to bottom: `loss_fn` -> `train_step` -> `train_and_evaluate`.
"""

import functools
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from derivative_audit import data, model, rules
from derivative_audit.config import Config

UNROLLED_ITERATIONS = 100  # 0.6^100 ~ 1e-22: the unrolled solve is converged in float64
LEARNING_RATE = 0.02
MAX_CONTRACTION = 0.9  # the solver converges like 0.9^k at worst


class TrainState(NamedTuple):
    params: model.Params  # float64 weights of the implicit layer
    opt_state: optax.OptState  # Adam moments
    step: jax.Array  # shape=(), int32


def loss_fn(params: model.Params, x: jax.Array, y: jax.Array, gradient: str) -> jax.Array:
    """Mean squared error of the fixed point z*(x) against y; `gradient` picks how
    the fixed point is differentiated (`implicit` or `unrolled`)."""
    if gradient == "implicit":
        z = rules.fixed_point_implicit(params, x, 1000)
    else:
        z = model.solve_unrolled(params, x, UNROLLED_ITERATIONS)
    return jnp.mean(jnp.square(z - y))


@functools.partial(jax.jit, static_argnames=("gradient", "tx"))
def train_step(
    state: TrainState, x: jax.Array, y: jax.Array, gradient: str, tx: optax.GradientTransformation
) -> tuple[TrainState, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(state.params, x, y, gradient)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # Keep W a contraction (spectral norm <= MAX_CONTRACTION): otherwise the fixed
    # point may stop existing or being unique, and neither gradient means anything.
    norm = jnp.linalg.norm(params.w, ord=2)
    params = params._replace(w=params.w * jnp.minimum(1.0, MAX_CONTRACTION / norm))
    return TrainState(params, opt_state, state.step + 1), loss


def train_and_evaluate(config: Config) -> dict[str, Any]:
    """Both runs; returns their loss curves, the largest relative gap between
    them, wall times, and the final implicit-run weights."""
    k_init, k_data = jax.random.split(jax.random.key(config.seed))
    width = config.n
    params = model.init(k_init, width, width, contraction=0.6)
    x, y = data.regression_data(k_data, 64, width, width)
    tx = optax.adam(LEARNING_RATE)
    curves: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    finals: dict[str, model.Params] = {}
    for gradient in ("implicit", "unrolled"):
        state = TrainState(params, tx.init(params), jnp.asarray(0, jnp.int32))
        losses = []
        start = time.perf_counter()
        for _ in range(config.train_steps):
            state, loss = train_step(state, x, y, gradient, tx)
            losses.append(float(loss))
        seconds[gradient] = time.perf_counter() - start
        curves[gradient] = losses
        finals[gradient] = state.params
    a, b = np.asarray(curves["implicit"]), np.asarray(curves["unrolled"])
    return {
        "steps": config.train_steps,
        "curves": curves,
        "max_rel_gap": float(np.max(np.abs(a - b) / np.abs(b))),
        "first_loss": float(a[0]),
        "final_loss": float(a[-1]),
        "seconds": seconds,
        "final_params": {k: np.asarray(v) for k, v in finals["implicit"]._asdict().items()},
        "spectral_norm_final": float(np.linalg.norm(np.asarray(finals["implicit"].w), 2)),
    }
