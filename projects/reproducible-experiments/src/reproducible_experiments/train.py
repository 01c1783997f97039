"""Training and evaluation, in dataflow order.

`create_train_state` -> `loss_fn` -> `train_epoch` -> `eval_split` ->
`train_and_evaluate(config)`.

A whole epoch runs inside one jitted `jax.lax.scan` (the XLA CPU runtime is
slow on many tiny dispatches). The model is split once into a static
`GraphDef` and a state of arrays (`nnx.split`); the jitted functions rebuild it
(`nnx.merge`), compute, and return NEW state, so nothing is mutated across the
jit boundary. Randomness: one key from `config.train_seed` (init, shuffling,
dropout) and one from `config.eval_seed` (the split), split before every use.

Nothing here knows about MLflow: `train_and_evaluate` reports each epoch to an
`on_epoch` callback, which is how `tracking` logs metrics while training runs.
"""

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from reproducible_experiments import checkpoint, data
from reproducible_experiments.config import Config
from reproducible_experiments.model import MLP


class TrainingDiverged(RuntimeError):
    """The training loss stopped being a finite number."""


class TrainState(NamedTuple):
    """All state that training changes, passed in and returned.

    Shapes for hidden width `H`: `hidden.kernel` (64, H), `hidden.bias` (H,),
    `head.kernel` (H, 10), `head.bias` (10,), all float32.
    """

    params: nnx.State  # the nnx.Param arrays above
    opt_state: optax.OptState  # Adam moments (same shapes as params) and step count
    key: jax.Array  # shape=(), typed PRNG key: the training stream, split before each use


class Hyper(NamedTuple):
    """Hyperparameters passed as traced scalars, so changing them does not recompile."""

    dropout_rate: jax.Array  # shape=(), float32
    label_smoothing: jax.Array  # shape=(), float32


# Cached so that equal settings give the very same object: it is a static (hashed)
# argument of the jitted functions, and a new object would recompile per run.
@functools.cache
def make_optimizer(learning_rate: float) -> optax.GradientTransformation:
    """Adam with a constant step size."""
    return optax.adam(learning_rate)


def create_train_state(
    config: Config, tx: optax.GradientTransformation, key: jax.Array
) -> tuple[nnx.GraphDef, TrainState]:
    """Initialises model and optimizer from `key` (consumed); returns graph and state."""
    init_key, train_key = jax.random.split(key)
    model = MLP(data.NUM_FEATURES, config.hidden_size, data.NUM_CLASSES, rngs=nnx.Rngs(init_key))
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, TrainState(params, tx.init(params), train_key)


def loss_fn(
    model: MLP,
    images: jax.Array,
    labels: jax.Array,
    hyper: Hyper,
    dropout_key: jax.Array | None,
) -> tuple[jax.Array, jax.Array]:
    """Mean softmax cross-entropy against label-smoothed one-hot targets.

    Args:
      images: float32 `(B, 64)`; labels: int32 `(B,)`.
      dropout_key: a key for dropout masks, or None for evaluation (no dropout).

    Returns `(loss, logits)`: float32 `()` and float32 `(B, 10)`.
    """
    logits = model(images, hyper.dropout_rate, dropout_key)
    one_hot = jax.nn.one_hot(labels, data.NUM_CLASSES, dtype=jnp.float32)
    targets = one_hot * (1.0 - hyper.label_smoothing) + hyper.label_smoothing / data.NUM_CLASSES
    return jnp.mean(optax.softmax_cross_entropy(logits, targets)), logits


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def train_epoch(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    batch_size: int,
    state: TrainState,
    images: jax.Array,
    labels: jax.Array,
    hyper: Hyper,
) -> tuple[TrainState, jax.Array]:
    """One shuffled pass over `images` (float32 `(N, 64)`), `labels` (int32 `(N,)`).

    The `N % batch_size` examples left after the last full batch sit out this
    epoch (a new shuffle next epoch). Returns `(new_state, mean_train_loss)`.
    """
    key, perm_key, dropout_root = jax.random.split(state.key, 3)
    steps = images.shape[0] // batch_size
    order = jax.random.permutation(perm_key, images.shape[0])[: steps * batch_size]
    order = order.reshape(steps, batch_size)
    dropout_keys = jax.random.split(dropout_root, steps)

    def step(carry, xs):
        params, opt_state = carry
        idx, dropout_key = xs

        def pure_loss(p: nnx.State) -> jax.Array:
            model = nnx.merge(graphdef, p)
            return loss_fn(model, images[idx], labels[idx], hyper, dropout_key)[0]

        loss, grads = jax.value_and_grad(pure_loss)(params)
        # optax's bias correction raises a Python float to an int32 count: code written
        # for JAX's standard promotion. Allowed here only, so strict mode checks our code.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, opt_state), losses = jax.lax.scan(
        step, (state.params, state.opt_state), (order, dropout_keys)
    )
    return TrainState(params, opt_state, key), jnp.mean(losses)


@functools.partial(jax.jit, static_argnums=0)
def eval_split(
    graphdef: nnx.GraphDef, params: nnx.State, images: jax.Array, labels: jax.Array
) -> dict[str, jax.Array]:
    """Unsmoothed cross-entropy and accuracy on a whole split, no dropout."""
    model = nnx.merge(graphdef, params)
    none = Hyper(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
    loss, logits = loss_fn(model, images, labels, none, None)
    accuracy = jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))
    return {"loss": loss, "accuracy": accuracy}


@dataclass
class TrainResult:
    """What a run produced.

    `history`: one dict per epoch (`epoch`, `train_loss`, `val_loss`, `val_accuracy`).
    `test`: `test_loss`, `test_accuracy`. Every value is a Python float made from a
    float32, so it survives a round trip through a tracking store bit for bit.
    `params_sha256`: hash of the trained parameter bytes (`checkpoint.digest`).
    `train_s`: wall time of the training loop and evaluations (data loading and
    split excluded).
    """

    config: Config
    split: dict[str, np.ndarray]
    data_identity: dict[str, str]
    history: list[dict[str, float]]
    test: dict[str, float]
    params_sha256: str
    train_s: float
    params: nnx.State  # the trained parameters (see `TrainState`)

    def metric_series(self) -> dict[str, list[tuple[int, float]]]:
        """Every logged metric as `name -> [(step, value), ...]` (step = epoch)."""
        series: dict[str, list[tuple[int, float]]] = {}
        for record in self.history:
            for name, value in record.items():
                if name != "epoch":
                    series.setdefault(name, []).append((int(record["epoch"]), value))
        for name, value in self.test.items():
            series[name] = [(len(self.history), value)]
        return series


def train_and_evaluate(
    config: Config,
    *,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    digits: data.Digits | None = None,
) -> TrainResult:
    """Trains `config` and evaluates on its test split.

    Args:
      config: the run's configuration.
      on_epoch: called with each epoch's metrics as soon as they exist.
      digits: the loaded data set (loaded here when None).

    Raises `TrainingDiverged` when a loss is not finite.
    """
    digits = data.load() if digits is None else digits
    split = data.split_ids(
        digits.labels, jax.random.key(config.eval_seed), config.val_fraction, config.test_fraction
    )
    arrays = {
        name: (jnp.asarray(digits.images[ids]), jnp.asarray(digits.labels[ids]))
        for name, ids in split.items()
    }
    tx = make_optimizer(config.learning_rate)
    graphdef, state = create_train_state(config, tx, jax.random.key(config.train_seed))
    hyper = Hyper(
        jnp.asarray(config.dropout_rate, jnp.float32),
        jnp.asarray(config.label_smoothing, jnp.float32),
    )
    batch_size = min(config.batch_size, len(split["train"]))

    start = time.perf_counter()
    history = []
    for epoch in range(1, config.num_epochs + 1):
        state, train_loss = train_epoch(graphdef, tx, batch_size, state, *arrays["train"], hyper)
        val = jax.device_get(eval_split(graphdef, state.params, *arrays["validation"]))
        record = {
            "epoch": epoch,
            "train_loss": float(train_loss),
            "val_loss": float(val["loss"]),
            "val_accuracy": float(val["accuracy"]),
        }
        if not np.isfinite(record["train_loss"]):
            raise TrainingDiverged(
                f"The training loss is `{record['train_loss']}` at epoch {epoch}; lower "
                f"`learning_rate` (now `{config.learning_rate}`)."
            )
        history.append(record)
        if on_epoch is not None:
            on_epoch(record)
    test = jax.device_get(eval_split(graphdef, state.params, *arrays["test"]))
    train_s = time.perf_counter() - start
    return TrainResult(
        config=config,
        split=split,
        data_identity=data.data_identity(digits, split),
        history=history,
        test={"test_loss": float(test["loss"]), "test_accuracy": float(test["accuracy"])},
        params_sha256=checkpoint.digest(state.params),
        params=state.params,
        train_s=train_s,
    )


def summary(result: TrainResult) -> dict[str, Any]:
    """A short, JSON-ready summary for printing."""
    last = result.history[-1]
    return {
        "test_accuracy": result.test["test_accuracy"],
        "test_loss": result.test["test_loss"],
        "final_val_accuracy": last["val_accuracy"],
        "epochs": len(result.history),
        "train_s": round(result.train_s, 3),
    }
