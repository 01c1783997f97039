"""The job's own observation: counters, heartbeats as JSON lines, Prometheus metrics.

The training loop calls `Observer.step_done(...)` once per step: it updates a
few Python integers under a lock and two Prometheus counters (about two
microseconds; `workload-operations bench` measures the cost against the step).
A reporter thread wakes every `heartbeat_interval_s`, takes a consistent
snapshot under the same lock and writes one JSON line:

    {"event": "heartbeat", "seq": 7, "t": 1234.5, "step": 130, "examples": 2080,
     "step_t": 1234.49, "examples_per_s": 318.2, "loss": 0.61}

`t` and `step_t` are `time.monotonic()` readings (CLOCK_MONOTONIC on Linux, the
same clock in every process of the machine), so a supervisor can relate them
to its own. The same figures are served as Prometheus metrics on 127.0.0.1 at
a free port, announced in a `{"event": "metrics", "port": ...}` line.

This module imports no JAX: the reporter starts before the job's imports, so
heartbeats also cover start-up.
"""

import json
import sys
import threading
import time
from typing import Any, TextIO

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class Observer:
    """Counts steps and examples, emits heartbeats, serves the counts as metrics."""

    def __init__(self, interval_s: float, out: TextIO | None = None, serve: bool = True):
        self.interval_s = interval_s
        self.out = out if out is not None else sys.stdout
        self.serve = serve
        # The reporter and the training loop share this lock: a heartbeat is a
        # consistent snapshot of (step, examples, step_t, loss).
        self.lock = threading.Lock()
        self._out_lock = threading.Lock()
        self.step = 0
        self.examples = 0
        self.step_t: float | None = None
        self.loss: Any = None  # The last step's loss (a JAX scalar, read by the reporter).
        self.seq = 0
        self._prev = (0, time.monotonic())  # (examples, t) at the previous heartbeat.
        self.registry = CollectorRegistry()
        self.steps_total = Counter(
            "workload_steps", "Optimizer steps completed.", registry=self.registry
        )
        self.examples_total = Counter(
            "workload_examples", "Training examples consumed.", registry=self.registry
        )
        self.heartbeats_total = Counter(
            "workload_heartbeats", "Heartbeats emitted.", registry=self.registry
        )
        self.loss_gauge = Gauge("workload_loss", "Loss of the last step.", registry=self.registry)
        self.rate_gauge = Gauge(
            "workload_examples_per_second",
            "Examples per second since the previous heartbeat.",
            registry=self.registry,
        )
        self.port: int | None = None
        self._server = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts the metrics server (127.0.0.1, a free port) and the reporter thread."""
        if self.serve:
            self._server, _ = start_http_server(0, addr="127.0.0.1", registry=self.registry)
            self.port = int(self._server.server_port)
            self.emit({"event": "metrics", "port": self.port, "t": time.monotonic()})
        self._thread = threading.Thread(target=self._report, name="heartbeat", daemon=True)
        self._thread.start()

    def step_done(self, step: int, examples: int, loss: Any) -> None:
        """Called by the training loop after step `step` consumed `examples` examples.

        Under `self.lock`: `step` becomes the step [claim:step-done-step-as-given],
        `examples` grows by the examples [claim:step-done-examples-summed],
        `step_t` is `time.monotonic()`, `loss` the loss as given (not converted: the
        reporter reads it) [claim:step-done-time-and-loss]. Then the `steps_total`
        counter grows by 1 and `examples_total` by the examples
        [claim:step-done-prometheus-counters].
        """
        # --- exercise stage 1: Update step, examples, time, loss; count. ---
        with self.lock:
            self.step = step
            self.examples += examples
            self.step_t = time.monotonic()
            self.loss = loss
        self.steps_total.inc()
        self.examples_total.inc(examples)
        # --- end exercise ---

    def heartbeat(self) -> dict:
        """One heartbeat record (and the matching metric updates).

        Takes (step, examples, step_t, loss) under `self.lock` in one snapshot, then
        returns `{"event": "heartbeat", "seq", "t", "step", "examples", "step_t",
        "examples_per_s", "loss"}`: `seq` counts heartbeats from 1; `t` is
        `time.monotonic()` now [claim:heartbeat-record-fields]; `examples_per_s` is the
        examples since the previous heartbeat over the seconds since it (since the
        observer was made, for the first), with the seconds floored at 1e-9
        [claim:heartbeat-rate]; `loss` is `float(loss)` [claim:heartbeat-loss-as-float],
        or None before the first step [claim:heartbeat-loss-none-before-first-step].
        Counts one heartbeat (`heartbeats_total`) and sets the loss gauge (when there
        is a loss) and the rate gauge [claim:heartbeat-counter-and-gauges].
        """
        # --- exercise stage 1: Snapshot progress, compute the rate, count. ---
        with self.lock:
            step, examples, step_t, loss = self.step, self.examples, self.step_t, self.loss
        now = time.monotonic()
        prev_examples, prev_t = self._prev
        rate = (examples - prev_examples) / max(now - prev_t, 1e-9)
        self._prev = (examples, now)
        self.seq += 1
        self.heartbeats_total.inc()
        loss_value = None if loss is None else float(loss)
        if loss_value is not None:
            self.loss_gauge.set(loss_value)
        self.rate_gauge.set(rate)
        return {
            "event": "heartbeat",
            "seq": self.seq,
            "t": now,
            "step": step,
            "examples": examples,
            "step_t": step_t,
            "examples_per_s": rate,
            "loss": loss_value,
        }
        # --- end exercise ---

    def _report(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.emit(self.heartbeat())

    def stop_reporting(self) -> None:
        """Stops the reporter thread (the metrics server keeps serving)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        self.stop_reporting()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def emit(self, record: dict) -> None:
        """Writes one JSON line and flushes it (a SIGKILL loses nothing already written)."""
        line = json.dumps(record) + "\n"
        with self._out_lock:
            self.out.write(line)
            self.out.flush()
