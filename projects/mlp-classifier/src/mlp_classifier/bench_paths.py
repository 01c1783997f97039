"""The timed paths of `mlp-classifier bench` and the training step they share.

Every path trains the same `model.MLP` with `train.loss_fn` and the same
optimizer, from the same initial weights (`init_train_state`), on one epoch of
stacked batches (`image` float32 `(S, B, F)`, `label` int32 `(S, B)`, `mask`
bool `(S, B)`), and has the interface `bench_timing.TimedPath`:
  (a) `NnxJitPath`: a Python loop over `nnx_train_step`, an `nnx.jit` step.
  (b) `SplitJitPath`: `nnx.split` once, a Python loop over a pure `jax.jit`
      step (`make_pure_step`) that donates the state.
  (c) `ScanPath`: the whole epoch (`make_pure_epoch`) as one `jax.lax.scan`
      inside one `jax.jit`, the state donated.
  `TrainStepPath`: the project's own `train.train_step` in a Python loop.
  `GemmPath`: one large f32 matmul per call, the FLOP/s ceiling.
  `MatmulFloorPath`: the matrix products of an epoch's steps alone, in one
      scan: what the epoch would cost if everything but its GEMMs were free.
  `ScopedPath`: another path under a given `jax.threefry_partitionable`.
The PyTorch eager path (d) is in `bench_torch.py`.
"""

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mlp_classifier import data, train
from mlp_classifier.bench_timing import compile_timed, cost_analysis
from mlp_classifier.config import Config
from mlp_classifier.model import MLP
from mlp_classifier.train import loss_fn

if TYPE_CHECKING:  # Only for annotations.
    from mlp_classifier.bench_settings import Setting

Batch = dict[str, jax.Array]


# --- THE TRAINING STEP, THREE WAYS ---------------------------------------------


def _model_key(config: Config) -> jax.Array:
    """The key `train.train_and_evaluate` gives `train.create_train_state`."""
    _key, model_key = jax.random.split(jax.random.key(config.seed))
    return model_key


def init_train_state(setting: "Setting") -> tuple[MLP, nnx.Optimizer]:
    """A fresh model (train mode) and optimizer (`train.make_optimizer`).

    Keys as in `train.create_model`, which this repeats for any input width:
    at width 64 the weights and dropout stream equal those that
    `mlp-classifier train` starts from, and every path starts from them.
    Built under one `nnx.jit`: run eagerly, each initializer op would compile
    on its own (dozens of small compiles per setting).
    """
    return _jit_init(setting)


@functools.partial(nnx.jit, static_argnums=0)
def _jit_init(setting: "Setting") -> tuple[MLP, nnx.Optimizer]:
    config = setting.config
    init_key, dropout_key = jax.random.split(_model_key(config))
    model = MLP(
        setting.in_features,
        config.hidden_sizes,
        data.NUM_CLASSES,
        config.dropout_rate,
        rngs=nnx.Rngs(params=init_key, dropout=dropout_key),
    )
    model.train()
    return model, nnx.Optimizer(model, train.make_optimizer(config), wrt=nnx.Param)


def train_step(model: MLP, optimizer: nnx.Optimizer, batch: Batch) -> jax.Array:
    """One optimizer step on `batch`; returns the loss before the update.
    Updates `model` (weights and dropout RNG state) and `optimizer` in place."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, _logits), grads = grad_fn(model, batch)
    # optax's bias correction relies on standard promotion (see train.train_step).
    with jax.numpy_dtype_promotion("standard"):
        optimizer.update(model, grads)  # In-place update.
    return loss


# (a) nnx.jit walks the object graph in Python on every call.
nnx_train_step = nnx.jit(train_step)


def make_pure_step(graphdef: nnx.GraphDef) -> Callable:
    """(b) The explicit form: `pure_step(state, batch) -> (new_state, loss)`,
    with `state = nnx.state((model, optimizer))`. Nothing is mutated outside;
    the merged objects live only inside the trace."""

    def pure_step(state: nnx.State, batch: Batch) -> tuple[nnx.State, jax.Array]:
        model, optimizer = nnx.merge(graphdef, state)
        loss = train_step(model, optimizer, batch)
        return nnx.state((model, optimizer)), loss

    return pure_step


def make_pure_epoch(graphdef: nnx.GraphDef) -> Callable:
    """(c) `pure_epoch(state, batches) -> (new_state, losses)`: `pure_step`
    scanned over the leading axis of `batches` (`(S, B, ...)`), losses `(S,)`."""
    pure_step = make_pure_step(graphdef)

    def pure_epoch(state: nnx.State, batches: Batch) -> tuple[nnx.State, jax.Array]:
        return jax.lax.scan(pure_step, state, batches)

    return pure_epoch


# --- PATHS -------------------------------------------------------------------


def _split_batches(batches: dict[str, np.ndarray]) -> list[Batch]:
    """Per-step device batches for the Python loops, placed before timing."""
    steps = batches["image"].shape[0]
    return [jax.device_put({k: v[i] for k, v in batches.items()}) for i in range(steps)]


class NnxJitPath:
    """(a) A Python loop over `nnx_train_step`."""

    def __init__(self, name: str, setting: "Setting", batches: dict[str, np.ndarray]):
        self.name = name
        self.model, self.optimizer = init_train_state(setting)
        self.batches = _split_batches(batches)
        self._losses: list[jax.Array] = []

    def prepare(self) -> dict[str, float]:
        _, times = compile_timed(nnx_train_step, self.model, self.optimizer, self.batches[0])
        return times

    def run_epoch(self) -> None:
        losses = []
        for batch in self.batches:
            losses.append(nnx_train_step(self.model, self.optimizer, batch))  # In-place update.
        # The last update is done when the weights it wrote are ready.
        jax.block_until_ready((losses, nnx.state((self.model, self.optimizer))))
        self._losses = losses

    def losses(self) -> np.ndarray:
        return np.asarray(jnp.stack(self._losses))

    def params(self) -> dict[str, np.ndarray]:
        return _param_arrays(self.model)


class SplitJitPath:
    """(b) `nnx.split` once, a Python loop over a pure `jax.jit` step that
    donates the state, `nnx.merge` when the weights are read."""

    def __init__(self, name: str, setting: "Setting", batches: dict[str, np.ndarray]):
        self.name = name
        self.graphdef, self.state = nnx.split(init_train_state(setting))
        self.step = jax.jit(make_pure_step(self.graphdef), donate_argnums=0)
        self.batches = _split_batches(batches)
        self._losses: list[jax.Array] = []
        self.cost: dict[str, float] = {}

    def prepare(self) -> dict[str, float]:
        compiled, times = compile_timed(self.step, self.state, self.batches[0])
        self.cost = cost_analysis(compiled)
        return times

    def run_epoch(self) -> None:
        state, losses = self.state, []
        for batch in self.batches:
            state, loss = self.step(state, batch)
            losses.append(loss)
        self.state = jax.block_until_ready(state)
        self._losses = jax.block_until_ready(losses)

    def losses(self) -> np.ndarray:
        return np.asarray(jnp.stack(self._losses))

    def params(self) -> dict[str, np.ndarray]:
        model, _optimizer = nnx.merge(self.graphdef, self.state)
        return _param_arrays(model)


class ScanPath:
    """(c) One `jax.jit` call per epoch: `lax.scan` over device-resident,
    stacked batches; the state is donated.

    `twin_of`: another `ScanPath` of the same setting whose jitted epoch (and
    so executable) this one reuses, with its own state: the A/A control runs
    the very same code as a separate entry, and costs no second compile.
    """

    def __init__(
        self,
        name: str,
        setting: "Setting",
        batches: dict[str, np.ndarray],
        twin_of: "ScanPath | None" = None,
    ):
        self.name = name
        self.graphdef, self.state = nnx.split(init_train_state(setting))
        if twin_of is not None:
            if twin_of.graphdef != self.graphdef:
                raise ValueError(f"`{name}` and its twin `{twin_of.name}` differ in structure.")
            self.epoch = twin_of.epoch
        else:
            self.epoch = jax.jit(make_pure_epoch(self.graphdef), donate_argnums=0)
        self.batches = jax.device_put(batches)
        self._losses: jax.Array | None = None
        self.cost: dict[str, float] = {}

    def prepare(self) -> dict[str, float]:
        compiled, times = compile_timed(self.epoch, self.state, self.batches)
        self.cost = cost_analysis(compiled)
        return times

    def run_epoch(self) -> None:
        self.state, self._losses = jax.block_until_ready(self.epoch(self.state, self.batches))

    def losses(self) -> np.ndarray:
        return np.asarray(self._losses)

    def params(self) -> dict[str, np.ndarray]:
        model, _optimizer = nnx.merge(self.graphdef, self.state)
        return _param_arrays(model)


class TrainStepPath:
    """The project's own step, `train.train_step` (split + `jax.jit`, graphdef
    and optimizer static, a `TrainState` in and out, no donation), in a Python
    loop: what `mlp-classifier train` runs. Input width 64 only."""

    def __init__(self, name: str, setting: "Setting", batches: dict[str, np.ndarray]):
        if setting.in_features != data.NUM_FEATURES:
            raise ValueError(
                f"`train.train_step` builds the model for {data.NUM_FEATURES} input features, "
                f"but setting `{setting.name}` has `in_features = {setting.in_features}`."
            )
        self.name = name
        self.tx = train.make_optimizer(setting.config)
        self.graphdef, self.state = train.create_train_state(
            setting.config, self.tx, _model_key(setting.config)
        )
        self.batches = _split_batches(batches)
        self._losses: list[jax.Array] = []

    def prepare(self) -> dict[str, float]:
        args = (self.graphdef, self.tx, self.state, self.batches[0])
        _, times = compile_timed(train.train_step, *args)
        return times

    def run_epoch(self) -> None:
        state, losses = self.state, []
        for batch in self.batches:
            state, metrics = train.train_step(self.graphdef, self.tx, state, batch)
            losses.append(metrics["loss"])
        self.state = jax.block_until_ready(state)
        self._losses = jax.block_until_ready(losses)

    def losses(self) -> np.ndarray:
        return np.asarray(jnp.stack(self._losses))

    def params(self) -> dict[str, np.ndarray]:
        flat = nnx.to_flat_state(self.state.params)
        return {"/".join(str(part) for part in path): np.asarray(v[...]) for path, v in flat}


class GemmPath:
    """The FLOP/s ceiling: one jitted `n x n @ n x n` f32 matmul per call,
    `2 n^3` FLOPs."""

    def __init__(self, name: str, n: int, seed: int):
        self.name = name
        self.n = n
        key_a, key_b = jax.random.split(jax.random.key(seed))
        self.a = jax.random.uniform(key_a, (n, n), jnp.float32)
        self.b = jax.random.uniform(key_b, (n, n), jnp.float32)
        self.matmul = jax.jit(jnp.matmul)
        self.cost: dict[str, float] = {}

    @property
    def flops(self) -> float:
        return 2.0 * self.n**3

    def prepare(self) -> dict[str, float]:
        compiled, times = compile_timed(self.matmul, self.a, self.b)
        self.cost = cost_analysis(compiled)
        return times

    def run_epoch(self) -> None:
        jax.block_until_ready(self.matmul(self.a, self.b))

    def losses(self) -> None:
        return None


class MatmulFloorPath:
    """The GEMMs of one epoch of training steps, and (almost) nothing else.

    Per step, with the model's kernels `W_0 .. W_L` (the head last) and the
    step's `(B, F)` images: the forward products `h_i = relu(h_{i-1} @ W_i)`
    (no relu on the logits), then the backward ones, `h_{i-1}^T @ g_i` for
    every kernel and `g_i @ W_i^T` for every layer but the first, with the
    logits standing in for their gradient; each kernel then moves by
    `1e-6 * dW` so that every product is needed. That is `3L + 2` matrix
    products of the model's shapes per step, plus one relu per hidden layer
    and one scaled add per kernel: no bias, no dropout, no softmax, no
    optimizer state. The kernels are donated, as in the scan path.
    """

    def __init__(self, name: str, setting: "Setting", batches: dict[str, np.ndarray]):
        self.name = name
        model, _optimizer = init_train_state(setting)
        self.kernels = [jnp.array(layer.kernel[...]) for layer in [*model.hidden, model.head]]
        self.images = jax.device_put(batches["image"])
        self.epoch = jax.jit(_matmul_epoch, donate_argnums=0)
        self.cost: dict[str, float] = {}

    def prepare(self) -> dict[str, float]:
        compiled, times = compile_timed(self.epoch, self.kernels, self.images)
        self.cost = cost_analysis(compiled)
        return times

    def run_epoch(self) -> None:
        self.kernels = jax.block_until_ready(self.epoch(self.kernels, self.images))

    def losses(self) -> None:
        return None


def matmul_flops(widths: list[int], batch_size: int) -> float:
    """The FLOPs of the `3L + 2` products of one `MatmulFloorPath` step (also
    those of one training step's forward and backward matmuls): with `widths =
    [in, *hidden, classes]`, each kernel `(d_in, d_out)` costs `2 B d_in d_out`
    forward and again for its gradient, and every kernel but the first once
    more for the gradient of its input."""
    pairs = list(zip(widths[:-1], widths[1:], strict=True))
    per_kernel = [2.0 * batch_size * d_in * d_out for d_in, d_out in pairs]
    return 2 * sum(per_kernel) + sum(per_kernel[1:])


def _matmul_epoch(kernels: list[jax.Array], images: jax.Array) -> list[jax.Array]:
    def step(kernels: list[jax.Array], x: jax.Array) -> tuple[list[jax.Array], None]:
        hs = [x]
        for w in kernels[:-1]:
            hs.append(jnp.maximum(hs[-1] @ w, 0.0))
        g = hs[-1] @ kernels[-1]
        new = list(kernels)
        for i in reversed(range(len(kernels))):
            new[i] = kernels[i] - 1e-6 * (hs[i].T @ g)
            if i > 0:
                g = g @ kernels[i].T
        return new, None

    return jax.lax.scan(step, kernels, images)[0]


class ScopedPath:
    """A path built, compiled and run under `jax.threefry_partitionable(value)`
    (the config is part of JAX's compile cache key, so each call re-enters
    it; the cost, microseconds, is inside the timed epoch)."""

    def __init__(self, value: bool, build: Callable[[], "ScanPath"]):
        self.value = value
        with jax.threefry_partitionable(value):
            self.path = build()
        self.name = self.path.name
        self.cost: dict[str, float] = {}

    def prepare(self) -> dict[str, float]:
        with jax.threefry_partitionable(self.value):
            times = self.path.prepare()
        self.cost = self.path.cost
        return times

    def run_epoch(self) -> None:
        with jax.threefry_partitionable(self.value):
            self.path.run_epoch()

    def losses(self) -> np.ndarray:
        return self.path.losses()


def _param_arrays(model: MLP) -> dict[str, np.ndarray]:
    """The `nnx.Param` leaves of `model` keyed by state path (`hidden/0/kernel`)."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {"/".join(str(part) for part in path): np.asarray(v[...]) for path, v in flat}
