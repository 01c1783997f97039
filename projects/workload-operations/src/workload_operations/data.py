"""Synthetic data and the Grain pipeline whose iterator state a checkpoint keeps.

The data set is a fixed random teacher network's labels on Gaussian inputs,
generated from `config.data_seed` through `jax.random`: training rows and a
separate held-out set (another key). A sample ID is a training row index.
Grain shuffles the IDs, cuts them into full batches (the partial batch at an
epoch's end is dropped) and repeats; the iterator's position is plain state
(`get_state()` / `set_state()`), so a restored iterator yields the same next
batch as an uninterrupted one.
"""

from functools import partial

import grain
import jax
import jax.numpy as jnp
import numpy as np

from workload_operations.config import Config


def make_dataset(config: Config) -> dict[str, np.ndarray]:
    """`x` float32 `(num_examples, num_features)`, `y` int32 `(num_examples,)`, and the
    held-out `heldout_x` float32 `(heldout_examples, num_features)`, `heldout_y` int32."""
    arrays = _generate(
        jax.random.key(config.data_seed),
        (config.num_examples, config.heldout_examples, config.num_features, config.num_classes),
    )
    return {name: np.asarray(value) for name, value in arrays.items()}


@partial(jax.jit, static_argnums=1)
def _generate(key: jax.Array, sizes: tuple[int, int, int, int]) -> dict[str, jax.Array]:
    """One compiled program for the whole data set: a job starts faster with fewer compiles."""
    num_examples, heldout_examples, num_features, num_classes = sizes
    key_x, key_w, key_h = jax.random.split(key, 3)
    teacher = jax.random.normal(key_w, (num_features, num_classes))
    x = jax.random.normal(key_x, (num_examples, num_features))
    hx = jax.random.normal(key_h, (heldout_examples, num_features))
    return {
        "x": x,
        "y": jnp.argmax(x @ teacher, axis=-1).astype(jnp.int32),
        "heldout_x": hx,
        "heldout_y": jnp.argmax(hx @ teacher, axis=-1).astype(jnp.int32),
    }


class Lookup(grain.transforms.Map):
    """Turns a batch of sample IDs into `ids` int32 `(B,)`, `x` `(B, F)`, `y` `(B,)`."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def map(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = np.asarray(ids, np.int64)
        return {"ids": ids.astype(np.int32), "x": self.x[ids], "y": self.y[ids]}


def id_batches(config: Config) -> grain.MapDataset:
    """Element `i` is the `i`-th batch of sample IDs (shuffled once per epoch)."""
    batches_per_epoch = config.num_examples // config.batch_size
    epochs = -(-config.num_steps // batches_per_epoch)
    return (
        grain.MapDataset.range(config.num_examples)
        .shuffle(seed=config.data_seed)
        .batch(config.batch_size, drop_remainder=True)
        .repeat(epochs)
    )


def iterator(config: Config, dataset: dict[str, np.ndarray]) -> grain.DatasetIterator:
    """Batches in step order; step `s` (1-based) reads element `s - 1`.

    No reader threads: each batch is produced inside `next()`, so the job's
    CPU use is its steps alone (Grain's default 16 threads would oversubscribe
    a 2-core machine), and the iterator state is exactly the steps consumed."""
    options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    mapped = id_batches(config).map(Lookup(dataset["x"], dataset["y"]))
    return iter(mapped.to_iter_dataset(options))


def ids_for_step(config: Config, step: int) -> list[int]:
    """The sample IDs of step `step` (1-based), computed without an iterator."""
    return [int(i) for i in id_batches(config)[step - 1]]
