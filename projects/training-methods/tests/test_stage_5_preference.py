"""Stage 5: direct preference optimization.

Independent checks: a table of hand-enumerated cases (ties, equal
reference, large margins either way, length differences under the summed
and the length-normalized log-probabilities), each computed here from the
closed form `log(1 + exp(-beta * margin))` with Python's `math`; the
reference model receives an exactly zero gradient and stays bitwise
unchanged through training; held-out preference accuracy and reward margin
rise. Changed condition: another beta.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from training_methods import dpo
from training_methods.data import NUM_SPECIAL


def _closed_form(pc, pr, rc, rr, beta):
    z = beta * ((pc - rc) - (pr - rr))
    # log(1 + exp(-z)), written so that neither branch overflows.
    return max(-z, 0.0) + math.log1p(math.exp(-abs(z)))


CASES = [
    # name, policy chosen, policy rejected, ref chosen, ref rejected
    ("tie: all equal", -5.0, -5.0, -5.0, -5.0),
    ("tie: policy moved like the reference", -2.0, -9.0, -2.0, -9.0),
    ("equal reference, policy prefers chosen", -1.0, -3.0, -4.0, -4.0),
    ("equal reference, policy prefers rejected", -3.0, -1.0, -4.0, -4.0),
    ("large positive margin", 0.0, -5000.0, -10.0, -10.0),
    ("large negative margin", -5000.0, 0.0, -10.0, -10.0),
]


@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_dpo_matches_the_table_of_cases(evidence, beta):
    columns = [jnp.asarray([c[i] for c in CASES], jnp.float32) for i in range(1, 5)]
    out = dpo.dpo_loss(*columns, beta)
    per_case = [float(x) for x in -jax.nn.log_sigmoid(out.chosen_reward - out.rejected_reward)]
    expected = [_closed_form(*c[1:], beta) for c in CASES]
    rewards_ok = np.allclose(out.chosen_reward, beta * (columns[0] - columns[2])) and np.allclose(
        out.rejected_reward, beta * (columns[1] - columns[3])
    )
    finite = bool(np.all(np.isfinite(per_case))) and bool(jnp.isfinite(out.loss))
    assert evidence.allclose(
        "DPO per case vs closed form",
        f"beta={beta}; cases: {[c[0] for c in CASES]}",
        per_case,
        expected,
        rtol=1e-5,
        atol=1e-6,
    )
    assert evidence.allclose(
        "DPO batch loss = mean over pairs",
        f"beta={beta}",
        float(out.loss),
        float(np.mean(expected)),
        rtol=1e-5,
        atol=1e-6,
    )
    assert finite and rewards_ok


class _Uniform(nnx.Module):
    """A stand-in model whose next-token distribution is uniform over `vocab`."""

    def __init__(self, vocab):
        self.vocab = vocab

    def __call__(self, tokens):
        return jnp.zeros((*tokens.shape, self.vocab), jnp.float32)


@pytest.mark.parametrize("vocab", [10, 21])
def test_length_differences_sum_versus_normalized(evidence, vocab):
    # Two responses of 2 and 5 symbols (+ EOS): 3 and 6 counted tokens.
    short = [1, 5, 6, 2, 6, 5, 3, 0, 0, 0, 0, 0, 0]
    long = [1, 5, 6, 7, 8, 9, 2, 9, 8, 7, 6, 5, 3]
    tokens = jnp.asarray([short, long], jnp.int32)
    lens = jnp.asarray([2, 5], jnp.int32)
    summed = np.asarray(dpo.sequence_logps(_Uniform(vocab), tokens, lens))
    normalized = np.asarray(dpo.sequence_logps(_Uniform(vocab), tokens, lens, normalize=True))
    expected_sum = [-3 * math.log(vocab), -6 * math.log(vocab)]
    expected_norm = [-math.log(vocab), -math.log(vocab)]
    assert evidence.allclose(
        "summed response log-prob (denominator 1)",
        f"uniform over {vocab}",
        summed,
        expected_sum,
        rtol=1e-6,
        atol=1e-6,
    )
    assert evidence.allclose(
        "length-normalized log-prob (denominator = response tokens)",
        f"uniform over {vocab}",
        normalized,
        expected_norm,
        rtol=1e-6,
        atol=1e-6,
    )
    # With the sum, a uniform policy prefers the shorter response by 3 log V;
    # normalized, the two tie (loss log 2 against an equal reference).
    beta = 1.0
    loss_sum = float(dpo.dpo_loss(summed[:1], summed[1:], jnp.zeros(1), jnp.zeros(1), beta).loss)
    loss_norm = float(
        dpo.dpo_loss(normalized[:1], normalized[1:], jnp.zeros(1), jnp.zeros(1), beta).loss
    )
    assert evidence.allclose(
        "length effect on DPO",
        f"uniform over {vocab}",
        [loss_sum, loss_norm],
        [_closed_form(*expected_sum, 0, 0, beta), math.log(2)],
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.fixture(scope="module")
def pairs(config, splits, corpus):
    held = corpus.take(splits["heldout"])
    return dpo.make_pairs(
        held["tokens"], held["prompt_len"], config.num_symbols, jax.random.key(50)
    )


def test_the_reference_gets_no_gradient(config, pairs, sft_run, evidence):
    _, base, _, _ = sft_run
    pair_model = dpo.PolicyAndReference(nnx.clone(base), nnx.clone(base))
    batch = {
        "chosen": jnp.asarray(pairs.chosen[:32]),
        "rejected": jnp.asarray(pairs.rejected[:32]),
        "prompt_len": jnp.asarray(pairs.prompt_len[:32]),
    }
    loss_fn = dpo.make_loss_fn(config.dpo_beta)
    grads = nnx.jit(lambda m, b: nnx.grad(lambda x: loss_fn(x, b, None)[0])(m))(pair_model, batch)
    ref_max = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads["reference"]))
    pol_max = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads["policy"]))
    assert evidence.record(
        "gradient reaching the reference model",
        "all parameters differentiated",
        {"reference_max_abs_grad": ref_max, "policy_max_abs_grad": pol_max},
        {"exact_zero": True},
        ref_max == 0.0 and pol_max > 0.0,
    )


def test_training_raises_heldout_preference_accuracy_and_margin(
    config, splits, corpus, pairs, sft_run, evidence
):
    _, base, _, _ = sft_run
    before = dpo.preference_metrics(dpo.PolicyAndReference(base, base), pairs, config.dpo_beta)
    trained, history = dpo.train_dpo(
        config, base, corpus, splits["train"], splits["heldout"], key=jax.random.key(51)
    )
    after = dpo.preference_metrics(trained, pairs, config.dpo_beta)
    ref_unchanged = all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(nnx.state(base, nnx.Param)),
            jax.tree.leaves(nnx.state(trained.reference, nnx.Param)),
            strict=True,
        )
    )
    opt_arrays = {x.shape for x in jax.tree.leaves(history["opt_state"]) if x.ndim}
    assert evidence.record(
        "held-out preference accuracy and reward margin, before and after DPO",
        f"beta={config.dpo_beta}, {config.dpo_steps} steps",
        {
            "before": before,
            "after": after,
            "reference_bitwise_unchanged": ref_unchanged,
            "first_loss": history["loss"][0],
            "last_loss": history["loss"][-1],
        },
        {"accuracy_before": 0.5},
        before["preference_accuracy"] == 0.5
        and before["reward_margin"] == 0.0
        and after["preference_accuracy"] > 0.9
        and after["reward_margin"] > 0.0
        and ref_unchanged
        and len(opt_arrays) > 0,
    )


def test_pairs_with_different_prompts_are_refused(corpus):
    chosen = corpus.tokens[:3].copy()
    rejected = chosen.copy()
    rejected[1, 1] = NUM_SPECIAL + (rejected[1, 1] - NUM_SPECIAL + 1) % 16
    with pytest.raises(ValueError, match=r"Preference pair `1` has different prompts"):
        dpo.check_pairs(dpo.Pairs(chosen, rejected, corpus.prompt_len[:3]))
