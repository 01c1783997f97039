"""The workloads of `mlp-classifier bench`: the two settings (`small`, `large`)
of a bench size and one epoch of their batches. `bench.py` runs them.
"""

import dataclasses
import functools
import math
from typing import Any

import click
import jax
import numpy as np

from mlp_classifier import data
from mlp_classifier.config import Config

# --- SIZES -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    """One workload, run identically by every path.

    name: `small` or `large`; prefixes the setting's measurement and ratio keys.
    config: the project config that fixes the model, optimizer, dropout and
      batch size (`Config.seed` fixes the initial weights and data order).
    source: `digits` (the project's train split, padded to whole batches) or
      `synthetic` (uniform [0, 1) features, uniform labels, no padding).
    in_features: input width; 64 for `digits`.
    num_steps: steps per epoch; for `digits`, None means the whole train split.
    threefry_partitionable: the value of `jax.threefry_partitionable` under which
      the setting's paths are built, compiled and run; None leaves JAX's
      setting alone. False (the large setting) draws the same number of
      uniform bits with half the threefry work (`jax.random` hashes pairs of
      counters and keeps both outputs, where the partitionable scheme hashes
      one counter pair per output and xors the two words): other random bits,
      the same model and dropout rate. A bench-only choice; the stage tests
      and `mlp-classifier train` keep JAX's default.
    """

    name: str
    config: Config
    source: str
    in_features: int
    num_steps: int | None
    threefry_partitionable: bool | None = None

    def describe(self) -> dict[str, Any]:
        """The setting as JSON-ready data (also what the config hash covers)."""
        return {
            "config": self.config.model_dump(mode="json"),
            "source": self.source,
            "in_features": self.in_features,
            "num_steps": self.num_steps,
            "threefry_partitionable": self.threefry_partitionable,
        }


@dataclasses.dataclass(frozen=True)
class BenchSize:
    """A full bench run: both settings, `repeats` timed epochs per path, and a
    `gemm_n`-cubed f32 matmul for the FLOP/s ceiling."""

    small: Setting
    large: Setting
    repeats: int
    gemm_n: int


def bench_size(size: str) -> BenchSize:
    """`default`: the measured run (1-3 minutes). `tiny`: the same code on
    toy shapes and 3 repeats, a few seconds, for tests only."""
    base = Config.default()
    if size == "tiny":
        small = Config(**{**base.model_dump(), "hidden_sizes": (16,), "dropout_rate": 0.1})
        large = Config(**{**base.model_dump(), "hidden_sizes": (32, 32), "batch_size": 64})
        return BenchSize(
            small=Setting("small", small, "digits", data.NUM_FEATURES, num_steps=4),
            large=Setting(
                "large", large, "synthetic", 32, num_steps=3, threefry_partitionable=False
            ),
            repeats=3,
            gemm_n=128,
        )
    if size == "default":
        # The project default, widened: same depth as its (256, 128), width 512.
        large_hidden = tuple(512 for _ in base.hidden_sizes) or (512,)
        large = Config(**{**base.model_dump(), "hidden_sizes": large_hidden, "batch_size": 512})
        return BenchSize(
            small=Setting("small", base, "digits", data.NUM_FEATURES, num_steps=None),
            large=Setting(
                "large", large, "synthetic", 512, num_steps=16, threefry_partitionable=False
            ),
            repeats=25,
            gemm_n=2048,
        )
    raise click.BadParameter(f"Unknown bench size `{size}`; use `tiny` or `default`.")


# --- DATA --------------------------------------------------------------------


def make_batches(setting: Setting) -> dict[str, np.ndarray]:
    """One epoch of batches, stacked: `image` float32 `(S, B, F)`, `label`
    int32 `(S, B)`, `mask` bool `(S, B)`. Same setting, same arrays."""
    config = setting.config
    batch_size = config.batch_size
    rng = np.random.default_rng(config.seed)
    if setting.source == "digits":
        digits, ids = _digits_train_split(
            config.split_seed, config.val_fraction, config.test_fraction
        )
        ids = rng.permutation(ids)
        num_steps = math.ceil(len(ids) / batch_size)
        if setting.num_steps is not None:
            num_steps = min(num_steps, setting.num_steps)
        ids = ids[: num_steps * batch_size]
        # The last batch is padded and masked, as in the project's pipeline.
        padded = np.full(num_steps * batch_size, -1)
        padded[: len(ids)] = ids
        images = np.where(padded[:, None] >= 0, digits.images[padded], 0.0).astype(np.float32)
        labels = np.where(padded >= 0, digits.labels[padded], 0).astype(np.int32)
        mask = padded >= 0
    elif setting.source == "synthetic":
        n = setting.num_steps * batch_size
        images = rng.random((n, setting.in_features), dtype=np.float32)
        labels = rng.integers(0, data.NUM_CLASSES, n).astype(np.int32)
        mask = np.ones(n, dtype=bool)
    else:
        raise ValueError(f"Unknown data source `{setting.source}`; use `digits` or `synthetic`.")
    return {
        "image": images.reshape(-1, batch_size, setting.in_features),
        "label": labels.reshape(-1, batch_size),
        "mask": mask.reshape(-1, batch_size),
    }


@functools.cache
def _digits_train_split(
    split_seed: int, val_fraction: float, test_fraction: float
) -> tuple[data.Digits, np.ndarray]:
    """The digits and the project's train IDs; cached because `split_ids`
    compiles a permutation per class size, seconds on a busy 2-core machine."""
    digits = data.load()
    key = jax.random.key(split_seed)
    return digits, data.split_ids(digits.labels, key, val_fraction, test_fraction)["train"]
