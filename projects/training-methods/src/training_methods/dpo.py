"""Stage 5: direct preference optimization (Rafailov et al. 2023).

For a prompt `x` with a chosen response `y_w` and a rejected one `y_l`:

    L = -log sigmoid( beta * [ (log pi(y_w|x) - log ref(y_w|x))
                             - (log pi(y_l|x) - log ref(y_l|x)) ] )

averaged over the pairs of the batch (the denominator is the number of
pairs). `log pi(y|x)` is a SEQUENCE log-probability: the sum of the token
log-probabilities over the response tokens and EOS only, never the prompt
or padding (the sigmoid loss of TRL's `DPOTrainer` sums the same way).
`-log sigmoid(z)` is computed as `softplus(-z)` by `jax.nn.log_sigmoid`,
finite for any margin. The reference model is frozen: its log-probabilities
pass through `stop_gradient` and its parameters are not in the trainable state.

Implicit rewards: `beta * (log pi(y|x) - log ref(y|x))`; a pair is ranked
right when the chosen reward exceeds the rejected one (a tie counts 1/2).

Length-normalized variant (`normalize=True`): each sequence log-probability
is divided by its number of response tokens (as in IPO and SimPO). Then a
longer response no longer accumulates more log-probability, the effective
beta per token grows by the length, and two responses that differ only in
length are compared per token.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from training_methods.sft import response_mask


class Pairs(NamedTuple):
    chosen: np.ndarray  # int32 (B, T)
    rejected: np.ndarray  # int32 (B, T)
    prompt_len: np.ndarray  # int32 (B,)


def check_pairs(pairs: Pairs) -> None:
    """Refuses pairs whose chosen and rejected prompts differ (named by index)."""
    for i, (c, r, n) in enumerate(zip(pairs.chosen, pairs.rejected, pairs.prompt_len, strict=True)):
        if not np.array_equal(c[: n + 2], r[: n + 2]):
            raise ValueError(
                f"Preference pair `{i}` has different prompts: chosen `{c[: n + 2].tolist()}`, "
                f"rejected `{r[: n + 2].tolist()}`; both responses must answer the same prompt."
            )


def make_pairs(
    tokens: np.ndarray, prompt_len: np.ndarray, num_symbols: int, key: jax.Array
) -> Pairs:
    """Chosen: the correct response. Rejected: the same response with one symbol
    changed to another symbol, at a position drawn from `key`.

    Refuses (`ValueError`) tokens outside the vocabulary of `num_symbols`,
    and prompt lengths that do not fit the rows."""
    from training_methods.data import NUM_SPECIAL, check_token_ids

    tokens, prompt_len = np.asarray(tokens), np.asarray(prompt_len)
    if tokens.ndim != 2 or prompt_len.shape != tokens.shape[:1]:
        raise ValueError(
            f"`tokens` must be `(N, T)` and `prompt_len` `(N,)`, got `{tokens.shape}` and "
            f"`prompt_len` `{prompt_len.shape}`."
        )
    check_token_ids(tokens, NUM_SPECIAL + num_symbols, "tokens")
    longest = (tokens.shape[1] - 3) // 2
    if np.any((prompt_len < 1) | (prompt_len > longest)):
        bad = int(prompt_len[(prompt_len < 1) | (prompt_len > longest)][0])
        raise ValueError(f"`prompt_len` `{bad}` is outside 1 to {longest} for rows of this width.")

    k_pos, k_sym = jax.random.split(key)
    n = len(tokens)
    pos = np.asarray(jax.random.randint(k_pos, (n,), 0, 1 << 30)) % prompt_len
    delta = 1 + np.asarray(jax.random.randint(k_sym, (n,), 0, num_symbols - 1))
    rejected = tokens.copy()
    rows = np.arange(n)
    cols = prompt_len + 2 + pos
    rejected[rows, cols] = (tokens[rows, cols] - NUM_SPECIAL + delta) % num_symbols + NUM_SPECIAL
    pairs = Pairs(tokens, rejected, prompt_len)
    check_pairs(pairs)
    return pairs


def pair_batch(batch: dict, step: int, num_symbols: int, key: jax.Array) -> dict:
    """A training batch of preference pairs (the `prepare` hook of `train.fit`)."""
    pairs = make_pairs(
        batch["tokens"], batch["prompt_len"], num_symbols, jax.random.fold_in(key, step)
    )
    return {
        "id": batch["id"],
        "chosen": pairs.chosen,
        "rejected": pairs.rejected,
        "prompt_len": pairs.prompt_len,
    }


def train_dpo(
    config, sft_model, corpus, train_ids, heldout_ids, *, key, ledger=None, progress=False
):
    """DPO from the SFT model: the policy starts as a copy, the reference is a
    frozen copy. Returns `(PolicyAndReference, history)`."""
    from training_methods.train import fit

    k_pairs, k_fit = jax.random.split(key)
    pair_model = PolicyAndReference(nnx.clone(sft_model), nnx.clone(sft_model))
    return fit(
        pair_model,
        make_loss_fn(config.dpo_beta),
        config,
        corpus,
        train_ids,
        heldout_ids,
        steps=config.dpo_steps,
        key=k_fit,
        objective="dpo",
        wrt=TRAINABLE,
        ledger=ledger,
        progress=progress,
        prepare=lambda b, step: pair_batch(b, step, config.num_symbols, k_pairs),
    )


def sequence_logps(
    model, tokens: jax.Array, prompt_len: jax.Array, normalize: bool = False
) -> jax.Array:
    """`(B,)` log-probability of each response (and EOS) given its prompt
    [claim:sequence-logps-sum-over-response].

    With `normalize`, each sum is divided by its response length
    [claim:sequence-logps-normalized], an int count cast to the log-probabilities'
    dtype (the tests' strict dtype promotion) [claim:sequence-logps-strict-dtypes].
    """
    logits = model(tokens[:, :-1])
    targets = tokens[:, 1:]
    mask = response_mask(targets, prompt_len)
    # --- exercise stage 5: Sum response target log-probs (mean if normalize; strict dtypes). ---
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], axis=-1)[..., 0]
    total = jnp.sum(jnp.where(mask, logp, 0.0), axis=1)
    if normalize:
        total = total / jnp.sum(mask, axis=1).astype(total.dtype)
    return total
    # --- end exercise ---


class DPOOut(NamedTuple):
    loss: jax.Array  # shape=(), mean over pairs
    chosen_reward: jax.Array  # (B,)
    rejected_reward: jax.Array  # (B,)


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float) -> DPOOut:
    """DPO from sequence log-probabilities `(B,)`: rewards `beta * (policy - reference)`,
    loss the mean over pairs of `-log_sigmoid(chosen_reward - rejected_reward)`
    [claim:dpo-rewards-and-loss]; the reference gets no gradient
    [claim:dpo-reference-no-gradient]."""
    ref_chosen = jax.lax.stop_gradient(ref_chosen)
    ref_rejected = jax.lax.stop_gradient(ref_rejected)
    # --- exercise stage 5: Rewards beta * (policy - ref); mean of -log_sigmoid of their gap. ---
    chosen_reward = beta * (policy_chosen - ref_chosen)
    rejected_reward = beta * (policy_rejected - ref_rejected)
    loss = -jnp.mean(jax.nn.log_sigmoid(chosen_reward - rejected_reward))
    # --- end exercise ---
    return DPOOut(loss, chosen_reward, rejected_reward)


class PolicyAndReference(nnx.Module):
    """The trained policy and its frozen reference, one graph for `nnx.split`."""

    def __init__(self, policy: nnx.Module, reference: nnx.Module):
        self.policy = policy
        self.reference = reference


# Only the policy's parameters are trainable; the reference is frozen state.
TRAINABLE = nnx.All(nnx.Param, nnx.PathContains("policy"))


@functools.lru_cache(maxsize=16)
def make_loss_fn(beta: float, normalize: bool = False):
    def loss_fn(pair_model: PolicyAndReference, batch, key):
        del key
        n = batch["prompt_len"]
        both = jnp.concatenate([batch["chosen"], batch["rejected"]])
        lens = jnp.concatenate([n, n])
        pol = sequence_logps(pair_model.policy, both, lens, normalize)
        ref = sequence_logps(pair_model.reference, both, lens, normalize)
        b = n.shape[0]
        out = dpo_loss(pol[:b], pol[b:], ref[:b], ref[b:], beta)
        return out.loss, out

    return loss_fn


def preference_metrics(
    pair_model: PolicyAndReference, pairs: Pairs, beta: float
) -> dict[str, float]:
    """Preference accuracy (ties 1/2) and mean reward margin over `pairs`."""
    out = _metrics(pair_model, *(jnp.asarray(x) for x in pairs), beta)
    margin = np.asarray(out.chosen_reward - out.rejected_reward, np.float64)
    return {
        "preference_accuracy": float(np.mean((margin > 0) + 0.5 * (margin == 0))),
        "reward_margin": float(margin.mean()),
        "loss": float(out.loss),
    }


@nnx.jit(static_argnums=4)
def _metrics(pair_model, chosen, rejected, prompt_len, beta):
    loss_fn = make_loss_fn(beta)
    _, out = loss_fn(
        pair_model, {"chosen": chosen, "rejected": rejected, "prompt_len": prompt_len}, None
    )
    return out
