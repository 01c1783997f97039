"""Stage 3: response-only supervised fine-tuning, and packing.

Independent checks: the response mask equals one built from token types in
NumPy (a target counts iff it lies after SEP and is not padding); the loss
equals a float64 per-token enumeration; perturbed prompt labels leave the
loss and the gradient bitwise unchanged; in a packed row, changing one
example changes no logit of another, and each packed example gets the
logits it gets alone. Changed conditions: another length range, other row
lengths. The tiny SFT run learns the task and is bitwise reproducible.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from training_methods import sft
from training_methods.data import NUM_SPECIAL, PAD, SEP, generate
from training_methods.model import build
from training_methods.train import evaluate, fit


def _reference_mask(tokens: np.ndarray) -> np.ndarray:
    mask = np.zeros((tokens.shape[0], tokens.shape[1] - 1), bool)
    for b, row in enumerate(tokens):
        sep = int(np.flatnonzero(row == SEP)[0])
        for t in range(tokens.shape[1] - 1):
            mask[b, t] = (t + 1) > sep and row[t + 1] != PAD
    return mask


@pytest.fixture(scope="module")
def other_corpus(config):
    other = config.replace(min_len=1, max_len=4)
    return other, generate(other, np.arange(64))


@pytest.fixture(scope="module")
def grad_fn():
    @nnx.jit
    def f(model, tokens, targets, mask):
        def loss(m):
            return sft.sft_loss(m(tokens[:, :-1]), targets, mask)

        return nnx.value_and_grad(loss)(model)

    return f


def _reference_pack(tokens, prompt_len, length):
    """Greedy in-order packing written out in plain Python, one list per field."""
    rows, used = [[]], 0
    for i, (row, n) in enumerate(zip(tokens.tolist(), prompt_len.tolist(), strict=True)):
        real = row[: 2 * n + 3]
        if used + len(real) > length:
            rows.append([])
            used = 0
        rows[-1].append((i, real))
        used += len(real)
    fields = {k: [] for k in ("tokens", "segment_ids", "positions", "example")}
    for row in rows:
        line = {k: [] for k in fields}
        for k, (i, real) in enumerate(row):
            line["tokens"] += real
            line["segment_ids"] += [k + 1] * len(real)
            line["positions"] += list(range(len(real)))
            line["example"] += [i] * len(real)
        pad = length - len(line["tokens"])
        for k, fill in (("tokens", 0), ("segment_ids", 0), ("positions", 0), ("example", -1)):
            fields[k].append(line[k] + [fill] * pad)
    return fields


@pytest.mark.claims(
    "pack-greedy-in-order", "pack-segment-ids", "pack-positions-restart", "pack-example-rows"
)
@pytest.mark.parametrize("n,length", [(12, 13), (12, 32), (20, 48), (7, 100), (1, 13)])
def test_pack_fields_equal_a_plain_python_packing(config, corpus, n, length):
    """Every packed field equals a plain-Python greedy packing, for five counts and row lengths.

    Every example appears exactly once, with its own real tokens.
    """
    tokens, prompt_len = corpus.tokens[:n], corpus.prompt_len[:n]
    packed = sft.pack(tokens, prompt_len, length)
    reference = _reference_pack(tokens, prompt_len, length)
    for field in ("tokens", "segment_ids", "positions", "example"):
        got = packed[field]
        assert got.dtype == np.int32, field
        assert got.tolist() == reference[field], field
    # Every example appears exactly once, with its own real tokens.
    for i in range(n):
        span = packed["example"] == i
        assert packed["tokens"][span].tolist() == tokens[i, : 2 * prompt_len[i] + 3].tolist()


def test_pack_row_length_boundaries(corpus):
    """A row as long as the longest example holds it; one shorter, 0 or a 1-D input is refused."""
    tokens, prompt_len = corpus.tokens[:40], corpus.prompt_len[:40]
    longest = int(np.max(2 * prompt_len + 3))
    assert longest == tokens.shape[1]
    # A row exactly as long as the longest example holds it; one token less refuses it.
    packed = sft.pack(tokens, prompt_len, longest)
    assert packed["tokens"].shape[1] == longest
    with pytest.raises(ValueError, match=rf"has {longest} tokens, more than the row `length`"):
        sft.pack(tokens, prompt_len, longest - 1)
    with pytest.raises(ValueError, match=r"row `length` must be at least 1, got `0`"):
        sft.pack(tokens, prompt_len, 0)
    with pytest.raises(ValueError, match=r"`tokens` must be `\(N, T\)`"):
        sft.pack(tokens[0], prompt_len[:1], longest)


@pytest.mark.claims("sft-loss-mean-over-counted", "sft-loss-strict-dtypes")
@pytest.mark.parametrize("count", [0, 1, 2, 7, 30])
def test_sft_loss_at_every_mask_size(log_softmax_excess, count):
    """The SFT loss equals a float64 mean at 0, 1, 2, 7 and 30 counted targets (0 if none)."""
    # The denominator's boundaries: no counted target, exactly one, all of them.
    rng = np.random.default_rng(100 + count)
    logits = rng.normal(size=(5, 6, 11)).astype(np.float32)
    targets = rng.integers(0, 11, (5, 6)).astype(np.int32)
    mask = np.zeros(30, bool)
    mask[rng.permutation(30)[:count]] = True
    mask = mask.reshape(5, 6)
    loss = float(sft.sft_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask)))
    z = logits.astype(np.float64)
    m = z.max(-1)
    ce = (
        m
        + np.log(np.exp(z - m[..., None]).sum(-1))
        - np.take_along_axis(z, targets[..., None], -1)[..., 0]
    )
    expected = float(ce[mask].sum() / count) if count else 0.0
    # float32 log-softmax: the rtol scales with the backend's excess (conftest).
    np.testing.assert_allclose(loss, expected, rtol=1e-6 * log_softmax_excess, atol=1e-7)


@pytest.mark.claims("sft-response-mask")
@pytest.mark.parametrize("which", ["tiny", "lengths 1-4"])
def test_response_mask_matches_token_types(corpus, other_corpus, evidence, which):
    """The response mask equals one built from token types (after SEP, not padding), two ranges."""
    data = corpus if which == "tiny" else other_corpus[1]
    tokens = data.tokens[:64]
    mask = np.asarray(
        sft.response_mask(jnp.asarray(tokens[:, 1:]), jnp.asarray(data.prompt_len[:64]))
    )
    reference = _reference_mask(tokens)
    assert evidence.record(
        "response mask vs token types (after SEP, not padding)",
        which,
        {
            "counted": int(mask.sum()),
            "reference_counted": int(reference.sum()),
            "mismatches": int(np.sum(mask != reference)),
        },
        {"exact": True},
        np.array_equal(mask, reference),
    )


@pytest.mark.claims("sft-response-mask", "sft-loss-mean-over-counted")
@pytest.mark.parametrize("which", ["tiny", "lengths 1-4"])
def test_prompt_labels_change_neither_loss_nor_gradient(
    config, corpus, other_corpus, grad_fn, evidence, which
):
    """The SFT loss equals a float64 enumeration and ignores prompt and padding labels, bitwise.

    Loss and gradients against the per-token mean over counted targets, then with every
    prompt and padding label changed; the default and a 1 to 4 token length range.
    """
    cfg, data = (config, corpus) if which == "tiny" else other_corpus
    model = build(cfg, key=jax.random.key(3))
    tokens = jnp.asarray(data.tokens[:32])
    targets = np.asarray(tokens[:, 1:]).copy()
    mask = sft.response_mask(jnp.asarray(targets), jnp.asarray(data.prompt_len[:32]))
    loss, grads = grad_fn(model, tokens, jnp.asarray(targets), mask)
    # float64 enumeration of the stated reduction: mean over counted targets.
    logits = np.asarray(nnx.jit(lambda m, t: m(t[:, :-1]))(model, tokens), np.float64)
    m_np = np.asarray(mask)
    ce = [
        np.log(np.sum(np.exp(logits[b, t] - logits[b, t].max())))
        + logits[b, t].max()
        - logits[b, t, targets[b, t]]
        for b in range(32)
        for t in range(targets.shape[1])
        if m_np[b, t]
    ]
    enumerated = sum(ce) / len(ce)
    perturbed = targets.copy()
    prompt_pos = ~m_np & (targets >= NUM_SPECIAL)
    perturbed[prompt_pos] = NUM_SPECIAL + (targets[prompt_pos] - NUM_SPECIAL + 1) % cfg.num_symbols
    perturbed[targets == PAD] = NUM_SPECIAL
    loss_p, grads_p = grad_fn(model, tokens, jnp.asarray(perturbed), mask)
    same = float(loss) == float(loss_p) and all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_p), strict=True)
    )
    assert evidence.allclose(
        "SFT loss (per-token mean over counted targets) vs float64 enumeration",
        which,
        float(loss),
        enumerated,
        rtol=1e-5,
        atol=1e-6,
    )
    assert evidence.record(
        "perturbed prompt and padding labels leave loss and gradient bitwise equal",
        which,
        {
            "loss": float(loss),
            "loss_perturbed": float(loss_p),
            "perturbed_positions": int(prompt_pos.sum()),
        },
        {"exact": True},
        same and prompt_pos.sum() > 0,
    )


@nnx.jit
def _packed_logits(model, tokens, segment_ids, positions):
    return model(tokens, segment_ids=segment_ids, positions=positions)


@pytest.mark.claims("pack-segment-ids", "pack-positions-restart")
@pytest.mark.parametrize("length", [32, 48])
def test_packed_examples_cannot_see_each_other(config, corpus, evidence, length):
    """Changing one packed example changes no other's logit; each gets its logits alone.

    Bitwise for the other examples of the row; within 1e-4 of the example run alone.
    Rows of 32 and 48 tokens.
    """
    model = build(config, key=jax.random.key(4))
    n = 12
    packed = sft.pack(corpus.tokens[:n], corpus.prompt_len[:n], length)
    logits = np.asarray(
        _packed_logits(
            model, *(jnp.asarray(packed[k]) for k in ("tokens", "segment_ids", "positions"))
        )
    )
    # Change the first example of row 0 (every token but BOS).
    victim = packed["example"] == 0
    changed = packed["tokens"].copy()
    changed[victim & (np.arange(length)[None] > 0)] = NUM_SPECIAL + 1
    logits_c = np.asarray(
        _packed_logits(
            model,
            jnp.asarray(changed),
            jnp.asarray(packed["segment_ids"]),
            jnp.asarray(packed["positions"]),
        )
    )
    others = (packed["example"] >= 0) & ~victim
    others_equal = np.array_equal(logits[others], logits_c[others])
    victim_moved = not np.array_equal(logits[victim], logits_c[victim])
    assert evidence.record(
        "changing one packed example changes no logit of another",
        f"row length {length}",
        {
            "other_tokens": int(others.sum()),
            "others_bitwise_equal": others_equal,
            "changed_example_moved": victim_moved,
        },
        {"exact": True},
        others_equal and victim_moved,
    )
    # Each packed example gets the logits it gets alone (positions restart).
    alone = np.asarray(_packed_logits(model, jnp.asarray(corpus.tokens[:n]), None, None))
    diffs = []
    for i in range(n):
        span = packed["example"] == i
        k = int(span.sum())
        diffs.append(float(np.max(np.abs(logits[span] - alone[i, :k]))))
    assert evidence.allclose(
        "packed example logits vs the example alone",
        f"row length {length}",
        np.max(diffs),
        0.0,
        rtol=0.0,
        atol=1e-4,
    )


@pytest.mark.claims("sft-response-mask", "sft-loss-mean-over-counted")
def test_loss_fn_is_next_token_cross_entropy_over_the_response(config, corpus):
    """loss_fn equals a float64 next-token cross-entropy over the targets of a token-type mask."""
    model = build(config, key=jax.random.key(8))
    batch = {
        "tokens": jnp.asarray(corpus.tokens[:16]),
        "prompt_len": jnp.asarray(corpus.prompt_len[:16]),
    }
    loss, aux = nnx.jit(sft.loss_fn)(model, batch, None)
    assert aux is None
    tokens = np.asarray(corpus.tokens[:16])
    logits = np.asarray(nnx.jit(lambda m, t: m(t[:, :-1]))(model, batch["tokens"]), np.float64)
    mask = _reference_mask(tokens)
    total, count = 0.0, 0
    for b in range(16):
        for t in range(tokens.shape[1] - 1):
            if mask[b, t]:
                z = logits[b, t]
                total += z.max() + np.log(np.sum(np.exp(z - z.max()))) - z[tokens[b, t + 1]]
                count += 1
    np.testing.assert_allclose(float(loss), total / count, rtol=1e-5, atol=1e-6)


def test_sft_learns_the_task_reproducibly(config, splits, corpus, sft_run, evidence):
    """The tiny SFT run reaches 0.9 held-out answer accuracy; two reruns repeat its losses bitwise.

    Held-out accuracy and loss before and after training; two 8-step reruns with the same
    config and seed against the session run's first 8 losses.
    """
    base, trained, history, _ = sft_run
    before = evaluate(base, corpus, splits["heldout"])
    after = evaluate(trained, corpus, splits["heldout"])
    assert evidence.record(
        "held-out answer accuracy and loss before/after SFT",
        f"{config.sft_steps} steps",
        {
            "before": before,
            "after": after,
            "first_loss": history["loss"][0],
            "last_loss": history["loss"][-1],
        },
        {"accuracy_after_min": 0.9},
        after["answer_accuracy"] >= 0.9 and after["loss"] < before["loss"],
    )
    # Same config and seed: bitwise-identical losses (a short rerun of the start).
    again = [
        fit(
            base,
            sft.loss_fn,
            config,
            corpus,
            splits["train"],
            splits["heldout"],
            steps=8,
            key=jax.random.split(jax.random.key(config.seed))[1],
            objective="sft",
        )[1]["loss"]
        for _ in range(2)
    ]
    assert evidence.record(
        "same seed, same loss bits",
        "two 8-step reruns vs the session run",
        {"rerun_a": again[0], "rerun_b": again[1], "session": history["loss"][:8]},
        {"exact": True},
        again[0] == again[1] == history["loss"][:8],
    )
