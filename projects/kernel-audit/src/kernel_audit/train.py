"""The training demo: the kernels' gradients in use.

The same network (`model.forward`) is trained twice from the same initial
weights on the same batches, once through the Pallas kernels (gradients from
their `custom_vjp`) and once through the `jax.numpy` references (gradients from
autodiff). Per-step losses of the two runs must agree to float32 accuracy.

Run: `kernel-audit train [--config FILE] [--workdir DIR]`.
Reads top to bottom: `loss_fn` -> `train_step` -> `train_and_evaluate`.
"""

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernel_audit import checkpoint, data, kernels, model
from kernel_audit.config import Config, ConfigError

D_IN, D_OUT = 24, 8


def loss_fn(
    params: model.Params, x: jax.Array, y: jax.Array, use_kernels: bool, interpret: bool | None
) -> jax.Array:
    """Mean squared error of the network on one batch."""
    pred = model.forward(params, x, use_kernels=use_kernels, interpret=interpret)
    return jnp.mean(jnp.square(pred - y))


@functools.partial(jax.jit, static_argnames=("use_kernels", "interpret"))
def train_step(
    params: model.Params,
    x: jax.Array,
    y: jax.Array,
    learning_rate: jax.Array,
    use_kernels: bool,
    interpret: bool | None,
) -> tuple[model.Params, jax.Array]:
    """One SGD step; returns the new parameters and the loss before the step."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y, use_kernels, interpret)
    new = jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)
    return new, loss


def train_and_evaluate(
    config: Config,
    workdir: str | Path | None = None,
    interpret: bool | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Trains both paths for `config.train_steps` steps; returns (and, with a
    `workdir`, writes as `metrics.json`) the per-step losses and their gap."""
    if not isinstance(config, Config):
        raise ConfigError(
            f"`config` must be a `Config` (e.g. `load_config(path)`), not a "
            f"`{type(config).__name__}`."
        )
    if workdir is not None:
        checkpoint.check_writable(workdir, directory=True, what="Output folder")
    key = jax.random.key(config.seed)
    key, init_key, teacher_key = jax.random.split(key, 3)
    params0 = model.init(init_key, D_IN, config.hidden, D_OUT)
    teacher = data.make_teacher(teacher_key, D_IN, D_OUT)
    lr = jnp.float32(config.learning_rate)
    # One list of batches, shared by both runs, so they see identical data.
    batches = []
    for _ in range(config.train_steps):
        key, sub = jax.random.split(key)
        batches.append(data.regression_batch(sub, teacher, config.batch_size))
    losses: dict[str, list[float]] = {"kernels": [], "reference": []}
    finals = {}
    start = time.perf_counter()
    for name, use_kernels in (("kernels", True), ("reference", False)):
        params = params0
        for step, (x, y) in enumerate(batches):
            params, loss = train_step(params, x, y, lr, use_kernels, interpret)
            losses[name].append(float(loss))
            if progress is not None and (step + 1) % max(1, config.train_steps // 5) == 0:
                progress(f"{name}: step {step + 1}/{config.train_steps} loss {float(loss):.5f}")
        finals[name] = params
    k, r = np.asarray(losses["kernels"]), np.asarray(losses["reference"])
    param_gap = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(finals["kernels"], finals["reference"], strict=True)
    )
    metrics = {
        "execution_mode": kernels.execution_mode(interpret),
        "steps": config.train_steps,
        "losses": losses,
        "max_rel_loss_gap": float(np.max(np.abs(k - r) / np.abs(r))),
        "max_param_gap": param_gap,
        "loss_decreased": bool(k[-1] < k[0]),
        "seconds": time.perf_counter() - start,
        "config": config.model_dump(mode="json"),
    }
    if workdir is not None:
        checkpoint.save_record(Path(workdir) / "metrics.json", metrics)
    return metrics
