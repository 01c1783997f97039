"""The problem `scientific-inverse bench` times: its parameter sets, SciPy's
`solve_ivp` loop (the baseline a practitioner writes) and the gradient by
forward sensitivity equations solved with diffrax."""

import dataclasses

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from scipy.integrate import solve_ivp

from scientific_inverse.model import OSCILLATOR
from scientific_inverse.solver import pid_controller


def parameter_sets(batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`(batch, 3)` underdamped (m, c, k) and `(batch, 2)` initial states."""
    rng = np.random.default_rng(seed)
    theta = np.stack(
        [rng.uniform(0.5, 2.0, batch), rng.uniform(0.05, 0.5, batch), rng.uniform(1.0, 9.0, batch)],
        axis=1,
    )
    y0 = np.stack([rng.uniform(-1, 1, batch), rng.uniform(-1, 1, batch)], axis=1)
    return theta, y0


def scipy_loop(theta: np.ndarray, y0: np.ndarray, ts: np.ndarray, rtol: float) -> np.ndarray:
    """One `solve_ivp` (RK45) per parameter set: `(batch, time, 2)`."""
    out = np.empty((theta.shape[0], ts.shape[0], 2))
    for b, (m, c, k) in enumerate(theta):
        sol = solve_ivp(
            lambda t, y, m=m, c=c, k=k: [y[1], -(c * y[1] + k * y[0]) / m],
            (0.0, float(ts[-1])),
            y0[b],
            method="RK45",
            t_eval=ts,
            rtol=rtol,
            atol=rtol,
        )
        out[b] = sol.y.T
    return out


def sensitivity_ode_gradient(
    theta: jax.Array, y0: jax.Array, ts: jax.Array, rtol: float, max_steps: int
) -> jax.Array:
    """Gradient of `0.5 * sum(x(ts)**2)` for one oscillator (`theta`: `(3,)`, `y0`:
    `(2,)`) by forward sensitivities: `z = (y, S)`, `S = dy/dtheta` `(2, 3)`, flattened
    into one array of 8 and solved once with Tsit5 + the project's PID controller at
    rtol = atol = `rtol` (at most `max_steps` steps), the error norm taken over `y`
    only, so the steps are the primal solve's. `dS/dt = J_y S + J_theta` comes from
    `jax.jvp` of the rhs (one tangent per parameter). Traceable; the caller provides
    the float64 scope."""
    n = theta.shape[0]

    def rhs(t: jax.Array, z: jax.Array, p: jax.Array) -> jax.Array:
        y, sens = z[:2], z[2:].reshape(2, n)

        def f(state: jax.Array, params: jax.Array) -> jax.Array:
            return OSCILLATOR.rhs(t, state, params, 0.0)

        def column(s_j: jax.Array, e_j: jax.Array) -> jax.Array:
            return jax.jvp(f, (y, p), (s_j, e_j))[1]

        d_sens = jax.vmap(column, in_axes=(1, 0), out_axes=1)(sens, jnp.eye(n, dtype=y.dtype))
        return jnp.concatenate([f(y, p), d_sens.reshape(-1)])

    controller = dataclasses.replace(
        pid_controller(rtol, rtol), norm=lambda error: optx.rms_norm(error[:2])
    )
    solution = diffrax.diffeqsolve(
        diffrax.ODETerm(rhs),
        diffrax.Tsit5(),
        t0=0.0,
        t1=ts[-1],
        dt0=None,
        y0=jnp.concatenate([y0, jnp.zeros(2 * n, y0.dtype)]),
        args=theta,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=controller,
        max_steps=max_steps,
    )
    z = solution.ys
    # d/dtheta 0.5 sum_i x_i^2 = sum_i x_i dx_i/dtheta.
    return z[:, 0] @ z[:, 2 : 2 + n]
