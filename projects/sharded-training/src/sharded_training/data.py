"""Synthetic data and the Grain pipeline that feeds each process its own shard.

The data set is a fixed random teacher network's labels on Gaussian inputs,
generated from `config.data_seed` through `jax.random`; a sample ID is a row
index. Grain shuffles the IDs afresh every epoch and cuts each epoch into global
batches of `batch_size`; the last batch of an epoch is padded with ID -1 and a
zero mask. Process `p` of `P` keeps rows `[p*B/P, (p+1)*B/P)` of every global
batch and looks up only those rows: no process ever holds another's examples.
The iterator's state (a position in this sequence) is what a checkpoint keeps.
"""

from typing import Any

import grain
import jax
import numpy as np

from sharded_training.config import Config

PAD_ID = -1


def make_dataset(config: Config) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels): float32 `(num_examples, num_features)`, int32 `(num_examples,)`."""
    key_x, key_w = jax.random.split(jax.random.key(config.data_seed))
    features = jax.random.normal(key_x, (config.num_examples, config.num_features))
    teacher = jax.random.normal(key_w, (config.num_features, config.num_classes))
    labels = jax.numpy.argmax(features @ teacher, axis=-1)
    return np.asarray(features, np.float32), np.asarray(labels, np.int32)


def global_id_batches(config: Config) -> grain.MapDataset:
    """Element `i` is the `i`-th global batch of sample IDs, length `<= batch_size`."""
    batches_per_epoch = -(-config.num_examples // config.batch_size)
    epochs = -(-config.num_steps // batches_per_epoch)
    return (
        grain.MapDataset.range(config.num_examples)
        .shuffle(seed=config.data_seed)
        .batch(config.batch_size, drop_remainder=False)
        .repeat(epochs)
    )


def process_rows(batch_size: int, process_index: int, process_count: int) -> slice:
    """The rows of every global batch that process `process_index` of
    `process_count` loads: one contiguous block, in process order, so that the
    data axis of the mesh (devices ordered by process) gets them in place.

    Raises `ValueError` unless `0 <= process_index < process_count` and the batch
    divides into `process_count` equal, non-empty blocks [claim:process-rows-refusals].

    Cases (returned as a `slice`, which the caller indexes a batch with):
      `(16, 0, 1)` -> rows 0-15.  `(16, 1, 2)` -> rows 8-15.  `(16, 3, 4)` -> rows 12-15
      [claim:process-rows-contiguous-blocks].
    """
    if process_count < 1:
        raise ValueError(f"`process_count` must be at least 1, not `{process_count}`.")
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"`process_index` must be from 0 to {process_count - 1}, not `{process_index}`."
        )
    if batch_size < 1 or batch_size % process_count:
        raise ValueError(
            f"`batch_size` = `{batch_size}` does not divide into {process_count} equal, "
            f"non-empty blocks of rows."
        )
    # --- exercise stage 2: Process p owns rows [p * B / P, (p + 1) * B / P) of each batch. ---
    per_process = batch_size // process_count
    return slice(process_index * per_process, (process_index + 1) * per_process)
    # --- end exercise ---


class LocalShard(grain.transforms.Map):
    """Pads a global batch of IDs to `batch_size`, keeps this process's rows and
    looks up only their features and labels."""

    def __init__(self, config: Config, process_index: int, process_count: int, data=None):
        self.batch_size = config.batch_size
        self.rows = (
            slice(0, config.batch_size)
            if process_count == 1
            else process_rows(config.batch_size, process_index, process_count)
        )
        self.features, self.labels = make_dataset(config) if data is None else data

    def map(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        padded = np.full(self.batch_size, PAD_ID, np.int64)
        padded[: len(ids)] = ids
        mine = padded[self.rows]
        valid = mine != PAD_ID
        rows = np.where(valid, mine, 0)
        return {
            "ids": mine.astype(np.int32),
            "x": self.features[rows],
            "y": self.labels[rows],
            "mask": valid.astype(np.float32),
        }


def local_iterator(
    config: Config,
    process_index: int = 0,
    process_count: int = 1,
    data=None,
    steps_per_item: int = 1,
    read_threads: int = 1,
    prefetch_steps: int = 2,
) -> grain.DatasetIterator:
    """This process's batches, in step order. Dict of `ids` int32 `(B/P,)`, `x` float32
    `(B/P, num_features)`, `y` int32 `(B/P,)`, `mask` float32 `(B/P,)`; with
    `steps_per_item` = K > 1, K consecutive batches stacked on a leading axis.

    One reader thread and a small prefetch: Grain's defaults (16 threads) would
    oversubscribe a 2-core machine. The reader prefetches up to `prefetch_steps`
    steps of input (rounded up to whole items); `read_threads=0` produces every
    batch inside `next()`, in the caller's thread.
    """
    if config.batch_size % process_count:
        raise ValueError(
            f"`batch_size` = `{config.batch_size}` does not divide over `{process_count}` "
            f"processes; use a multiple of {process_count}."
        )
    dataset = global_id_batches(config).map(LocalShard(config, process_index, process_count, data))
    if steps_per_item > 1:
        dataset = dataset.batch(steps_per_item, drop_remainder=True)
    buffer = -(-prefetch_steps // steps_per_item) if read_threads else 0
    options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=buffer)
    return iter(dataset.to_iter_dataset(options))


def global_ids_for_step(config: Config, step: int) -> list[int]:
    """The IDs of global batch `step` (0-based), computed without the iterator."""
    return [int(i) for i in global_id_batches(config)[step]]


def batch_as_numpy(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in batch.items()}
