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


def check_token_ids(tokens, vocab: int, name: str = "tokens", ids=None) -> np.ndarray:
    """Refuses (`ValueError`) token ids outside `0 .. vocab - 1`, naming the first
    offending id, where it is and the vocabulary size; returns the array.

    `ids` (optional, one per row): the example ids, named in the message.
    For concrete arrays only (NumPy, or JAX arrays outside `jit`).
    """
    arr = np.asarray(tokens)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"`{name}` must hold integer token ids, but its dtype is `{arr.dtype}`.")
    bad = (arr < 0) | (arr >= vocab)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        at = f"`{name}[{', '.join(map(str, where))}]`"
        if ids is not None and arr.ndim == 2:
            at += f" (example id `{int(np.asarray(ids)[where[0]])}`)"
        raise ValueError(
            f"Token id `{int(arr[where])}` at {at} is outside the vocabulary of size `{vocab}` "
            f"(valid ids: 0 to {vocab - 1})."
        )
    return arr


def _check_ids(ids, name: str) -> np.ndarray:
    """A non-empty 1-D integer vector of example ids (refused otherwise)."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D vector of example ids, got shape `{arr.shape}`.")
    if arr.size == 0:
        raise ValueError(f"`{name}` is empty: at least one example id is needed.")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"`{name}` must hold integer example ids, but its dtype is `{arr.dtype}`.")
    return arr


@dataclass(frozen=True)
class Corpus:
    """Examples of one task, indexed by id (row `i` is example id `ids[i]`).

    `ids`: int32 `(N,)`, strictly increasing; `tokens`: int32 `(N, seq_len)`;
    `prompt_len`: int32 `(N,)`, each `L` with `1 <= L` and `2L + 3 <= seq_len`.
    `vocab`: the vocabulary size, when known (`generate` sets it): every token
    is then checked to lie in `0 .. vocab - 1`. Shapes and values are checked
    when the corpus is built (`ValueError` naming the field).
    """

    ids: np.ndarray
    tokens: np.ndarray
    prompt_len: np.ndarray
    vocab: int | None = None

    def __post_init__(self) -> None:
        ids, tokens, prompt_len = (np.asarray(x) for x in (self.ids, self.tokens, self.prompt_len))
        if tokens.ndim != 2:
            raise ValueError(f"`tokens` must be `(N, seq_len)`, got shape `{tokens.shape}`.")
        for name, arr in (("ids", ids), ("prompt_len", prompt_len)):
            if arr.shape != tokens.shape[:1]:
                raise ValueError(
                    f"`{name}` has shape `{arr.shape}` but `tokens` has `{tokens.shape[0]}` rows."
                )
        for name, arr in (("ids", ids), ("tokens", tokens), ("prompt_len", prompt_len)):
            if not np.issubdtype(arr.dtype, np.integer):
                raise ValueError(f"`{name}` must be integer, but its dtype is `{arr.dtype}`.")
        if ids.size > 1 and np.any(np.diff(ids) <= 0):
            i = int(np.argmax(np.diff(ids) <= 0))
            raise ValueError(
                f"`ids` must be strictly increasing: `{int(ids[i])}` is followed by "
                f"`{int(ids[i + 1])}` (row {i + 1})."
            )
        longest = (tokens.shape[1] - 3) // 2
        bad = (prompt_len < 1) | (prompt_len > longest)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"`prompt_len` `{int(prompt_len[i])}` of example id `{int(ids[i])}` is outside "
                f"1 to {longest} (rows of `{tokens.shape[1]}` tokens hold 2 L + 3)."
            )
        if self.vocab is not None:
            check_token_ids(tokens, self.vocab, "tokens", ids)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Row indices of example `ids` in this corpus (`ValueError` for an absent id)."""
        ids = np.asarray(ids)
        index = np.searchsorted(self.ids, ids)
        if np.any(index >= len(self.ids)) or np.any(
            self.ids[np.minimum(index, len(self.ids) - 1)] != ids
        ):
            missing = np.setdiff1d(ids, self.ids)[:5].tolist()
            raise ValueError(
                f"Example ids {', '.join(f'`{i}`' for i in missing)} are not in the corpus."
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
    ids = _check_ids(ids, "ids")
    if ids.min() < 0 or ids.max() >= 2**31:
        bad = int(ids[(ids < 0) | (ids >= 2**31)][0])
        raise ValueError(f"Example id `{bad}` in `ids` is outside 0 to 2**31 - 1.")
    ids = ids.astype(np.int32)
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
    return Corpus(ids=ids, tokens=tokens, prompt_len=lengths, vocab=vocab_size(config))


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
    *,
    vocab: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """A Grain pipeline of `steps` shuffled training batches over `ids`.

    Each epoch is a fresh permutation of `ids` drawn from its own key; the
    Grain source holds one row-index vector per batch, gathered with one NumPy
    index per batch (per-example Grain elements cost ~0.4 ms each here).
    Refuses (`HeldoutLeak`) any id of `heldout`: objectives never read a
    held-out example, whatever the caller passes. Refuses (`ValueError`)
    empty `ids`, a `batch_size` or `steps` below 1, ids absent from `corpus`,
    and any token of the rows read outside `0 .. vocab - 1` (`vocab`: the
    model's vocabulary size; default: the corpus's own `vocab`).
    """
    ids = _check_ids(ids, "ids")
    for name, value in (("batch_size", batch_size), ("steps", steps)):
        if not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer, got `{value}`.")
    vocab = corpus.vocab if vocab is None else vocab
    if vocab is None:
        raise ValueError(
            "The vocabulary size is unknown: pass `vocab` (the model's vocabulary) or "
            "build the corpus with `vocab`, so its token ids can be checked."
        )
    leaked = np.intersect1d(ids, heldout)
    if leaked.size:
        raise HeldoutLeak(
            f"Held-out example ids `{leaked[:5].tolist()}` were passed to an objective; "
            f"objectives read training ids only."
        )
    rows = corpus.rows(ids)
    check_token_ids(corpus.tokens[rows], vocab, "corpus.tokens", corpus.ids[rows])
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
