"""The physical systems: right-hand sides, parameter checks, a known solution.

Two systems, each a first-order ODE `dy/dt = f(t, y, theta)` on a state of
shape `(2,)`:

- `OSCILLATOR`: the damped, optionally loaded, harmonic oscillator
  `m x'' + c x' + k x = F0` with state `y = (x, v)` and parameters
  `theta = (m, c, k)` (mass, damping, stiffness); `F0` is a known constant
  load applied from t = 0 (0 by default: the free response). Its exact
  solution (`oscillator_exact`) is the known trajectory of stage 1.
- `PENDULUM`: the damped nonlinear pendulum `phi'' = -(g / L) sin(phi) - c phi'`
  with state `y = (phi, omega)` and parameters `theta = (L, c)`; g = 9.81.

`f` is written for one trajectory (`y`: `(2,)`, `theta`: `(P,)`); batching is
`vmap`'s job (see `solver.py`).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

GRAVITY = 9.81


class ParameterError(ValueError):
    """Parameters, initial conditions or a time grid that cannot be simulated."""


class System(NamedTuple):
    """An ODE system: its name, right-hand side and the names of its parameters."""

    name: str
    rhs: Callable[[jax.Array, jax.Array, jax.Array, float], jax.Array]
    """`rhs(t, y, theta, load) -> dy/dt`; `y`: `(2,)`, `theta`: `(P,)`."""
    param_names: tuple[str, ...]
    state_names: tuple[str, str]


def oscillator_rhs(t: jax.Array, y: jax.Array, theta: jax.Array, load: float) -> jax.Array:
    del t  # Autonomous: the load is constant from t = 0.
    x, v = y[0], y[1]
    m, c, k = theta[0], theta[1], theta[2]
    return jnp.stack([v, (load - c * v - k * x) / m])


def pendulum_rhs(t: jax.Array, y: jax.Array, theta: jax.Array, load: float) -> jax.Array:
    del t, load  # Autonomous and unloaded.
    phi, omega = y[0], y[1]
    length, c = theta[0], theta[1]
    return jnp.stack([omega, -(GRAVITY / length) * jnp.sin(phi) - c * omega])


OSCILLATOR = System("oscillator", oscillator_rhs, ("m", "c", "k"), ("x", "v"))
PENDULUM = System("pendulum", pendulum_rhs, ("L", "c"), ("phi", "omega"))
SYSTEMS = {s.name: s for s in (OSCILLATOR, PENDULUM)}


def real_array(name: str, value: object) -> np.ndarray:
    """`value` as a float64 array, or a `ParameterError` naming `name` if it does not
    hold real numbers (strings, booleans, complex or ragged nested lists)."""
    try:
        array = np.asarray(value)
    except ValueError:
        raise ParameterError(f"`{name}` is ragged: its rows differ in length.") from None
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise ParameterError(f"`{name}` must hold real numbers, but has dtype `{array.dtype}`.")
    return array.astype(np.float64)


def check_parameters(system: System, theta: np.ndarray, y0: np.ndarray) -> None:
    """Refuses non-physical or non-finite inputs with a message naming the value.

    `theta`: `(B, P)`, `y0`: `(B, 2)`, `B >= 1`. Mass, stiffness and length must be
    positive, damping non-negative; everything finite.
    """
    theta = real_array("theta", theta)
    y0 = real_array("y0", y0)
    if theta.ndim != 2 or theta.shape[1] != len(system.param_names):
        raise ParameterError(
            f"`theta` must have shape (batch, {len(system.param_names)}) for the "
            f"{system.name} parameters {system.param_names}, but has shape `{theta.shape}`."
        )
    if theta.shape[0] == 0:
        raise ParameterError("`theta` holds no parameter sets (batch size 0).")
    if y0.ndim != 2 or y0.shape[1] != 2 or y0.shape[0] != theta.shape[0]:
        raise ParameterError(
            f"`y0` must have shape (batch, 2) with the batch of `theta` ({theta.shape[0]}), "
            f"but has shape `{y0.shape}`."
        )
    for name, values in (("theta", theta), ("y0", y0)):
        if not np.all(np.isfinite(values)):
            row = int(np.argwhere(~np.isfinite(values))[0, 0])
            raise ParameterError(
                f"`{name}` row {row} is not finite: `{values[row].tolist()}`; "
                "replace NaN or infinite entries before simulating."
            )
    positive = {"m": "mass", "k": "stiffness", "L": "length"}
    for j, name in enumerate(system.param_names):
        column = theta[:, j]
        if name in positive and np.any(column <= 0):
            row = int(np.argmax(column <= 0))
            raise ParameterError(
                f"The {positive[name]} `{name}` must be positive, but row {row} has "
                f"`{name} = {column[row]:g}`; a non-physical {positive[name]} has no "
                "trajectory to simulate."
            )
        if name == "c" and np.any(column < 0):
            row = int(np.argmax(column < 0))
            raise ParameterError(
                f"The damping `c` must be non-negative, but row {row} has `c = {column[row]:g}`."
            )


def oscillator_exact(
    theta: jax.Array, y0: jax.Array, ts: jax.Array, load: float = 0.0
) -> jax.Array:
    """The exact trajectory of an UNDERDAMPED oscillator at times `ts`.

    `theta`: `(3,)` = (m, c, k), `y0`: `(2,)`, `ts`: `(T,)`; returns `(T, 2)`.
    With `gamma = c / 2m`, `omega_d = sqrt(k/m - gamma^2)` and the equilibrium
    `x_eq = F0 / k`:  `x(t) - x_eq = exp(-gamma t) (A cos(omega_d t) + B sin(omega_d t))`
    with `A = x0 - x_eq`, `B = (v0 + gamma A) / omega_d`. Differentiable in
    `theta`, so its gradient is the continuous reference of stage 2.
    """
    m, c, k = theta[0], theta[1], theta[2]
    gamma = c / (2.0 * m)
    omega_d = jnp.sqrt(k / m - gamma**2)
    x_eq = load / k
    a = y0[0] - x_eq
    b = (y0[1] + gamma * a) / omega_d
    decay = jnp.exp(-gamma * ts)
    cos, sin = jnp.cos(omega_d * ts), jnp.sin(omega_d * ts)
    x = x_eq + decay * (a * cos + b * sin)
    # v = d/dt x: derivative of the product, written out.
    v = decay * ((b * omega_d - gamma * a) * cos - (a * omega_d + gamma * b) * sin)
    return jnp.stack([x, v], axis=-1)
