"""Data: a synthetic language drawn from a key, split by example id, Grain pipelines.

Every example is a function of its id: example `i` comes from
`jax.random.fold_in(key, i)`, so its correct answer is known exactly and
nothing is downloaded. An example is

    BOS p_1 .. p_L SEP r_1 .. r_L EOS PAD ...

with `L` in `[min_len, max_len]` and the response `r` a function of the
prompt `p` (the task): `reverse` (r = p reversed) or `shift` (r = p reversed
with every symbol moved one place on in the alphabet, the LoRA adaptation
task). Sequences are padded to `seq_len = 2 * max_len + 3`.

The split is by id, fixed before any lab runs: ids `0 .. num_train-1` are the
training ids, `num_train .. num_train+num_heldout-1` the held-out ids.
Objectives only read through `batches(...)`, which refuses held-out ids.

A batch is a dict of NumPy arrays: `id` int32 `(B,)`, `tokens` int32
`(B, seq_len)`, `prompt_len` int32 `(B,)`.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import grain
import jax
import jax.numpy as jnp
import numpy as np

from training_methods.config import Config

PAD, BOS, SEP, EOS, MASK = 0, 1, 2, 3, 4
NUM_SPECIAL = 5
TASKS = ("reverse", "shift")


def vocab_size(config: Config) -> int:
    return NUM_SPECIAL + config.num_symbols


@dataclass(frozen=True)
class Corpus:
    """Examples of one task, indexed by id (row `i` is example id `ids[i]`).

    `ids`: int32 `(N,)`; `tokens`: int32 `(N, seq_len)`; `prompt_len`: int32 `(N,)`.
    """

    ids: np.ndarray
    tokens: np.ndarray
    prompt_len: np.ndarray

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Row indices of example `ids` in this corpus (ids must be present)."""
        index = np.searchsorted(self.ids, ids)
        if np.any(index >= len(self.ids)) or np.any(
            self.ids[np.minimum(index, len(self.ids) - 1)] != ids
        ):
            raise KeyError(
                f"Example ids `{np.setdiff1d(ids, self.ids)[:5].tolist()}` are not in the corpus."
            )
        return index

    def take(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        r = self.rows(np.asarray(ids))
        return {"id": self.ids[r], "tokens": self.tokens[r], "prompt_len": self.prompt_len[r]}


def split_ids(config: Config) -> dict[str, np.ndarray]:
    """The split by example id, decided by the config alone, before any lab runs."""
    train = np.arange(config.num_train, dtype=np.int32)
    heldout = np.arange(config.num_train, config.num_train + config.num_heldout, dtype=np.int32)
    return {"train": train, "heldout": heldout}


def generate(config: Config, ids: np.ndarray, task: str = "reverse") -> Corpus:
    """Examples `ids` of `task`, each drawn from `fold_in(key(data_seed), id)`.

    The draws are `max_len + 1` random uint32 words per example (one jitted
    call); the length and the symbols are those words modulo the range sizes
    (a bias below 1e-8 for these small ranges). Assembly is plain NumPy.
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task `{task}`; known tasks: {', '.join(TASKS)}.")
    ids = np.asarray(ids, dtype=np.int32)
    words = np.asarray(
        _draw(jax.random.key(config.data_seed), jnp.asarray(ids), config.max_len + 1)
    )
    lengths = config.min_len + (words[:, 0] % (config.max_len - config.min_len + 1)).astype(
        np.int32
    )
    symbols = (words[:, 1:] % config.num_symbols).astype(np.int32)
    tokens = np.zeros((len(ids), config.seq_len), np.int32)
    for row, (length, sym) in enumerate(zip(lengths, symbols, strict=True)):
        prompt = sym[:length]
        response = prompt[::-1] if task == "reverse" else (prompt[::-1] + 1) % config.num_symbols
        tokens[row, : 2 * length + 3] = [
            BOS,
            *(prompt + NUM_SPECIAL),
            SEP,
            *(response + NUM_SPECIAL),
            EOS,
        ]
    return Corpus(ids=ids, tokens=tokens, prompt_len=lengths)


@jax.jit(static_argnums=2)
def _draw(key, ids, n):
    return jax.vmap(lambda i: jax.random.bits(jax.random.fold_in(key, i), (n,), jnp.uint32))(ids)


class HeldoutLeak(ValueError):
    """An objective asked for a held-out example id."""


def batches(
    corpus: Corpus,
    ids: np.ndarray,
    heldout: np.ndarray,
    batch_size: int,
    key: jax.Array,
    steps: int,
) -> Iterator[dict[str, np.ndarray]]:
    """A Grain pipeline of `steps` shuffled training batches over `ids`.

    Each epoch is a fresh permutation of `ids` drawn from its own key; the
    Grain source holds one row-index vector per batch, gathered with one NumPy
    index per batch (per-example Grain elements cost ~0.4 ms each here).
    Refuses (`HeldoutLeak`) any id of `heldout`: objectives never read a
    held-out example, whatever the caller passes.
    """
    leaked = np.intersect1d(ids, heldout)
    if leaked.size:
        raise HeldoutLeak(
            f"Held-out example ids `{leaked[:5].tolist()}` were passed to an objective; "
            f"objectives read training ids only."
        )
    rows = corpus.rows(np.asarray(ids, dtype=np.int32))
    epochs = -(-steps * batch_size // len(rows))
    order = np.concatenate(
        [
            rows[np.asarray(jax.random.permutation(k, len(rows)))]
            for k in jax.random.split(key, epochs)
        ]
    )[: steps * batch_size].reshape(steps, batch_size)
    ds = grain.MapDataset.source(order).map(
        lambda r: {
            "id": corpus.ids[r],
            "tokens": corpus.tokens[r],
            "prompt_len": corpus.prompt_len[r],
        }
    )
    # In-memory data: 0 reader threads (Grain's default of 16 oversubscribes 2 cores).
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


def valid_mask(tokens: np.ndarray | jax.Array) -> jax.Array:
    """True at real tokens, False at padding."""
    return jnp.asarray(tokens) != PAD
