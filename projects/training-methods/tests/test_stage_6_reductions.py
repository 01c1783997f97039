"""Stage 6: reductions on ragged batches and gradient accumulation.

Independent checks: per-token and per-sequence means against float64 loops;
gradients accumulated over micro-batches against the full-batch gradient
computed in one pass: equal (to float32 tolerance) when normalized by the
global count of counted tokens, different when each micro-batch is averaged
first (the difference is measured). Changed conditions: micro-batches of 2
and 4 sequences; the batch split over 2 CPU devices with a `psum`ed count.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from training_methods import reductions
from training_methods.model import build
from training_methods.sft import response_mask


@pytest.fixture(scope="module")
def setup(config, corpus):
    model = build(config, key=jax.random.key(60))
    graphdef, params = nnx.split(model)

    def token_loss_fn(p, batch):
        m = nnx.merge(graphdef, p)
        tokens = batch["tokens"]
        logits = m(tokens[:, :-1])
        targets = tokens[:, 1:]
        logp = jax.nn.log_softmax(logits, -1)
        ce = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return ce, response_mask(targets, batch["prompt_len"])

    # A ragged batch: sorted by length, so micro-batches hold very different counts.
    order = np.argsort(corpus.prompt_len[:64], kind="stable")
    rows = np.concatenate([order[:4], order[-4:]])
    batch = {
        "tokens": jnp.asarray(corpus.tokens[rows]),
        "prompt_len": jnp.asarray(corpus.prompt_len[rows]),
    }
    return token_loss_fn, params, batch


def _loops(losses: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    tok_sum, tok_n, seq_means = 0.0, 0, []
    for b in range(losses.shape[0]):
        s, n = 0.0, 0
        for t in range(losses.shape[1]):
            if mask[b, t]:
                s += float(losses[b, t])
                n += 1
        tok_sum, tok_n = tok_sum + s, tok_n + n
        if n:
            seq_means.append(s / n)
    return tok_sum / tok_n, sum(seq_means) / len(seq_means)


@pytest.mark.parametrize("ragged", [True, False])
def test_per_token_and_per_sequence_means(corpus, setup, evidence, ragged):
    token_loss_fn, params, batch = setup
    if not ragged:  # every sequence of one length: the two means coincide
        rows = np.flatnonzero(corpus.prompt_len == 3)[:8]
        batch = {
            "tokens": jnp.asarray(corpus.tokens[rows]),
            "prompt_len": jnp.asarray(corpus.prompt_len[rows]),
        }
    losses, mask = jax.jit(token_loss_fn)(params, batch)
    if ragged:  # one sequence with no counted token at all (e.g. a response cut away)
        mask = mask.at[0].set(False)
    tok, seq = (
        float(reductions.per_token_mean(losses, mask)),
        float(reductions.per_sequence_mean(losses, mask)),
    )
    ref_tok, ref_seq = _loops(np.asarray(losses, np.float64), np.asarray(mask))
    cond = "ragged lengths" if ragged else "equal lengths"
    assert evidence.allclose(
        "per-token mean vs float64 loop", cond, tok, ref_tok, rtol=1e-5, atol=1e-6
    )
    assert evidence.allclose(
        "per-sequence mean vs float64 loop", cond, seq, ref_seq, rtol=1e-5, atol=1e-6
    )
    differ = abs(ref_tok - ref_seq) > 1e-4
    assert evidence.record(
        "per-token and per-sequence means differ only on ragged batches",
        cond,
        {"per_token": ref_tok, "per_sequence": ref_seq},
        None,
        differ == ragged,
    )


def _tolerance(full) -> float:
    # float32 sums of at most a few hundred terms, then one division.
    return 64 * float(np.finfo(np.float32).eps) * max(1.0, reductions.max_abs(full)) * 16


@pytest.mark.parametrize("micro", [2, 4])
def test_accumulation_matches_the_full_batch_only_with_the_global_count(setup, evidence, micro):
    token_loss_fn, params, batch = setup
    n = batch["tokens"].shape[0]
    micros = [{k: v[i : i + micro] for k, v in batch.items()} for i in range(0, n, micro)]
    full = reductions.full_batch_grad(token_loss_fn, params, batch)
    good, count = reductions.accumulate_global(token_loss_fn, params, micros)
    bad = reductions.accumulate_mean_of_means(token_loss_fn, params, micros)
    tol = _tolerance(full)
    err_good = reductions.max_abs_diff(good, full)
    err_bad = reductions.max_abs_diff(bad, full)
    counts = [int(jnp.sum(token_loss_fn(params, m)[1])) for m in micros]
    assert evidence.record(
        "accumulated vs full-batch gradient",
        f"{len(micros)} micro-batches of {micro}, counts {counts}",
        {
            "global_count_max_abs_diff": err_good,
            "mean_of_means_max_abs_diff": err_bad,
            "mean_of_means_relative_to_grad": err_bad / reductions.max_abs(full),
            "global_count": int(count),
        },
        {"atol": tol},
        err_good <= tol and err_bad > 100 * tol,
    )


def test_sharded_accumulation_over_two_devices(setup, evidence):
    if len(jax.devices()) < 2:
        pytest.skip(f"needs 2 CPU devices, JAX has {len(jax.devices())}")
    token_loss_fn, params, batch = setup
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    full = reductions.full_batch_grad(token_loss_fn, params, batch)
    sharded, count = reductions.sharded_grad(token_loss_fn, params, batch, mesh)
    expected_count = int(jnp.sum(token_loss_fn(params, batch)[1]))
    err = reductions.max_abs_diff(sharded, full)
    assert evidence.record(
        "batch split over 2 devices, global count by psum, vs full batch",
        "2 CPU devices",
        {"max_abs_diff": err, "count": int(count), "expected_count": expected_count},
        {"atol": _tolerance(full)},
        err <= _tolerance(full) and int(count) == expected_count,
    )
