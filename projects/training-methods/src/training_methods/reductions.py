"""Stage 6: objective reductions on ragged batches, and gradient accumulation.

Per-token mean: `sum_i sum_t l_it m_it / sum_i sum_t m_it` (every counted
token weighs the same). Per-sequence mean: `(1/S) sum_i [sum_t l_it m_it /
sum_t m_it]` over the `S` sequences with at least one counted token (every
sequence weighs the same). On a ragged batch they differ.

Gradient accumulation over micro-batches `k` reproduces the full-batch
per-token-mean gradient only when each micro-batch contributes its loss SUM
and the total is divided by the GLOBAL count of counted tokens:

    g = sum_k grad(sum_{i,t in k} l m) / sum_k count_k

The mean of per-micro-batch means, `(1/K) sum_k grad(mean_k)`, weighs a
token of a sparse micro-batch more than one of a dense micro-batch; it is
the gradient-accumulation normalization bug that several training libraries
shipped and fixed in 2024. Across devices the global count is a `psum`.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from training_methods.mlm import check_mask


def per_token_mean(losses: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean over every counted token of the batch (`mask` bool, `losses`' shape)
    [claim:per-token-mean].

    Strict dtype promotion in the tests: cast the int count to `losses.dtype`
    [claim:per-token-mean-strict-dtypes].
    """
    check_mask(mask, losses)
    # --- exercise stage 6: Sum of counted losses over the counted-token count (strict dtypes). ---
    return jnp.sum(jnp.where(mask, losses, 0.0)) / jnp.maximum(jnp.sum(mask), 1).astype(
        losses.dtype
    )
    # --- end exercise ---


def per_sequence_mean(losses: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean over sequences (with a counted token) of each sequence's token mean
    [claim:per-sequence-mean].

    Strict dtype promotion in the tests: cast both int counts to `losses.dtype`
    [claim:per-sequence-mean-strict-dtypes].
    """
    check_mask(mask, losses)
    # --- exercise stage 6: Mean per sequence, then over non-empty sequences (strict dtypes). ---
    count = jnp.sum(mask, axis=1)
    seq = jnp.sum(jnp.where(mask, losses, 0.0), axis=1) / jnp.maximum(count, 1).astype(losses.dtype)
    has = count > 0
    return jnp.sum(jnp.where(has, seq, 0.0)) / jnp.maximum(jnp.sum(has), 1).astype(losses.dtype)
    # --- end exercise ---


def sum_and_count(token_loss_fn: Callable, params, batch):
    """Gradient of the micro-batch loss SUM, and its counted-token count."""

    def summed(p):
        losses, mask = token_loss_fn(p, batch)
        return jnp.sum(jnp.where(mask, losses, 0.0)), jnp.sum(mask)

    grads, count = jax.grad(summed, has_aux=True)(params)
    return grads, count


def accumulate_global(token_loss_fn: Callable, params, micro_batches: list) -> tuple:
    """Accumulated gradient normalized by the global count
    [claim:accumulate-by-the-global-count]; also returns the count
    [claim:accumulate-returns-the-count].

    The count is an int array: cast it to each gradient's dtype before dividing
    (the tests' strict dtype promotion) [claim:accumulate-strict-dtypes].
    """
    step = jax.jit(lambda p, b: sum_and_count(token_loss_fn, p, b))
    # --- exercise stage 6: Add micro-batch grad sums and counts, then divide (strict dtypes). ---
    total, count = None, 0
    for batch in micro_batches:
        g, n = step(params, batch)
        total = g if total is None else jax.tree.map(jnp.add, total, g)
        count = count + n
    grads = jax.tree.map(lambda x: x / jnp.maximum(count, 1).astype(x.dtype), total)
    # --- end exercise ---
    return grads, count


def accumulate_mean_of_means(token_loss_fn: Callable, params, micro_batches: list):
    """The normalization bug, kept for comparison: mean over micro-batches of each
    micro-batch's per-token-mean gradient."""
    step = jax.jit(lambda p, b: sum_and_count(token_loss_fn, p, b))
    grads = []
    for batch in micro_batches:
        g, n = step(params, batch)
        grads.append(jax.tree.map(lambda x, n=n: x / jnp.maximum(n, 1).astype(x.dtype), g))
    return jax.tree.map(lambda *xs: sum(xs) / len(xs), *grads)


def full_batch_grad(token_loss_fn: Callable, params, batch):
    """Gradient of the per-token mean over the whole batch at once."""

    def mean_loss(p):
        losses, mask = token_loss_fn(p, batch)
        return per_token_mean(losses, mask)

    return jax.jit(jax.grad(mean_loss))(params)


def sharded_grad(token_loss_fn: Callable, params, batch, mesh: Mesh):
    """Per-token-mean gradient with the batch split over the `data` axis of `mesh`:
    each device sums its shard; the gradient sum and the count are `psum`med. The
    summed count is an int array: cast it to each gradient's dtype before dividing
    (the tests' strict dtype promotion)."""

    def local(p, b):
        """This device's gradient sum and count, each `psum`med over `data`; the summed
        gradient divided by the summed count [claim:sharded-grad-psum-global-count]."""
        # Mark the replicated parameters as device-varying, so that `grad` gives
        # this device's own gradient; left invariant, JAX's transpose would
        # already sum the gradient over devices and the psum below would double it.
        p = jax.tree.map(lambda x: jax.lax.pcast(x, "data", to="varying"), p)
        g, n = sum_and_count(token_loss_fn, p, b)
        # --- exercise stage 6: psum grad sums and counts, then divide (strict dtypes). ---
        g = jax.lax.psum(g, "data")
        n = jax.lax.psum(n, "data")
        return jax.tree.map(lambda x: x / jnp.maximum(n, 1).astype(x.dtype), g), n
        # --- end exercise ---

    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P(), P()))
    return jax.jit(fn)(params, batch)


def max_abs_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def max_abs(a) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64)))) for x in jax.tree.leaves(a))
