"""Brief training of the source models, so that the weights being converted
are trained weights (BatchNorm running statistics away from 0 and 1,
attention that attends), not an initialisation.

    train_torch(config, split) -> TorchSource    Adam, cross-entropy, NCHW
    train_keras(config, split) -> KerasSource    Adam, cross-entropy, NHWC

Seconds on a 2-core CPU; the held-out accuracy is reported so a person can
see that the source model learned something (about 0.9 after 3 epochs).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from weight_conversion import data, sources
from weight_conversion.config import Config


class TorchSource(NamedTuple):
    model: sources.TorchDigitNet  # in eval mode after training
    losses: list[float]  # mean training loss per epoch
    test_accuracy: float  # on the held-out split


class KerasSource(NamedTuple):
    model: Any  # the Keras model
    losses: list[float]
    test_accuracy: float


def train_torch(
    config: Config,
    split: data.Split,
    progress: Callable[[str], None] | None = None,
    dtype: torch.dtype = torch.float32,
) -> TorchSource:
    """Trains `TorchDigitNet` for `config.epochs` epochs; returns it in eval mode.

    One intra-op thread: the ops are tiny, a second thread only adds
    synchronisation, and one thread makes the sums' order fixed."""
    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    model = sources.TorchDigitNet(config.arch).to(dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.from_numpy(data.nchw(split.train_images)).to(dtype)
    y = torch.from_numpy(split.train_labels)
    order_rng = np.random.default_rng(config.seed)
    losses = []
    for epoch in range(config.epochs):
        model.train()
        order = torch.from_numpy(order_rng.permutation(len(y)))
        total, count = 0.0, 0
        for start in range(0, len(y), config.batch_size):
            idx = order[start : start + config.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
            count += len(idx)
        losses.append(total / count)
        if progress:
            progress(f"torch epoch {epoch + 1}/{config.epochs}: loss {losses[-1]:.4f}")
    model.eval()
    logits = sources.torch_logits(model, data.nchw(split.test_images))
    accuracy = float(np.mean(np.argmax(logits, axis=1) == split.test_labels))
    return TorchSource(model, losses, accuracy)


def train_keras(
    config: Config, split: data.Split, progress: Callable[[str], None] | None = None
) -> KerasSource:
    """Trains the Keras model (JAX backend) for `config.epochs` epochs."""
    keras = sources.keras_module()
    model = sources.build_keras_model(sources.keras_arch(config.arch), config.seed)
    model.compile(
        optimizer=keras.optimizers.Adam(config.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    # Whole batches only: a short last batch has another shape, so another compile.
    usable = len(split.train_labels) // config.batch_size * config.batch_size
    with sources.keras_rank_promotion():
        history = model.fit(
            data.nhwc(split.train_images[:usable]),
            split.train_labels[:usable],
            epochs=config.epochs,
            batch_size=config.batch_size,
            shuffle=True,
            verbose=0,
        )
    losses = [float(v) for v in history.history["loss"]]
    if progress:
        progress(f"keras: {config.epochs} epochs, final loss {losses[-1]:.4f}")
    logits = sources.keras_taps(model, data.nhwc(split.test_images))["head"]
    accuracy = float(np.mean(np.argmax(logits, axis=1) == split.test_labels))
    return KerasSource(model, losses, accuracy)
