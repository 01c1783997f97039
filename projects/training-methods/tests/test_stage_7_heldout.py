"""Stage 7: held-out checks.

Independent checks: no held-out id in the ledger of any objective that ran
(SFT and masked LM), and the data pipeline refuses held-out ids; exact
duplicates and n-gram overlap between the splits against a brute-force
NumPy comparison; the held-out answer accuracy, reported under its own
namespace, equals the accuracy of real greedy decoding. Changed conditions:
n-grams of 3 and 4; a ledger with a planted held-out id is flagged.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from training_methods import heldout, mlm
from training_methods.data import HeldoutLeak, batches, split_ids
from training_methods.train import Ledger, fit


@pytest.mark.claims("ngrams-every-window-in-order")
@pytest.mark.parametrize("length", [0, 1, 2, 3, 5, 7])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ngrams_are_every_window_in_order(length, n):
    """ngrams gives every contiguous window in order, repeats kept, for lengths 0-7 and n 1-4."""
    seq = tuple(range(10, 10 + length))
    windows = []
    for start in range(length):
        if start + n <= length:
            windows.append(seq[start : start + n])
    assert heldout.ngrams(seq, n) == windows
    # Repeated windows are kept: (1, 1, 1, 1) has length - n + 1 equal windows.
    assert heldout.ngrams((1,) * length, n) == [(1,) * n] * max(length - n + 1, 0)


@pytest.mark.parametrize("config_kw", [{}, {"num_train": 100, "num_heldout": 17}])
def test_split_ids_are_the_two_documented_ranges(config, config_kw):
    """split_ids gives 0..num_train-1 and the next num_heldout ids as int32, for two configs."""
    cfg = config.replace(**config_kw)
    split = split_ids(cfg)
    assert split["train"].tolist() == list(range(cfg.num_train))
    assert split["heldout"].tolist() == list(range(cfg.num_train, cfg.num_train + cfg.num_heldout))
    assert split["train"].dtype == split["heldout"].dtype == np.int32


@pytest.mark.claims("audit-leaked-ids", "audit-ngram-overlap", "audit-n-positive")
def test_audit_boundaries_n_and_truncation(splits, corpus):
    """The audit lists at most ten leaked ids per objective, and handles n = 1, long n and bad n.

    Hand-computed answers: n = 1 sees every prompt symbol (overlap 1); n longer than every
    prompt gives no n-gram and overlap 0; the default n is 3; 0, -1 and 2.5 are refused.
    """
    train, held = _split_corpora(corpus, splits)
    held_ids = [int(i) for i in splits["heldout"]]
    leaky = Ledger()
    leaky.add("sft", np.asarray(held_ids[:12] + [0, 1, 2]))
    leaky.add("mlm", np.asarray([3, 4]))
    report = heldout.audit(leaky, train, held, n=1)
    # At most the first ten leaked ids (sorted) per objective; an objective without leaks: [].
    assert report["leaked_ids"] == {"sft": held_ids[:10], "mlm": []}
    assert report["separated"] is False and report["objectives"] == ["mlm", "sft"]
    # n = 1: every held-out prompt symbol is a unigram; all symbols occur in training.
    assert report["ngram_n"] == 1
    assert report["heldout_ngrams"] == int(held.prompt_len.sum())
    assert report["ngram_overlap"] == 1.0
    # The default n is 3.
    default = heldout.audit(leaky, train, held)
    assert default == heldout.audit(leaky, train, held, n=3) and default["ngram_n"] == 3
    # n longer than every prompt: no held-out n-gram, overlap 0 (not a division by zero).
    longest = int(held.prompt_len.max())
    empty = heldout.audit(Ledger(), train, held, n=longest + 1)
    assert empty["heldout_ngrams"] == 0 and empty["ngram_overlap"] == 0.0
    assert empty["separated"] is True and empty["leaked_ids"] == {}
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match=rf"must be a positive integer, got `{bad}`"):
            heldout.audit(Ledger(), train, held, n=bad)


@pytest.fixture(scope="module")
def ledger(config, splits, corpus, sft_run):
    _, _, _, sft_ledger = sft_run
    both = Ledger()
    both.read = {k: set(v) for k, v in sft_ledger.read.items()}
    model = sft_run[0]
    fit(
        model,
        mlm.make_loss_fn(config.mask_rate, config.num_symbols),
        config,
        corpus,
        splits["train"],
        splits["heldout"],
        steps=4,
        key=jax.random.key(70),
        objective="mlm",
        ledger=both,
    )
    return both


def _split_corpora(corpus, splits):
    from training_methods.data import Corpus

    def sub(ids):
        r = corpus.rows(ids)
        return Corpus(corpus.ids[r], corpus.tokens[r], corpus.prompt_len[r])

    return sub(splits["train"]), sub(splits["heldout"])


@pytest.mark.claims("audit-leaked-ids")
def test_no_heldout_id_enters_any_objective(splits, corpus, ledger, evidence):
    """No held-out id is in the SFT or masked-LM ledger; a planted one is flagged.

    Against the split's own held-out ids; the data pipeline also refuses to batch them.
    """
    train, held = _split_corpora(corpus, splits)
    report = heldout.audit(ledger, train, held)
    planted = Ledger()
    planted.read = {k: set(v) for k, v in ledger.read.items()}
    planted.read["sft"].add(int(splits["heldout"][3]))
    flagged = heldout.audit(planted, train, held)
    with pytest.raises(HeldoutLeak, match=str(int(splits["heldout"][0]))):
        batches(corpus, splits["heldout"][:10], splits["heldout"], 4, jax.random.key(0), 1)
    assert evidence.record(
        "objective ledgers vs held-out ids",
        "sft + mlm; then one planted held-out id",
        {
            "objectives": report["objectives"],
            "ids_read": {k: len(v) for k, v in ledger.read.items()},
            "separated": report["separated"],
            "planted_flagged": flagged["leaked_ids"]["sft"],
        },
        {"exact": True},
        report["separated"]
        and set(report["objectives"]) == {"sft", "mlm"}
        and flagged["leaked_ids"]["sft"] == [int(splits["heldout"][3])]
        and not flagged["separated"],
    )


@pytest.mark.parametrize("planted_batch", [1, 2])
def test_ledger_records_every_batch_read(config, splits, corpus, ledger, evidence, planted_batch):
    """Every batch's ids reach the ledger, not only the first; a later held-out id is flagged.

    The rule: "every `fit` records, in its `Ledger`, the example ids its objective read".
    Independent expected values: the union of the id batches passed to `add`, written out
    here; and, for the real runs, `batches`' documented epochs (each a fresh permutation
    of the training ids): SFT's `sft_steps x batch_size` draws (150 x 64) cover at least
    one full epoch of the 2048 training ids, so it read every one; masked LM's 4 x 64
    draws lie inside one epoch, 256 distinct training ids.
    Changed condition: one held-out id planted in the 2nd, then the 3rd of three batches.
    """
    train, held = _split_corpora(corpus, splits)
    train_ids = [int(i) for i in splits["train"]]
    leak = int(splits["heldout"][5 + planted_batch])
    fed = [[0, 1, 2], [3, 4, 5, 6], [7, 8]]
    fed[planted_batch] = [*fed[planted_batch], leak]
    hand = Ledger()
    for ids in fed:
        hand.add("sft", np.asarray(ids, np.int32))
    hand.add("mlm", np.asarray([9, 10], np.int32))
    hand.add("mlm", np.asarray([11], np.int32))
    report = heldout.audit(hand, train, held)
    expected = {"sft": {*range(9), leak}, "mlm": {9, 10, 11}}
    batch = config.batch_size
    full_epochs = config.sft_steps * batch // len(train_ids)
    assert evidence.record(
        "ledger ids vs every batch fed to it; a held-out id in a later batch",
        f"held-out id in batch {planted_batch + 1} of 3; SFT and masked-LM fits",
        {
            "recorded": {k: sorted(v) for k, v in hand.read.items()},
            "leaked_ids": report["leaked_ids"],
            "sft_ids_read": len(ledger.read["sft"]),
            "mlm_ids_read": len(ledger.read["mlm"]),
            "sft_full_epochs": full_epochs,
        },
        {"exact": True},
        hand.read == expected
        and report["leaked_ids"] == {"sft": [leak], "mlm": []}
        and not report["separated"]
        and full_epochs >= 1
        and ledger.read["sft"] == set(train_ids)
        and len(ledger.read["mlm"]) == 4 * batch
        and ledger.read["mlm"] <= set(train_ids),
    )


def _prompt_matrix(c):
    m = np.full((len(c.ids), c.tokens.shape[1]), -1, np.int64)
    for i, (row, n) in enumerate(zip(c.tokens, c.prompt_len, strict=True)):
        m[i, :n] = row[1 : n + 1]
    return m


@pytest.mark.claims("audit-exact-duplicates", "audit-ngram-overlap")
@pytest.mark.parametrize("n", [3, 4])
def test_duplicates_and_ngram_overlap_vs_brute_force(splits, corpus, ledger, evidence, n):
    """The audit's duplicates and n-gram overlap equal a brute-force NumPy search, n = 3 and 4."""
    train, held = _split_corpora(corpus, splits)
    report = heldout.audit(ledger, train, held, n=n)
    tm, hm = _prompt_matrix(train), _prompt_matrix(held)
    # Exact duplicates: a held-out row equal to some training row (incl. the -1 padding).
    dup = [int(held.ids[i]) for i in range(len(hm)) if np.any(np.all(tm == hm[i], axis=1))]

    # n-grams as windows of the padded matrix that contain no padding.
    def windows(m):
        w = np.lib.stride_tricks.sliding_window_view(m, n, axis=1).reshape(-1, n)
        return w[np.all(w >= 0, axis=1)]

    tw, hw = windows(tm), windows(hm)
    seen = np.array([np.any(np.all(tw == g, axis=1)) for g in hw])
    overlap = float(seen.mean())
    assert evidence.record(
        "exact duplicates and n-gram overlap vs brute force",
        f"n={n}",
        {
            "duplicates": len(dup),
            "audit_duplicates": report["exact_duplicates"],
            "ngram_overlap": overlap,
            "audit_ngram_overlap": report["ngram_overlap"],
            "heldout_ngrams": len(hw),
        },
        {"exact": True},
        dup == report["duplicate_ids"]
        and abs(overlap - report["ngram_overlap"]) < 1e-12
        and report["heldout_ngrams"] == len(hw),
    )


@nnx.jit
def _next_logits(model, tokens):
    return model(tokens)


def _greedy_accuracy(model, c) -> float:
    """Real greedy decoding: write the answer token by token from the prompt."""
    tokens = np.zeros_like(c.tokens)
    for i, n in enumerate(c.prompt_len):
        tokens[i, : n + 2] = c.tokens[i, : n + 2]
    done = np.zeros(len(tokens), bool)
    for t in range(tokens.shape[1] - 1):
        logits = np.asarray(_next_logits(model, jnp.asarray(tokens)))
        writing = (t >= c.prompt_len + 1) & (t <= 2 * c.prompt_len + 1)
        nxt = logits[:, t].argmax(-1)
        tokens[writing, t + 1] = nxt[writing]
        done |= writing
    return float(np.mean([np.array_equal(tokens[i], c.tokens[i]) for i in range(len(tokens))]))


@pytest.mark.claims("heldout-metrics-namespace", "heldout-metrics-dedup")
def test_heldout_metrics_live_in_their_own_namespace(splits, corpus, ledger, sft_run, evidence):
    """Held-out answer accuracy equals real greedy decoding, and every metric is under `heldout/`.

    The de-duplicated count is the held-out count less the audit's exact duplicates.
    """
    _, trained, _, _ = sft_run
    train, held = _split_corpora(corpus, splits)
    report = heldout.audit(ledger, train, held)
    metrics = heldout.heldout_metrics(trained, held, report["duplicate_ids"])
    greedy = _greedy_accuracy(trained, held)
    names_ok = all(k.startswith(heldout.NAMESPACE) for k in metrics) and {
        "heldout/answer_accuracy",
        "heldout/loss",
        "heldout/dedup/answer_accuracy",
    } <= set(metrics)
    counts_ok = metrics["heldout/dedup/examples"] == len(held.ids) - report["exact_duplicates"]
    assert evidence.record(
        "held-out answer accuracy vs real greedy decoding; namespaced metrics",
        "the session's SFT model",
        {"metrics": metrics, "greedy_accuracy": greedy, "duplicates": report["exact_duplicates"]},
        {"exact": True},
        names_ok and counts_ok and metrics["heldout/answer_accuracy"] == greedy,
    )
