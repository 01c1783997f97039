"""Training and evaluation, in dataflow order, then the artifact of stage 1.

`create_model` -> `loss_fn` -> `train_epoch` -> `predict_logits` ->
`train_and_evaluate(config, workdir)`.

Training uses the explicit NNX form: `nnx.split` once into a static graph and
arrays; the jitted epoch rebuilds the model inside each step (`nnx.merge`),
takes one AdamW step per batch inside a `jax.lax.scan`, and returns NEW
arrays. What is saved is the plain `model.Params` tree (see `model.py`).
"""

import functools
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deployment_audit import checkpoint, data
from deployment_audit.config import Config, ConfigError, check_output_path
from deployment_audit.model import MLP, Params, logits_from_raw, normalize, params_of


class TrainState(NamedTuple):
    params: nnx.State  # every nnx.Param: `kernel` (d_in, d_out), `bias` (d_out,), float32
    opt_state: optax.OptState  # AdamW moments, same shapes as `params`; step count
    step: jax.Array  # shape=(), int32: optimizer steps taken


def create_model(config: Config, key: jax.Array) -> MLP:
    """A freshly initialised MLP; `key` is consumed by the weight init."""
    return MLP(data.NUM_FEATURES, config.hidden_sizes, data.NUM_CLASSES, rngs=nnx.Rngs(params=key))


@functools.cache
def make_optimizer(learning_rate: float) -> optax.GradientTransformation:
    """AdamW with a constant step size; cached so the jitted epoch sees one object."""
    return optax.adamw(learning_rate, weight_decay=1e-4)


def loss_fn(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of `model` on normalized `x` (B, 64) and labels `y` (B,)."""
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def train_epoch(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    batch_size: int,
    state: TrainState,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
) -> tuple[TrainState, jax.Array]:
    """One shuffled pass over `x` float32 (N, 64) normalized, `y` int32 (N,).

    Returns the new state and the mean loss of each step, float32 `(N // batch_size,)`.
    """
    num_steps = x.shape[0] // batch_size
    order = jax.random.permutation(key, x.shape[0])[: num_steps * batch_size]
    batches = order.reshape(num_steps, batch_size)

    def step(state: TrainState, idx: jax.Array) -> tuple[TrainState, jax.Array]:
        params, opt_state, count = state

        def pure_loss(p: nnx.State) -> jax.Array:
            return loss_fn(nnx.merge(graphdef, p), x[idx], y[idx])

        loss, grads = jax.value_and_grad(pure_loss)(params)
        # optax's bias correction mixes a Python float with an int32 count: allow
        # standard promotion there only, so strict mode still checks our own code.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = tx.update(grads, opt_state, params)
        return TrainState(optax.apply_updates(params, updates), opt_state, count + 1), loss

    return jax.lax.scan(step, state, batches)


@jax.jit
def predict_logits(params: Params, mean: jax.Array, scale: jax.Array, x: jax.Array) -> jax.Array:
    """The deployed function, jitted: raw pixels float32 (B, 64) -> logits (B, 10)."""
    return logits_from_raw(params, mean, scale, x)


def train_and_evaluate(
    config: Config,
    workdir: str | Path | None = None,
    *,
    overwrite: bool = False,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Trains `config`, evaluates on the held-out split, and (with `workdir`) writes
    the stage-1 artifact: `checkpoint/` (Orbax), `golden.json`, `metrics.json`.

    Returns the metrics dict, with the `params` tree and `spec` under `_params`/`_spec`
    (not written to `metrics.json`).
    """
    start = time.perf_counter()
    if not isinstance(config, Config):
        raise ConfigError(
            f"`config` must be a `Config` (e.g. `load_config(path)`), not a "
            f"`{type(config).__name__}`."
        )
    if workdir is not None:
        check_writable(workdir, overwrite)  # Fail before training, not after.
    digits = data.load()
    split = data.split_ids(digits.labels, jax.random.key(config.split_seed), config.test_fraction)
    spec = {
        "preprocessing": data.preprocessing_spec(digits.images[split["train"]]),
        "labels": list(data.LABELS),
        "config": config.model_dump(mode="json"),
    }
    mean, scale = (jnp.asarray(a) for a in data.spec_arrays(spec["preprocessing"]))
    x_train = normalize(jnp.asarray(digits.images[split["train"]]), mean, scale)
    y_train = jnp.asarray(digits.labels[split["train"]])

    key = jax.random.key(config.seed)
    key, init_key = jax.random.split(key)
    model = create_model(config, init_key)
    graphdef, params = nnx.split(model, nnx.Param)
    tx = make_optimizer(config.learning_rate)
    state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32))
    history = []
    for epoch in range(1, config.num_epochs + 1):
        key, epoch_key = jax.random.split(key)
        state, losses = train_epoch(
            graphdef, tx, config.batch_size, state, epoch_key, x_train, y_train
        )
        record = {"epoch": epoch, "train_loss": float(losses.mean())}
        history.append(record)
        if progress is not None:
            progress(record)

    trained = params_of(nnx.merge(graphdef, state.params))
    test_ids = split["test"]
    logits = np.asarray(predict_logits(trained, mean, scale, jnp.asarray(digits.images[test_ids])))
    predictions = logits.argmax(axis=1)
    golden_ids = test_ids[: config.num_golden]
    metrics: dict[str, Any] = {
        "epochs": history,
        "test_accuracy": float((predictions == digits.labels[test_ids]).mean()),
        "test_count": len(test_ids),
        "params_sha256": checkpoint.digest(trained),
        "split": {name: ids.tolist() for name, ids in split.items()},
        "wall_s": time.perf_counter() - start,
    }
    # The golden logits come from a call on exactly the golden batch: the batch size
    # changes how XLA tiles the matmuls, hence the last bits of float32 sums.
    golden_inputs = digits.images[golden_ids]
    golden_logits = predict_logits(trained, mean, scale, jnp.asarray(golden_inputs))
    golden = golden_record(golden_ids, golden_inputs, np.asarray(golden_logits))
    if workdir is not None:
        workdir = Path(workdir)
        if workdir.exists():
            shutil.rmtree(workdir)  # check_writable allowed it: --overwrite was given.
        workdir.mkdir(parents=True)
        checkpoint.save(workdir / "checkpoint", trained, spec)
        (workdir / "golden.json").write_text(json.dumps(golden) + "\n")
        (workdir / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return {**metrics, "_params": trained, "_spec": spec, "_golden": golden}


class WorkdirError(ValueError):
    """A workdir that cannot be written; the message says what to do."""


def check_writable(workdir: str | Path, overwrite: bool) -> None:
    """Refuses a non-empty `workdir` unless `overwrite`, and one that cannot be
    created (a file at its place or where a folder of its path would go)."""
    workdir = Path(workdir)
    if workdir.is_dir() and any(workdir.iterdir()) and not overwrite:
        raise WorkdirError(
            f"`{workdir}` already exists and is not empty; pass `--overwrite` to replace it "
            f"or choose another `--workdir`."
        )
    try:
        check_output_path(workdir, directory=True, what="The workdir")
    except ConfigError as err:
        raise WorkdirError(str(err)) from None


def golden_record(ids: np.ndarray, inputs: np.ndarray, logits: np.ndarray) -> dict[str, Any]:
    """The golden sample as JSON. float32 values are written as the float64 numbers
    they equal, so reading them back as float32 restores the exact bits."""
    return {
        "ids": [int(i) for i in ids],
        "inputs": np.asarray(inputs, np.float32).tolist(),
        "logits": np.asarray(logits, np.float32).tolist(),
        "predictions": [int(p) for p in np.asarray(logits).argmax(axis=1)],
    }


def like_params(config_json: dict[str, Any]) -> Params:
    """A zero `Params` tree with the shapes of the saved config (for `checkpoint.restore`)."""
    widths = [data.NUM_FEATURES, *config_json["hidden_sizes"], data.NUM_CLASSES]
    return {
        "layers": [
            {"kernel": jnp.zeros((a, b), jnp.float32), "bias": jnp.zeros((b,), jnp.float32)}
            for a, b in zip(widths[:-1], widths[1:], strict=True)
        ]
    }


def load_trained(workdir: str | Path) -> tuple[Params, dict[str, Any], dict[str, Any]]:
    """`(params, spec, golden)` read back from a stage-1 workdir; a missing or damaged
    part is a `CheckpointError` naming it."""
    workdir = Path(workdir)
    spec = checkpoint.read_spec(workdir / "checkpoint")
    params, spec = checkpoint.restore(workdir / "checkpoint", like_params(spec["config"]))
    golden = read_json(workdir / "golden.json", "golden sample")
    return params, spec, golden


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object file of a workdir; `CheckpointError` if missing, not JSON or not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise checkpoint.CheckpointError(
            f"Cannot read the {what} `{path}`: {err.strerror}."
        ) from None
    except ValueError as err:
        raise checkpoint.CheckpointError(f"The {what} `{path}` is not valid JSON: {err}.") from None
    if not isinstance(value, dict):
        raise checkpoint.CheckpointError(f"The {what} `{path}` is not a JSON object.")
    return value
