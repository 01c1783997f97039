"""Training machinery shared by every lab, in dataflow order:

    create_train_state -> (a lab's loss_fn) -> train_step -> eval_step -> fit

The explicit NNX form: `nnx.split(model, wrt, ...)` separates the trainable
state from the frozen state (everything else: LoRA's base weights, DPO's
reference model); a pure jitted step differentiates the trainable state
only, and `nnx.merge` rebuilds the model. The optimizer state is built from
the trainable state alone.

Every `fit` records, in its `Ledger`, the example ids its objective read, so
the held-out checks (stage 7) can prove no held-out id entered an objective.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import click
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from training_methods.config import Config
from training_methods.data import Corpus, batches, check_token_ids, vocab_size


class TrainState(NamedTuple):
    trainable: nnx.State  # the differentiated leaves (float, model shapes)
    frozen: nnx.State  # everything else, never updated
    opt_state: Any  # optax state of `trainable` only
    step: jax.Array  # shape=(), int32


class Ledger:
    """The example ids each objective read: `{objective name: set of ids}`."""

    def __init__(self) -> None:
        self.read: dict[str, set[int]] = {}

    def add(self, objective: str, ids: np.ndarray) -> None:
        self.read.setdefault(objective, set()).update(int(i) for i in np.asarray(ids).ravel())


def optimizer(config: Config) -> optax.GradientTransformation:
    """AdamW without weight decay: adapters and policies drift only by their gradient."""
    return optax.adamw(config.learning_rate, weight_decay=0.0)


def create_train_state(model: nnx.Module, tx, wrt: Any = nnx.Param):
    """`(graphdef, TrainState)`: `wrt` (an NNX filter) selects the trainable leaves."""
    graphdef, trainable, frozen = nnx.split(model, wrt, ...)
    return graphdef, TrainState(trainable, frozen, tx.init(trainable), jnp.zeros((), jnp.int32))


def make_train_step(graphdef, tx, loss_fn: Callable) -> Callable:
    """A jitted `step(state, batch, key) -> (state, loss, aux)`.

    `loss_fn(model, batch, key) -> (loss, aux)` is the lab's objective.
    """

    @jax.jit
    def train_step(state: TrainState, batch, key):
        def objective(trainable):
            model = nnx.merge(graphdef, trainable, state.frozen)
            return loss_fn(model, batch, key)

        (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(state.trainable)
        # optax mixes weak Python scalars with arrays inside its update.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = tx.update(grads, state.opt_state, state.trainable)
            trainable = optax.apply_updates(state.trainable, updates)
        return TrainState(trainable, state.frozen, opt_state, state.step + 1), loss, aux

    return train_step


def next_token_logits(model, tokens):
    """Decoder logits for targets `tokens[:, 1:]`: `(B, T-1, V)`."""
    return model(tokens[:, :-1])


@nnx.jit
def eval_step(model, tokens, prompt_len):
    """Per-example exact answer correctness (bool `(B,)`) and per-example
    response loss sum and token count, teacher-forced.

    An example is correct when the argmax at every response position (the
    response symbols and EOS) is the right token; then greedy decoding from
    the prompt writes exactly the answer.
    """
    from training_methods.sft import response_mask  # stage 3's mask

    logits = next_token_logits(model, tokens)
    targets = tokens[:, 1:]
    mask = response_mask(targets, prompt_len)
    hit = (jnp.argmax(logits, -1) == targets) | ~mask
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.all(hit, axis=1), jnp.sum(jnp.where(mask, ce, 0.0), 1), jnp.sum(mask, 1)


def evaluate(model, corpus: Corpus, ids: np.ndarray, batch_size: int = 256) -> dict[str, float]:
    """Answer accuracy and per-token response loss over examples `ids`.

    Refuses (`ValueError`) empty `ids`, ids absent from `corpus` and tokens
    outside the model's vocabulary.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(
            f"`ids` must be a non-empty 1-D vector of example ids, got shape `{ids.shape}`."
        )
    rows = corpus.rows(ids)
    check_token_ids(corpus.tokens[rows], model.vocab, "corpus.tokens", corpus.ids[rows])
    correct, loss_sum, count = [], [], []
    for start in range(0, len(ids), batch_size):
        b = corpus.take(ids[start : start + batch_size])
        c, s, n = eval_step(model, jnp.asarray(b["tokens"]), jnp.asarray(b["prompt_len"]))
        correct.append(np.asarray(c))
        loss_sum.append(np.asarray(s, np.float64))
        count.append(np.asarray(n))
    correct, loss_sum, count = map(np.concatenate, (correct, loss_sum, count))
    return {
        "answer_accuracy": float(correct.mean()),
        "loss": float(loss_sum.sum() / max(count.sum(), 1)),
        "examples": int(len(ids)),
    }


def fit(
    model: nnx.Module,
    loss_fn: Callable,
    config: Config,
    corpus: Corpus,
    train_ids: np.ndarray,
    heldout_ids: np.ndarray,
    *,
    steps: int,
    key: jax.Array,
    objective: str,
    wrt: Any = nnx.Param,
    ledger: Ledger | None = None,
    progress: bool = False,
    tx: optax.GradientTransformation | None = None,
    prepare: Callable[[dict, int], dict] | None = None,
) -> tuple[nnx.Module, dict[str, Any]]:
    """Trains `model` on `loss_fn` for `steps` batches of `train_ids`.

    `prepare(batch, step)`, if given, turns each host batch into the lab's
    batch (e.g. preference pairs). Returns the trained model (a new object;
    `model` is left as it was) and a
    history `{"loss": [...], "opt_state": ..., "trainable": ...}`.

    Refuses (`ValueError`) empty `train_ids`, `steps` below 1, and (through
    `data.batches`) held-out ids, ids absent from `corpus` and tokens outside
    the config's vocabulary, before anything is compiled.
    """
    train_ids = np.asarray(train_ids)
    if train_ids.ndim != 1 or train_ids.size == 0:
        raise ValueError(
            f"`train_ids` must be a non-empty 1-D vector of example ids, got shape "
            f"`{train_ids.shape}`."
        )
    if not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError(f"`steps` must be a positive integer, got `{steps}`.")
    key, k_data = jax.random.split(key)
    stream = batches(
        corpus,
        train_ids,
        heldout_ids,
        config.batch_size,
        k_data,
        steps,
        vocab=vocab_size(config),
    )
    if tx is None:
        tx = optimizer(config)
        graphdef, state = create_train_state(model, tx, wrt)
        step_fn = _cached_step(graphdef, loss_fn, config.learning_rate)
    else:
        graphdef, state = create_train_state(model, tx, wrt)
        step_fn = make_train_step(graphdef, tx, loss_fn)
    losses = []
    with (
        click.progressbar(length=steps, label=objective, file=None) if progress else _Null() as bar
    ):
        for _ in range(steps):
            batch = next(stream)
            if ledger is not None:
                ledger.add(objective, batch["id"])
            if prepare is not None:
                batch = prepare(batch, len(losses))
            key, k_step = jax.random.split(key)
            state, loss, _ = step_fn(state, {k: jnp.asarray(v) for k, v in batch.items()}, k_step)
            losses.append(loss)
            bar.update(1)
    trained = nnx.merge(graphdef, state.trainable, state.frozen)
    return trained, {
        "loss": [float(x) for x in jax.device_get(losses)],
        "opt_state": state.opt_state,
        "trainable": state.trainable,
        "frozen": state.frozen,
    }


@functools.lru_cache(maxsize=32)
def _cached_step(graphdef, loss_fn, learning_rate):
    # One compiled step per (model structure, objective, optimizer): repeated
    # runs of a lab (other seeds, other data) reuse the compilation.
    return make_train_step(graphdef, optax.adamw(learning_rate, weight_decay=0.0), loss_fn)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n):
        del n
