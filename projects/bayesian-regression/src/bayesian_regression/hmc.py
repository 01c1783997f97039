"""Hamiltonian Monte Carlo, written out: leapfrog, Metropolis correction,
dual-averaging step size and a diagonal mass matrix adapted in warm-up,
chains side by side with `jax.vmap`.

Dataflow: `leapfrog -> hmc_step -> dual_averaging_update -> run_chain ->
run_chains`. A target is any `logdensity_fn(position) -> scalar` over an
unconstrained vector of shape `(d,)`.

References: Neal (2011), "MCMC using Hamiltonian dynamics" (leapfrog and the
acceptance rule); Hoffman & Gelman (2014), Algorithm 5 (dual averaging, with
their constants gamma=0.05, t0=10, kappa=0.75); the Stan reference manual
(windowed variance estimate, its regularization, divergence at an energy
error above 1000).
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from bayesian_regression.data import DataError, check_count, check_number, check_tree

LogDensity = Callable[[jax.Array], jax.Array]

# An energy error above this is a divergent transition (Stan's threshold).
MAX_ENERGY_ERROR = 1000.0
# Every transition's step size is the adapted one times U(1 - JITTER, 1 + JITTER).
JITTER = 0.5
# `step_size_factor` must lie in this range: below it a chain barely moves (every
# move is accepted and nothing mixes); above it every transition diverges.
STEP_SIZE_FACTOR_RANGE = (1e-3, 1e3)


class HMCState(NamedTuple):
    position: jax.Array  # shape=(d,)
    log_density: jax.Array  # shape=()
    grad: jax.Array  # shape=(d,): gradient of the log density at `position`


class HMCInfo(NamedTuple):
    accept_prob: jax.Array  # shape=(): min(1, exp(-energy_change))
    is_divergent: jax.Array  # shape=(), bool
    energy_change: jax.Array  # shape=(): H(proposal) - H(start); inf when non-finite


class DualAveraging(NamedTuple):
    log_step: jax.Array  # shape=(): log step size used at the next iteration
    log_step_avg: jax.Array  # shape=(): iterate average, the step size kept after warm-up
    h_bar: jax.Array  # shape=(): running mean of (target - accept_prob)
    mu: jax.Array  # shape=(): shrinkage point, log(10 * initial step)
    count: jax.Array  # shape=(), float32: updates since the last restart


class Samples(NamedTuple):
    positions: jax.Array  # shape=(chains, draws, d)
    accept_prob: jax.Array  # shape=(chains, draws)
    is_divergent: jax.Array  # shape=(chains, draws), bool
    step_size: jax.Array  # shape=(chains,): adapted step size
    inv_mass: jax.Array  # shape=(chains, d): adapted diagonal inverse mass matrix


def init_state(logdensity_fn: LogDensity, position: jax.Array) -> HMCState:
    log_density, grad = jax.value_and_grad(logdensity_fn)(position)
    return HMCState(position, log_density, grad)


def leapfrog(
    logdensity_fn: LogDensity,
    position: jax.Array,
    momentum: jax.Array,
    grad: jax.Array,
    step_size: jax.Array,
    inv_mass: jax.Array,
    num_steps: int,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`num_steps` leapfrog steps of `H(q, p) = -log p(q) + p^T M^{-1} p / 2` with
    `M^{-1} = diag(inv_mass)`. Returns `(position, momentum, log_density, grad)`.
    [claim:leapfrog-second-order-reversible]

    `grad` is the gradient of the LOG DENSITY at `position` (not of H), passed in
    so it is not recomputed: a kick is `p + step_size / 2 * grad`.
    [claim:leapfrog-kick-by-log-density-gradient] Each step
    evaluates the density and its gradient once, at the new position; the
    returned `log_density` and `grad` are those at the returned position.
    [claim:leapfrog-returns-end-density]
    """

    # --- exercise stage 2: Half kick, drift by inv_mass * p, half kick. ---
    def one_step(_, carry):
        q, p, _, g = carry
        p = p + 0.5 * step_size * g
        q = q + step_size * inv_mass * p
        log_density, g = jax.value_and_grad(logdensity_fn)(q)
        p = p + 0.5 * step_size * g
        return q, p, log_density, g

    init = (position, momentum, jnp.zeros((), position.dtype), grad)
    return jax.lax.fori_loop(0, num_steps, one_step, init)
    # --- end exercise ---


def hmc_step(
    noise: tuple[jax.Array, jax.Array],
    state: HMCState,
    logdensity_fn: LogDensity,
    step_size: jax.Array,
    inv_mass: jax.Array,
    num_steps: int,
) -> tuple[HMCState, HMCInfo]:
    """One HMC transition: fresh momentum `p ~ N(0, M)`, a leapfrog trajectory,
    and a Metropolis accept/reject on the change in total energy.

    `noise = (z, u)`: `z ~ N(0, I)` of shape `(d,)` and `u ~ U(0, 1)` of shape
    `()`, drawn by the caller for every iteration at once (one random-number
    call per chain compiles far faster than three inside the loop).

    Cases:
        momentum -> `z / sqrt(inv_mass)` (so p ~ N(0, M) with M = diag(1 / inv_mass))
            [claim:hmc-momentum-from-mass]
        energy change dH = H(end) - H(start), H = -log p(q) + sum(inv_mass p^2) / 2;
            a non-finite dH -> +inf (always rejected) [claim:hmc-nonfinite-energy-rejected]
        accept when `u < min(1, exp(-dH))`; rejected -> the old state, unchanged
            [claim:hmc-metropolis-accept]
        `HMCInfo(accept_prob, is_divergent = dH > MAX_ENERGY_ERROR, energy_change = dH)`
            [claim:hmc-info-fields]
    """
    # --- exercise stage 2: p ~ N(0, M), leapfrog, accept w.p. min(1, exp(-dH)). ---
    z, u = noise
    momentum = z / jnp.sqrt(inv_mass)
    energy_start = -state.log_density + 0.5 * jnp.sum(inv_mass * momentum**2)
    position, momentum_end, log_density, grad = leapfrog(
        logdensity_fn, state.position, momentum, state.grad, step_size, inv_mass, num_steps
    )
    energy_end = -log_density + 0.5 * jnp.sum(inv_mass * momentum_end**2)
    energy_change = energy_end - energy_start
    energy_change = jnp.where(jnp.isfinite(energy_change), energy_change, jnp.inf)
    accept_prob = jnp.minimum(1.0, jnp.exp(-energy_change))
    accept = u < accept_prob
    proposal = HMCState(position, log_density, grad)
    new_state = jax.tree.map(lambda new, old: jnp.where(accept, new, old), proposal, state)
    info = HMCInfo(accept_prob, energy_change > MAX_ENERGY_ERROR, energy_change)
    return new_state, info
    # --- end exercise ---


def dual_averaging_init(step_size: jax.Array) -> DualAveraging:
    log_step = jnp.log(step_size)
    zero = jnp.zeros((), log_step.dtype)
    return DualAveraging(log_step, zero, zero, jnp.log(10.0) + log_step, zero)


def dual_averaging_update(
    da: DualAveraging, accept_prob: jax.Array, target: float
) -> DualAveraging:
    """Hoffman & Gelman (2014), Algorithm 5: steer the mean acceptance to `target`."""
    gamma, t0, kappa = 0.05, 10.0, 0.75
    count = da.count + 1.0
    weight = 1.0 / (count + t0)
    h_bar = (1.0 - weight) * da.h_bar + weight * (target - accept_prob)
    log_step = da.mu - jnp.sqrt(count) / gamma * h_bar
    eta = count**-kappa
    log_step_avg = eta * log_step + (1.0 - eta) * da.log_step_avg
    return DualAveraging(log_step, log_step_avg, h_bar, da.mu, count)


class _Welford(NamedTuple):
    mean: jax.Array  # shape=(d,)
    m2: jax.Array  # shape=(d,): sum of squared deviations
    count: jax.Array  # shape=(), float32


def _welford_update(w: _Welford, x: jax.Array, on: jax.Array) -> _Welford:
    count = w.count + 1.0
    delta = x - w.mean
    mean = w.mean + delta / count
    m2 = w.m2 + delta * (x - mean)
    new = _Welford(mean, m2, count)
    return jax.tree.map(lambda a, b: jnp.where(on, a, b), new, w)


def _regularized_variance(w: _Welford) -> jax.Array:
    """Stan's shrinkage of the windowed variance towards 1e-3."""
    n = w.count
    var = w.m2 / jnp.maximum(n - 1.0, 1.0)
    return (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0))


def run_chain(
    key: jax.Array,
    position: jax.Array,
    logdensity_fn: LogDensity,
    num_warmup: int,
    num_samples: int,
    num_steps: int,
    target_accept: float,
    step_size_factor: jax.Array | float = 1.0,
    initial_step_size: float = 0.1,
) -> Samples:
    """One chain (no chain axis in the result): `num_warmup` adaptation
    iterations, then `num_samples` kept draws, in ONE `lax.scan` (one copy of
    the trajectory code to compile instead of two).

    Every transition uses the current step size times a uniform jitter in
    `[1 - JITTER, 1 + JITTER]`. Warm-up of `W` iterations: `[0, W/2)` dual
    averaging with a unit mass matrix, positions of `[W/4, W/2)` collected for
    their variance; at `W/2` the inverse mass becomes that (regularized) variance and dual averaging
    restarts; `[W/2, W)` dual averaging again. Sampling uses the iterate
    average `exp(log_step_avg)` times `step_size_factor` (1 in normal use;
    larger to provoke divergences on purpose)."""
    half, quarter = num_warmup // 2, num_warmup // 4
    d = position.shape[0]

    def body(carry, inputs):
        state, da, inv_mass, welford = carry
        t, noise, jitter = inputs
        adapting = t < num_warmup
        base_step = jnp.where(
            adapting, jnp.exp(da.log_step), step_size_factor * jnp.exp(da.log_step_avg)
        )
        # Jittered step (Neal 2011, sec. 5.4.2.2): with a fixed trajectory length
        # L * eps near a period of the target, a chain returns to where it began.
        step_size = base_step * jitter
        state, info = hmc_step(noise, state, logdensity_fn, step_size, inv_mass, num_steps)
        # WARM-UP: adapt step size; estimate the variance in the first window.
        new_da = dual_averaging_update(da, info.accept_prob, target_accept)
        da = jax.tree.map(lambda a, b: jnp.where(adapting, a, b), new_da, da)
        welford = _welford_update(welford, state.position, (t >= quarter) & (t < half))
        switch = t == half - 1
        inv_mass = jnp.where(switch, _regularized_variance(welford), inv_mass)
        da = jax.tree.map(
            lambda a, b: jnp.where(switch, a, b), dual_averaging_init(jnp.exp(da.log_step)), da
        )
        return (state, da, inv_mass, welford), (state.position, info, base_step)

    zeros = jnp.zeros((d,), position.dtype)
    carry = (
        init_state(logdensity_fn, position),
        dual_averaging_init(jnp.asarray(initial_step_size, position.dtype)),
        jnp.ones((d,), position.dtype),
        _Welford(zeros, zeros, jnp.zeros((), position.dtype)),
    )
    num_iter = num_warmup + num_samples
    key_z, key_u, key_j = jax.random.split(key, 3)
    noise = (jax.random.normal(key_z, (num_iter, d)), jax.random.uniform(key_u, (num_iter,)))
    jitter = jax.random.uniform(key_j, (num_iter,), minval=1.0 - JITTER, maxval=1.0 + JITTER)
    (_, _, inv_mass, _), (positions, info, step_sizes) = jax.lax.scan(
        body, carry, (jnp.arange(num_iter), noise, jitter)
    )
    kept = slice(num_warmup, None)
    return Samples(
        positions[kept], info.accept_prob[kept], info.is_divergent[kept], step_sizes[-1], inv_mass
    )


def initial_positions(key: jax.Array, num_chains: int, dim: int, radius: float = 2.0) -> jax.Array:
    """Stan's default starts: uniform on `[-radius, radius]` in every coordinate."""
    return jax.random.uniform(key, (num_chains, dim), minval=-radius, maxval=radius)


@functools.lru_cache(maxsize=32)
def make_sampler(
    logdensity_fn: Callable[[jax.Array, Any], jax.Array],
    dim: int,
    num_chains: int,
    num_warmup: int,
    num_samples: int,
    num_steps: int,
    target_accept: float,
):
    """A jitted `(key, data, step_size_factor) -> Samples` running `num_chains`
    chains side by side (`jax.vmap`) from Stan-style random starts, on the target
    `logdensity_fn(position, data)`.

    The data travel as an argument, not as constants baked into the program, and
    the sampler is cached on its settings: a second data set of the same shapes,
    or another `step_size_factor`, reuses the compiled program.
    """

    def chains(key: jax.Array, data: Any, step_size_factor: jax.Array) -> Samples:
        key_init, key_chains = jax.random.split(key)
        positions = initial_positions(key_init, num_chains, dim)
        keys = jax.random.split(key_chains, num_chains)

        def one_chain(key, position):
            return run_chain(
                key,
                position,
                lambda q: logdensity_fn(q, data),
                num_warmup,
                num_samples,
                num_steps,
                target_accept,
                step_size_factor,
            )

        return jax.vmap(one_chain)(keys, positions)

    return jax.jit(chains)


def check_step_size_factor(value, name: str = "step_size_factor") -> float:
    """A finite factor inside `STEP_SIZE_FACTOR_RANGE`; raises `DataError` otherwise."""
    low, high = STEP_SIZE_FACTOR_RANGE
    return check_number(value, name, low=low, high=high)


def check_target(logdensity_fn, data: Any, dim: int) -> None:
    """Checks a target before anything compiles: `data` holds finite, non-empty
    values (and passes `logdensity_fn.validate_data(data)` where the target defines
    one), and `logdensity_fn(position, data)` traces, on a position of shape
    `(dim,)`, to a scalar. Raises `DataError` naming what does not fit."""
    if not callable(logdensity_fn):
        raise DataError(f"`logdensity_fn` must be a function, not `{logdensity_fn!r}`.")
    validate = getattr(logdensity_fn, "validate_data", None)
    if validate is not None:
        validate(data)
    check_tree(data, "data")
    position = jax.ShapeDtypeStruct((dim,), jnp.float32)
    try:
        out = jax.eval_shape(logdensity_fn, position, data)
    except TypeError as err:  # JAX's shape and dtype errors; ValueErrors already name it
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(
            f"`logdensity_fn` fails on a position of shape `({dim},)` with this `data`: {first}"
        ) from None
    if not isinstance(out, jax.ShapeDtypeStruct) or out.shape != ():
        shape = getattr(out, "shape", type(out).__name__)
        raise DataError(f"`logdensity_fn` must return a scalar, but it returns `{shape}`.")


def run_chains(
    key: jax.Array,
    logdensity_fn: Callable[[jax.Array, Any], jax.Array],
    data: Any,
    dim: int,
    num_chains: int,
    num_warmup: int,
    num_samples: int,
    num_steps: int,
    target_accept: float,
    step_size_factor: float = 1.0,
) -> Samples:
    """`num_chains` vmapped chains of `num_warmup + num_samples` iterations each.

    Every setting is checked first (positive counts, `target_accept` in `(0, 1)`,
    `step_size_factor` in `STEP_SIZE_FACTOR_RANGE`), then the target (`check_target`),
    before anything compiles: a `DataError` names the bad one."""
    dim = check_count(dim, "dim")
    num_chains = check_count(num_chains, "num_chains")
    num_warmup = check_count(num_warmup, "num_warmup", minimum=0)
    num_samples = check_count(num_samples, "num_samples")
    num_steps = check_count(num_steps, "num_steps")
    check_number(target_accept, "target_accept", low=0.0, high=1.0, low_open=True, high_open=True)
    check_step_size_factor(step_size_factor)
    check_target(logdensity_fn, data, dim)
    sampler = make_sampler(
        logdensity_fn, dim, num_chains, num_warmup, num_samples, num_steps, float(target_accept)
    )
    return sampler(key, data, jnp.asarray(step_size_factor, jnp.float32))
