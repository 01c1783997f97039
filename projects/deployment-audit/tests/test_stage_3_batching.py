"""Stage 3: the batcher's queue bound and batches, in-process, no server.

Independent checks: the batcher, with a stand-in model whose answers show the
rows they came from, against tables worked out by hand from the rules (a
request is accepted while the queued rows stay within the bound; a batch
takes whole requests from the head up to the maximum batch size); a batch
that is exactly full runs at once, one row short of it waits for the
timeout, judged without reading a clock. Changed conditions: queue bounds of
6, 7 and 20 rows, maximum batches of 2, 4 and 8 rows.
"""

import asyncio

import numpy as np
import pytest

from deployment_audit import data, serve
from deployment_audit.config import ServeConfig


class _EchoModel:
    """A stand-in for the artifact: the logits are a row's first ten pixels, so
    every answer shows which rows it was computed from."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x[:, :10], np.float32)


def _batcher_scenario(max_queue_rows: int, sizes: list[int]) -> tuple[list, list]:
    """Requests of `sizes` rows (request i holds the value i) submitted back to back
    into a batcher with batches of at most 4 rows; returns what each request got
    and the batches' rows and request counts."""
    config = ServeConfig(
        max_batch_size=4,
        batch_timeout_ms=50.0,
        max_queue_rows=max_queue_rows,
        max_rows_per_request=4,
    )

    async def scenario():
        stats = serve.Stats()
        batcher = serve.Batcher(_EchoModel(), config, stats)
        runner = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)  # The batcher waits for work.
        tasks = [
            asyncio.create_task(batcher.submit(np.full((n, data.NUM_FEATURES), i, np.float32)))
            for i, n in enumerate(sizes)
        ]
        answers = asyncio.gather(*tasks, return_exceptions=True)
        # A liveness guard, not a timing check: the batcher's loop only ends by failing.
        await asyncio.wait({answers, runner}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if runner.done():
            runner.result()  # Raises the error that stopped the batcher.
            raise AssertionError("the batcher stopped with requests unanswered")
        if not answers.done():
            raise AssertionError("the batcher left requests unanswered for 120 s")
        got = answers.result()
        runner.cancel()
        return got, [(b["rows"], b["requests"]) for b in stats.batches]

    got, batches = asyncio.run(scenario())
    for g in got:  # Only a full queue may refuse a request; any other error is the batcher's.
        if isinstance(g, BaseException) and not isinstance(g, serve.Overloaded):
            raise g
    answers = [
        "503" if isinstance(g, serve.Overloaded) else sorted({float(v) for v in np.ravel(g)})
        for g in got
    ]
    return answers, batches


@pytest.mark.claims(
    "dynamic-batching",
    "queue-admits-within-row-bound",
    "queue-refuses-past-row-bound",
    "batch-whole-requests-in-order",
    "batch-no-jumping-ahead",
    "batch-fills-exactly",
)
def test_the_queue_bound_counts_rows_and_batches_hold_whole_requests(evidence):
    """The queue bound counts rows and batches take whole requests, against hand-worked answers.

    In-process, no server: six requests of 1, 2, 3, 1, 2, 1 rows arrive before
    the batcher runs. The expectation is worked out by hand from the rules (accept
    while the queued rows stay within the bound; a batch takes whole requests
    from the head up to 4 rows). Repeated with a bound of 6 and of 7 rows."""
    sizes = [1, 2, 3, 1, 2, 1]
    expected = {
        6: (["0", "1", "2", "503", "503", "503"], [(3, 2), (3, 1)]),
        7: (["0", "1", "2", "3", "503", "503"], [(3, 2), (4, 2)]),
    }
    observed, ok = {}, True
    for bound, (answers, batches) in expected.items():
        got, got_batches = _batcher_scenario(bound, sizes)
        shown = [g if g == "503" else ",".join(f"{v:g}" for v in g) for g in got]
        observed[f"bound {bound}"] = {"answers": shown, "batches": got_batches}
        ok &= shown == answers and got_batches == batches
    assert evidence.record(
        "queue bound in rows, and batches of whole requests",
        "requests of 1, 2, 3, 1, 2, 1 rows; batches of at most 4; queue bound 6 and 7 rows",
        observed,
        {k: {"answers": v[0], "batches": v[1]} for k, v in expected.items()},
        ok,
    ), observed


@pytest.mark.claims(
    "dynamic-batching",
    "batch-whole-requests-in-order",
    "batch-no-jumping-ahead",
    "batch-fills-exactly",
)
def test_a_batch_never_passes_its_maximum():
    """Batches never pass 4 rows and take whole requests in arrival order, as worked out by hand.

    Requests of 1, 4, 2, 2, 3, 1 rows, all queued (bound 20), batches of at most 4
    rows, worked out by hand: the 4-row request cannot join the 1-row one (5 > 4),
    two requests fill a batch exactly (2 + 2, 3 + 1)."""
    answers, batches = _batcher_scenario(20, [1, 4, 2, 2, 3, 1])
    assert answers == [[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]]
    assert batches == [(1, 1), (4, 1), (4, 2), (4, 2)]


NEVER_S = 600.0  # A batch timeout no correct run reaches: the full batch must not wait for it.
GUARD_S = 30.0  # How long the test waits for an answer that needs a few event-loop turns.


def _full_batch_scenario(max_batch: int) -> dict:
    """Drives a batcher whose timeout is `NEVER_S` across the full-batch boundary.

    First `max_batch - 1` rows (one request) are queued and the batcher is given
    time to take them; then one more row fills the batch. Then `max_batch`
    one-row requests arrive at once into the idle batcher. Returns what was
    observed at each step."""
    # `ServeConfig` caps the timeout at 1 s for a real server; the batcher only
    # reads the fields, and this test needs one no machine mistakes for prompt.
    config = ServeConfig.model_construct(
        max_batch_size=max_batch,
        batch_timeout_ms=NEVER_S * 1e3,
        max_queue_rows=4 * max_batch,
        max_rows_per_request=max_batch,
    )

    def rows(n: int, value: int) -> np.ndarray:
        return np.full((n, data.NUM_FEATURES), value, np.float32)

    async def answered(runner, tasks) -> bool:
        """Whether every task finished within GUARD_S (a liveness guard: the
        batcher's loop only ends by failing, which is re-raised)."""
        answers = asyncio.gather(*tasks)
        await asyncio.wait({answers, runner}, timeout=GUARD_S, return_when=asyncio.FIRST_COMPLETED)
        if runner.done():
            runner.result()
            raise AssertionError("the batcher stopped")
        return answers.done()

    async def scenario():
        stats = serve.Stats()
        batcher = serve.Batcher(_EchoModel(), config, stats)
        runner = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)
        seen = {}
        # One row short of a batch: the batcher must keep waiting (for NEVER_S).
        short = asyncio.create_task(batcher.submit(rows(max_batch - 1, 1)))
        for _ in range(20):
            await asyncio.sleep(0)  # Turns of the loop: the batcher sees the rows...
        await asyncio.sleep(0.2)  # ...and real time passes; neither may start a batch.
        seen["one_short"] = {
            "answered": short.done(),
            "queued_rows": batcher.queued_rows,
            "batches": len(stats.batches),
        }
        # The row that fills the batch: it must run now, not after NEVER_S.
        last = asyncio.create_task(batcher.submit(rows(1, 2)))
        filled = await answered(runner, [short, last])
        seen["filled"] = {
            "answered_within_guard": filled,
            "batches": [(b["rows"], b["requests"]) for b in stats.batches],
            "values": [sorted({float(v) for v in np.ravel(t.result())}) for t in (short, last)]
            if filled
            else None,
        }
        if not filled:  # The batcher holds a full batch: the verdict is in.
            runner.cancel()
            return seen
        # A full batch at once, into an idle batcher.
        before = len(stats.batches)
        burst = [asyncio.create_task(batcher.submit(rows(1, 10 + i))) for i in range(max_batch)]
        at_once = await answered(runner, burst)
        seen["at_once"] = {
            "answered_within_guard": at_once,
            "batches": [(b["rows"], b["requests"]) for b in list(stats.batches)[before:]],
            "values": [float(t.result()[0, 0]) for t in burst] if at_once else None,
        }
        runner.cancel()
        return seen

    return asyncio.run(scenario())


@pytest.mark.claims("dynamic-batching", "batch-fills-exactly", "queue-admits-within-row-bound")
@pytest.mark.parametrize("max_batch", [2, 8])
def test_a_full_batch_runs_without_waiting_for_the_timeout(evidence, max_batch):
    """Exactly max_batch_size queued rows run at once; one row fewer waits for the timeout.

    In-process, no server, no clock read by the test. The batch timeout is
    `NEVER_S` (600 s): with `max_batch - 1` rows queued a correct batcher keeps
    waiting, so nothing has been taken after a few loop turns and 0.2 s (a
    negative a correct batcher meets at any machine speed: its deadline is 600 s
    away). The row that fills the batch needs only a few event-loop turns and one
    echo call to be answered, which the test waits for up to `GUARD_S` (30 s,
    orders of magnitude more than it needs on any machine), while a batcher that
    waits on a full batch would hold it for the 600 s timeout, 20 times the
    guard: the verdict does not depend on the machine's speed. Then a full batch
    of one-row requests arriving at once must run the same way. For batches of
    at most 2 and 8 rows."""
    seen = _full_batch_scenario(max_batch)
    expected = {
        "one_short": {"answered": False, "queued_rows": max_batch - 1, "batches": 0},
        "filled": {
            "answered_within_guard": True,
            "batches": [(max_batch, 2)],
            "values": [[1.0], [2.0]],
        },
        "at_once": {
            "answered_within_guard": True,
            "batches": [(max_batch, max_batch)],
            "values": [float(10 + i) for i in range(max_batch)],
        },
    }
    assert evidence.record(
        "a full batch runs at once; one row short of it waits for the timeout",
        f"in-process batcher, max batch {max_batch} rows, batch timeout {NEVER_S:g} s, "
        f"guard {GUARD_S:g} s",
        seen,
        expected,
        seen == expected,
    ), seen
