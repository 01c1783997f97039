"""Stage 3: the batcher's row accounting across batches, in-process, no server.

Independent check: a plain-Python model of the documented rules (a request is
accepted while the queued rows plus its rows stay within `max_queue_rows`; a
batch takes whole requests from the head up to `max_batch_size` rows; the
rows a batch takes leave the queue), against which every request's answer
(its own rows, or 503), every batch's rows and requests, and the queued-row
count once a wave is answered are compared. The requests come in waves: each
wave is submitted at once into an idle batcher and fully answered before the
next, so what a wave may queue depends on what the earlier batches released.
Changed conditions: requests of 1 to 4 rows (so a batch's rows and its number
of requests differ by 0 to 3), one to several earlier batches, queue bounds
from 4 to 12 rows, each wave filling the bound exactly and then passing it.
"""

import asyncio
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployment_audit import data, serve
from deployment_audit.config import ServeConfig

MAX_BATCH = 4
GUARD_S = 120.0  # A liveness guard, not a timing check: the batcher's loop only ends by failing.


class _EchoModel:
    """The logits are a row's first ten pixels, so every answer shows its rows."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x[:, :10], np.float32)


def _config(max_queue_rows: int) -> ServeConfig:
    return ServeConfig(
        max_batch_size=MAX_BATCH,
        batch_timeout_ms=1.0,
        max_queue_rows=max_queue_rows,
        max_rows_per_request=MAX_BATCH,
    )


async def _answers(tasks: list[asyncio.Task], runner: asyncio.Task) -> list:
    """Every request's answer, in order: "503" for a full queue, else the sorted
    values of its rows. Waits up to GUARD_S; raises the error that stopped the
    batcher, or any refusal other than a full queue."""
    answers = asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.wait({answers, runner}, timeout=GUARD_S, return_when="FIRST_COMPLETED")
    if runner.done():
        runner.result()  # Raises the error that stopped the batcher.
        raise AssertionError("the batcher stopped with requests unanswered")
    if not answers.done():
        raise AssertionError(f"the batcher left requests unanswered for {GUARD_S:g} s")
    got = []
    for g in answers.result():
        if isinstance(g, serve.Overloaded):
            got.append("503")
        elif isinstance(g, BaseException):
            raise g  # Only a full queue may refuse a request.
        else:
            got.append(sorted({float(v) for v in np.ravel(g)}))
    return got


def _run_waves(max_queue_rows: int, waves: list[list[int]]) -> list[dict]:
    """Submits each wave of requests (sizes in rows; request k of the whole run
    holds the value k) at once into the batcher, waits until the wave is
    answered, and returns per wave: each request's answer ("503" or its values),
    the wave's batches as (rows, requests) and `queued_rows` afterwards."""
    config = _config(max_queue_rows)

    async def scenario():
        stats = serve.Stats()
        batcher = serve.Batcher(_EchoModel(), config, stats)
        runner = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)  # The batcher waits for work.
        seen, k = [], 0
        for wave in waves:
            before = len(stats.batches)
            tasks = []
            for n in wave:
                x = np.full((n, data.NUM_FEATURES), k, np.float32)
                tasks.append(asyncio.create_task(batcher.submit(x)))
                k += 1
            got = await _answers(tasks, runner)
            seen.append(
                {
                    "answers": got,
                    "batches": [(b["rows"], b["requests"]) for b in list(stats.batches)[before:]],
                    "queued_rows_after": batcher.queued_rows,
                }
            )
        runner.cancel()
        return seen

    return asyncio.run(scenario())


def _reference(max_queue_rows: int, waves: list[list[int]]) -> list[dict]:
    """The documented rules in plain Python. A wave arrives into an empty queue
    (the previous wave is answered); every request of a wave is queued or refused
    before the first batch is taken, then batches take whole requests greedily."""
    out, k = [], 0
    for wave in waves:
        queued, accepted, answers = 0, [], []
        for n in wave:
            if queued + n <= max_queue_rows:
                queued += n
                accepted.append(n)
                answers.append([float(k)])
            else:
                answers.append("503")
            k += 1
        batches, rows, count = [], 0, 0
        for n in accepted:
            if rows + n > MAX_BATCH:
                batches.append((rows, count))
                rows, count = 0, 0
            rows, count = rows + n, count + 1
        if count:
            batches.append((rows, count))
        out.append({"answers": answers, "batches": batches, "queued_rows_after": 0})
    return out


# (queue bound, waves): earlier waves of multi-row requests, then a wave that
# fills the bound exactly and passes it by one row (accepted, accepted, 503).
CASES = {
    "1-row requests, 1 batch": (8, [[1, 1, 1, 1], [4, 4, 1]]),
    "2 + 2 rows, 1 batch": (8, [[2, 2], [4, 4, 1]]),
    "one 4-row request": (8, [[4], [4, 4, 1]]),
    "3 + 1 and 2 + 2, 2 batches": (5, [[3, 1, 2, 2], [4, 1, 1]]),
    "three waves of 2 + 2": (8, [[2, 2], [2, 2], [2, 2], [4, 4, 1]]),
    "bound 4, 2-row pairs": (4, [[2, 2], [2, 2], [3, 1, 1]]),
    "bound 12, 3-row requests": (12, [[3, 3, 3], [4, 4, 4, 1]]),
}


@pytest.mark.claims(
    "batch-releases-its-rows",
    "queue-admits-within-row-bound",
    "queue-refuses-past-row-bound",
    "batch-whole-requests-in-order",
    "batch-no-jumping-ahead",
    "batch-fills-exactly",
)
@pytest.mark.parametrize("case", list(CASES))
def test_rows_taken_by_a_batch_are_released_from_the_queue_bound(evidence, case):
    """Once earlier batches ran, a wave queues exactly max_queue_rows rows and the next row gets
    503, as the plain-Python model of the rules says, for requests of 1 to 4 rows.

    A batcher that released the number of requests instead of their rows would
    still count rows that already ran, and refuse requests that fit; the last
    wave of each case fills the bound exactly (accepted) and passes it by one
    row (503). Also compared: every batch's rows and requests, and no queued
    rows left once a wave is answered. Bounds of 4, 5, 8 and 12 rows, one to
    three earlier batches."""
    bound, waves = CASES[case]
    got, expected = _run_waves(bound, waves), _reference(bound, waves)
    assert evidence.record(
        "row accounting against the plain-Python model",
        f"{case}: queue bound {bound} rows, waves {waves}",
        {"answers": [w["answers"] for w in got], "batches": [w["batches"] for w in got]},
        {"differences allowed from the model": 0},
        got == expected,
    ), {"got": got, "expected": expected, "bound": bound, "waves": waves}


class _HeldModel(_EchoModel):
    """An echo model whose first call blocks until the test releases it, so the
    test knows which batch is running and which requests are still queued."""

    def __init__(self) -> None:
        self.called, self.release = threading.Event(), threading.Event()

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.called.set()
        if not self.release.wait(GUARD_S):
            raise RuntimeError("the test never released the model")
        return super().predict(x)


def _run_with_a_batch_held(max_queue_rows: int, first: list[int], during: list[int]) -> dict:
    """Submits `first` at once, holds the model inside the first batch, submits
    `during` while it runs, then releases it; returns every request's answer
    (`first` then `during`, request k holding the value k) and all batches."""
    config = _config(max_queue_rows)

    async def scenario():
        stats, model = serve.Stats(), _HeldModel()
        batcher = serve.Batcher(model, config, stats)
        runner = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)

        def submit(sizes, start):
            return [
                asyncio.create_task(
                    batcher.submit(np.full((n, data.NUM_FEATURES), start + i, np.float32))
                )
                for i, n in enumerate(sizes)
            ]

        tasks = submit(first, 0)
        try:
            await asyncio.sleep(0)  # Every `first` request is queued or refused now.
            for t in tasks:  # A submit that failed otherwise than by a full queue.
                if t.done() and not isinstance(t.exception(), serve.Overloaded | None):
                    t.result()
            # Waits (in a thread, up to GUARD_S) until the first batch is inside the model.
            called = asyncio.ensure_future(asyncio.to_thread(model.called.wait, GUARD_S))
            await asyncio.wait({called, runner}, timeout=GUARD_S, return_when="FIRST_COMPLETED")
            if runner.done():
                runner.result()  # Raises the error that stopped the batcher.
                raise AssertionError("the batcher stopped before running a batch")
            if not called.done() or not called.result():
                raise AssertionError(f"the batcher ran no batch within {GUARD_S:g} s")
            tasks += submit(during, len(first))
            await asyncio.sleep(0)  # Every `during` request is queued or refused now.
        finally:
            model.called.set()  # Frees the waiting thread, whatever happened.
            model.release.set()
        got = await _answers(tasks, runner)
        runner.cancel()
        return {
            "answers": got,
            "batches": [(b["rows"], b["requests"]) for b in stats.batches],
            "queued_rows_after": batcher.queued_rows,
        }

    return asyncio.run(scenario())


# (queue bound, first requests, requests arriving while the first batch runs), with
# the answers worked out by hand: the rows still queued behind the running batch
# count against the bound, the rows it took do not.
HELD = {
    # First batch (3 rows, 1 request) runs, 4 rows wait: 4 + 4 = 8 fits, 1 more does not.
    "bound 8, 3 + 2 + 2 first": (
        8,
        [3, 2, 2],
        [4, 1],
        {"answers": [[0.0], [1.0], [2.0], [3.0], "503"], "batches": [(3, 1), (4, 2), (4, 1)]},
    ),
    # First batch (4 rows, 2 requests) runs, 1 row waits: 1 + 2 + 3 = 6 fits, 1 more does not.
    "bound 6, 2 + 2 + 1 first": (
        6,
        [2, 2, 1],
        [2, 3, 1],
        {
            "answers": [[0.0], [1.0], [2.0], [3.0], [4.0], "503"],
            "batches": [(4, 2), (3, 2), (3, 1)],
        },
    ),
    # First batch (3 rows padded to 4) runs, 3 rows wait: 3 + 3 + 2 = 8 fits, 1 more does not.
    "bound 8, 3 + 3 first (padded batch)": (
        8,
        [3, 3],
        [3, 2, 1],
        {
            "answers": [[0.0], [1.0], [2.0], [3.0], "503"],
            "batches": [(3, 1), (3, 1), (3, 1), (2, 1)],
        },
    ),
    # One-row requests (rows = requests): 4 run, nothing waits; 4 fits, 1 more does not.
    "bound 4, 1-row requests": (
        4,
        [1, 1, 1, 1, 1],
        [4, 1],
        {"answers": [[0.0], [1.0], [2.0], [3.0], "503", [5.0], "503"], "batches": [(4, 4), (4, 1)]},
    ),
}


@pytest.mark.claims(
    "batch-releases-its-rows",
    "queue-admits-within-row-bound",
    "queue-refuses-past-row-bound",
)
@pytest.mark.parametrize("case", list(HELD))
def test_rows_behind_a_running_batch_still_count_and_its_rows_do_not(evidence, case):
    """While a batch runs, a request is accepted exactly while the rows still queued behind it plus
    its own stay within max_queue_rows, as worked out by hand, for four bounds and batch shapes.

    The model is held inside the first batch (a threading event, no clock), so
    the queue's contents are known when the second group arrives: releasing too
    few rows (the number of requests) refuses requests that fit, releasing too
    many (everything queued, or the padded batch size) accepts one that does not.
    Each case fills the bound exactly and passes it by one row."""
    bound, first, during, expected = HELD[case]
    got = _run_with_a_batch_held(bound, first, during)
    assert evidence.record(
        "rows queued behind a running batch against answers worked out by hand",
        f"{case}: queue bound {bound} rows, {first} first, {during} while it runs",
        got,
        {"differences allowed from the hand-worked answers": 0},
        got == {**expected, "queued_rows_after": 0},
    ), got


@pytest.mark.claims(
    "batch-releases-its-rows",
    "queue-admits-within-row-bound",
    "queue-refuses-past-row-bound",
    "batch-whole-requests-in-order",
    "batch-no-jumping-ahead",
    "batch-fills-exactly",
)
@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(
    bound=st.integers(MAX_BATCH, 12),
    waves=st.lists(
        st.lists(st.integers(1, MAX_BATCH), min_size=1, max_size=6), min_size=2, max_size=4
    ),
)
def test_row_accounting_against_the_plain_python_model(bound, waves):
    """Answers, batches and the queued-row count after each wave equal the plain-Python model of
    the rules, over drawn queue bounds (4 to 12 rows) and waves of 1- to 4-row requests.

    Each wave is submitted at once into an idle batcher and answered before the
    next one, so every wave after the first tests what the earlier batches
    released from the queue bound."""
    got = _run_waves(bound, waves)
    assert got == _reference(bound, waves), {"got": got}
