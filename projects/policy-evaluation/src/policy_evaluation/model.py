"""Actor-critic MLP as a plain pytree of arrays (no framework state to carry).

`init_params(key, obs_size, num_actions, hidden)` returns
`{"actor": [(W, b), ...], "critic": [(W, b), ...]}`; `apply(params, obs)` gives
`(logits, value)` for one observation or a batch (leading axes are kept).
"""

import jax
import jax.numpy as jnp


# (n_in, n_out, gain) per layer, actor then critic: gain sqrt 2 for hidden layers,
# 0.01 for the policy head (near-uniform first policy), 1 for the value head.
def _layer_specs(obs_size: int, num_actions: int, hidden: int) -> list[tuple[int, int, float]]:
    root2 = 2.0**0.5
    return [
        (obs_size, hidden, root2),
        (hidden, hidden, root2),
        (hidden, num_actions, 0.01),
        (obs_size, hidden, root2),
        (hidden, hidden, root2),
        (hidden, 1, 1.0),
    ]


def orthonormal_columns(x: jax.Array) -> jax.Array:
    """Gram-Schmidt, each column projected out twice ("twice is enough"): the Q
    of `x = Q R` `[rows, cols]`, rows >= cols, with R's diagonal positive.

    That sign convention is the one `jax.random.orthogonal` imposes on LAPACK's
    Q (it multiplies by `sign(diag(R))`), so for a full-rank `x` this is the
    same matrix up to rounding. Plain array ops, no LAPACK call: see
    `orthogonal_weights` for why that matters here.
    """
    cols = x.shape[1]

    def next_column(j: jax.Array, q: jax.Array) -> jax.Array:
        earlier = (jnp.arange(cols) < j).astype(x.dtype)  # columns 0..j-1 are done
        v = q[:, j]
        for _ in range(2):
            v = v - q @ ((q.T @ v) * earlier)
        return q.at[:, j].set(v / jnp.linalg.norm(v))

    return jax.lax.fori_loop(0, cols, next_column, x)


def orthogonal_weights(keys: jax.Array, shapes: list[tuple[int, int]]) -> list[jax.Array]:
    """`jax.nn.initializers.orthogonal()(keys[i], shapes[i])` for every layer,
    without LAPACK.

    Each layer draws the same Gaussian matrix as `jax.random.orthogonal`
    (`(max(n, m), min(n, m))` from its own key) and orthonormalizes its columns
    with `orthonormal_columns`; a stage-4 test compares every layer with the
    library's initializer.

    Why not the library's QR: under `vmap` a QR becomes a batched LAPACK call
    that jaxlib 0.10 fans out over XLA's CPU thread pool and then blocks on.
    Two such calls running at once (one per layer, or one per CPU device when
    the seeds are sharded) fill a 2-thread pool, and each waits forever for
    work queued behind the other.
    """
    weights = []
    for key, (n, m) in zip(keys, shapes, strict=True):
        q = orthonormal_columns(jax.random.normal(key, (max(n, m), min(n, m)), jnp.float32))
        weights.append(q.mT if n < m else q)
    return weights


def init_params(key: jax.Array, obs_size: int, num_actions: int, hidden: int) -> dict:
    """Orthogonal weights scaled by each layer's gain, zero biases; one key per
    layer, split from `key`."""
    specs = _layer_specs(obs_size, num_actions, hidden)
    keys = jax.random.split(key, len(specs))
    weights = orthogonal_weights(keys, [(n_in, n_out) for n_in, n_out, _ in specs])
    layers = [
        (jnp.float32(gain) * w, jnp.zeros((n_out,), jnp.float32))
        for w, (_, n_out, gain) in zip(weights, specs, strict=True)
    ]
    return {"actor": layers[:3], "critic": layers[3:]}


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
