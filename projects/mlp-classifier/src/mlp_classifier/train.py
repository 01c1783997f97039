"""Training and evaluation, in dataflow order.

`create_train_state` -> `loss_fn` -> `train_step` -> `eval_step` ->
`train_and_evaluate(config, workdir)`.

The steps use the explicit form of NNX under `jax.jit`: the model is split
once into a static `GraphDef` and arrays (`nnx.split`); each jitted step
rebuilds a model from the arrays (`nnx.merge`), computes, and returns NEW
arrays. Nothing is mutated across the jit boundary, so the caller's
`TrainState` is a plain value. (`nnx.jit` does the same bookkeeping for you,
but walks the object graph in Python on every call; `mlp-classifier bench`
measures what that costs for this model.)
"""

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mlp_classifier import checkpoint, data
from mlp_classifier.config import Config
from mlp_classifier.model import MLP

Batch = dict[str, jax.Array]


class TrainState(NamedTuple):
    """All state that training changes: a pytree of arrays, passed in and returned.

    Shapes for layer widths `w_0 = 64, w_1, ..., w_L = 10` (layer i maps w_i to w_i+1).
    """

    params: nnx.State  # every nnx.Param: `kernel` (w_i, w_i+1) and `bias` (w_i+1,), float32
    rng: nnx.State  # dropout stream: `key` shape=() typed PRNG key, `count` shape=() uint32
    opt_state: optax.OptState  # optimizer moments, same shapes as `params`; step counts
    step: jax.Array  # shape=(), int32: optimizer steps taken


def make_optimizer(config: Config) -> optax.GradientTransformation:
    """The optax optimizer named by `config.optimizer`, with a constant step size."""
    return _optimizer(config.optimizer, config.learning_rate, config.momentum, config.weight_decay)


# Cached so that equal settings give the very same object: `train_step` takes `tx`
# as a static (hashed) argument, and a new object would force a recompile per run.
@functools.cache
def _optimizer(
    name: str, learning_rate: float, momentum: float, weight_decay: float
) -> optax.GradientTransformation:
    if name == "sgd":
        return optax.sgd(learning_rate, momentum=momentum)
    return optax.adamw(learning_rate, weight_decay=weight_decay)


def create_model(config: Config, key: jax.Array) -> MLP:
    """A freshly initialised MLP; `key` is consumed (split into init and dropout keys)."""
    init_key, dropout_key = jax.random.split(key)
    return MLP(
        data.NUM_FEATURES,
        config.hidden_sizes,
        data.NUM_CLASSES,
        config.dropout_rate,
        rngs=nnx.Rngs(params=init_key, dropout=dropout_key),
    )


def create_train_state(
    config: Config, tx: optax.GradientTransformation, key: jax.Array
) -> tuple[nnx.GraphDef, TrainState]:
    """Initialises the model and optimizer; returns the static graph and the state."""
    model = create_model(config, key)
    graphdef, params, rng = nnx.split(model, nnx.Param, nnx.RngState)
    state = TrainState(params, rng, tx.init(params), jnp.zeros((), jnp.int32))
    return graphdef, state


def loss_fn(model: MLP, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Softmax cross-entropy averaged over the valid rows of `batch`.

    Args:
      model: the MLP, in train or eval mode.
      batch: `image` float32 `(B, 64)`, `label` int32 `(B,)`, `mask` bool `(B,)`.
        Rows with `mask == False` are padding: they contribute nothing.

    Returns:
      `(loss, logits)`: loss float32 `()`, logits float32 `(B, num_classes)`.

    Cases:
      every row valid -> the plain mean over the B rows. [claim:loss-masked-mean]
      some rows padding -> the mean over the valid rows only; changing the padded
        rows' images or labels changes no bit of the loss. [claim:loss-masked-mean]
      no valid row -> exactly 0.0, not 0 / 0 = NaN (divide by `max(count, 1)`).
        [claim:loss-all-padding-is-zero]
    Under the tests' strict dtype promotion `mask` is bool and its sum an integer:
    cast it to the loss dtype before multiplying or dividing (`float32 * bool` raises).
    """
    # --- exercise stage 2: Mean cross-entropy over rows whose mask is True only. ---
    logits = model(batch["image"])
    per_example = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    weights = batch["mask"].astype(per_example.dtype)
    # max(., 1) keeps an all-padding batch at loss 0 instead of 0/0 = NaN.
    loss = jnp.sum(per_example * weights) / jnp.maximum(jnp.sum(weights), 1.0)
    return loss, logits
    # --- end exercise ---


def _batch_counts(logits: jax.Array, batch: Batch) -> dict[str, jax.Array]:
    """Number of valid rows and of correct predictions among them, int32 `()`."""
    correct = (jnp.argmax(logits, axis=-1) == batch["label"]) & batch["mask"]
    return {"count": jnp.sum(batch["mask"], dtype=jnp.int32), "correct": jnp.sum(correct)}


@functools.partial(jax.jit, static_argnums=(0, 1))
def train_step(
    graphdef: nnx.GraphDef, tx: optax.GradientTransformation, state: TrainState, batch: Batch
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on `batch`, dropout on. Pure: returns the new state.

    Returns `(new_state, metrics)`; metrics: `loss` float32 `()` (mean over valid
    rows), `count` and `correct` int32 `()`, at the parameters the step started
    from. [claim:step-metrics]

    The new state, as the tests check it:
      params -> `optax.apply_updates(params, updates)` with `tx.update(grads,
        opt_state, params)`, grads of `pure_loss` at `state.params` and `state.rng`
        (optax's updates already point downhill: add them). [claim:step-applies-optax]
      rng -> the RngState `pure_loss` returns (advanced one draw per hidden layer),
        never `state.rng`, or every step would draw the same dropout masks.
        [claim:step-advances-the-rng]
      step -> `state.step + 1`, int32. [claim:step-counts]
    Under the tests' strict dtype promotion optax's Adam bias correction (a Python
    float raised to the int32 count) raises: call `tx.update` inside
    `with jax.numpy_dtype_promotion("standard"):`, and only there.
    """

    def pure_loss(
        params: nnx.State, rng: nnx.State
    ) -> tuple[jax.Array, tuple[jax.Array, nnx.State]]:
        # copy=True: fresh Variables owned by this trace, so dropout may advance them.
        model = nnx.merge(graphdef, params, rng, copy=True)
        model.train()  # Dropout on. Only this traced copy changes mode.
        loss, logits = loss_fn(model, batch)  # In-place update: advances the dropout RngCount.
        # Read the advanced RNG state back out, so that it is returned, not lost.
        return loss, (logits, nnx.state(model, nnx.RngState))

    # --- exercise stage 2: Grad of pure_loss, optax update, keep the advanced RNG. ---
    (loss, (logits, rng)), grads = jax.value_and_grad(pure_loss, has_aux=True)(
        state.params, state.rng
    )
    # optax's bias correction raises a Python float to an int32 count: code written for
    # JAX's standard promotion. Allow it here only, so strict mode still checks our own code.
    with jax.numpy_dtype_promotion("standard"):
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(params, rng, opt_state, state.step + 1)
    # --- end exercise ---
    return new_state, {"loss": loss, **_batch_counts(logits, batch)}


@functools.partial(jax.jit, static_argnums=0)
def eval_step(graphdef: nnx.GraphDef, state: TrainState, batch: Batch) -> dict[str, jax.Array]:
    """Loss and predictions on `batch` with dropout off. Reads `state`, returns no state.

    Returns: `loss` float32 `()`, `count`, `correct` int32 `()`, `predictions`
    int32 `(B,)`.
    """
    model = nnx.merge(graphdef, state.params, state.rng)
    model.eval()  # Dropout off: deterministic, and the RNG is never drawn from.
    loss, logits = loss_fn(model, batch)
    predictions = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return {"loss": loss, "predictions": predictions, **_batch_counts(logits, batch)}


def evaluate(
    graphdef: nnx.GraphDef, state: TrainState, batches: Iterable[dict[str, np.ndarray]]
) -> dict[str, Any]:
    """Mean loss and accuracy over all valid rows of `batches`, with per-example results.

    Returns: `loss`, `accuracy` (floats), `count` (int), and NumPy arrays `ids`,
    `labels`, `predictions` of shape `(count,)`, in batch order.
    """
    loss_sum, correct, count = 0.0, 0, 0
    ids, labels, predictions = [], [], []
    for batch in batches:
        valid = batch["mask"]
        ids.append(batch["id"][valid])
        labels.append(batch["label"][valid])
        inputs = {name: batch[name] for name in ("image", "label", "mask")}
        out = jax.device_get(eval_step(graphdef, state, inputs))
        loss_sum += float(out["loss"]) * int(out["count"])
        correct += int(out["correct"])
        count += int(out["count"])
        predictions.append(out["predictions"][valid])
    return {
        "loss": loss_sum / max(count, 1),
        "accuracy": correct / max(count, 1),
        "count": count,
        "ids": np.concatenate(ids),
        "labels": np.concatenate(labels),
        "predictions": np.concatenate(predictions),
    }


@dataclass
class RunResult:
    """What a run produced. `metrics` is the JSON-ready record that `reproduce`
    compares bit for bit; `train_ids_seen` holds every sample ID the training
    loop consumed (valid rows only), for the leakage check."""

    config: Config
    split: dict[str, np.ndarray]
    metrics: dict[str, Any]
    graphdef: nnx.GraphDef
    state: TrainState
    test_images: dict[int, np.ndarray]
    train_ids_seen: np.ndarray
    wall_s: float


def train_and_evaluate(
    config: Config,
    workdir: str | Path | None = None,
    *,
    overwrite: bool = False,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Trains `config`, evaluates on the test split, and writes a run dossier.

    Args:
      config: the run's configuration.
      workdir: the dossier directory; None trains without writing anything.
      overwrite: replace an existing dossier at `workdir` instead of refusing.
      progress: called with each epoch's metrics as soon as they exist.
    """
    # Imported here: plots pull in matplotlib, which a run without a workdir never needs.
    from mlp_classifier import dossier

    start = time.perf_counter()
    if workdir is not None:
        dossier.check_writable(workdir, overwrite=overwrite)  # Fail before training, not after.

    digits = data.load()
    split = data.split_ids(
        digits.labels, jax.random.key(config.split_seed), config.val_fraction, config.test_fraction
    )
    key = jax.random.key(config.seed)
    key, model_key = jax.random.split(key)
    tx = make_optimizer(config)
    graphdef, state = create_train_state(config, tx, model_key)

    history, seen = [], []
    for epoch in range(1, config.num_epochs + 1):
        key, shuffle_key = jax.random.split(key)
        batches = data.dataset(
            digits, split["train"], config.batch_size, seed=data.shuffle_seed(shuffle_key)
        )
        sums = {
            "loss": jnp.zeros(()),
            "count": jnp.zeros((), jnp.int32),
            "correct": jnp.zeros((), jnp.int32),
        }
        for batch in batches:
            # Record what the loop consumes: the leakage test checks these IDs.
            seen.append(batch.pop("id")[batch["mask"]])
            state, step_metrics = train_step(graphdef, tx, state, batch)
            # Summed on device; read back once per epoch, not once per step.
            sums = {
                "loss": sums["loss"] + step_metrics["loss"] * step_metrics["count"].astype(float),
                "count": sums["count"] + step_metrics["count"],
                "correct": sums["correct"] + step_metrics["correct"],
            }
        sums = jax.device_get(sums)
        val = evaluate(graphdef, state, data.dataset(digits, split["validation"], 256))
        record = {
            "epoch": epoch,
            "train_loss": float(sums["loss"]) / int(sums["count"]),
            "train_accuracy": int(sums["correct"]) / int(sums["count"]),
            "val_loss": val["loss"],
            "val_accuracy": val["accuracy"],
        }
        history.append(record)
        if progress is not None:
            progress(record)

    test = evaluate(graphdef, state, data.dataset(digits, split["test"], 256))
    confusion = np.zeros((data.NUM_CLASSES, data.NUM_CLASSES), np.int64)
    np.add.at(confusion, (test["labels"], test["predictions"]), 1)
    wrong = test["predictions"] != test["labels"]
    metrics = {
        "epochs": history,
        "test": {"loss": test["loss"], "accuracy": test["accuracy"], "count": test["count"]},
        "confusion_matrix": confusion.tolist(),  # rows: true label, columns: prediction
        "misclassified": [
            {"id": int(i), "label": int(y), "prediction": int(p)}
            for i, y, p in zip(
                test["ids"][wrong], test["labels"][wrong], test["predictions"][wrong], strict=True
            )
        ],
        "state_sha256": checkpoint.digest(state),
    }
    result = RunResult(
        config=config,
        split=split,
        metrics=metrics,
        graphdef=graphdef,
        state=state,
        test_images={int(i): digits.images[i] for i in test["ids"][wrong]},
        train_ids_seen=np.concatenate(seen),
        wall_s=time.perf_counter() - start,
    )
    if workdir is not None:
        dossier.write(result, workdir, overwrite=overwrite)
    return result
