"""Stage 1: a scrape of a job that dies mid-reply is a failed scrape, never a crash.

A job killed by a fault drill can close its metrics socket after announcing a
reply's length but before sending all of it. `scrape` must report that as an
OSError (what `take_scrape` records as a scrape error), on every side of the
cut: nothing sent, one byte, all but one byte; a whole reply parses. A job that
hangs holding its socket open times the scrape out: `take_scrape` records that
as an error too.
"""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import pytest

from workload_operations.supervisor import _Watch, scrape

BODY = b"# TYPE workload_steps_total counter\nworkload_steps_total 7.0\n"


def _one_reply_server(sent: int) -> tuple[int, threading.Thread]:
    """A server on a free port that answers one request with the full
    Content-Length of BODY but only its first `sent` bytes, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                head = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    + f"Content-Length: {len(BODY)}\r\nConnection: close\r\n\r\n".encode()
                )
                conn.sendall(head + BODY[:sent])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return port, thread


@pytest.mark.claims("scrape-failure-is-an-os-error")
@pytest.mark.parametrize("sent", [0, 1, len(BODY) - 1])
def test_a_reply_cut_short_is_an_os_error(sent):
    port, thread = _one_reply_server(sent)
    with pytest.raises(OSError, match="IncompleteRead"):
        scrape(port, timeout_s=10.0)
    thread.join(timeout=10.0)


@pytest.mark.claims("supervisor-scrapes-metrics")
def test_a_whole_reply_is_read():
    port, thread = _one_reply_server(len(BODY))
    assert scrape(port, timeout_s=10.0) == {"workload_steps_total": 7.0}
    thread.join(timeout=10.0)


@pytest.mark.claims("scrape-failure-is-an-os-error")
def test_a_scrape_that_times_out_is_recorded_as_an_error():
    """A job that accepts the scrape and never answers: `take_scrape` returns an error
    record (the socket's timeout, not a ConnectionError), with the step it was taken at."""
    listener = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()

    def hold() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                release.wait(timeout=30.0)  # Holds the socket open, sends nothing.

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    watch = SimpleNamespace(
        port=listener.getsockname()[1], sup=SimpleNamespace(h=0.2), last_heartbeat={"step": 3}
    )
    record = _Watch.take_scrape(watch)
    release.set()
    thread.join(timeout=10.0)
    assert set(record) == {"t", "step_before", "error"} and record["step_before"] == 3
    assert "timed out" in record["error"], record
