"""Stage 1: masked language modelling (BERT-style corruption, masked-only loss).

Corruption (Devlin et al. 2019, section 3.1): each real, non-special token is
selected with probability `mask_rate`; a selected token becomes MASK with
probability 0.8, a random symbol with probability 0.1, and stays itself with
probability 0.1. All draws come from one key.

Loss: cross-entropy at selected positions only, averaged over the number of
selected positions in the batch. Padding and unselected positions contribute
nothing, to the loss or to the gradient.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from training_methods.data import MASK, NUM_SPECIAL


class Corrupted(NamedTuple):
    inputs: jax.Array  # int32 (B, T): tokens after corruption
    labels: jax.Array  # int32 (B, T): the original tokens
    loss_mask: jax.Array  # bool (B, T): the selected positions


def check_mask(mask: jax.Array, like: jax.Array, name: str = "mask") -> None:
    """Refuses a mask that is not bool or not of shape `like.shape` (no broadcasting)
    [claim:mask-bool-and-same-shape]."""
    if mask.dtype != jnp.bool_:
        raise ValueError(f"`{name}` must be bool, but its dtype is `{mask.dtype}`.")
    if mask.shape != like.shape:
        raise ValueError(
            f"`{name}` has shape `{tuple(mask.shape)}` but the labels have shape "
            f"`{tuple(like.shape)}`; a mask is never broadcast."
        )


@jax.jit(static_argnums=3)
def corrupt(key: jax.Array, tokens: jax.Array, mask_rate: float, num_symbols: int) -> Corrupted:
    """BERT corruption of int32 `tokens` `(B, T)`; special tokens are never selected.

    Real symbols are the ids `NUM_SPECIAL .. NUM_SPECIAL + num_symbols - 1`; ids below
    `NUM_SPECIAL` (PAD, BOS, SEP, EOS, MASK) are special. Each real token is selected
    with probability `mask_rate` [claim:mlm-selects-real-symbols-at-rate]; a selected
    one becomes `MASK` with probability 0.8, a random real symbol with probability 0.1,
    and stays itself otherwise [claim:mlm-split-80-10-10]; the random symbol is uniform
    over those ids [claim:mlm-random-symbol-uniform]. Returns the corrupted inputs
    (int32), the original tokens as labels and the selection as a bool `loss_mask`
    [claim:mlm-corrupt-returns-labels-and-mask].

    One key per draw (`k_select`, `k_kind`, `k_random`): the tests run with
    `jax_debug_key_reuse`, so a key used for two draws is an error
    [claim:mlm-one-key-per-draw].
    """
    k_select, k_kind, k_random = jax.random.split(key, 3)
    # --- exercise stage 1: Real symbols at mask_rate; 80% MASK, 10% random; keys never reused. ---
    candidate = tokens >= NUM_SPECIAL
    selected = candidate & jax.random.bernoulli(k_select, mask_rate, tokens.shape)
    u = jax.random.uniform(k_kind, tokens.shape)
    random_tokens = jax.random.randint(
        k_random, tokens.shape, NUM_SPECIAL, NUM_SPECIAL + num_symbols
    )
    inputs = jnp.where(selected & (u < 0.8), MASK, tokens)
    inputs = jnp.where(selected & (u >= 0.8) & (u < 0.9), random_tokens, inputs)
    # --- end exercise ---
    return Corrupted(inputs.astype(jnp.int32), tokens, selected)


def mlm_loss(logits: jax.Array, labels: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Mean cross-entropy over the positions where `loss_mask` is True.

    `logits` `(B, T, V)`, `labels` int32 `(B, T)`, `loss_mask` bool `(B, T)`
    [claim:mask-bool-and-same-shape].
    Denominator: the number of selected positions in the batch (at least 1)
    [claim:mlm-loss-mean-over-selected].
    Under the tests' strict dtype promotion a float never mixes with an int or a
    bool: `ce * mask` and `sum / count` are errors; mask with `jnp.where` and
    cast the count to the loss dtype [claim:mlm-loss-strict-dtypes].
    """
    check_mask(loss_mask, labels, "loss_mask")
    # --- exercise stage 1: Mean CE over selected positions only (strict dtypes: cast count). ---
    per_token = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    per_token = jnp.where(loss_mask, per_token, 0.0)
    return jnp.sum(per_token) / jnp.maximum(jnp.sum(loss_mask), 1).astype(per_token.dtype)
    # --- end exercise ---


def masked_accuracy(logits: jax.Array, labels: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Fraction of selected positions whose argmax is the original token."""
    hit = (jnp.argmax(logits, -1) == labels) & loss_mask
    return jnp.sum(hit) / jnp.maximum(jnp.sum(loss_mask), 1)


@functools.lru_cache(maxsize=16)
def make_loss_fn(mask_rate: float, num_symbols: int):
    """The masked-LM objective of one batch: corrupt with `key`, encode
    bidirectionally, score the selected positions."""

    def loss_fn(model, batch, key):
        c = corrupt(key, batch["tokens"], mask_rate, num_symbols)
        logits = model(c.inputs, causal=False)
        return mlm_loss(logits, c.labels, c.loss_mask), masked_accuracy(
            logits, c.labels, c.loss_mask
        )

    return loss_fn
