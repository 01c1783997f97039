"""A bounded load generator for the serving host (loopback only).

`LoadGenerator(port, clients)` runs `clients` threads, each with its own HTTP
connection, sending one-row `POST /predict` requests back to back until
`stop()` is called, `max_requests` were sent, or `max_seconds` passed,
whichever comes first. Every request is recorded: start and end
(`time.perf_counter`), HTTP status (0 for a transport error), and the model
id that answered.
"""

import threading
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sample:
    start: float
    end: float
    status: int
    model_id: str | None
    prediction: int | None
    row: int


@dataclass
class LoadGenerator:
    port: int
    clients: int = 2
    max_requests: int = 50_000
    max_seconds: float = 300.0
    rows: np.ndarray | None = None  # float32 (n, 64) inputs, sent in turn
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rows is None:
            from engineering_release import data

            self.rows = data.heldout_set(0, 0.2).images
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sent = 0
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True)
            for i in range(self.clients)
        ]

    def _client(self, index: int) -> None:
        import httpx

        deadline = time.perf_counter() + self.max_seconds
        bodies = [{"inputs": [row.tolist()]} for row in self.rows]
        with httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30.0) as http:
            i = index
            while not self._stop.is_set() and time.perf_counter() < deadline:
                with self._lock:
                    if self._sent >= self.max_requests:
                        return
                    self._sent += 1
                row = i % len(bodies)
                i += self.clients
                start = time.perf_counter()
                try:
                    r = http.post("/predict", json=bodies[row])
                    status = r.status_code
                    body = r.json() if status == 200 else {}
                except Exception:  # noqa: BLE001 - any transport failure is a failed request.
                    status, body = 0, {}
                end = time.perf_counter()
                prediction = body.get("predictions", [None])[0]
                with self._lock:
                    self.samples.append(
                        Sample(start, end, status, body.get("model_id"), prediction, row)
                    )

    def start(self) -> "LoadGenerator":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        for t in self._threads:
            t.join(60.0)
        return list(self.samples)

    def between(self, start: float, end: float) -> list[Sample]:
        """Samples that started at or after `start` and ended by `end`."""
        with self._lock:
            return [s for s in self.samples if s.start >= start and s.end <= end]

    def wait_for(self, count: int, timeout_s: float = 60.0) -> None:
        deadline = time.perf_counter() + timeout_s
        while len(self.samples) < count and time.perf_counter() < deadline:
            time.sleep(0.01)


def p99(latencies: list[float]) -> float:
    return float(np.percentile(np.asarray(latencies), 99)) if latencies else float("nan")
