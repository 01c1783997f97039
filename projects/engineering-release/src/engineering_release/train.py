"""Training of the released classifier, in dataflow order.

`create_model` -> `loss_fn` -> `train_step` -> `shuffled_batches` -> `train_steps` ->
`predict` ->
`train(config)`.

The model is split once into a static `GraphDef` and its parameters
(`nnx.split`); `train_step` rebuilds the model from the arrays (`nnx.merge`)
and returns NEW arrays. Every step of a run runs inside one jitted
`lax.scan` over precomputed shuffles, so a run compiles once. Every random
number descends from `config.seed` through explicit `jax.random` keys: the
same seed gives the same bits, which is what makes the model's content id
reproducible.
"""

import functools
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from engineering_release import checkpoint, data
from engineering_release.config import TrainConfig
from engineering_release.model import MLP, architecture


class TrainState(NamedTuple):
    # hidden/kernel (64, H), hidden/bias (H,), head/kernel (H, 10), head/bias (10,): float32
    params: nnx.State
    opt_state: optax.OptState  # Adam moments, same shapes as params, and a count ()


def create_model(hidden_size: int, key: jax.Array) -> MLP:
    """A freshly initialised MLP; `key` is consumed."""
    return MLP(hidden_size, rngs=nnx.Rngs(params=key))


def loss_fn(model: MLP, images: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy; `images` float32 `(B, 64)`, `labels` int32 `(B,)`."""
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@functools.cache
def _optimizer(learning_rate: float) -> optax.GradientTransformation:
    # Cached: `train_epochs` takes the optimizer as a static argument; one object
    # per learning rate avoids a recompile per run.
    return optax.adam(learning_rate)


def train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    params: nnx.State,
    opt_state: optax.OptState,
    images: jax.Array,
    labels: jax.Array,
) -> tuple[nnx.State, optax.OptState, jax.Array]:
    """One Adam step. Pure: returns new params and optimizer state, and the loss."""

    def pure_loss(p: nnx.State) -> jax.Array:
        return loss_fn(nnx.merge(graphdef, p), images, labels)

    loss, grads = jax.value_and_grad(pure_loss)(params)
    # optax's bias correction mixes a Python float with an int32 count.
    with jax.numpy_dtype_promotion("standard"):
        updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def shuffled_batches(key: jax.Array, num_examples: int, num_epochs: int, batch_size: int):
    """Row indices int32 `(num_epochs * num_batches, batch_size)`: one permutation
    per epoch (its own key), cut into batches; each epoch drops its remainder."""
    num_batches = num_examples // batch_size
    keys = jax.random.split(key, num_epochs)
    orders = jax.vmap(lambda k: jax.random.permutation(k, num_examples))(keys)
    return orders[:, : num_batches * batch_size].reshape(-1, batch_size).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 1))
def train_steps(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    state: TrainState,
    images: jax.Array,
    labels: jax.Array,
    batches: jax.Array,
) -> tuple[TrainState, jax.Array]:
    """Every step of the run in one `lax.scan` over `batches` (row indices, one
    row per step); returns the final state and the loss of each step."""

    def step(state: TrainState, idx: jax.Array) -> tuple[TrainState, jax.Array]:
        params, opt_state = state
        params, opt_state, loss = train_step(
            graphdef, tx, params, opt_state, images[idx], labels[idx]
        )
        return TrainState(params, opt_state), loss

    return jax.lax.scan(step, state, batches)


@functools.partial(jax.jit, static_argnums=0)
def predict(graphdef: nnx.GraphDef, params: nnx.State, images: jax.Array) -> jax.Array:
    """Logits float32 `(B, 10)` for raw pixels float32 `(B, 64)`."""
    return nnx.merge(graphdef, params)(images)


@dataclass
class Trained:
    """A finished run: the artifact's content (`params` flat, by path) and its record."""

    config: TrainConfig
    graphdef: nnx.GraphDef
    params: dict[str, np.ndarray]
    epoch_losses: list[float]
    golden_inputs: np.ndarray  # float32 (golden_count, 64): held-out rows
    golden_logits: np.ndarray  # float32 (golden_count, 10): this model's logits on them


def train(config: TrainConfig) -> Trained:
    """Trains `config` on the training split; nothing is written to disk."""
    examples = data.train_set(config.split_seed, config.test_fraction)
    key = jax.random.key(config.seed)
    key, init_key = jax.random.split(key)
    model = create_model(config.hidden_size, init_key)
    graphdef, params = nnx.split(model, nnx.Param)
    tx = _optimizer(config.learning_rate)
    batches = shuffled_batches(key, len(examples.ids), config.num_epochs, config.batch_size)
    state = TrainState(params, tx.init(params))
    state, losses = train_steps(
        graphdef, tx, state, jnp.asarray(examples.images), jnp.asarray(examples.labels), batches
    )
    losses = np.asarray(losses).reshape(config.num_epochs, -1).mean(axis=1)
    heldout = data.heldout_set(config.split_seed, config.test_fraction)
    golden_inputs = heldout.images[: config.golden_count]
    golden_logits = np.asarray(predict(graphdef, state.params, jnp.asarray(golden_inputs)))
    return Trained(
        config=config,
        graphdef=graphdef,
        params=checkpoint.flatten(state.params),
        epoch_losses=[float(v) for v in losses],
        golden_inputs=golden_inputs,
        golden_logits=golden_logits,
    )


def write_model(trained: Trained, directory) -> None:
    """Writes the trained model as a canonical artifact directory (see `checkpoint`)."""
    checkpoint.write_artifact(
        directory,
        architecture=architecture(trained.config.hidden_size),
        params=trained.params,
        golden_inputs=trained.golden_inputs,
        golden_logits=trained.golden_logits,
        training=trained.config.to_dict(),
    )
