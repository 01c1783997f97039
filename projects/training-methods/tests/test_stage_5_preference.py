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


@pytest.mark.claims("dpo-rewards-and-loss")
@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_dpo_matches_the_table_of_cases(evidence, log_sigmoid_excess, beta):
    """DPO equals the closed form log(1 + exp(-beta margin)) on six enumerated cases, beta 0.1, 2.

    Ties, an equal reference either way and margins of +-5000 stay finite; the batch loss
    is the mean over pairs and the rewards are beta * (policy - reference).
    """
    columns = [jnp.asarray([c[i] for c in CASES], jnp.float32) for i in range(1, 5)]
    out = dpo.dpo_loss(*columns, beta)
    per_case = [float(x) for x in -jax.nn.log_sigmoid(out.chosen_reward - out.rejected_reward)]
    expected = [_closed_form(*c[1:], beta) for c in CASES]
    rewards_ok = np.allclose(out.chosen_reward, beta * (columns[0] - columns[2])) and np.allclose(
        out.rejected_reward, beta * (columns[1] - columns[3])
    )
    finite = bool(np.all(np.isfinite(per_case))) and bool(jnp.isfinite(out.loss))
    # float32 log-sigmoid: the rtol scales with the backend's excess (conftest).
    rtol = 1e-5 * log_sigmoid_excess
    assert evidence.allclose(
        "DPO per case vs closed form",
        f"beta={beta}; cases: {[c[0] for c in CASES]}",
        per_case,
        expected,
        rtol=rtol,
        atol=1e-6,
    )
    assert evidence.allclose(
        "DPO batch loss = mean over pairs",
        f"beta={beta}",
        float(out.loss),
        float(np.mean(expected)),
        rtol=rtol,
        atol=1e-6,
    )
    assert finite and rewards_ok


class _Uniform(nnx.Module):
    """A stand-in model whose next-token distribution is uniform over `vocab`."""

    def __init__(self, vocab):
        self.vocab = vocab

    def __call__(self, tokens):
        return jnp.zeros((*tokens.shape, self.vocab), jnp.float32)


@pytest.mark.claims(
    "sequence-logps-sum-over-response", "sequence-logps-normalized", "sequence-logps-strict-dtypes"
)
@pytest.mark.parametrize("vocab", [10, 21])
def test_length_differences_sum_versus_normalized(
    evidence, log_softmax_excess, log_sigmoid_excess, vocab
):
    """Under a uniform policy the summed log-prob prefers the short response; normalized, a tie.

    Against 3 log V and 6 log V (summed) and log V each (normalized) for 3 and 6 counted
    tokens, and the DPO losses these give (a tie is log 2); vocabularies 10 and 21.
    """
    # Two responses of 2 and 5 symbols (+ EOS): 3 and 6 counted tokens.
    short = [1, 5, 6, 2, 6, 5, 3, 0, 0, 0, 0, 0, 0]
    long = [1, 5, 6, 7, 8, 9, 2, 9, 8, 7, 6, 5, 3]
    tokens = jnp.asarray([short, long], jnp.int32)
    lens = jnp.asarray([2, 5], jnp.int32)
    summed = np.asarray(dpo.sequence_logps(_Uniform(vocab), tokens, lens))
    normalized = np.asarray(dpo.sequence_logps(_Uniform(vocab), tokens, lens, normalize=True))
    expected_sum = [-3 * math.log(vocab), -6 * math.log(vocab)]
    expected_norm = [-math.log(vocab), -math.log(vocab)]
    # float32 log-softmax, then log-sigmoid: rtols scale with the backend's excess (conftest).
    excess = max(log_softmax_excess, log_sigmoid_excess)
    assert evidence.allclose(
        "summed response log-prob (denominator 1)",
        f"uniform over {vocab}",
        summed,
        expected_sum,
        rtol=1e-6 * log_softmax_excess,
        atol=1e-6,
    )
    assert evidence.allclose(
        "length-normalized log-prob (denominator = response tokens)",
        f"uniform over {vocab}",
        normalized,
        expected_norm,
        rtol=1e-6 * log_softmax_excess,
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
        rtol=1e-5 * excess,
        atol=1e-6,
    )


class _Bigram(nnx.Module):
    """A stand-in model whose next-token logits depend on the current token only."""

    def __init__(self, table):
        self.table = nnx.Param(jnp.asarray(table, jnp.float32))

    def __call__(self, tokens):
        return self.table[...][tokens]


_V = 12  # 5 special tokens and 7 symbols


def _bigram_table(seed):
    return np.asarray(jax.random.normal(jax.random.key(seed), (_V, _V)), np.float64) * 2.0


def _rows(seed, n, lens):
    """Rows `BOS p SEP r EOS PAD..` of width 13, prompt lengths `lens`."""
    rng = np.random.default_rng(seed)
    rows = np.zeros((n, 13), np.int32)
    for i, n_i in enumerate(lens):
        p = rng.integers(NUM_SPECIAL, _V, n_i)
        r = rng.integers(NUM_SPECIAL, _V, n_i)
        rows[i, : 2 * n_i + 3] = [1, *p, 2, *r, 3]
    return rows


def _np_logps(table, rows, lens, normalize=False):
    logsm = table - np.log(np.sum(np.exp(table), -1, keepdims=True))
    out = []
    for row, n_i in zip(rows, lens, strict=True):
        # Targets: the response tokens and EOS, token indices n + 2 .. 2n + 2.
        terms = [logsm[row[t - 1], row[t]] for t in range(n_i + 2, 2 * n_i + 3)]
        out.append(sum(terms) / (len(terms) if normalize else 1))
    return np.asarray(out)


@pytest.mark.claims(
    "sequence-logps-sum-over-response", "sequence-logps-normalized", "sequence-logps-strict-dtypes"
)
@pytest.mark.parametrize("normalize", [False, True])
def test_sequence_logps_equal_a_numpy_enumeration(normalize):
    """Sequence log-probs of a random bigram model equal NumPy's, summed and normalized."""
    lens = np.asarray([1, 2, 5, 3, 4], np.int32)
    rows = _rows(7, 5, lens)
    table = _bigram_table(5)
    got = dpo.sequence_logps(_Bigram(table), jnp.asarray(rows), jnp.asarray(lens), normalize)
    np.testing.assert_allclose(
        np.asarray(got), _np_logps(table, rows, lens, normalize), rtol=1e-5, atol=1e-5
    )


def test_preference_metrics_count_ties_as_half(log_softmax_excess, log_sigmoid_excess):
    """Preference accuracy counts a tie as 1/2; margin and loss equal NumPy, for 10 pairs."""
    lens = np.asarray([1, 2, 3, 4, 5, 2, 3, 4, 5, 3], np.int32)
    chosen = _rows(11, 10, lens)
    rejected = chosen.copy()
    for i in range(9):  # the last pair is a tie: identical responses
        t = lens[i] + 2 + i % lens[i]
        rejected[i, t] = NUM_SPECIAL + (rejected[i, t] - NUM_SPECIAL + 1) % (_V - NUM_SPECIAL)
    table, beta = _bigram_table(9), 0.7
    pair_model = dpo.PolicyAndReference(_Bigram(table), _Uniform(_V))
    got = dpo.preference_metrics(pair_model, dpo.Pairs(chosen, rejected, lens), beta)
    ref = -(lens + 1) * np.log(_V)  # the uniform reference, equal for both responses
    chosen_r = beta * (_np_logps(table, chosen, lens) - ref)
    rejected_r = beta * (_np_logps(table, rejected, lens) - ref)
    margin = chosen_r - rejected_r
    margin[-1] = 0.0
    assert np.sum(margin > 1e-3) >= 2 and np.sum(margin < -1e-3) >= 2
    assert np.all(np.abs(margin[:-1]) > 1e-3)
    accuracy = (np.sum(margin > 0) + 0.5) / len(margin)
    np.testing.assert_allclose(got["preference_accuracy"], accuracy, rtol=0, atol=1e-12)
    # float32 log-softmax, then log-sigmoid: rtols scale with the backend's excess (conftest).
    rtol = 1e-5 * log_softmax_excess
    np.testing.assert_allclose(got["reward_margin"], margin.mean(), rtol=rtol, atol=1e-6)
    loss = np.mean(np.logaddexp(0.0, -margin))
    rtol = 1e-5 * max(log_softmax_excess, log_sigmoid_excess)
    np.testing.assert_allclose(got["loss"], loss, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("where", ["bos", "prompt", "sep", "response"])
def test_check_pairs_compares_exactly_the_prompt(corpus, where):
    """check_pairs refuses a pair differing at BOS, a prompt token or SEP; a response change passes.

    The message names the pair and both prompts, as written here.
    """
    chosen = corpus.tokens[:4].copy()
    lens = corpus.prompt_len[:4]
    rejected = chosen.copy()
    n = int(lens[2])
    col = {"bos": 0, "prompt": n, "sep": n + 1, "response": n + 2}[where]
    rejected[2, col] = NUM_SPECIAL + (rejected[2, col] - NUM_SPECIAL + 3) % 16
    if where == "response":
        dpo.check_pairs(dpo.Pairs(chosen, rejected, lens))  # the same prompt: accepted
        return
    c, r = chosen[2, : n + 2].tolist(), rejected[2, : n + 2].tolist()
    with pytest.raises(ValueError) as info:
        dpo.check_pairs(dpo.Pairs(chosen, rejected, lens))
    assert str(info.value) == (
        f"Preference pair `2` has different prompts: chosen `{c}`, rejected `{r}`; "
        "both responses must answer the same prompt."
    )


@pytest.fixture(scope="module")
def pairs(config, splits, corpus):
    held = corpus.take(splits["heldout"])
    return dpo.make_pairs(
        held["tokens"], held["prompt_len"], config.num_symbols, jax.random.key(50)
    )


@pytest.mark.claims("dpo-reference-no-gradient")
def test_the_reference_gets_no_gradient(config, pairs, sft_run, evidence):
    """The reference model gets an exactly zero gradient while the policy's is non-zero."""
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
    """DPO training lifts held-out preference accuracy from 0.5 to over 0.9 and the margin above 0.

    Before training policy and reference are the same model (accuracy 0.5, margin 0);
    the reference stays bitwise unchanged through training.
    """
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
    """A pair whose prompts differ is refused, naming the pair's index."""
    chosen = corpus.tokens[:3].copy()
    rejected = chosen.copy()
    rejected[1, 1] = NUM_SPECIAL + (rejected[1, 1] - NUM_SPECIAL + 1) % 16
    with pytest.raises(ValueError, match=r"Preference pair `1` has different prompts"):
        dpo.check_pairs(dpo.Pairs(chosen, rejected, corpus.prompt_len[:3]))
