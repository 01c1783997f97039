"""Sensitivities of a trajectory loss with respect to the physical parameters.

The loss compares the position with data `d` at observation times `t_i`:

    L(theta) = (1 / 2N) sum_i (x(t_i; theta) - d_i)^2

and its gradient is computed five ways:

- `discrete_grad`: reverse-mode autodiff through the RK4 `lax.scan`: the exact
  derivative of the DISCRETE map, which differs from the continuous one by
  O(dt^4);
- `finite_difference_grad`: central differences of that same discrete loss
  (NumPy loop, float64) -- checks autodiff, not the discretisation;
- `exact_grad`: autodiff of the loss built on the exact solution (oscillator
  only): the continuous reference;
- `forward_sensitivity_grad`: the forward sensitivity equations
  `S' = (df/dy) S + df/dtheta` with hand-written Jacobians, integrated by
  SciPy's DOP853 at rtol 1e-12: a continuous reference that shares no code
  with JAX (oscillator and pendulum);
- `diffrax_grad`: diffrax's Tsit5 + PID controller, differentiated with
  `RecursiveCheckpointAdjoint` or `BacksolveAdjoint`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from scipy.integrate import solve_ivp

from scientific_inverse.model import (
    GRAVITY,
    OSCILLATOR,
    ParameterError,
    System,
    check_parameters,
    oscillator_exact,
    real_array,
)
from scientific_inverse.numerics import in_float64
from scientific_inverse.solver import diffrax_solve, integrate, steps_for


def check_problem(
    system: System, theta: object, y0: object, ts: object, data: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The inputs of every gradient below as float64 arrays, or a `ParameterError`
    naming the one that cannot be used: `theta` `(P,)` physical and finite, `y0`
    `(2,)`, `ts` `(N,)` with `N >= 1`, positive and increasing, `data` `(N,)`
    finite (a NaN datum would make the gradient NaN)."""
    theta, y0 = real_array("theta", theta), real_array("y0", y0)
    ts, data = real_array("ts", ts), real_array("data", data)
    if theta.shape != (len(system.param_names),) or y0.shape != (2,):
        raise ParameterError(
            f"`theta` must have shape ({len(system.param_names)},) and `y0` shape (2,) for "
            f"one trajectory, but they have shapes `{theta.shape}` and `{y0.shape}`."
        )
    check_parameters(system, theta[None], y0[None])
    if ts.ndim != 1 or ts.shape[0] == 0:
        raise ParameterError(f"`ts` must be a non-empty `(N,)` array, but has shape `{ts.shape}`.")
    if not (np.all(np.isfinite(ts)) and ts[0] > 0 and np.all(np.diff(ts) > 0)):
        raise ParameterError(
            f"`ts` must be finite, positive and increasing, but starts `{ts[:3].tolist()}`."
        )
    if data.shape != ts.shape:
        raise ParameterError(
            f"`data` must have the shape of `ts` `{ts.shape}`, but has shape `{data.shape}`."
        )
    if not np.all(np.isfinite(data)):
        index = int(np.argmax(~np.isfinite(data)))
        raise ParameterError(
            f"`data[{index}] = {data[index]}` is not finite; drop missing values first."
        )
    return theta, y0, ts, data


def _loss(x_model: jax.Array, data: jax.Array) -> jax.Array:
    return 0.5 * jnp.mean((x_model - data) ** 2)


def _grid(ts: np.ndarray, dt: float) -> tuple[int, int]:
    """(n_steps, stride) such that ts[i] = (i + 1) * stride * dt on an RK4 grid of step dt."""
    spacing = float(ts[0])
    if not np.allclose(ts, spacing * np.arange(1, ts.shape[0] + 1), rtol=0, atol=1e-12):
        raise ValueError("Observation times must be evenly spaced from `ts[0]` onwards.")
    stride = steps_for(spacing, dt)
    return stride * ts.shape[0], stride


def _rk4_loss_fn(
    system: System,
    theta: jax.Array,
    y0: jax.Array,
    data: jax.Array,
    dt: jax.Array,
    n_steps: int,
    stride: int,
) -> jax.Array:
    ys = integrate(system, theta, y0, dt, n_steps, 0.0)
    return _loss(ys[stride::stride, 0], data)


_rk4_loss = jax.jit(_rk4_loss_fn, static_argnums=(0, 5, 6))
_rk4_grad = jax.jit(jax.grad(_rk4_loss_fn, argnums=1), static_argnums=(0, 5, 6))


@in_float64
def discrete_loss(
    system: System, theta: np.ndarray, y0: np.ndarray, ts: np.ndarray, data: np.ndarray, dt: float
) -> float:
    """The loss with the RK4 trajectory of step `dt` (`theta`: `(P,)`, `ts`, `data`: `(N,)`)."""
    theta, y0, ts, data = check_problem(system, theta, y0, ts, data)
    n_steps, stride = _grid(ts, dt)
    return float(
        _rk4_loss(
            system, jnp.asarray(theta), jnp.asarray(y0), jnp.asarray(data), dt, n_steps, stride
        )
    )


@in_float64
def discrete_grad(
    system: System, theta: np.ndarray, y0: np.ndarray, ts: np.ndarray, data: np.ndarray, dt: float
) -> np.ndarray:
    """Reverse-mode gradient through the RK4 scan: `(P,)`."""
    theta, y0, ts, data = check_problem(system, theta, y0, ts, data)
    n_steps, stride = _grid(ts, dt)
    return np.asarray(
        _rk4_grad(
            system, jnp.asarray(theta), jnp.asarray(y0), jnp.asarray(data), dt, n_steps, stride
        )
    )


def finite_difference_grad(
    system: System,
    theta: np.ndarray,
    y0: np.ndarray,
    ts: np.ndarray,
    data: np.ndarray,
    dt: float,
    rel_step: float = 1e-5,
) -> np.ndarray:
    """Central differences of `discrete_loss`, one parameter at a time (float64).

    `rel_step` near eps**(1/3) ~ 6e-6 balances truncation O(h^2) against
    round-off O(eps / h) in float64.

    Cases:
      parameter j -> step `h = rel_step * max(1, |theta[j]|)` (a zero parameter
        still gets a step) [claim:fd-step-floor], `(L(theta + h e_j) - L(theta - h e_j)) / (2 h)`
        with the other parameters unchanged [claim:fd-central-per-parameter], on copies
        (`theta` itself is not modified). [claim:fd-theta-not-modified]
      the result -> equals autodiff through the scan to 1e-7 of the gradient's
        largest entry, for both systems and two step sizes. [claim:fd-equals-autodiff]
    """
    theta = np.asarray(theta, dtype=np.float64)
    grad = np.zeros_like(theta)
    # --- exercise stage 2: Central differences of the discrete loss, one parameter at a time. ---
    for j in range(theta.shape[0]):
        h = rel_step * max(1.0, abs(theta[j]))
        up, down = theta.copy(), theta.copy()
        up[j] += h
        down[j] -= h
        grad[j] = (
            discrete_loss(system, up, y0, ts, data, dt)
            - discrete_loss(system, down, y0, ts, data, dt)
        ) / (2 * h)
    # --- end exercise ---
    return grad


@jax.jit
def _exact_grad(theta: jax.Array, y0: jax.Array, ts: jax.Array, data: jax.Array) -> jax.Array:
    return jax.grad(lambda th: _loss(oscillator_exact(th, y0, ts)[:, 0], data))(theta)


@in_float64
def exact_grad(theta: np.ndarray, y0: np.ndarray, ts: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Gradient of the loss on the exact oscillator solution: the continuous reference."""
    theta, y0, ts, data = check_problem(OSCILLATOR, theta, y0, ts, data)
    return np.asarray(
        _exact_grad(jnp.asarray(theta), jnp.asarray(y0), jnp.asarray(ts), jnp.asarray(data))
    )


def _jacobians(system: System, y: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hand-written `(df/dy (2, 2), df/dtheta (2, P))` of each system's right-hand side."""
    if system.name == "oscillator":
        m, c, k = theta
        x, v = y
        dfdy = np.array([[0.0, 1.0], [-k / m, -c / m]])
        dfdth = np.array([[0.0, 0.0, 0.0], [(c * v + k * x) / m**2, -v / m, -x / m]])
        return dfdy, dfdth
    length, c = theta
    phi, omega = y
    dfdy = np.array([[0.0, 1.0], [-(GRAVITY / length) * np.cos(phi), -c]])
    dfdth = np.array([[0.0, 0.0], [(GRAVITY / length**2) * np.sin(phi), -omega]])
    return dfdy, dfdth


def _numpy_rhs(system: System, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    if system.name == "oscillator":
        m, c, k = theta
        return np.array([y[1], -(c * y[1] + k * y[0]) / m])
    length, c = theta
    return np.array([y[1], -(GRAVITY / length) * np.sin(y[0]) - c * y[1]])


def forward_sensitivity_grad(
    system: System,
    theta: np.ndarray,
    y0: np.ndarray,
    ts: np.ndarray,
    data: np.ndarray,
    rtol: float = 1e-12,
) -> np.ndarray:
    """Gradient from the forward sensitivity equations, integrated by SciPy (DOP853).

    Augmented state `(y (2), S (2 x P))` with `S(0) = 0` (the initial condition
    does not depend on theta); `dL/dtheta = (1/N) sum_i (x_i - d_i) S[0, :](t_i)`.

    Layout of the augmented state `z` (`rhs` must read and return it this way):
      `z[:2]` -> `y`; `z[2:]` -> `S.ravel()` with `S` of shape `(2, P)` in row-major
        order, so `z[2:2 + P]` is `dx/dtheta`, the row the gradient reads.
        [claim:sensitivity-state-layout]
      `rhs(t, z)` -> `concatenate([f(y), (df/dy @ S + df/dtheta).ravel()])`, same
        layout; the result agrees with the exact-solution gradient to 1e-8.
        [claim:sensitivity-rhs]
    """
    theta, y0, ts, data = check_problem(system, theta, y0, ts, data)
    p = theta.shape[0]

    def rhs(t: float, z: np.ndarray) -> np.ndarray:
        """`dz/dt` in the layout above: `f(y)`, then `df/dy @ S + df/dtheta`.
        [claim:sensitivity-rhs]"""
        del t
        # --- exercise stage 2: The state's rhs, then dS/dt = df/dy S + df/dtheta. ---
        y, s = z[:2], z[2:].reshape(2, p)
        dfdy, dfdth = _jacobians(system, y, theta)
        return np.concatenate([_numpy_rhs(system, y, theta), (dfdy @ s + dfdth).ravel()])
        # --- end exercise ---

    z0 = np.concatenate([np.asarray(y0, dtype=np.float64), np.zeros(2 * p)])
    sol = solve_ivp(rhs, (0.0, float(ts[-1])), z0, method="DOP853", t_eval=ts, rtol=rtol, atol=rtol)
    if not sol.success:
        raise RuntimeError(f"The sensitivity reference did not integrate: {sol.message}")
    x = sol.y[0]
    s_x = sol.y[2 : 2 + p]  # dx/dtheta, shape (P, N)
    return s_x @ (x - data) / ts.shape[0]


@functools.partial(jax.jit, static_argnums=(0, 5))
def _diffrax_grad(
    system: System,
    theta: jax.Array,
    y0: jax.Array,
    ts: jax.Array,
    data: jax.Array,
    adjoint: str,
    rtol: jax.Array,
) -> jax.Array:
    def loss(th: jax.Array) -> jax.Array:
        ys = diffrax_solve(system, th, y0, ts, rtol=rtol, atol=rtol, adjoint=adjoint)
        return _loss(ys[:, 0], data)

    if adjoint == "forward":  # Forward mode: one tangent per parameter.
        return jax.jacfwd(loss)(theta)
    return jax.grad(loss)(theta)


@in_float64
def diffrax_grad(
    system: System,
    theta: np.ndarray,
    y0: np.ndarray,
    ts: np.ndarray,
    data: np.ndarray,
    *,
    adjoint: str,
    rtol: float,
) -> np.ndarray:
    """Gradient through diffrax (Tsit5, PID controller, rtol = atol = `rtol`) with the
    named adjoint (`recursive`, `backsolve` or `forward`): `(P,)`. The tolerance is traced,
    so changing it does not recompile."""
    theta, y0, ts, data = check_problem(system, theta, y0, ts, data)
    if adjoint not in ("recursive", "backsolve", "forward"):
        raise ParameterError(
            f"Unknown adjoint `{adjoint}`; use `recursive`, `backsolve` or `forward`."
        )
    if not (np.isfinite(rtol) and 0 < rtol < 1):
        raise ParameterError(f"The tolerance must lie in (0, 1), but `rtol = {rtol}`.")
    return np.asarray(
        _diffrax_grad(
            system,
            jnp.asarray(theta),
            jnp.asarray(y0),
            jnp.asarray(ts),
            jnp.asarray(data),
            adjoint,
            jnp.asarray(rtol),
        )
    )


def oscillator_problem(t_end: float = 5.0, obs_dt: float = 0.2) -> dict[str, np.ndarray]:
    """The stage-2 problem: theta = (m, c, k) = (1, 0.3, 4), data from the exact
    trajectory of (1, 0.35, 3.6), so the gradient is far from zero."""
    ts = obs_dt * np.arange(1, steps_for(t_end, obs_dt) + 1, dtype=np.float64)
    y0 = np.array([1.0, 0.0])
    with jax.enable_x64(True):
        data = np.asarray(
            oscillator_exact(jnp.array([1.0, 0.35, 3.6]), jnp.asarray(y0), jnp.asarray(ts))[:, 0]
        )
    return {
        "theta": np.array([1.0, 0.3, 4.0]),
        "y0": y0,
        "ts": ts,
        "data": data,
        "system": OSCILLATOR,
    }


def study(
    dts: tuple[float, ...] = (0.1, 0.05, 0.025, 0.0125),
    diffrax_rtols: tuple[float, ...] = (1e-6, 1e-8, 1e-10),
) -> dict[str, object]:
    """The stage-2 comparison on `oscillator_problem()`, as a JSON-able dict: the
    discrete gradient's distance to finite differences and to the exact gradient
    per step, the observed order, and both diffrax adjoints per tolerance."""
    problem = oscillator_problem()
    system, theta, y0, ts, data = (problem[k] for k in ("system", "theta", "y0", "ts", "data"))
    exact = exact_grad(theta, y0, ts, data)
    scale = float(np.abs(exact).max())
    forward = forward_sensitivity_grad(system, theta, y0, ts, data)
    rows = []
    for dt in dts:
        discrete = discrete_grad(system, theta, y0, ts, data, dt)
        fd = finite_difference_grad(system, theta, y0, ts, data, dt)
        rows.append(
            {
                "dt": dt,
                "grad": discrete.tolist(),
                "rel_vs_finite_difference": float(np.abs(discrete - fd).max() / scale),
                "rel_vs_exact": float(np.abs(discrete - exact).max() / scale),
            }
        )
    gaps = np.array([r["rel_vs_exact"] for r in rows])
    order = float(np.polyfit(np.log(np.array(dts)), np.log(gaps), 1)[0])
    adjoints = []
    for rtol in diffrax_rtols:
        grads = {
            name: diffrax_grad(system, theta, y0, ts, data, adjoint=name, rtol=rtol)
            for name in ("recursive", "backsolve")
        }
        adjoints.append(
            {
                "rtol": rtol,
                "recursive_rel_vs_exact": float(np.abs(grads["recursive"] - exact).max() / scale),
                "backsolve_rel_vs_exact": float(np.abs(grads["backsolve"] - exact).max() / scale),
                "recursive_vs_backsolve": float(
                    np.abs(grads["recursive"] - grads["backsolve"]).max() / scale
                ),
            }
        )
    return {
        "theta": theta.tolist(),
        "exact_grad": exact.tolist(),
        "forward_sensitivity_rel_vs_exact": float(np.abs(forward - exact).max() / scale),
        "discrete": rows,
        "discrete_order": order,
        "diffrax": adjoints,
    }
