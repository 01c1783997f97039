"""Actor-critic MLP as a plain pytree of arrays (no framework state to carry).

`init_params(key, obs_size, num_actions, hidden)` returns
`{"actor": [(W, b), ...], "critic": [(W, b), ...]}`; `apply(params, obs)` gives
`(logits, value)` for one observation or a batch (leading axes are kept).
"""

import jax
import jax.numpy as jnp


def _dense(key: jax.Array, n_in: int, n_out: int, scale: float) -> tuple[jax.Array, jax.Array]:
    w = jax.nn.initializers.orthogonal(scale)(key, (n_in, n_out), jnp.float32)
    return w, jnp.zeros((n_out,), jnp.float32)


def init_params(key: jax.Array, obs_size: int, num_actions: int, hidden: int) -> dict:
    keys = jax.random.split(key, 6)
    root2 = 2.0**0.5
    actor = [
        _dense(keys[0], obs_size, hidden, root2),
        _dense(keys[1], hidden, hidden, root2),
        _dense(keys[2], hidden, num_actions, 0.01),
    ]
    critic = [
        _dense(keys[3], obs_size, hidden, root2),
        _dense(keys[4], hidden, hidden, root2),
        _dense(keys[5], hidden, 1, 1.0),
    ]
    return {"actor": actor, "critic": critic}


def _mlp(layers: list, x: jax.Array) -> jax.Array:
    for i, (w, b) in enumerate(layers):
        x = x @ w
        x = x + jnp.broadcast_to(b, x.shape)  # explicit: strict rank promotion
        if i < len(layers) - 1:
            x = jnp.tanh(x)
    return x


def apply(params: dict, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Policy logits `[..., num_actions]` and state value `[...]`."""
    return _mlp(params["actor"], obs), _mlp(params["critic"], obs)[..., 0]
