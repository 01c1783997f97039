"""Stage 2: the symmetric InfoNCE objective.

Independent check: an explicit Python loop over all N x N pairs in float64
(log-sum-exp with the maximum subtracted). Changed conditions: random
embeddings and Transformer-encoded views; temperatures from 1 down to 1e-4
(logits up to 1e4, where the unshifted exponential overflows). False
negatives: duplicated positives are found, and agree with a brute-force
comparison of every pair.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from training_methods import contrastive
from training_methods.model import build


def _loop_reference(a: np.ndarray, b: np.ndarray, temperature: float) -> float:
    a = a.astype(np.float64) / np.linalg.norm(a.astype(np.float64), axis=1, keepdims=True)
    b = b.astype(np.float64) / np.linalg.norm(b.astype(np.float64), axis=1, keepdims=True)
    n = len(a)
    s = [[float(np.dot(a[i], b[j])) / temperature for j in range(n)] for i in range(n)]
    total = 0.0
    for i in range(n):
        row = [s[i][j] for j in range(n)]
        col = [s[j][i] for j in range(n)]
        for values in (row, col):
            m = max(values)
            total += m + math.log(sum(math.exp(v - m) for v in values)) - s[i][i]
    return total / (2 * n)


@nnx.jit
def _views(model, tokens, prompt_len):
    p, r = contrastive.views(tokens, prompt_len)
    return contrastive.encode(model, p), contrastive.encode(model, r)


@pytest.mark.claims("false-negative-pairs")
@pytest.mark.parametrize("num_dupes", [1, 3])
def test_duplicated_positives_are_reported(config, corpus, evidence, num_dupes):
    """Duplicated positives found equal a brute-force search of every pair, for 1 and 3 copies."""
    tokens = corpus.tokens[:32].copy()
    rng_key = jax.random.key(13 + num_dupes)
    picks = np.asarray(jax.random.choice(rng_key, 32, (2 * num_dupes,), replace=False))
    # All planted copies share one source: a group of num_dupes + 1 equal rows.
    for dst in picks[num_dupes:]:
        tokens[dst] = tokens[picks[0]]
    found = contrastive.false_negatives(tokens)
    brute = [
        (i, j) for i in range(32) for j in range(i + 1, 32) if np.array_equal(tokens[i], tokens[j])
    ]
    assert evidence.record(
        "false negatives vs brute-force comparison of every pair",
        f"{num_dupes} copies of one positive",
        {"found": found, "brute_force": brute},
        {"exact": True},
        sorted(found) == brute and len(brute) >= num_dupes,
    )


def test_mismatched_embeddings_are_refused():
    """Embeddings of different shapes and a zero temperature are refused, naming the values."""
    with pytest.raises(ValueError, match=r"`\(4, 8\)` and `\(3, 8\)`"):
        contrastive.info_nce(jnp.ones((4, 8)), jnp.ones((3, 8)), 0.1)
    with pytest.raises(ValueError, match=r"`temperature` must be positive, got `0.0`"):
        contrastive.info_nce(jnp.ones((4, 8)), jnp.ones((4, 8)), 0.0)


@pytest.mark.claims("info-nce-symmetric", "info-nce-no-rank-promotion")
@pytest.mark.parametrize(
    "source,temperature", [("random", 0.1), ("random", 1.0), ("encoder", 0.05)]
)
def test_info_nce_equals_the_pair_loop(
    config, corpus, evidence, log_softmax_excess, source, temperature
):
    """Symmetric InfoNCE equals a float64 loop over all N x N pairs, for random and encoded inputs.

    Temperatures 0.1 and 1 (random) and 0.05 (Transformer-encoded prompt and response views).
    """
    if source == "random":
        ka, kb = jax.random.split(jax.random.key(11))
        a, b = jax.random.normal(ka, (24, 16)), jax.random.normal(kb, (24, 16))
    else:
        model = build(config, key=jax.random.key(5))
        a, b = _views(model, jnp.asarray(corpus.tokens[:24]), jnp.asarray(corpus.prompt_len[:24]))
    loss = float(contrastive.info_nce(a, b, temperature))
    reference = _loop_reference(np.asarray(a), np.asarray(b), temperature)
    assert evidence.allclose(
        "symmetric InfoNCE vs float64 loop over all pairs",
        f"{source} embeddings, T={temperature}",
        loss,
        reference,
        # float32 log-softmax: the rtol scales with the backend's excess (conftest).
        rtol=2e-5 * log_softmax_excess,
        atol=1e-6,
    )


@nnx.jit
def _encode_and_states(model, tokens):
    return (
        contrastive.encode(model, tokens),
        model.hidden(tokens, causal=False),
        model.hidden(tokens, causal=True),
    )


@pytest.mark.parametrize("view", ["prompt", "response"])
def test_encode_pools_bidirectional_states(config, corpus, evidence, view):
    """encode is the mean over real tokens of the encoder's (non-causal) hidden states.

    The rule: "Mean-pooled bidirectional hidden states over real tokens: `(N, D)`".
    Independent reference: the model's documented encoder call `hidden(tokens,
    causal=False)`, pooled here in float64 NumPy over the non-PAD positions. The check
    can fail: those states differ from the causal ones (the first real token sees the
    later ones), and the bidirectional pool differs from the causal pool by far more than
    the tolerance. Changed condition: prompt views `BOS p SEP`, then response views `r EOS`.
    """
    model = build(config, key=jax.random.key(7))
    prompt, response = contrastive.views(
        jnp.asarray(corpus.tokens[:16]), jnp.asarray(corpus.prompt_len[:16])
    )
    tokens = prompt if view == "prompt" else response
    encoded, bidir, causal = map(np.asarray, _encode_and_states(model, tokens))
    real = (np.asarray(tokens) != 0)[..., None].astype(np.float64)

    def pool(states):
        return np.sum(states.astype(np.float64) * real, axis=1) / np.sum(real, axis=1)

    reference, causal_pool = pool(bidir), pool(causal)
    # Bidirectional: the first position already depends on the later tokens.
    first_differs = float(np.max(np.abs(bidir[:, 0] - causal[:, 0])))
    pools_differ = float(np.max(np.abs(reference - causal_pool)))
    assert first_differs > 1e-2 and pools_differ > 1e-2, (first_differs, pools_differ)
    assert evidence.allclose(
        "encode vs float64 mean-pool of hidden(causal=False) over real tokens",
        f"{view} views of 16 examples (causal pool differs by {pools_differ:.3g})",
        encoded,
        reference,
        rtol=1e-5,
        atol=1e-5,
    )


_loss_and_grads = jax.jit(
    jax.value_and_grad(contrastive.info_nce, argnums=(0, 1)), static_argnums=2
)


@pytest.mark.claims("info-nce-symmetric")
@pytest.mark.parametrize("temperature", [1e-3, 1e-4])
def test_low_temperature_stays_finite_and_exact(evidence, temperature):
    """At temperatures 1e-3 and 1e-4 the loss and gradients stay finite and equal the float64 loop.

    The same logits overflow an unshifted log-sum-exp in float32, so the check can fail;
    the tolerance is the rounding of float32 logits of magnitude 1/T.
    """
    ka, kb = jax.random.split(jax.random.key(12))
    a = jax.random.normal(ka, (16, 8))
    b = a + 0.3 * jax.random.normal(kb, (16, 8))  # near-matching pairs: large logits
    loss, grads = _loss_and_grads(a, b, temperature)
    finite = bool(np.isfinite(float(loss))) and all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    reference = _loop_reference(np.asarray(a), np.asarray(b), temperature)
    # The naive form (exp without the maximum subtracted) overflows float32 here.
    an = a / jnp.linalg.norm(a, axis=1, keepdims=True)
    bn = b / jnp.linalg.norm(b, axis=1, keepdims=True)
    naive = jnp.log(jnp.sum(jnp.exp((an @ bn.T) / temperature), axis=1))
    # float32 logits of magnitude 1/T carry an absolute rounding of ~eps/T.
    atol = 64 * float(np.finfo(np.float32).eps) / temperature
    close = abs(float(loss) - reference) <= atol + 1e-5 * abs(reference)
    assert evidence.record(
        "InfoNCE at low temperature: finite, equal to the float64 loop",
        f"T={temperature}",
        {
            "loss": float(loss),
            "reference": reference,
            "max_logit": 1 / temperature,
            "naive_logsumexp_finite": bool(jnp.all(jnp.isfinite(naive))),
            "finite": finite,
        },
        {"atol": atol},
        finite and close and not bool(jnp.all(jnp.isfinite(naive))),
    )
