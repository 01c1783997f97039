"""Stage 7: held-out checks, kept apart from every objective.

- The split is by example id and decided by the config before any lab runs
  (`data.split_ids`); `data.batches` refuses held-out ids, and every `fit`
  writes the ids its objective read into a `Ledger`.
- `audit` proves the separation after the fact: no held-out id in any
  objective's ledger, and reports content contamination between the splits:
  held-out examples that are exact duplicates of a training example (same
  prompt, hence same answer: a memorized answer would score there) and the
  fraction of held-out prompt n-grams seen in training prompts.
- `heldout_metrics` puts held-out figures in their own namespace
  (`heldout/...`), the exact task metric (answer accuracy) beside the loss,
  on all held-out examples and on the de-duplicated ones.
"""

import numpy as np

from training_methods.data import Corpus
from training_methods.train import Ledger, evaluate

NAMESPACE = "heldout/"


def prompts(corpus: Corpus) -> list[tuple[int, ...]]:
    """Each example's prompt symbols (the answer is a function of them)."""
    return [
        tuple(row[1 : n + 1].tolist())
        for row, n in zip(corpus.tokens, corpus.prompt_len, strict=True)
    ]


def ngrams(seq: tuple[int, ...], n: int) -> list[tuple[int, ...]]:
    """Every contiguous window of `n` tokens of `seq`, in order (repeats kept)
    [claim:ngrams-every-window-in-order]."""
    # --- exercise stage 7: Return every contiguous n-token window of seq, in order. ---
    return [seq[i : i + n] for i in range(len(seq) - n + 1)]
    # --- end exercise ---


def audit(ledger: Ledger, train: Corpus, heldout: Corpus, n: int = 3) -> dict:
    """Separation and contamination report (figures, and the verdict they imply).

    `leaked_ids`: per objective, the first ten (sorted) held-out ids its ledger read;
    `separated` is True when there are none [claim:audit-leaked-ids].
    `duplicate_ids`, `exact_duplicates`: the held-out examples whose prompt is a
    training prompt [claim:audit-exact-duplicates].
    `ngram_overlap`: the fraction of held-out prompt n-grams (repeats counted) that
    occur in training prompts, 0.0 when there is none [claim:audit-ngram-overlap].
    Raises `ValueError` unless `n` is a positive integer [claim:audit-n-positive].
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"The n-gram length `n` must be a positive integer, got `{n}`.")
    heldout_ids = set(heldout.ids.tolist())
    # --- exercise stage 7: Find leaked ids, duplicate prompts and held-out n-gram overlap. ---
    leaks = {name: sorted(read & heldout_ids) for name, read in ledger.read.items()}
    train_prompts = set(prompts(train))
    held = prompts(heldout)
    duplicates = [int(i) for i, p in zip(heldout.ids, held, strict=True) if p in train_prompts]
    train_grams = {g for p in train_prompts for g in ngrams(p, n)}
    held_grams = [g for p in held for g in ngrams(p, n)]
    seen = sum(g in train_grams for g in held_grams)
    # --- end exercise ---
    return {
        "objectives": sorted(ledger.read),
        "leaked_ids": {name: ids[:10] for name, ids in leaks.items()},
        "separated": not any(leaks.values()),
        "exact_duplicates": len(duplicates),
        "duplicate_ids": duplicates,
        "heldout_examples": len(held),
        "ngram_n": n,
        "heldout_ngrams": len(held_grams),
        "ngram_overlap": seen / max(len(held_grams), 1),
    }


def heldout_metrics(model, heldout: Corpus, duplicate_ids: list[int]) -> dict[str, float]:
    """Held-out metrics under `heldout/` [claim:heldout-metrics-namespace]: all examples
    and de-duplicated ones (less `duplicate_ids`) [claim:heldout-metrics-dedup]."""
    clean = np.setdiff1d(heldout.ids, np.asarray(duplicate_ids, dtype=np.int32))
    # --- exercise stage 7: Evaluate all and de-duplicated held-out ids under the namespace. ---
    every = evaluate(model, heldout, heldout.ids)
    dedup = evaluate(model, heldout, clean)
    out = {f"{NAMESPACE}{k}": v for k, v in every.items()}
    out |= {f"{NAMESPACE}dedup/{k}": v for k, v in dedup.items()}
    # --- end exercise ---
    return out
