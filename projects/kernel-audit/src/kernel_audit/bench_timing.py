"""The measurement harness of `kernel-audit bench`, with
lowering and compilation timed apart from the first call and the
warm calls, every timed call ending in `jax.block_until_ready`, compiles
counted through `jax.monitoring`, and the timed rounds interleaved across
paths in an order shuffled anew each round (`round_orders`, from a generator
seeded by the bench seed and the measurement's label, `order_rng`), so that no
path always runs first and the A/A control does not always follow the same
neighbour; summarized by median and p90. A path whose lowering, compilation or first call
raises (`COMPILE_FAILURES`: a configuration the kernel's checks accept but the
chip's compiler refuses, such as a scoped-VMEM overflow) can be recorded as
failed and left out of the timed rounds, so one bad configuration does not stop
a run (`measure(..., failed=...)`).
"""

import dataclasses
import gc
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

# Event name of `jax.monitoring` (jax/_src/dispatch.py): one per XLA compilation.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _lowering_exceptions() -> tuple[type[BaseException], ...]:
    """Mosaic's own lowering error, where this JAX has one (a private class)."""
    try:
        from jax._src.pallas.mosaic.lowering import LoweringException
    except ImportError:  # pragma: no cover - depends on the installed JAX.
        return ()
    return (LoweringException,)


# What lowering, compiling or first calling one path may raise without stopping the
# run: XLA's and Mosaic's runtime errors (`JaxRuntimeError`, alias `XlaRuntimeError`:
# a scoped-VMEM overflow, an out-of-memory), a lowering's `ValueError` or
# `NotImplementedError`, and Mosaic's `LoweringException`. Bound here, at import, so
# a test that replaces this module's `jax` does not change it.
COMPILE_FAILURES: tuple[type[BaseException], ...] = (
    jax.errors.JaxRuntimeError,
    ValueError,
    NotImplementedError,
    *_lowering_exceptions(),
)
ERROR_CHARS = 400


def one_line(err: BaseException) -> str:
    """`<type>: <message>` on one line (whitespace collapsed), at most `ERROR_CHARS`
    characters of message."""
    message = " ".join(str(err).split())
    if len(message) > ERROR_CHARS:
        message = message[: ERROR_CHARS - 3] + "..."
    return f"{type(err).__name__}: {message}"


@dataclasses.dataclass
class Path:
    """One timed path: a jitted function and its arguments.

    `execution_mode`: `interpret` (Pallas interpreter), `compiled` (Pallas
    compiled by Mosaic for the TPU) or `xla` (XLA's own fusion of the `jax.numpy` code).
    """

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    execution_mode: str
    compiled: Any = None
    output: Any = None


class CompileCounter:
    """Counts XLA backend compiles while active."""

    def __init__(self) -> None:
        self.compiles = 0

    def _on_event(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        del duration_secs, kwargs
        if event == BACKEND_COMPILE_EVENT:
            self.compiles += 1

    def __enter__(self) -> "CompileCounter":
        jax.monitoring.register_event_duration_secs_listener(self._on_event)
        return self

    def __exit__(self, *exc: object) -> None:
        jax.monitoring.unregister_event_duration_listener(self._on_event)


def _timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of `fn()`, with the garbage collector paused."""
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def order_rng(seed: int, label: str) -> np.random.Generator:
    """The generator of one measurement's path orders: NumPy's `default_rng` seeded
    with `[seed, crc32(label)]`, so each setting's orders follow from the bench seed
    and the setting's name alone (not from which settings ran before it)."""
    return np.random.default_rng([seed, zlib.crc32(label.encode())])


def round_orders(n_paths: int, repeats: int, rng: np.random.Generator) -> list[list[int]]:
    """`repeats` orders of the paths `0 .. n_paths - 1`, each `rng.permutation`."""
    return [[int(i) for i in rng.permutation(n_paths)] for _ in range(repeats)]


def measure(
    paths: Sequence[Path],
    orders: Sequence[Sequence[int]],
    log: Callable[[str], None],
    failed: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Lowers, compiles and first-calls each path, then one timed round per entry of
    `orders`, calling the paths in that round's order (indices into `paths`).
    Returns per path: lower_s, compile_s, first_call_s, median_s, p90_s, min_s,
    max_s, n, times_s (in round order), compiles seen during the timed rounds, and
    execution_mode. Each path's output is kept on the path (`path.output`).

    Given `failed` (a dict), a path whose lowering, compilation or first call raises
    one of `COMPILE_FAILURES` is entered there (name -> `one_line` error), logged,
    and left out of the timed rounds and of the results; the other paths go on.
    Without it the error propagates."""
    results: dict[str, dict[str, Any]] = {}
    repeats = len(orders)
    with CompileCounter() as counter:
        for path in paths:
            try:
                start = time.perf_counter()
                lowered = jax.jit(path.fn).lower(*path.args)
                lowered_at = time.perf_counter()
                path.compiled = lowered.compile()
                compiled_at = time.perf_counter()
                first = _timed(lambda p=path: jax.block_until_ready(p.compiled(*p.args)))
                path.output = path.compiled(*path.args)
            except COMPILE_FAILURES as err:
                if failed is None:
                    raise
                failed[path.name] = one_line(err)
                path.compiled = path.output = None
                log(f"  {path.name:<26} ({path.execution_mode}) FAILED: {failed[path.name]}")
                continue
            results[path.name] = {
                "execution_mode": path.execution_mode,
                "lower_s": lowered_at - start,
                "compile_s": compiled_at - lowered_at,
                "first_call_s": first,
            }
            log(
                f"  {path.name:<26} ({path.execution_mode}) compile "
                f"{compiled_at - lowered_at:.3f}s first call {first:.4f}s"
            )
        times: dict[str, list[float]] = {p.name: [] for p in paths if p.name in results}
        before = counter.compiles
        for round_index, order in enumerate(orders):
            gc.collect()
            for index in order:
                path = paths[index]
                if path.name not in results:
                    continue
                times[path.name].append(
                    _timed(lambda p=path: jax.block_until_ready(p.compiled(*p.args)))
                )
            if (round_index + 1) % max(1, repeats // 4) == 0:
                log(f"  round {round_index + 1}/{repeats}")
        timed_compiles = counter.compiles - before
    for name, values in times.items():
        arr = np.asarray(values)
        results[name].update(
            median_s=float(np.median(arr)),
            p90_s=float(np.percentile(arr, 90)),
            min_s=float(arr.min()),
            max_s=float(arr.max()),
            n=len(values),
            times_s=[float(v) for v in values],
            compiles_during_timed_rounds=timed_compiles,
        )
    return results


def cost_analysis(compiled: Any) -> dict[str, float]:
    """FLOPs and bytes accessed from XLA's cost analysis of an executable."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list | tuple):
        analysis = analysis[0]
    analysis = analysis or {}
    return {
        "flops": float(analysis.get("flops", float("nan"))),
        "bytes_accessed": float(analysis.get("bytes accessed", float("nan"))),
    }


def copy_ceilings(elements: int, repeats: int, seed: int, host_copy: bool) -> dict[str, Any]:
    """Bytes/s of a float32 read+write of `elements` on the device, interleaved in
    shuffled rounds (`order_rng(seed, "copy")`):

      `xla_reused`   `x + 1` under `jax.jit` with `x` donated: XLA writes into the
                     input's own buffer, pre-touched and reused every call (the
                     ceiling: no page faults, only memory traffic);
      `xla_fresh`    `x + 1` into a fresh output buffer each call (what a plain jitted
                     call does; on a CPU its first write to each new page faults);
    and with `host_copy` (a CPU backend, where the device memory is host memory):
      `numpy_copy`   `np.copyto(dst, src)` into a pre-touched, reused `dst`;
      `numpy_copy_aa` the same again: the A/A control of the NumPy copy.
    On a TPU a host copy measures nothing about the chip's memory and is left out.
    Every path moves `2 * 4 * elements` bytes per call. Returns per path its median,
    min and max bytes/s and per-call times, plus `xla_reused_buffer` (whether the
    donated output aliased the input, checked by buffer address; None where the
    backend gives no address)."""
    import jax.numpy as jnp

    nbytes = 2 * 4 * elements
    add_one = jax.jit(lambda s: s + jnp.float32(1.0))
    in_place = jax.jit(lambda s: s + jnp.float32(1.0), donate_argnums=0)
    src = jax.block_until_ready(jnp.ones((elements,), jnp.float32))
    reused = jax.block_until_ready(jnp.zeros((elements,), jnp.float32))
    address = _address(reused)
    reused = jax.block_until_ready(in_place(reused))  # Compile; the buffer is touched.
    aliased = None if address is None else _address(reused) == address
    jax.block_until_ready(add_one(src))
    state = {"reused": reused}

    def xla_reused() -> None:
        state["reused"] = jax.block_until_ready(in_place(state["reused"]))

    def xla_fresh() -> None:
        jax.block_until_ready(add_one(src))

    paths: dict[str, Callable[[], None]] = {"xla_reused": xla_reused, "xla_fresh": xla_fresh}
    if host_copy:
        np_src = np.ones(elements, np.float32)
        np_dst = np.zeros(elements, np.float32)  # Touched: np.zeros pages are written below.
        np.copyto(np_dst, np_src)

        def numpy_copy() -> None:
            np.copyto(np_dst, np_src)

        paths |= {"numpy_copy": numpy_copy, "numpy_copy_aa": numpy_copy}
    names = list(paths)
    times: dict[str, list[float]] = {n: [] for n in names}
    for order in round_orders(len(names), repeats, order_rng(seed, "copy")):
        gc.collect()
        for index in order:
            times[names[index]].append(_timed(paths[names[index]]))
    out: dict[str, Any] = {"bytes_per_call": nbytes, "xla_reused_buffer": aliased}
    for name, values in times.items():
        arr = np.asarray(values)
        out[name] = {
            "bytes_per_s": nbytes / float(np.median(arr)),
            "bytes_per_s_min": nbytes / float(arr.max()),
            "bytes_per_s_max": nbytes / float(arr.min()),
            "median_s": float(np.median(arr)),
            "n": len(values),
            "times_s": [float(v) for v in values],
        }
    return out


def _address(array: jax.Array) -> int | None:
    """The device buffer's address, or None where the backend does not give one."""
    try:
        return array.unsafe_buffer_pointer()
    except (NotImplementedError, RuntimeError, AttributeError):
        return None
