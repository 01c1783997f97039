"""The PyTorch eager baseline of `mlp-classifier bench`: the same MLP, loss and
optimizer as `model.py` and `train.py`, written with `torch.nn`.

Imported only when `torch` is installed (the optional extra
`mlp-classifier[torch]`); `bench.py` reports the path as skipped otherwise.
Weights are copied from an NNX `MLP`, so both frameworks start from the same
parameters and, with dropout 0, follow the same loss trajectory up to float32
rounding.
"""

import copy
import os
import statistics
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from mlp_classifier.config import Config
from mlp_classifier.model import MLP


class TorchMLP(nn.Module):
    """`model.MLP` in PyTorch: each hidden layer is `Linear -> relu -> Dropout`,
    then a `Linear` head. One `Dropout` module is shared by all layers, as in
    the NNX model. `forward` maps float32 `(batch, in_features)` to logits
    float32 `(batch, num_classes)`."""

    def __init__(
        self, in_features: int, hidden_sizes: Sequence[int], num_classes: int, dropout_rate: float
    ):
        super().__init__()
        widths = [in_features, *hidden_sizes]
        self.hidden = nn.ModuleList(
            [nn.Linear(d_in, d_out) for d_in, d_out in zip(widths[:-1], widths[1:], strict=True)]
        )
        self.dropout = nn.Dropout(dropout_rate)
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = self.dropout(F.relu(layer(x)))
        return self.head(x)


def from_nnx(model: MLP, dropout_rate: float) -> TorchMLP:
    """A `TorchMLP` holding a copy of `model`'s weights.

    NNX stores a kernel as `(in, out)` and computes `x @ kernel + bias`; torch
    stores `weight` as `(out, in)` and computes `x @ weight.T + bias`, hence the
    transpose.
    """
    layers = [*model.hidden, model.head]
    in_features = layers[0].in_features
    hidden_sizes = [layer.out_features for layer in model.hidden]
    net = TorchMLP(in_features, hidden_sizes, model.head.out_features, dropout_rate)
    with torch.no_grad():
        for src, dst in zip(layers, [*net.hidden, net.head], strict=True):
            dst.weight.copy_(torch.from_numpy(np.asarray(src.kernel[...]).T.copy()))
            dst.bias.copy_(torch.from_numpy(np.asarray(src.bias[...]).copy()))
    return net


def params(net: TorchMLP) -> dict[str, np.ndarray]:
    """`net`'s weights under the NNX state paths (`hidden/0/kernel`, ...,
    `head/bias`), kernels transposed back to `(in, out)`."""
    out = {}
    named = [(f"hidden/{i}", layer) for i, layer in enumerate(net.hidden)] + [("head", net.head)]
    for prefix, layer in named:
        out[f"{prefix}/kernel"] = layer.weight.detach().numpy().T.copy()
        out[f"{prefix}/bias"] = layer.bias.detach().numpy().copy()
    return out


def loss_fn(net: TorchMLP, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """`train.loss_fn` in torch: softmax cross-entropy averaged over the rows
    with `mask == True`; an all-padding batch gives 0, not NaN.

    `batch`: `image` float32 `(B, F)`, `label` int64 `(B,)`, `mask` bool `(B,)`.
    """
    per_example = F.cross_entropy(net(batch["image"]), batch["label"], reduction="none")
    weights = batch["mask"].to(per_example.dtype)
    return (per_example * weights).sum() / weights.sum().clamp(min=1.0)


def make_optimizer(net: TorchMLP, config: Config) -> torch.optim.Optimizer:
    """The torch twin of the optax optimizer that `config` names.

    `adamw`: `torch.optim.AdamW` with optax's defaults (b1 0.9, b2 0.999, eps
    1e-8) and decoupled weight decay on every parameter, as `optax.adamw` with
    no mask. `sgd`: heavy-ball momentum, `buf = m * buf + g; p -= lr * buf`,
    which is `optax.sgd(lr, momentum)` (`optax.trace`, not Nesterov).
    """
    if config.optimizer == "adamw":
        return torch.optim.AdamW(
            net.parameters(),
            lr=config.learning_rate,
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=config.weight_decay,
        )
    return torch.optim.SGD(net.parameters(), lr=config.learning_rate, momentum=config.momentum)


def to_torch(batches: dict[str, np.ndarray]) -> list[dict[str, torch.Tensor]]:
    """Stacked NumPy batches (`image` `(S, B, F)`, `label` `(S, B)`, `mask`
    `(S, B)`) as a list of `S` torch batches; labels become int64, the index
    type `F.cross_entropy` takes."""
    return [
        {
            "image": torch.from_numpy(np.ascontiguousarray(batches["image"][i])),
            "label": torch.from_numpy(batches["label"][i].astype(np.int64)),
            "mask": torch.from_numpy(np.ascontiguousarray(batches["mask"][i])),
        }
        for i in range(batches["image"].shape[0])
    ]


class TorchPath:
    """Path (d) of the bench: a Python loop of eager torch steps.

    `run_epoch()` trains one epoch in place; torch CPU ops finish before they
    return, so no extra synchronization is needed for the timer. The per-step
    losses stay tensors during the epoch (no `.item()` per step, which the JAX
    loops do not pay either).

    Threads: `prepare()` times a few epochs on a throwaway copy of the model
    with 1 intra-op thread and with one per visible core (what XLA's CPU
    client uses), and keeps 1 unless more is at least 10% faster. On a shared
    2-core machine, 2 OpenMP threads can stall for seconds when a core is
    taken away (measured: 5 s epochs against 20 ms), while batch-32 GEMMs are
    too small to gain from a second thread; the choice and both timings are
    reported (`threads`, `thread_trials_s`), so the baseline is torch at its
    better setting, not at a handicap.
    """

    name = "torch"

    def __init__(self, model: MLP, config: Config, batches: dict[str, np.ndarray], seed: int):
        torch.manual_seed(seed)  # The dropout masks: torch's own generator.
        self.config = config
        self.net = from_nnx(model, config.dropout_rate)
        self.net.train()
        self.optimizer = make_optimizer(self.net, config)
        self.batches = to_torch(batches)
        self._losses: list[torch.Tensor] = []
        self.threads = torch.get_num_threads()
        self.thread_trials_s: dict[str, float] = {}

    def prepare(self, trials: int = 3) -> dict[str, float]:
        """Picks the thread count (see the class docstring); eager torch has
        nothing to lower or compile, so both times are 0."""
        candidates = sorted({1, len(os.sched_getaffinity(0))})
        trial_net = copy.deepcopy(self.net)
        trial_optimizer = make_optimizer(trial_net, self.config)
        rng_state = torch.get_rng_state()
        for threads in candidates:
            torch.set_num_threads(threads)
            times = []
            for _ in range(trials):
                start = time.perf_counter()
                _epoch(trial_net, trial_optimizer, self.batches)
                times.append(time.perf_counter() - start)
            self.thread_trials_s[str(threads)] = statistics.median(times)
        torch.set_rng_state(rng_state)  # The trials leave the real run's masks unchanged.
        # More threads only when clearly faster: in the interleaved rounds the
        # OpenMP team competes with XLA's pool for the same cores, and a tie in
        # isolation became multi-second stalls there.
        self.threads = 1
        for threads in candidates[1:]:
            if self.thread_trials_s[str(threads)] < 0.9 * self.thread_trials_s["1"]:
                self.threads = threads
        torch.set_num_threads(self.threads)
        return {"lower_s": 0.0, "compile_s": 0.0}

    def run_epoch(self) -> None:
        self._losses = _epoch(self.net, self.optimizer, self.batches)

    def losses(self) -> np.ndarray:
        """float32 `(S,)`: the loss of each step of the last epoch."""
        return torch.stack(self._losses).numpy().astype(np.float32)

    def params(self) -> dict[str, np.ndarray]:
        return params(self.net)


def _epoch(
    net: TorchMLP, optimizer: torch.optim.Optimizer, batches: list[dict[str, torch.Tensor]]
) -> list[torch.Tensor]:
    """Trains `net` in place on every batch in order; returns the step losses."""
    losses = []
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net, batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses
