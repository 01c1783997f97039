"""The measurement harness of `mlp-classifier bench`, with
compilation timed apart from execution
(a path's `prepare`), every timed call ending in `jax.block_until_ready` (a
path's `run_epoch`), compiles and jaxpr traces counted through
`jax.monitoring`, FLOPs and bytes from XLA's cost analysis of an executable,
and timed rounds interleaved across paths (A B C A B C ...), summarized by
median and p90.

A path is anything with the `TimedPath` interface; the paths themselves are in
`bench_paths.py`, the PyTorch one in `bench_torch.py`.
"""

import gc
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import numpy as np

# Event names of `jax.monitoring` (defined in jax/_src/dispatch.py): one
# backend-compile event per XLA compilation, one trace event per jaxpr trace.
# Cache hits emit neither, so a loop that reuses its executable adds zero.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"


class TimedPath(Protocol):
    """What the timing loop needs from a path.

    `prepare()` lowers and compiles ahead of time and returns
    `{"lower_s", "compile_s"}`; `run_epoch()` trains one epoch and returns only
    when the results are computed (it ends in `jax.block_until_ready`);
    `losses()` is float32 `(S,)` for the last epoch (None for the GEMM).
    """

    name: str

    def prepare(self) -> dict[str, float]: ...

    def run_epoch(self) -> None: ...

    def losses(self) -> np.ndarray | None: ...


def _timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of `fn()`. The garbage collector is paused so that a
    collection triggered by one path is not billed to another."""
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def compile_timed(jitted: Any, *args: Any) -> tuple[Any, dict[str, float]]:
    """Lowers and compiles `jitted` for `args` ahead of the first call.

    Returns `(compiled, times)`: the executable, and `lower_s` (tracing and
    lowering to StableHLO) and `compile_s` (XLA compilation) in seconds.
    """
    start = time.perf_counter()
    lowered = jitted.lower(*args)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    return compiled, {"lower_s": lowered_at - start, "compile_s": time.perf_counter() - lowered_at}


def cost_analysis(compiled: Any) -> dict[str, float]:
    """FLOPs and bytes accessed from XLA's cost analysis of an executable."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list | tuple):  # Older jax: one dict per device.
        analysis = analysis[0]
    analysis = analysis or {}
    return {
        "flops": float(analysis.get("flops", math.nan)),
        "bytes_accessed": float(analysis.get("bytes accessed", math.nan)),
    }


class CompileCounter:
    """Counts XLA backend compiles and jaxpr traces while active (a context
    manager over a `jax.monitoring` listener)."""

    def __init__(self) -> None:
        self.compiles = 0
        self.traces = 0

    def _on_event(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        del duration_secs, kwargs
        if event == BACKEND_COMPILE_EVENT:
            self.compiles += 1
        elif event == TRACE_EVENT:
            self.traces += 1

    def snapshot(self) -> tuple[int, int]:
        return self.compiles, self.traces

    def __enter__(self) -> "CompileCounter":
        jax.monitoring.register_event_duration_secs_listener(self._on_event)
        return self

    def __exit__(self, *exc: object) -> None:
        jax.monitoring.unregister_event_duration_listener(self._on_event)


def measure(
    paths: Sequence[TimedPath], repeats: int, counter: CompileCounter, log: Callable[[str], None]
) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray]]:
    """Compiles each path, runs its first epoch, then `repeats` rounds of one
    epoch per path in a fixed interleaved order (A B C D A B C D ...).

    Returns the per-path measurements (`compile_s`, `first_call_s`,
    `median_s`, `p90_s`, `n`, plus `lower_s`,
    `min_s`, `max_s`, every timed value in `times_s`, and the compiles/traces
    seen while preparing, during the first call and during the timed rounds)
    and each path's per-step losses from its first epoch.
    """
    results: dict[str, dict[str, Any]] = {}
    first_losses: dict[str, np.ndarray] = {}
    for path in paths:
        before = counter.snapshot()
        result = dict(path.prepare())
        prepared = counter.snapshot()
        result["first_call_s"] = _timed(path.run_epoch)
        after = counter.snapshot()
        result["compiles"] = {
            "prepare": prepared[0] - before[0],
            "first_call": after[0] - prepared[0],
        }
        result["traces"] = {
            "prepare": prepared[1] - before[1],
            "first_call": after[1] - prepared[1],
        }
        results[path.name] = result
        losses = path.losses()
        if losses is not None:
            first_losses[path.name] = losses
        log(
            f"  {path.name:<14} lower {result['lower_s']:.3f}s  compile {result['compile_s']:.3f}s"
            f"  first call {result['first_call_s']:.4f}s"
        )
    times: dict[str, list[float]] = {path.name: [] for path in paths}
    timed_compiles = dict.fromkeys(times, 0)
    timed_traces = dict.fromkeys(times, 0)
    for round_index in range(repeats):
        gc.collect()
        for path in paths:
            before = counter.snapshot()
            times[path.name].append(_timed(path.run_epoch))
            after = counter.snapshot()
            timed_compiles[path.name] += after[0] - before[0]
            timed_traces[path.name] += after[1] - before[1]
        if (round_index + 1) % max(1, repeats // 5) == 0 or round_index + 1 == repeats:
            log(f"  round {round_index + 1}/{repeats}")
    for name, values in times.items():
        arr = np.asarray(values)
        results[name].update(
            median_s=float(np.median(arr)),
            p90_s=float(np.percentile(arr, 90)),
            min_s=float(arr.min()),
            max_s=float(arr.max()),
            n=len(values),
            times_s=[float(v) for v in values],
        )
        results[name]["compiles"]["timed"] = timed_compiles[name]
        results[name]["traces"]["timed"] = timed_traces[name]
    return results, first_losses
