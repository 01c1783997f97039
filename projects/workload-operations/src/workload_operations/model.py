"""A two-layer MLP as explicit parameters: `init(config, key) -> Params`,
`apply(params, x) -> logits`.

Parameters are a plain dict of arrays (no module objects), so a checkpoint,
a checksum and a held-out evaluation all see the same pytree:
  - `w1`: float32 `(num_features, hidden_size)`, `b1`: float32 `(hidden_size,)`
  - `w2`: float32 `(hidden_size, num_classes)`, `b2`: float32 `(num_classes,)`
"""

import jax
import jax.numpy as jnp

from workload_operations.config import Config

Params = dict[str, jax.Array]


def init(config: Config, key: jax.Array) -> Params:
    """LeCun-normal weights, zero biases."""
    k1, k2 = jax.random.split(key)
    f, h, c = config.num_features, config.hidden_size, config.num_classes
    return {
        "w1": jax.random.normal(k1, (f, h)) / jnp.sqrt(jnp.float32(f)),
        "b1": jnp.zeros((h,), jnp.float32),
        "w2": jax.random.normal(k2, (h, c)) / jnp.sqrt(jnp.float32(h)),
        "b2": jnp.zeros((c,), jnp.float32),
    }


def apply(params: Params, x: jax.Array) -> jax.Array:
    """Logits float32 `(batch, num_classes)` for `x` float32 `(batch, num_features)`."""
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"][None, :])
    return hidden @ params["w2"] + params["b2"][None, :]
