"""Stage 3: response-only supervised fine-tuning, and packed sequences.

Targets are `tokens[:, 1:]` (next-token prediction). A target counts when it
is a response token or the EOS that ends the response: never a prompt token,
the separator, or padding.

Reduction (stated): the loss is the mean over every counted target token of
the batch, `sum(ce * mask) / sum(mask)`; a long response weighs more than a
short one (per-token mean; stage 6 compares it with the per-sequence mean).

Packing: several examples share one row; `segment_ids` (1, 2, ..., 0 for
padding) keep attention inside each example and `positions` restart at 0 for
each example, so a packed example gets the logits it would get alone.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from training_methods.mlm import check_mask


def response_mask(targets: jax.Array, prompt_len: jax.Array) -> jax.Array:
    """bool `(B, T-1)`: True where target `t` (token `t+1`) is a response token or EOS
    [claim:sft-response-mask].

    With prompt length `L` the sequence is `BOS p_1..p_L SEP r_1..r_L EOS`: the
    response starts at token index `L + 2` and EOS sits at `2L + 2`.
    """
    pos = jnp.arange(targets.shape[1])[None, :]
    length = prompt_len[:, None]
    # --- exercise stage 3: Mark response-token and EOS targets; never prompt, SEP or padding. ---
    token_index = pos + 1
    return (token_index >= length + 2) & (token_index <= 2 * length + 2)
    # --- end exercise ---


def sft_loss(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-token mean cross-entropy over the counted targets of the batch
    [claim:sft-loss-mean-over-counted].

    Under the tests' strict dtype promotion the int count must be cast to the
    loss dtype, and a float is masked with `jnp.where`, not multiplied by a bool
    [claim:sft-loss-strict-dtypes].
    """
    check_mask(mask, targets)
    # --- exercise stage 3: Sum CE over counted targets; divide by their number (strict dtypes). ---
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    total = jnp.sum(jnp.where(mask, ce, 0.0))
    return total / jnp.maximum(jnp.sum(mask), 1).astype(total.dtype)
    # --- end exercise ---


def loss_fn(model, batch, key):
    """The SFT objective of one batch (`key` unused: no randomness)."""
    del key
    tokens = batch["tokens"]
    targets = tokens[:, 1:]
    mask = response_mask(targets, batch["prompt_len"])
    logits = model(tokens[:, :-1])
    return sft_loss(logits, targets, mask), None


def pack(tokens: np.ndarray, prompt_len: np.ndarray, length: int) -> dict[str, np.ndarray]:
    """Packs examples (rows of `tokens`, real part `2L + 3` tokens) greedily, in
    order, into rows of `length` [claim:pack-greedy-in-order]. Returns int32 arrays
    `(R, length)`: `tokens`, `segment_ids` (k for the k-th example of the row, 0 for
    padding) [claim:pack-segment-ids] and `positions` (0 at the start of every
    example) [claim:pack-positions-restart], plus `example` (the input row of each
    token, -1 for padding) [claim:pack-example-rows].
    """
    tokens, prompt_len = np.asarray(tokens), np.asarray(prompt_len)
    if tokens.ndim != 2:
        raise ValueError(f"`tokens` must be `(N, T)`, got shape `{tokens.shape}`.")
    if prompt_len.shape != tokens.shape[:1]:
        raise ValueError(
            f"`prompt_len` has shape `{prompt_len.shape}` but `tokens` has {len(tokens)} rows."
        )
    if length < 1:
        raise ValueError(f"The row `length` must be at least 1, got `{length}`.")
    rows: list[list[tuple[int, np.ndarray]]] = [[]]
    used = 0
    for i, (seq, n) in enumerate(zip(tokens, prompt_len, strict=True)):
        real = seq[: 2 * int(n) + 3]
        if len(real) > length:
            raise ValueError(
                f"Example {i} has {len(real)} tokens, more than the row `length` {length}."
            )
        if used + len(real) > length:
            rows.append([])
            used = 0
        rows[-1].append((i, real))
        used += len(real)
    out = {
        k: np.zeros((len(rows), length), np.int32) for k in ("tokens", "segment_ids", "positions")
    }
    out["example"] = np.full((len(rows), length), -1, np.int32)
    for r, row in enumerate(rows):
        start = 0
        for k, (i, real) in enumerate(row):
            span = slice(start, start + len(real))
            out["tokens"][r, span] = real
            out["example"][r, span] = i
            # --- exercise stage 3: Segment id k + 1 per example; positions restart at 0. ---
            out["segment_ids"][r, span] = k + 1
            out["positions"][r, span] = np.arange(len(real))
            # --- end exercise ---
            start += len(real)
    return out
