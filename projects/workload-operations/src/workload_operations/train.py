"""Training, in dataflow order:
`create_train_state -> loss_fn -> train_step -> eval_step -> train_and_evaluate`.

The job is deliberately small (a 16-32-4 MLP on synthetic data) and paced at
`steps_per_second`, a stand-in for the cost of a real step: what this project
studies is the process around it, not the model. `train_and_evaluate` is the
loop a supervised job runs: it reports each step to an `Observer`, gives an
`Injector` its chance to fail on purpose, requests checkpoints through a
`checkpoint.Recorder`, and resumes (`resume=True`) only from the latest
accepted step. Every step's loss (as float32 bits) and sample IDs go to
`<workdir>/metrics.jsonl`, so an interrupted and continued run can be
compared bitwise with an uninterrupted one.
"""

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from workload_operations import data, model
from workload_operations.config import Config


class TrainState(NamedTuple):
    params: model.Params  # w1 (F, H), b1 (H,), w2 (H, C), b2 (C,); float32
    opt_state: Any  # optax Adam state: count () int32, mu and nu shaped like params
    step: jax.Array  # shape=(), int32: optimizer steps taken


def optimizer(config: Config) -> optax.GradientTransformation:
    return optax.adam(config.learning_rate)


def create_train_state(config: Config) -> TrainState:
    """Initial parameters from `config.seed`, Adam's zero moments, step 0 (one compile)."""

    @jax.jit
    def init(key: jax.Array) -> TrainState:
        params = model.init(config, key)
        return TrainState(params, optimizer(config).init(params), jnp.zeros((), jnp.int32))

    return init(jax.random.key(config.seed))


def loss_fn(params: model.Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean cross-entropy of `x` float32 `(B, F)` against labels `y` int32 `(B,)`."""
    logits = model.apply(params, x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))


def make_train_step(config: Config) -> Callable[[TrainState, Any, Any], tuple[TrainState, Any]]:
    tx = optimizer(config)

    @jax.jit
    def train_step(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[TrainState, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(state.params, x, y)
        # optax mixes weak Python scalars into its moments; allow the standard rules there.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, opt_state, state.step + 1), loss

    return train_step


@jax.jit
def eval_step(params: model.Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(mean loss, predicted classes int32 `(N,)`) on a held-out set."""
    logits = model.apply(params, x)
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))
    return loss, jnp.argmax(logits, axis=-1).astype(jnp.int32)


def float_bits(value: Any) -> str:
    """The float32 bit pattern as hex, so records compare bits, not printed digits."""
    return np.asarray(value, np.float32).reshape(()).view(np.uint32).item().to_bytes(4, "big").hex()


def heldout_evaluation(params: model.Params, dataset: dict[str, np.ndarray]) -> dict:
    """The figures a recovery point must reproduce: loss bits and a predictions digest."""
    loss, predictions = eval_step(params, dataset["heldout_x"], dataset["heldout_y"])
    predictions = np.asarray(predictions)
    import hashlib

    return {
        "loss": float(loss),
        "loss_bits": float_bits(loss),
        "predictions_sha256": hashlib.sha256(predictions.tobytes()).hexdigest(),
        "accuracy": float(np.mean(predictions == dataset["heldout_y"])),
    }


def abstract_state(state: TrainState) -> TrainState:
    """Shapes, dtypes and shardings of `state`: the restore target Orbax fills."""
    return jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state
    )


class Pacer:
    """Holds the loop to `steps_per_second` (0: unpaced); catches up after a delay
    of up to one second, so a brief scheduling hiccup does not lower the rate."""

    def __init__(self, steps_per_second: float):
        self.period = 1.0 / steps_per_second if steps_per_second > 0 else 0.0
        self.next = time.monotonic()

    def wait(self) -> None:
        if not self.period:
            return
        self.next += self.period
        delay = self.next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -1.0:
            self.next = time.monotonic()


class MetricsLog:
    """Per-step loss bits and sample IDs, buffered; written at saves and at the end."""

    def __init__(self, path: Path | None, attempt: int):
        self.path, self.attempt = path, attempt
        self.pending: list[tuple[int, Any, np.ndarray]] = []
        self.records: list[dict] = []

    def add(self, step: int, loss: Any, ids: np.ndarray) -> None:
        self.pending.append((step, loss, ids))

    def flush(self) -> None:
        new = [
            {
                "attempt": self.attempt,
                "step": step,
                "loss": float(loss),
                "loss_bits": float_bits(loss),
                "ids": [int(i) for i in ids],
            }
            for step, loss, ids in self.pending
        ]
        self.pending = []
        self.records += new
        if self.path is not None and new:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in new))


def train_and_evaluate(
    config: Config,
    workdir: str | Path | None,
    *,
    observer=None,
    injector=None,
    resume: bool = False,
    attempt: int = 0,
    say: Callable[[str], None] | None = None,
) -> dict:
    """Trains to `config.num_steps`; returns the per-step records, the step it
    started from and the final held-out evaluation.

    `workdir=None` keeps everything in memory (no checkpoints, no files)."""
    say = say or (lambda _: None)
    workdir = None if workdir is None else Path(workdir).absolute()
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    dataset = data.make_dataset(config)
    state = create_train_state(config)
    iterator = data.iterator(config, dataset)
    start_step, set_aside = 0, []
    recorder = None
    if workdir is not None and config.checkpoint_every:
        from workload_operations import checkpoint

        if resume:
            accepted = checkpoint.latest_accepted(workdir)
            set_aside = checkpoint.set_aside_after(workdir, accepted)
            if accepted is not None:
                arrays, iterator, _ = checkpoint.restore(
                    workdir, accepted, abstract_state(state), iterator
                )
                state = TrainState(*arrays)
                start_step = accepted
            say(f"resuming from accepted step {start_step}; set aside {set_aside}")
        recorder = checkpoint.Recorder(workdir)
    log = MetricsLog(None if workdir is None else workdir / "metrics.jsonl", attempt)
    train_step = make_train_step(config)
    pacer = Pacer(config.steps_per_second)
    report_every = max(1, config.num_steps // 10)
    for step in range(start_step + 1, config.num_steps + 1):
        batch = next(iterator)
        state, loss = train_step(state, batch["x"], batch["y"])  # A new state; nothing in place.
        log.add(step, loss, batch["ids"])
        if observer is not None:
            observer.step_done(step, config.batch_size, loss)
        if injector is not None:
            injector.after_step(step)
            injector.delay()
        if recorder is not None:
            if step % config.checkpoint_every == 0 or step == config.num_steps:
                log.flush()
                heldout = heldout_evaluation(state.params, dataset)
                recorder.request(step, state, iterator, heldout)
                if injector is not None:
                    injector.after_save(step)
            recorder.poll()
        if step % report_every == 0:
            say(f"step {step:>6}/{config.num_steps}  loss {float(loss):.4f}")
        pacer.wait()
    if recorder is not None:
        recorder.close()
    log.flush()
    return {
        "start_step": start_step,
        "set_aside": set_aside,
        "records": log.records,
        "final_heldout": heldout_evaluation(state.params, dataset),
        "state": state,
    }
