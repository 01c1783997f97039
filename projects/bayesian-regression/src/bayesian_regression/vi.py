"""Variational inference with Gaussian families, reparameterization gradients
and Optax.

Families over an unconstrained vector of shape `(d,)`:
  - `meanfield`: `q = N(loc, diag(exp(log_scale))^2)`;
  - `fullrank`:  `q = N(loc, L L^T)`, `L` lower triangular with a positive
    diagonal (`exp` of the raw diagonal).

Dataflow: `sample_q -> entropy -> elbo -> fit`. The ELBO is
`E_q[log p(theta, y)] + H[q]`, with the entropy in closed form and the
expectation by Monte Carlo over `theta = loc + L eps`, `eps ~ N(0, I)`, so
that its gradient flows through the draws (the reparameterization trick).
Against a target with known normalizer `log Z`, `KL(q || p) = log Z - ELBO`.
"""

import functools
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from bayesian_regression.data import DataError, check_array, check_count, check_number
from bayesian_regression.hmc import check_target

Family = Literal["meanfield", "fullrank"]
LOG_2PI = 1.8378770664093453


class VIParams(NamedTuple):
    loc: jax.Array  # shape=(d,)
    raw_scale: jax.Array  # shape=(d,) for meanfield (log scales); (d, d) for fullrank


class VIResult(NamedTuple):
    params: VIParams
    elbo_trace: jax.Array  # shape=(steps,): the minibatch ELBO estimate at every step


# Initial scale of every coordinate. A narrow start keeps the first ELBO gradients
# tame: from N(0, I), draws of a log-variance far below its posterior make
# exp(-log sigma^2) explode, and the fit crawls out of that noise.
INIT_SCALE = 0.1


def init_params(dim: int, family: Family) -> VIParams:
    """`q = N(0, INIT_SCALE^2 I)` in either family."""
    log_scale = jnp.log(INIT_SCALE)
    if family == "meanfield":
        return VIParams(jnp.zeros((dim,)), jnp.full((dim,), log_scale))
    if family == "fullrank":
        return VIParams(jnp.zeros((dim,)), log_scale * jnp.eye(dim))
    raise ValueError(f"Unknown VI `family` `{family!r}`; use `meanfield` or `fullrank`.")


def check_params(params, name: str = "params") -> int:
    """Checks `VIParams` of either family (finite, matching shapes); returns `d`."""
    if not isinstance(params, VIParams):
        raise DataError(f"`{name}` must be `VIParams` (see `init_params`), not `{type(params)}`.")
    dim = check_array(params.loc, f"{name}.loc", ndim=1, floating=True).shape[0]
    if getattr(params.raw_scale, "ndim", None) == 1:
        check_array(params.raw_scale, f"{name}.raw_scale", shape=(dim,), floating=True)
    else:
        check_array(params.raw_scale, f"{name}.raw_scale", shape=(dim, dim), floating=True)
    return dim


def scale_matrix(params: VIParams) -> jax.Array:
    """`L` with `Cov_q = L L^T`, shape `(d, d)`."""
    if params.raw_scale.ndim == 1:
        return jnp.diag(jnp.exp(params.raw_scale))
    raw = params.raw_scale
    return jnp.tril(raw, -1) + jnp.diag(jnp.exp(jnp.diag(raw)))


def mean_and_cov(params: VIParams) -> tuple[jax.Array, jax.Array]:
    scale = scale_matrix(params)
    return params.loc, scale @ scale.T


def sample_q(params: VIParams, eps: jax.Array) -> jax.Array:
    """Reparameterized draws `loc + L eps`; `eps`: shape `(m, d)` -> `(m, d)`."""
    return params.loc[None, :] + eps @ scale_matrix(params).T


def entropy(params: VIParams) -> jax.Array:
    """`H[q] = d/2 (1 + log 2 pi) + log |det L|`."""
    dim = params.loc.shape[0]
    log_det = jnp.sum(jnp.log(jnp.diag(scale_matrix(params))))
    return 0.5 * dim * (1.0 + LOG_2PI) + log_det


def elbo(
    params: VIParams,
    key: jax.Array,
    logdensity_fn: Callable[[jax.Array, Any], jax.Array],
    data: Any,
    num_mc: int,
) -> jax.Array:
    """Monte-Carlo ELBO with `num_mc` reparameterized draws from `q`.

    `eps = jax.random.normal(key, (num_mc, d))` (the key used once), draws
    `sample_q(params, eps)`; returns the mean of `logdensity_fn(theta, data)` over
    the draws plus the closed-form `entropy(params)` (not a Monte-Carlo one).
    [claim:elbo-mc-mean-plus-entropy]
    """
    check_params(params)
    check_count(num_mc, "num_mc")
    # --- exercise stage 2: Mean log density at loc + L eps, plus the entropy. ---
    eps = jax.random.normal(key, (num_mc, params.loc.shape[0]))
    theta = sample_q(params, eps)
    log_p = jax.vmap(lambda t: logdensity_fn(t, data))(theta)
    return jnp.mean(log_p) + entropy(params)
    # --- end exercise ---


@functools.lru_cache(maxsize=16)
def make_fit(
    logdensity_fn: Callable[[jax.Array, Any], jax.Array],
    dim: int,
    family: Family,
    num_steps: int,
    learning_rate: float,
    num_mc: int,
):
    """A jitted `(key, data) -> VIResult`: `num_steps` Adam steps on `-ELBO`,
    the whole loop in one `lax.scan`; cached on its settings. The learning rate
    decays (cosine, to 1% of `learning_rate`) so that the last iterates average
    out the gradient noise instead of jittering at the full step."""
    schedule = optax.cosine_decay_schedule(learning_rate, num_steps, alpha=0.01)
    optimizer = optax.adam(schedule)

    def fit(key: jax.Array, data: Any) -> VIResult:
        params = init_params(dim, family)
        loss = lambda p, k: -elbo(p, k, logdensity_fn, data, num_mc)  # noqa: E731

        def step(carry, key):
            params, opt_state = carry
            neg_elbo, grads = jax.value_and_grad(loss)(params, key)
            # Optax mixes Python floats with int32 step counts; exempt it from strict promotion.
            with jax.numpy_dtype_promotion("standard"):
                updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            return (params, opt_state), -neg_elbo

        keys = jax.random.split(key, num_steps)
        (params, _), trace = jax.lax.scan(step, (params, optimizer.init(params)), keys)
        return VIResult(params, trace)

    return jax.jit(fit)


def fit(
    key: jax.Array,
    logdensity_fn: Callable[[jax.Array, Any], jax.Array],
    data: Any,
    dim: int,
    family: Family,
    num_steps: int,
    learning_rate: float,
    num_mc: int,
) -> VIResult:
    """Fits `q` of `family` to `logdensity_fn(theta, data)` over `theta` of shape `(dim,)`.

    Every setting and the target (`hmc.check_target`) are checked before anything
    compiles; a `ValueError` names the bad one."""
    dim = check_count(dim, "dim")
    num_steps = check_count(num_steps, "num_steps")
    check_number(learning_rate, "learning_rate", low=0.0, low_open=True)
    num_mc = check_count(num_mc, "num_mc")
    init_params(dim, family)  # Validates `family` before compiling anything.
    check_target(logdensity_fn, data, dim)
    return make_fit(logdensity_fn, dim, family, num_steps, float(learning_rate), num_mc)(key, data)


@functools.partial(jax.jit, static_argnums=(2, 4))
def elbo_estimate(
    params: VIParams, key: jax.Array, logdensity_fn, data: Any, num_mc: int
) -> tuple[jax.Array, jax.Array]:
    """ELBO with many draws, for reporting: `(mean, standard error)`."""
    eps = jax.random.normal(key, (num_mc, params.loc.shape[0]))
    log_p = jax.vmap(lambda t: logdensity_fn(t, data))(sample_q(params, eps))
    value = jnp.mean(log_p) + entropy(params)
    return value, jnp.std(log_p) / jnp.sqrt(num_mc)
