"""Data-parallel (and model-parallel) training on a mesh, with full-state recovery.

Reads top to bottom in dataflow order: `loss_fn` -> `train_step` ->
`make_step_fn` (the jitted, sharded step) -> `run` (the loop: restore, train,
checkpoint, log). `run` is the same code for one process and for several: the
mesh spans every device of every process, each process feeds only its own rows.
"""

import dataclasses
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from sharded_training import checkpoint, data, model, sharding
from sharded_training.config import Config, check_output_dir


class TrainState(NamedTuple):
    params: dict[str, jax.Array]  # see model.py; sharded by sharding.param_specs()
    opt_state: Any  # optax.adam state, sharded like params
    step: jax.Array  # shape=(), int32: optimizer steps taken
    key: jax.Array  # shape=(), typed PRNG key: the dropout randomness still to come


def make_optimizer(config: Config) -> optax.GradientTransformation:
    return optax.adam(config.learning_rate)


def loss_fn(params, batch: dict, key: jax.Array, dropout_rate: float):
    """Count-weighted mean loss over the VALID examples of the global batch.

    Under `jit` with a batch sharded over `data`, the two sums become per-shard
    sums plus an all-reduce: every valid example has weight 1/total count,
    whichever shard holds it.

    Returns `(loss, count)`: the scalar loss and the number of valid rows (the sum
    of the float32 `mask`), which `train_step` reports as `count` [claim:loss-returns-valid-count].

    Cases:
      padding rows (`mask` 0) -> weight 0, whatever their features and labels
        [claim:loss-padding-weight-zero].
      shards with unequal valid counts -> the loss still equals the plain mean over
        the valid rows on one device (rtol 1e-5); a mean of per-shard means does not
        [claim:loss-unequal-shards-plain-mean].
    """
    # --- exercise stage 1: Sum masked losses, divide by the global count of valid rows. ---
    losses = model.per_example_loss(params, batch["x"], batch["y"], key, dropout_rate)
    count = jnp.sum(batch["mask"])
    return jnp.sum(losses * batch["mask"]) / count, count
    # --- end exercise ---


def train_step(state: TrainState, batch: dict, optimizer, dropout_rate: float):
    """One Adam step; returns the new state and `{"loss", "count"}`."""
    key, dropout_key = jax.random.split(state.key)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, count), grads = grad_fn(state.params, batch, dropout_key, dropout_rate)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(params, opt_state, state.step + 1, key)
    return new_state, {"loss": loss, "count": count}


def init_state(config: Config, mesh) -> TrainState:
    """Fresh state from `config.seed`, created on `mesh` inside `jit` (params and
    their Adam moments sharded by `sharding.param_specs()`, the rest replicated):
    no process ever materialises arrays on another process's devices."""
    optimizer = make_optimizer(config)

    def init() -> TrainState:
        init_key, dropout_key = jax.random.split(jax.random.key(config.seed))
        params = model.init_params(config, init_key)
        return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32), dropout_key)

    return jax.jit(init, out_shardings=state_sharding_tree(jax.eval_shape(init), mesh))()


def state_sharding_tree(abstract: TrainState, mesh):
    """Shardings for a state tree: a leaf under a param name (`w1`, ...) gets that
    param's sharding, every other leaf (step, key, Adam count) is replicated."""
    params = sharding.param_shardings(mesh)
    rep = sharding.replicated(mesh)

    def pick(path, leaf):
        del leaf
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return params[names[-1]] if names and names[-1] in params else rep

    return jax.tree_util.tree_map_with_path(pick, abstract)


def state_shardings(state: TrainState):
    return jax.tree.map(lambda a: a.sharding, state)


def make_step_fn(config: Config, mesh, like: TrainState, *, donate: bool = False):
    """The jitted step with pinned shardings: state in = state out, batch over `data`."""
    shardings = state_shardings(like)
    batch_sh = sharding.batch_sharding(mesh)
    rep = sharding.replicated(mesh)

    def step(state, batch):
        return train_step(state, batch, make_optimizer(config), config.dropout_rate)

    return jax.jit(
        step,
        in_shardings=(shardings, {"x": batch_sh, "y": batch_sh, "mask": batch_sh}),
        out_shardings=(shardings, {"loss": rep, "count": rep}),
        donate_argnums=(0,) if donate else (),
    )


def abstract_batch(config: Config, mesh) -> dict[str, jax.ShapeDtypeStruct]:
    sh = sharding.batch_sharding(mesh)
    b = config.batch_size
    return {
        "x": jax.ShapeDtypeStruct((b, config.num_features), jnp.float32, sharding=sh),
        "y": jax.ShapeDtypeStruct((b,), jnp.int32, sharding=sh),
        "mask": jax.ShapeDtypeStruct((b,), jnp.float32, sharding=sh),
    }


def compile_step(config: Config, mesh, state: TrainState, *, donate: bool = False):
    """Lowers and compiles the step ahead of time: (executable, compile seconds, HLO text).
    The loop calls this executable, so nothing compiles inside it."""
    start = time.perf_counter()
    compiled = (
        make_step_fn(config, mesh, state, donate=donate)
        .lower(state, abstract_batch(config, mesh))
        .compile()
    )
    return compiled, time.perf_counter() - start, compiled.as_text()


def host_value(x: jax.Array) -> np.ndarray:
    """The full value of a (possibly multi-process) array on this host."""
    if x.is_fully_addressable:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def digest(state: TrainState) -> str:
    """sha256 over path, dtype, shape and bytes of every leaf: equal digests mean
    bitwise-equal params, optimizer state, step and PRNG key."""
    h = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(checkpoint.to_arrays(state))
    for path, leaf in leaves:
        array = host_value(leaf)
        h.update(jax.tree_util.keystr(path).encode())
        h.update(f"{array.dtype}{array.shape}".encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def float_bits(value: float) -> str:
    """The float32 bit pattern, so that logs compare bits, not printed digits."""
    return np.float32(value).view(np.uint32).item().to_bytes(4, "big").hex()


IDLE_S = 120.0  # How long the other processes sit outside any collective at an `idle` kill.


class KillPoint(NamedTuple):
    """Where a process SIGKILLs itself: after step `step`'s update (`phase="step"`),
    right after the async save of step `step` was started (`phase="save"`, while
    Orbax is still writing), or after step `step` while every other process sits
    idle, outside any collective, for `IDLE_S` seconds (`phase="idle"`: only the
    `jax.distributed` heartbeat can tell them that the peer is gone)."""

    step: int
    phase: str
    process: int = 0


def _maybe_kill(kill: KillPoint | None, step: int, phase: str, process: int) -> None:
    if kill is None or (kill.step, kill.phase) != (step, phase):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if kill.process == process:
        os.kill(os.getpid(), signal.SIGKILL)
    elif phase == "idle":
        time.sleep(IDLE_S)


class Logger:
    """One JSON line per step and per event, flushed at once (a SIGKILL loses nothing
    already written)."""

    def __init__(self, path: Path | None):
        self.file = None if path is None else open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def run(
    config: Config,
    workdir: str | Path | None,
    *,
    checkpoints: bool = True,
    attempt: int = 0,
    kill: KillPoint | None = None,
    progress: Callable[[str], None] | None = None,
    devices=None,
) -> dict:
    """Trains `config.num_steps` steps (resuming from the latest good checkpoint in
    `workdir/checkpoints`) and returns the per-step losses, the sample IDs this
    process fed, the restore point and the final state's digest.

    `workdir=None` runs without files (used by in-process references).
    """
    process, process_count = jax.process_index(), jax.process_count()
    mesh = sharding.make_mesh(config.mesh_shape, devices)
    sharding.check_batch(config.batch_size, mesh)
    workdir = None if workdir is None else Path(workdir).absolute()
    if workdir is not None:
        check_output_dir(workdir, "The workdir")
    logger = Logger(None)
    if workdir is not None:
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        logger = Logger(workdir / "logs" / f"attempt_{attempt}_p{process}.jsonl")
    try:
        say = progress or (lambda _: None)

        say("joined; devices ready")
        state = init_state(config, mesh)
        say("state initialised")
        iterator = data.local_iterator(config, process, process_count)
        say("data ready")
        restored_step, rejected = 0, []
        manager = None
        if checkpoints and workdir is not None:
            ckpt_dir = workdir / "checkpoints"
            good, checks = checkpoint.find_restorable(
                ckpt_dir, config, process_count, primary=process == 0
            )
            rejected = [dataclasses.asdict(c) for c in checks if not c.ok]
            for check in rejected:
                say(f"checkpoint step {check['step']} rejected: {check['reason']}")
            say("checkpoints checked")
            multihost_utils.sync_global_devices("checkpoints_checked")
            say("barrier passed")
            manager = checkpoint.manager(ckpt_dir, config)
            say("manager ready")
            if good is not None:
                abstract = jax.tree.map(
                    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                    checkpoint.to_arrays(state),
                )
                items = manager.restore(good, args=checkpoint.restore_args(abstract, iterator))
                state = checkpoint.from_arrays(items[checkpoint.STATE], state)
                iterator = items[checkpoint.DATA]
                restored_step = int(host_value(state.step))
                fallback = f" (fell back past {len(rejected)} rejected step(s))" if rejected else ""
                say(f"restored checkpoint step {good}{fallback}")
            elif rejected:
                say("no complete checkpoint left after the rejected ones; starting from step 0")
        logger.write(
            {
                "event": "start",
                "attempt": attempt,
                "restored_step": restored_step,
                "rejected": rejected,
            }
        )

        step_fn, compile_s, hlo = compile_step(config, mesh, state)
        say(f"step compiled in {compile_s:.2f} s")
        if workdir is not None and process == 0:
            found = sharding.collectives(hlo)
            (workdir / "collectives.json").write_text(
                json.dumps(
                    {
                        "mesh_shape": list(config.mesh_shape),
                        "compile_s": compile_s,
                        "param_bytes": 4 * model.num_params(config),
                        "collectives": found,
                    },
                    indent=1,
                )
                + "\n"
            )
        losses: dict[int, float] = {}
        ids: dict[int, list[int]] = {}
        for step in range(restored_step + 1, config.num_steps + 1):
            batch = next(iterator)
            gbatch = sharding.global_batch(batch, mesh, config.batch_size)
            state, metrics = step_fn(state, gbatch)
            loss = float(np.asarray(metrics["loss"].addressable_data(0)))
            losses[step] = loss
            ids[step] = [int(i) for i in batch["ids"]]
            logger.write(
                {
                    "step": step,
                    "loss": loss,
                    "loss_bits": float_bits(loss),
                    "count": float(np.asarray(metrics["count"].addressable_data(0))),
                    "ids": ids[step],
                }
            )
            if step % 10 == 0 or step == config.num_steps:
                say(f"step {step:>5}/{config.num_steps}  loss {loss:.4f}")
            _maybe_kill(kill, step, "step", process)
            _maybe_kill(kill, step, "idle", process)
            if manager is not None and (
                step % config.checkpoint_every == 0 or step == config.num_steps
            ):
                meta = {
                    "step": step,
                    "config_sha256": config.digest(),
                    "process_count": process_count,
                    "config": config.model_dump(mode="json"),
                }
                manager.save(
                    step, args=checkpoint.save_args(checkpoint.to_arrays(state), iterator, meta)
                )
                _maybe_kill(kill, step, "save", process)
        say("steps done")
        if manager is not None:
            manager.wait_until_finished()
            manager.close()
        say("checkpoints written")
        final = {
            "restored_step": restored_step,
            "rejected": rejected,
            "losses": losses,
            "ids": ids,
            "digest": digest(state),
            "process": process,
            "process_count": process_count,
            "devices": jax.device_count(),
            "local_devices": jax.local_device_count(),
        }
        logger.write({"event": "final", "digest": final["digest"]})
    finally:
        logger.close()
    final["state"] = state
    return final


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start
