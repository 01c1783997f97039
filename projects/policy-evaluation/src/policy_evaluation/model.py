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


def orthogonal_weights(keys: jax.Array, shapes: list[tuple[int, int]]) -> list[jax.Array]:
    """`jax.nn.initializers.orthogonal()(keys[i], shapes[i])` for every layer, with
    one QR factorization for all of them.

    Each layer draws the same Gaussian matrix as `jax.random.orthogonal`
    (`(max(n, m), min(n, m))` from its own key); the draws are zero-padded to a
    common shape and stacked. Padding with zero rows and trailing zero columns
    leaves the leading columns of Q and the leading diagonal of R as they were,
    so each layer's weight is its own orthogonal matrix (equal to the library's
    up to rounding; a stage-4 test compares them).

    Why one QR: under `vmap` a QR becomes a batched LAPACK call that jaxlib 0.10
    fans out over XLA's CPU thread pool and then blocks on. Several independent
    QRs run side by side, one per pool thread; on a 2-core machine two of them
    fill the pool and each waits forever for work queued behind the other.
    """
    dims = [(max(n, m), min(n, m)) for n, m in shapes]
    rows, cols = max(r for r, _ in dims), max(c for _, c in dims)
    draws = [
        jnp.pad(jax.random.normal(k, d, jnp.float32), ((0, rows - d[0]), (0, cols - d[1])))
        for k, d in zip(keys, dims, strict=True)
    ]
    q, r = jnp.linalg.qr(jnp.stack(draws))  # [..., layers, rows, cols], one geqrf + orgqr
    weights = []
    for i, ((n, m), (d_rows, d_cols)) in enumerate(zip(shapes, dims, strict=True)):
        sign = jnp.sign(jnp.diagonal(r[..., i, :d_cols, :d_cols], axis1=-2, axis2=-1))
        x = q[..., i, :d_rows, :d_cols] * sign[..., None, :]
        weights.append(x.mT if n < m else x)
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
