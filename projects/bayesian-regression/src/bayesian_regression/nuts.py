"""The same regression in NumPyro, sampled with its NUTS: a second opinion
from a library sampler on the posterior that `hmc.py` targets.

Draws come back in the samplers' shared parameterization `(w, log sigma^2)`,
shape `(chains, draws, d + 1)`, so every comparison (with the exact posterior,
with the hand-built HMC, with the diagnostics) reads them the same way.
"""

import contextlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

from bayesian_regression.data import DataError, check_count, check_number
from bayesian_regression.model import Prior, check_regression_data


class NutsResult(NamedTuple):
    positions: jax.Array  # shape=(chains, draws, d + 1): (w, log sigma^2)
    accept_prob: jax.Array  # shape=(chains, draws): mean acceptance along each tree
    is_divergent: jax.Array  # shape=(chains, draws), bool
    step_size: jax.Array  # shape=(chains,): adapted step size
    num_steps: jax.Array  # shape=(chains, draws): leapfrog steps per draw


def regression_model(x: jax.Array, y: jax.Array | None, prior: Prior) -> None:
    """The conjugate model of `model.py`, written in NumPyro."""
    sigma2 = numpyro.sample("sigma2", dist.InverseGamma(prior.shape, prior.rate))
    scale = jnp.sqrt(sigma2) * prior.scale
    w = numpyro.sample("w", dist.Normal(prior.mean, scale).to_event(1))
    numpyro.sample("y", dist.Normal(x @ w, jnp.sqrt(sigma2)), obs=y)


@contextlib.contextmanager
def library_numerics():
    """NumPyro mixes ranks and dtypes freely and reuses keys by design inside its
    own kernels; the project's strict modes apply to our code, not to it."""
    with (
        jax.numpy_dtype_promotion("standard"),
        jax.numpy_rank_promotion("allow"),
        jax.debug_key_reuse(False),
    ):
        yield


def make_mcmc(num_chains: int, num_warmup: int, num_samples: int, target_accept: float) -> MCMC:
    """An `MCMC` object; running it twice with the same shapes reuses its compilation."""
    check_count(num_chains, "num_chains")
    check_count(num_warmup, "num_warmup", minimum=0)
    check_count(num_samples, "num_samples")
    check_number(target_accept, "target_accept", low=0.0, high=1.0, low_open=True, high_open=True)
    kernel = NUTS(regression_model, target_accept_prob=target_accept)
    return MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
        # Data as arguments of the compiled program: a rerun on data of the same
        # shapes reuses the compilation (the benchmark times that rerun).
        jit_model_args=True,
    )


def run_nuts(key: jax.Array, mcmc: MCMC, x: jax.Array, y: jax.Array, prior: Prior) -> NutsResult:
    """NUTS draws of the regression posterior; `x`, `y` and `prior` are checked first."""
    if not isinstance(mcmc, MCMC):
        raise DataError(f"`mcmc` must be a NumPyro `MCMC` (see `make_mcmc`), not `{type(mcmc)}`.")
    check_regression_data((x, y, prior))
    with library_numerics():
        mcmc.run(key, x, y, prior, extra_fields=("diverging", "num_steps", "mean_accept_prob"))
        samples = mcmc.get_samples(group_by_chain=True)
        extra = mcmc.get_extra_fields(group_by_chain=True)
        positions = jnp.concatenate([samples["w"], jnp.log(samples["sigma2"])[..., None]], axis=-1)
        step_size = mcmc.last_state.adapt_state.step_size
    return NutsResult(
        positions, extra["mean_accept_prob"], extra["diverging"], step_size, extra["num_steps"]
    )
