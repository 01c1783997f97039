"""Splitting the vmapped seeds over CPU devices, so that every core works.

On the CPU backend a vmapped PPO run of this size keeps one core busy (CPU
time / wall time about 1.04, measured): XLA runs one device's program largely
on one thread. Splitting the seed axis over several CPU devices runs the
pieces side by side; the seeds never exchange data, so nothing else changes.

JAX fixes the number of CPU devices when its backend starts, so
`request_cpu_devices` must run before the first JAX computation (the CLI calls
it first; the tests' conftest asks for two). `JAX_NUM_CPU_DEVICES=N` in the
environment does the same from outside.
"""

from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from policy_evaluation.config import Config


class DeviceError(RuntimeError):
    """The run asks for more CPU devices than JAX started with; the message says
    how to fix it."""


def request_cpu_devices(count: int) -> None:
    """Asks JAX for at least `count` CPU devices. A no-op once the backend has
    started (then `seed_sharding` reports a shortfall as a `DeviceError`)."""
    if jax.config.jax_num_cpu_devices >= count:
        return
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        pass  # the backend has started; its device count stays what it is


def seed_sharding(config: Config) -> NamedSharding | None:
    """Leading-axis sharding over the first `config.seed_shards` CPU devices, or
    None for one shard or a non-CPU backend (where all seeds share one device)."""
    shards = config.seed_shards
    if shards == 1 or jax.default_backend() != "cpu":
        return None
    devices = jax.devices("cpu")
    if len(devices) < shards:
        raise DeviceError(
            f"`seed_shards` = {shards} needs {shards} CPU devices, but JAX started with "
            f"{len(devices)}. Set JAX_NUM_CPU_DEVICES={shards} in the environment (or call "
            f"`request_cpu_devices({shards})` before the first JAX computation), or lower "
            "`seed_shards`."
        )
    return NamedSharding(Mesh(np.asarray(devices[:shards]), ("seed",)), PartitionSpec("seed"))


def jit_over_seeds(fn: Callable, config: Config) -> Callable:
    """`jax.jit(jax.vmap(fn))` whose arguments and results all have the seed
    axis first; with several shards, each device computes its slice of seeds."""
    sharding = seed_sharding(config)
    if sharding is None:
        return jax.jit(jax.vmap(fn))
    return jax.jit(jax.vmap(fn), in_shardings=sharding, out_shardings=sharding)
