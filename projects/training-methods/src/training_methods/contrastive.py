"""Stage 2: a symmetric InfoNCE (CLIP-style) objective, and false negatives.

For a batch of `N` pairs `(a_i, b_i)` with L2-normalised embeddings, the
logits are `s_ij = <a_i, b_j> / temperature`; the loss is the mean of the
cross-entropy of each row (a_i must pick b_i among all b) and of each column
(b_j must pick a_j among all a) (Radford et al. 2021, figure 3):

    L = (1 / 2N) * sum_i [ -log softmax_j(s_ij)[i] - log softmax_j(s_ji)[i] ]

`log_softmax` subtracts the row maximum, so logits of 1e4 (temperature 1e-4)
stay finite. Two pairs with the same content inside one batch are false
negatives: each is counted as a negative of the other although it matches;
`false_negatives` finds them from the content the embeddings came from.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def info_nce(a: jax.Array, b: jax.Array, temperature: float) -> jax.Array:
    """Symmetric InfoNCE of embeddings `a`, `b` `(N, D)` (normalised here)
    [claim:info-nce-symmetric].

    The tests raise on implicit rank promotion: divide `(N, D)` by norms taken
    with `keepdims=True` `(N, 1)`, never by `(N,)` [claim:info-nce-no-rank-promotion].
    """
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"`a` and `b` must both be `(N, D)`, got `{a.shape}` and `{b.shape}`.")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be positive, got `{temperature}`.")
    # --- exercise stage 2: Cosine logits / temperature (strict ranks); mean of row, column CE. ---
    a = a / jnp.linalg.norm(a, axis=-1, keepdims=True)
    b = b / jnp.linalg.norm(b, axis=-1, keepdims=True)
    logits = (a @ b.T) / jnp.asarray(temperature, a.dtype)
    rows = -jnp.diagonal(jax.nn.log_softmax(logits, axis=1))
    cols = -jnp.diagonal(jax.nn.log_softmax(logits, axis=0))
    return (jnp.mean(rows) + jnp.mean(cols)) / 2
    # --- end exercise ---


def false_negatives(content: np.ndarray) -> list[tuple[int, int]]:
    """Pairs `(i, j)`, `i < j`, whose positives have identical content
    [claim:false-negative-pairs].

    `content`: `(N, ...)` the data each pair's positive was computed from
    (e.g. token rows). Such a pair puts a true match among the negatives.
    """
    content = np.asarray(content).reshape(len(content), -1)
    # --- exercise stage 2: Return every pair (i, j), i < j, of rows with equal content. ---
    groups: dict[bytes, list[int]] = {}
    for i, row in enumerate(content):
        groups.setdefault(row.tobytes(), []).append(i)
    return [
        (g[x], g[y]) for g in groups.values() for x in range(len(g)) for y in range(x + 1, len(g))
    ]
    # --- end exercise ---


def encode(model: nnx.Module, tokens: jax.Array) -> jax.Array:
    """Mean-pooled bidirectional hidden states over real tokens: `(N, D)`."""
    hidden = model.hidden(tokens, causal=False)
    valid = (tokens != 0)[..., None].astype(hidden.dtype)
    return jnp.sum(hidden * valid, axis=1) / jnp.maximum(jnp.sum(valid, axis=1), 1.0)


def views(tokens: jax.Array, prompt_len: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The two views of an example: its prompt `BOS p SEP` and its response `r EOS`
    (left-aligned, zero-padded), each `(N, T)`."""
    t = jnp.arange(tokens.shape[1])[None, :]
    length = prompt_len[:, None]
    prompt = jnp.where(t <= length + 1, tokens, 0)
    shifted = jnp.take_along_axis(tokens, jnp.clip(t + length + 2, 0, tokens.shape[1] - 1), axis=1)
    response = jnp.where(t <= length, shifted, 0)
    return prompt, response


@functools.lru_cache(maxsize=16)
def make_loss_fn(temperature: float):
    def loss_fn(model, batch, key):
        del key
        prompt, response = views(batch["tokens"], batch["prompt_len"])
        return info_nce(encode(model, prompt), encode(model, response), temperature), None

    return loss_fn


def retrieval_accuracy(model, tokens, prompt_len) -> float:
    """Fraction of prompts whose nearest response (cosine) is their own."""
    prompt, response = views(jnp.asarray(tokens), jnp.asarray(prompt_len))
    a, b = encode(model, prompt), encode(model, response)
    sim = (a / jnp.linalg.norm(a, axis=-1, keepdims=True)) @ (
        b / jnp.linalg.norm(b, axis=-1, keepdims=True)
    ).T
    return float(jnp.mean(jnp.argmax(sim, axis=1) == jnp.arange(len(tokens))))
