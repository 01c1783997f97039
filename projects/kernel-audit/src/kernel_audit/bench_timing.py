"""The measurement harness of `kernel-audit bench`, with
lowering and compilation timed apart from the first call and the
warm calls, every timed call ending in `jax.block_until_ready`, compiles
counted through `jax.monitoring`, and the timed rounds interleaved across
paths (A B C, B C A, C A B, ...: the order rotates so no path always runs
first), summarized by median and p90.
"""

import dataclasses
import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

# Event name of `jax.monitoring` (jax/_src/dispatch.py): one per XLA compilation.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclasses.dataclass
class Path:
    """One timed path: a jitted function and its arguments.

    `execution_mode`: `interpret` (Pallas interpreter), `compiled` (Pallas
    compiled for the GPU) or `xla` (XLA's own fusion of the `jax.numpy` code).
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


def measure(
    paths: Sequence[Path], repeats: int, log: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """Lowers, compiles and first-calls each path, then `repeats` interleaved
    rounds. Returns per path: lower_s, compile_s, first_call_s, median_s, p90_s,
    min_s, max_s, n, times_s, compiles seen during the timed rounds, and
    execution_mode. Each path's output is kept on the path (`path.output`)."""
    results: dict[str, dict[str, Any]] = {}
    with CompileCounter() as counter:
        for path in paths:
            start = time.perf_counter()
            lowered = jax.jit(path.fn).lower(*path.args)
            lowered_at = time.perf_counter()
            path.compiled = lowered.compile()
            compiled_at = time.perf_counter()
            first = _timed(lambda p=path: jax.block_until_ready(p.compiled(*p.args)))
            path.output = path.compiled(*path.args)
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
        times: dict[str, list[float]] = {p.name: [] for p in paths}
        before = counter.compiles
        for round_index in range(repeats):
            gc.collect()
            # Rotate the order each round so that no path always runs first.
            shift = round_index % len(paths)
            for path in [*paths[shift:], *paths[:shift]]:
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


def copy_ceilings(elements: int, repeats: int) -> dict[str, Any]:
    """Bytes/s of a float32 read+write of `elements`, four ways, interleaved:

      `xla_reused`   `x + 1` under `jax.jit` with `x` donated: XLA writes into the
                     input's own buffer, pre-touched and reused every call (the
                     ceiling: no page faults, only memory traffic);
      `xla_fresh`    `x + 1` into a fresh output buffer each call (what a plain jitted
                     call does; on a CPU its first write to each new page faults);
      `numpy_copy`   `np.copyto(dst, src)` into a pre-touched, reused `dst`;
      `numpy_copy_aa` the same again: the A/A control of the NumPy copy.
    Every path moves `2 * 4 * elements` bytes per call. Returns per path its median,
    min and max bytes/s and per-call times, plus `xla_reused_buffer` (whether the
    donated output aliased the input, checked by buffer address)."""
    import jax.numpy as jnp

    nbytes = 2 * 4 * elements
    add_one = jax.jit(lambda s: s + jnp.float32(1.0))
    in_place = jax.jit(lambda s: s + jnp.float32(1.0), donate_argnums=0)
    src = jax.block_until_ready(jnp.ones((elements,), jnp.float32))
    reused = jax.block_until_ready(jnp.zeros((elements,), jnp.float32))
    address = reused.unsafe_buffer_pointer()
    reused = jax.block_until_ready(in_place(reused))  # Compile; the buffer is touched.
    aliased = reused.unsafe_buffer_pointer() == address
    jax.block_until_ready(add_one(src))
    np_src = np.ones(elements, np.float32)
    np_dst = np.zeros(elements, np.float32)  # Touched: np.zeros pages are written below.
    np.copyto(np_dst, np_src)
    state = {"reused": reused}

    def xla_reused() -> None:
        state["reused"] = jax.block_until_ready(in_place(state["reused"]))

    def xla_fresh() -> None:
        jax.block_until_ready(add_one(src))

    def numpy_copy() -> None:
        np.copyto(np_dst, np_src)

    paths = {
        "xla_reused": xla_reused,
        "xla_fresh": xla_fresh,
        "numpy_copy": numpy_copy,
        "numpy_copy_aa": numpy_copy,
    }
    names = list(paths)
    times: dict[str, list[float]] = {n: [] for n in names}
    for round_index in range(repeats):
        gc.collect()
        shift = round_index % len(names)
        for name in [*names[shift:], *names[:shift]]:
            times[name].append(_timed(paths[name]))
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
