"""A queue model of the server, fitted to its measured service times.

The server has two resources in series:
  - the event loop, which spends `h` seconds of CPU on each request (HTTP
    parsing, JSON, validation, the response), one request at a time;
  - the model worker, which runs one batch at a time for `S(n) = a + c * n`
    seconds, `n` the padded batch size.
The batcher between them follows the server's policy exactly: it takes the
first queued request once the worker is free, waits until `batch_timeout_ms`
after that request entered the queue (or until `max_batch_size` rows are
queued), and runs the whole requests that fit.

`fit` estimates `a, c` by least squares on the batch records of `/metrics`,
and `h` from the server's CPU time not spent in batches, per request, at ONE
rate (the lowest); `simulate` replays any arrival schedule through the model
(a discrete-event simulation, no randomness of its own); `capacity` is the
throughput at which one of the two resources is busy all the time.
"""

from typing import Any

import numpy as np

from deployment_audit.serve import bucket


def _line(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Least-squares `t = a + c * n`, both clipped at 0 (a negative time is noise).
    With a single `n` the slope is not identifiable: `c = 0`, `a` the mean."""
    if len(np.unique(n)) < 2:
        return float(max(t.mean(), 0.0)), 0.0
    design = np.stack([np.ones_like(n), n], axis=1)
    (a, c), *_ = np.linalg.lstsq(design, t, rcond=None)
    return float(max(a, 0.0)), float(max(c, 0.0))


def fit_batch_service(batches: list[dict[str, Any]]) -> dict[str, float]:
    """`compute_s = a + c * padded` (wall time of a batch, what latency sees) and
    `compute_cpu_s = a_cpu + c_cpu * padded` (its CPU time), by least squares."""
    n = np.asarray([b["padded"] for b in batches], np.float64)
    a, c = _line(n, np.asarray([b["compute_s"] for b in batches], np.float64))
    a_cpu, c_cpu = _line(n, np.asarray([b["compute_cpu_s"] for b in batches], np.float64))
    return {
        "a_s": a,
        "c_s_per_row": c,
        "a_cpu_s": a_cpu,
        "c_cpu_s_per_row": c_cpu,
        "num_batches": len(batches),
    }


def fit_request_overhead(cpu_s: float, batches: list[dict[str, Any]], requests: int) -> float:
    """Event-loop CPU seconds per request: the server's process CPU time not spent
    computing batches, per request."""
    return max(cpu_s - sum(b["compute_cpu_s"] for b in batches), 0.0) / max(requests, 1)


def capacity(model: dict[str, float], max_batch: int) -> dict[str, float]:
    """Requests/s at which a resource saturates, for requests of `mean_rows` rows.

    The worker's best case packs `max_batch // mean_rows` requests per batch.
    """
    per_batch = max(1, int(max_batch // max(model["mean_rows"], 1.0)))
    padded = bucket(min(max_batch, int(round(per_batch * model["mean_rows"]))), max_batch)
    worker = per_batch / (model["a_s"] + model["c_s_per_row"] * padded)
    loop = 1.0 / model["h_s"] if model["h_s"] > 0 else float("inf")
    return {
        "loop_limit_rps": loop,
        "worker_limit_rps": worker,
        "capacity_rps": min(loop, worker),
        "bottleneck": "event loop" if loop < worker else "model worker",
    }


def simulate(
    arrivals: np.ndarray,
    rows: np.ndarray,
    model: dict[str, float],
    max_batch: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Replays arrivals (seconds, sorted) with `rows` per request through the model.

    Returns per-request server latencies (queue entry to batch done, seconds),
    their percentiles, the predicted busy fraction of both resources, and the
    predicted CPU seconds per request (loop CPU plus the batches' CPU).
    """
    n = len(arrivals)
    h = model["h_s"]
    queued_at = np.empty(n)
    loop_free = 0.0
    for i, t in enumerate(arrivals):
        loop_free = max(t, loop_free) + h
        queued_at[i] = loop_free
    done = np.empty(n)
    worker_free, i, busy, cpu = 0.0, 0, 0.0, 0.0
    while i < n:
        start_collect = max(worker_free, queued_at[i])
        close = max(start_collect, queued_at[i] + timeout_s)
        j, total = i, 0
        while j < n and total + rows[j] <= max_batch and queued_at[j] <= close:
            total += rows[j]
            if total >= max_batch:
                close = max(start_collect, queued_at[j])
            j += 1
        padded = bucket(total, max_batch)
        service = model["a_s"] + model["c_s_per_row"] * padded
        finish = close + service
        busy += service
        cpu += model.get("a_cpu_s", 0.0) + model.get("c_cpu_s_per_row", 0.0) * padded
        done[i:j] = finish
        worker_free = finish
        i = j
    latency = done - queued_at + h
    span = max(done[-1] - arrivals[0], 1e-9)
    return {
        "cpu_per_request_s": float(h + cpu / n),
        "latencies_s": latency,
        "p50_s": float(np.percentile(latency, 50)),
        "p95_s": float(np.percentile(latency, 95)),
        "p99_s": float(np.percentile(latency, 99)),
        "loop_utilization": float(n * h / span),
        "worker_utilization": float(busy / span),
    }
