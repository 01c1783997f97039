"""Stage 1: masked language modelling.

Independent checks: the masked loss equals a per-position float64 NumPy
enumeration over the selected positions; a label changed at an unselected
or padded position changes neither the loss nor the gradient (bitwise);
the corruption's 80/10/10 split matches its probabilities within 5 binomial
standard deviations. Changed condition: another mask rate and padding pattern.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from training_methods import mlm
from training_methods.data import NUM_SPECIAL, PAD
from training_methods.model import build

CONDITIONS = [(0.15, "ragged"), (0.4, "half-padded")]


def _tokens(corpus, pattern: str) -> np.ndarray:
    tokens = corpus.tokens[:32].copy()
    if pattern == "half-padded":
        # Cut every other example short: a different padding pattern.
        for row in range(0, 32, 2):
            n = 3 + row % 4
            tokens[row, n:] = PAD
    return tokens


@pytest.fixture(scope="module")
def encoder(config):
    return build(config, key=jax.random.key(7))


@nnx.jit
def _encode(model, inputs):
    return model(inputs, causal=False)


@pytest.fixture(scope="module")
def loss_and_grad():
    @nnx.jit
    def f(model, inputs, labels, mask):
        def loss(m):
            return mlm.mlm_loss(m(inputs, causal=False), labels, mask)

        return nnx.value_and_grad(loss)(model)

    return f


def _enumerated_loss(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    total, count = 0.0, 0
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            if mask[b, t]:
                z = logits[b, t].astype(np.float64)
                m = z.max()
                total += m + np.log(np.sum(np.exp(z - m))) - z[labels[b, t]]
                count += 1
    return total / max(count, 1)


@pytest.mark.parametrize("rate,pattern", CONDITIONS)
def test_loss_equals_float64_enumeration(config, corpus, encoder, evidence, rate, pattern):
    tokens = jnp.asarray(_tokens(corpus, pattern))
    c = mlm.corrupt(jax.random.key(1), tokens, rate, config.num_symbols)
    logits = _encode(encoder, c.inputs)
    loss = float(mlm.mlm_loss(logits, c.labels, c.loss_mask))
    reference = _enumerated_loss(np.asarray(logits), np.asarray(c.labels), np.asarray(c.loss_mask))
    assert evidence.allclose(
        "masked loss vs float64 per-position enumeration",
        f"mask_rate={rate}, {pattern}",
        loss,
        reference,
        rtol=1e-5,
        atol=1e-6,
    )
    # Padding and special tokens are never selected.
    selected = np.asarray(c.loss_mask)
    assert not np.any(selected & (np.asarray(tokens) < NUM_SPECIAL))


@pytest.mark.parametrize("rate,pattern", CONDITIONS)
def test_labels_outside_the_mask_change_neither_loss_nor_gradient(
    config, corpus, encoder, loss_and_grad, evidence, rate, pattern
):
    tokens = jnp.asarray(_tokens(corpus, pattern))
    c = mlm.corrupt(jax.random.key(2), tokens, rate, config.num_symbols)
    mask = np.asarray(c.loss_mask)
    labels = np.asarray(c.labels).copy()
    unselected_real = np.argwhere(~mask & (labels >= NUM_SPECIAL))
    padded = np.argwhere(np.asarray(tokens) == PAD)
    assert len(unselected_real) and len(padded)
    changed = labels.copy()
    for b, t in [*unselected_real[:5], *padded[:5]]:
        changed[b, t] = NUM_SPECIAL + (labels[b, t] + 1) % config.num_symbols
    loss_a, grad_a = loss_and_grad(encoder, c.inputs, jnp.asarray(labels), c.loss_mask)
    loss_b, grad_b = loss_and_grad(encoder, c.inputs, jnp.asarray(changed), c.loss_mask)
    same_grad = all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(grad_a), jax.tree.leaves(grad_b), strict=True)
    )
    # The check can fail: changing a SELECTED label does change the loss.
    sel = np.argwhere(mask)[0]
    moved = labels.copy()
    moved[sel[0], sel[1]] = NUM_SPECIAL + (labels[sel[0], sel[1]] + 1) % config.num_symbols
    loss_c, _ = loss_and_grad(encoder, c.inputs, jnp.asarray(moved), c.loss_mask)
    passed = float(loss_a) == float(loss_b) and same_grad and float(loss_c) != float(loss_a)
    assert evidence.record(
        "labels at unselected and padded positions are ignored",
        f"mask_rate={rate}, {pattern}",
        {
            "loss": float(loss_a),
            "loss_changed_unselected": float(loss_b),
            "gradients_bitwise_equal": same_grad,
            "loss_changed_selected": float(loss_c),
        },
        {"exact": True},
        passed,
    )


@pytest.mark.parametrize("rate", [0.15, 0.4])
def test_corruption_split_matches_its_probabilities(config, corpus, evidence, rate):
    tokens = jnp.asarray(corpus.tokens[:2048])
    c = mlm.corrupt(jax.random.key(3), tokens, rate, config.num_symbols)
    again = mlm.corrupt(jax.random.key(3), tokens, rate, config.num_symbols)
    assert np.array_equal(c.inputs, again.inputs), "same key, same corruption"
    real = np.asarray(tokens) >= NUM_SPECIAL
    sel = np.asarray(c.loss_mask)
    inputs = np.asarray(c.inputs)
    n_real, n_sel = int(real.sum()), int(sel.sum())
    s = config.num_symbols
    # A random replacement equals the original with probability 1/s.
    observed = {
        "selected": n_sel / n_real,
        "mask": float(np.mean(inputs[sel] == 4)),
        "changed_to_random": float(
            np.mean((inputs[sel] != 4) & (inputs[sel] != np.asarray(tokens)[sel]))
        ),
        "unchanged": float(np.mean(inputs[sel] == np.asarray(tokens)[sel])),
    }
    expected = {
        "selected": rate,
        "mask": 0.8,
        "changed_to_random": 0.1 * (s - 1) / s,
        "unchanged": 0.1 + 0.1 / s,
    }
    counts = {"selected": n_real, "mask": n_sel, "changed_to_random": n_sel, "unchanged": n_sel}
    ok = all(
        abs(observed[k] - p) <= 5 * np.sqrt(p * (1 - p) / counts[k]) for k, p in expected.items()
    )
    untouched = np.array_equal(inputs[~sel], np.asarray(tokens)[~sel])
    assert evidence.record(
        "corruption split vs its probabilities (5 binomial sigma)",
        f"mask_rate={rate}",
        {"observed": observed, "expected": expected, "unselected_untouched": untouched},
        {"sigma": 5},
        ok and untouched,
    )


def test_bad_masks_are_refused_by_name(config, corpus):
    tokens = jnp.asarray(corpus.tokens[:4])
    logits = jnp.zeros((4, tokens.shape[1], 8))
    with pytest.raises(ValueError, match=r"`loss_mask` must be bool, but its dtype is `float32`"):
        mlm.mlm_loss(logits, tokens, jnp.ones(tokens.shape, jnp.float32))
    with pytest.raises(ValueError, match=r"`loss_mask` has shape `\(4, 1\)`.*never broadcast"):
        mlm.mlm_loss(logits, tokens, jnp.ones((4, 1), bool))
