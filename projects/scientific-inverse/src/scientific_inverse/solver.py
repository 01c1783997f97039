"""Integrators: a hand-written RK4 inside `jax.lax.scan`, batched with `vmap`,
and diffrax's adaptive Tsit5 with a PID step-size controller.

Axis contract (asserted by `simulate`, relied on everywhere else):

    theta : (batch, params)       one parameter set per trajectory
    y0    : (batch, state)        one initial condition per trajectory
    ts    : (time,)               shared time grid, ts[0] = 0, ts[-1] = t_end
    ys    : (batch, time, state)  ys[b, i] is trajectory b at ts[i]; ys[:, 0] == y0

`state` is 2 for both systems; `time = n_steps + 1` (the initial point is kept).
"""

from typing import Any, NamedTuple

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from scientific_inverse.model import ParameterError, System, check_parameters, real_array
from scientific_inverse.numerics import in_float64

RK4_ORDER = 4
# Integer steps are found from t_end / dt; a remainder above this fraction of a
# step means the grid cannot end at t_end.
GRID_SLACK = 1e-9
# Most states `simulate` keeps (batch x (steps + 1)): 2e7 states are 320 MB of float64.
MAX_STATES = 20_000_000


class Trajectory(NamedTuple):
    ts: np.ndarray  # shape=(time,), float64
    ys: np.ndarray  # shape=(batch, time, state), float64


def steps_for(t_end: float, dt: float) -> int:
    """The whole number of steps of size `dt` that reach `t_end`, or a `ParameterError`."""
    if not (np.isfinite(t_end) and t_end > 0):
        raise ParameterError(f"The end time must be positive and finite, but `t_end = {t_end}`.")
    if not (np.isfinite(dt) and dt > 0):
        raise ParameterError(f"The step size must be positive and finite, but `dt = {dt}`.")
    ratio = t_end / dt
    n_steps = round(ratio)
    if n_steps < 1 or abs(ratio - n_steps) > GRID_SLACK * max(1.0, ratio):
        raise ParameterError(
            f"The step size `dt = {dt:g}` cannot reach the end time `t_end = {t_end:g}` in a "
            f"whole number of steps (t_end / dt = {ratio:.6g}); choose `dt = t_end / N` "
            f"for a positive integer N, e.g. `dt = {t_end / max(1, np.ceil(ratio)):.6g}`."
        )
    return n_steps


def rk4_step(
    system: System, t: jax.Array, y: jax.Array, theta: jax.Array, dt: jax.Array, load: float
) -> jax.Array:
    """One classical Runge-Kutta step (order 4) of `system` from `(t, y)`; `y`: `(2,)`.

    Cases:
      stage times -> k1 at `t`, k2 and k3 at `t + dt / 2`, k4 at `t + dt`; the tests
        step a time-dependent rhs, so the time argument of each stage is checked.
        [claim:rk4-stage-times]
      each stage -> `system.rhs(time, state, theta, load)`, the load passed to all four.
        [claim:rk4-load-to-every-stage]
      result -> `y + dt / 6 (k1 + 2 k2 + 2 k3 + k4)`, equal to a NumPy RK4 step to
        1e-13 in float64. [claim:rk4-weighted-sum]
    """
    # --- exercise stage 1: The four stages of classical RK4 and their 1-2-2-1 weighted sum. ---
    f = system.rhs
    k1 = f(t, y, theta, load)
    k2 = f(t + dt / 2, y + dt / 2 * k1, theta, load)
    k3 = f(t + dt / 2, y + dt / 2 * k2, theta, load)
    k4 = f(t + dt, y + dt * k3, theta, load)
    return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    # --- end exercise ---


def integrate(
    system: System, theta: jax.Array, y0: jax.Array, dt: jax.Array, n_steps: int, load: float
) -> jax.Array:
    """RK4 over `n_steps` steps in one `lax.scan`: `(n_steps + 1, 2)`, initial point first.

    One trajectory: `theta`: `(P,)`, `y0`: `(2,)`. Traceable and differentiable
    (reverse mode through the scan gives the discrete derivative of stage 2).
    """

    def body(y: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        # t = i * dt rather than a running sum: no accumulated rounding in t.
        y_next = rk4_step(system, i * dt, y, theta, dt, load)
        return y_next, y_next

    _, ys = jax.lax.scan(body, y0, jnp.arange(n_steps, dtype=y0.dtype))
    return jnp.concatenate([y0[None, :], ys], axis=0)


def integrate_to_observations(
    system: System,
    theta: jax.Array,
    y0: jax.Array,
    dt: jax.Array,
    stride: jax.Array,
    n_obs: int,
    max_stride: int,
    load: float,
) -> jax.Array:
    """RK4 with `stride` steps of size `dt` between observations: `(n_obs, 2)`, the
    state after `stride`, `2 stride`, ... steps (the initial point is not returned).

    `dt` and `stride` are traced, so one compiled program serves every grid of a
    refinement study: the inner scan always runs `max_stride` substeps and keeps
    only the first `stride` of them (`jnp.where`), which costs extra steps on
    coarse grids but no recompilation. Requires `stride <= max_stride`.
    """

    def substep(carry: tuple[jax.Array, jax.Array], i: jax.Array) -> tuple[Any, None]:
        y, t = carry
        y_next = rk4_step(system, t, y, theta, dt, load)
        active = i < stride
        return (jnp.where(active, y_next, y), jnp.where(active, t + dt, t)), None

    def observe(carry: tuple[jax.Array, jax.Array], _: None) -> tuple[Any, jax.Array]:
        carry, _ = jax.lax.scan(substep, carry, jnp.arange(max_stride))
        return carry, carry[0]

    t0 = jnp.zeros((), dtype=y0.dtype)
    _, ys = jax.lax.scan(observe, (y0, t0), None, length=n_obs)
    return ys


# vmap over (theta, y0): axis 0 of both is the batch; dt and the load are shared.
_batched = jax.vmap(integrate, in_axes=(None, 0, 0, None, None, None))
_batched_jit = jax.jit(_batched, static_argnums=(0, 4, 5))


@in_float64
def simulate(
    system: System,
    theta: np.ndarray,
    y0: np.ndarray,
    t_end: float,
    dt: float,
    load: float = 0.0,
) -> Trajectory:
    """Integrates a batch of trajectories with RK4; see the module's axis contract.

    Refuses non-physical parameters, a `dt` that cannot reach `t_end` and more
    than `MAX_STATES` stored states with a `ParameterError` before any computation.
    """
    theta = real_array("theta", theta)
    y0 = real_array("y0", y0)
    check_parameters(system, theta, y0)
    n_steps = steps_for(t_end, dt)
    if theta.shape[0] * (n_steps + 1) > MAX_STATES:
        raise ParameterError(
            f"{theta.shape[0]} trajectories of {n_steps} steps (`t_end = {t_end:g}`, "
            f"`dt = {dt:g}`) would keep more than {MAX_STATES:.0e} states; "
            "use a larger `dt` or fewer trajectories."
        )
    ys = _batched_jit(system, jnp.asarray(theta), jnp.asarray(y0), dt, n_steps, load)
    ys = np.asarray(jax.block_until_ready(ys))
    batch = theta.shape[0]
    # The axis contract, asserted on every call.
    assert ys.shape == (batch, n_steps + 1, 2), ys.shape
    if not np.all(np.isfinite(ys)):
        bad = int(np.argwhere(~np.all(np.isfinite(ys), axis=(1, 2)))[0, 0])
        raise ParameterError(
            f"Trajectory {bad} left the finite range (theta `{theta[bad].tolist()}`, "
            f"dt `{dt:g}`): the step is too large for this stiffness; reduce `dt`."
        )
    return Trajectory(ts=np.arange(n_steps + 1) * dt, ys=ys)


# ----------------------------------------------------------------------------- diffrax


def pid_controller(rtol: float, atol: float) -> diffrax.PIDController:
    """Diffrax's PID step-size controller; pcoeff/icoeff are the values diffrax's
    documentation suggests for non-stiff problems (PIDController docstring)."""
    return diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=0.3, icoeff=0.4)


def make_adjoint(
    name: str, rtol: float, atol: float, checkpoints: int | None = None
) -> diffrax.AbstractAdjoint:
    """`recursive` (discretise-then-optimise, checkpointed reverse mode through the
    solver's own steps; `checkpoints=None` keeps O(sqrt(max_steps)) of them and
    recomputes the rest) or `backsolve` (optimise-then-discretise: the adjoint ODE
    solved backwards in time, with its own Tsit5 and PID controller), or `forward`
    (forward-mode differentiation of the solver's own steps: `jax.jvp`/`jacfwd`
    only; the discrete derivative that `recursive` must reproduce)."""
    if name == "forward":
        return diffrax.ForwardMode()
    if name == "recursive":
        return diffrax.RecursiveCheckpointAdjoint(checkpoints=checkpoints)
    if name == "backsolve":
        return diffrax.BacksolveAdjoint(
            solver=diffrax.Tsit5(), stepsize_controller=pid_controller(rtol, atol)
        )
    raise ValueError(f"Unknown adjoint `{name}`; use `recursive`, `backsolve` or `forward`.")


def diffrax_solve(
    system: System,
    theta: jax.Array,
    y0: jax.Array,
    ts: jax.Array,
    *,
    rtol: float,
    atol: float,
    adjoint: str = "recursive",
    load: float = 0.0,
    max_steps: int = 100_000,
    checkpoints: int | None = None,
) -> jax.Array:
    """One trajectory with Tsit5 + PID control, saved at `ts` (`(T,)`): `(T, 2)`.

    Traceable (call it inside `jit`/`vmap`/`grad`); the caller provides the
    float64 scope. The initial step is chosen by the controller (`dt0=None`).
    """
    term = diffrax.ODETerm(lambda t, y, args: system.rhs(t, y, args, load))
    solution = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        t0=0.0,
        t1=ts[-1],
        dt0=None,
        y0=y0,
        args=theta,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=pid_controller(rtol, atol),
        adjoint=make_adjoint(adjoint, rtol, atol, checkpoints),
        max_steps=max_steps,
    )
    return solution.ys


@in_float64
def rk4_error_study(
    dts: tuple[float, ...], theta: np.ndarray, y0: np.ndarray, t_end: float
) -> dict[str, Any]:
    """Max |RK4 - exact| over a batch of underdamped oscillators (`theta`: `(B, 3)`,
    `y0`: `(B, 2)`) for each step in `dts`, and the fitted order (log-log slope)."""
    from scientific_inverse.model import OSCILLATOR, oscillator_exact

    exact = jax.jit(jax.vmap(oscillator_exact, in_axes=(0, 0, None)))
    errors = []
    for dt in dts:
        run = simulate(OSCILLATOR, theta, y0, t_end, dt)
        ref = np.asarray(exact(jnp.asarray(theta), jnp.asarray(y0), jnp.asarray(run.ts)))
        errors.append(float(np.abs(run.ys - ref).max()))
    order = float(np.polyfit(np.log(np.asarray(dts)), np.log(np.asarray(errors)), 1)[0])
    return {"dt": list(dts), "max_abs_error": errors, "observed_order": order}
