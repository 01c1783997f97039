"""Stage 1: the heartbeat's step is the step the training loop reports, not a call count.

A job resumed from a checkpoint at step s calls `step_done(s + 1, ...)` first
(`train_and_evaluate` loops over `range(start_step + 1, num_steps + 1)`), and a
loop may also report steps that skip. `step_done`'s contract reads literally:
"`step` becomes the step", while `steps_total` "grows by 1" per call. So the
reference here is plain Python over the calls made: the heartbeat's `step` is
the last step given, the steps counter is the number of calls, the examples
are the sum of the batches. Varied: a fresh start (steps from 1) against
resumed starts just past it (from 2) and far from it, consecutive steps
against skipping ones, and heartbeats with no step since the one before.
"""

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workload_operations.observe import Observer

# name -> per heartbeat, the (step, batch) calls made before it; every case's first
# heartbeat follows at least one step. Resumed steps start past 1 and skip.
_CASES = {
    "fresh from 1": [[(1, 16), (2, 16), (3, 16)], [(4, 16)]],
    "resumed after step 1": [[(2, 16), (3, 16)], [(4, 16)]],
    "resumed after step 40": [[(41, 5), (42, 5), (43, 5)], [], [(44, 5), (45, 5)]],
    "skipping by 10": [[(10, 8), (20, 8)], [(30, 8)], []],
    "resumed far, irregular gaps": [[(1_000_001, 3)], [(1_000_004, 3), (1_000_009, 3)]],
}


def _drive(beats: list[list[tuple[int, int]]]) -> tuple[list[dict], list[dict], Observer]:
    """Runs the calls through a fresh Observer; returns each heartbeat, the plain-Python
    reference for it (last step given, calls so far, examples so far) and the observer."""
    observer = Observer(10.0, out=io.StringIO(), serve=False)
    got, want = [], []
    last_step, calls, examples = None, 0, 0
    for calls_before in beats:
        for step, batch in calls_before:
            observer.step_done(step, batch, 0.5)
            last_step, calls, examples = step, calls + 1, examples + batch
        beat = observer.heartbeat()
        got.append(
            {
                "step": beat["step"],
                "examples": beat["examples"],
                "steps_total": observer.registry.get_sample_value("workload_steps_total"),
            }
        )
        want.append({"step": last_step, "examples": examples, "steps_total": calls})
    return got, want, observer


@pytest.mark.claims(
    "step-done-step-as-given",
    "step-done-prometheus-counters",
    "step-done-examples-summed",
)
@pytest.mark.parametrize("case", list(_CASES))
def test_heartbeat_step_is_the_step_given_on_a_resumed_or_skipping_run(case, evidence):
    """Each heartbeat's step is the last step the loop gave, by a Python replay of the calls.

    Fresh (from 1), resumed after step 1 and after step 40, skipping by 10, resumed past
    step 1,000,000 with irregular gaps; a heartbeat with no step since the previous one
    repeats its step. The Prometheus steps counter counts the calls (not the step
    number), the examples are the batches summed.
    """
    got, want, _ = _drive(_CASES[case])
    assert evidence.record(
        "heartbeat step = last step given; steps counter = calls; examples = batches summed",
        case,
        {"heartbeats": got, "reference": want},
        {"exact": True},
        got == want,
    ), (got, want)


# A resumed start (0 is a fresh run), then per heartbeat the gaps from each step to the
# next (1: consecutive) and a batch size; a heartbeat may follow no new step.
_resumed = st.tuples(
    st.integers(0, 2) | st.integers(3, 10**7),
    st.lists(
        st.tuples(st.lists(st.just(1) | st.integers(2, 500), max_size=5), st.integers(1, 64)),
        min_size=1,
        max_size=4,
    ).filter(lambda beats: len(beats[0][0]) > 0),
)


@pytest.mark.claims(
    "step-done-step-as-given",
    "step-done-prometheus-counters",
    "step-done-examples-summed",
)
@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(run=_resumed)
def test_drawn_resumed_runs_heartbeat_the_steps_given(run):
    """Drawn resumed runs: each heartbeat's step is the last step given, by a Python replay.

    Drawn: the step resumed from (0 = fresh, 1, 2, up to 10^7), gaps between steps of 1
    (consecutive) to 500, batch sizes 1 to 64, heartbeats with and without new steps.
    """
    start, drawn = run
    beats, step = [], start
    for gaps, batch in drawn:
        calls = []
        for gap in gaps:
            step += gap
            calls.append((step, batch))
        beats.append(calls)
    got, want, _ = _drive(beats)
    assert got == want, (start, beats, got, want)
