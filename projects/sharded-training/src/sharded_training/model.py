"""A two-layer MLP classifier as a plain pytree of parameters.

Params: `w1` `(num_features, hidden)`, `b1` `(hidden,)`, `w2` `(hidden, classes)`,
`b2` `(classes,)`, all float32. The hidden dimension is the one a `model` mesh
axis shards (see `sharding.param_specs`).
"""

import jax
import jax.numpy as jnp

from sharded_training.config import Config


def init_params(config: Config, key: jax.Array) -> dict[str, jax.Array]:
    """Glorot-style normal init from `key`."""
    k1, k2 = jax.random.split(key)
    d, h, c = config.num_features, config.hidden_size, config.num_classes
    return {
        "w1": jax.random.normal(k1, (d, h)) * jnp.sqrt(2.0 / (d + h)),
        "b1": jnp.zeros((h,), jnp.float32),
        "w2": jax.random.normal(k2, (h, c)) * jnp.sqrt(2.0 / (h + c)),
        "b2": jnp.zeros((c,), jnp.float32),
    }


def apply(params, x: jax.Array, key: jax.Array | None, dropout_rate: float) -> jax.Array:
    """Logits `(batch, classes)` for `x` `(batch, features)`; dropout when `key` is given."""
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"][None, :])
    if key is not None and dropout_rate > 0.0:
        keep = jax.random.bernoulli(key, 1.0 - dropout_rate, hidden.shape)
        hidden = jnp.where(keep, hidden / (1.0 - dropout_rate), 0.0)
    return hidden @ params["w2"] + params["b2"][None, :]


def per_example_loss(params, x, y, key, dropout_rate: float) -> jax.Array:
    """Softmax cross-entropy of each example, `(batch,)`."""
    logits = apply(params, x, key, dropout_rate)
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(log_probs, y[:, None], axis=-1)[:, 0]


def num_params(config: Config) -> int:
    d, h, c = config.num_features, config.hidden_size, config.num_classes
    return d * h + h + h * c + c
