"""Stage 2: a retained failure.

Independent checks: the classifier against an enumerated table of symptoms
with known answers (repeated with every time scaled to another heartbeat
interval); real drills against the fault that was injected (which the
classifier never sees), 5 repetitions of each fault at different steps, with
the group's processes looked up afterwards through psutil (not the
supervisor's own /proc scan).
"""

import json
import os
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from workload_operations import diagnose, faults
from workload_operations.cli import main
from workload_operations.config import Config
from workload_operations.diagnose import Symptoms, classify
from workload_operations.drill import run_drills


def _symptoms(h: float, **changes) -> Symptoms:
    """A healthy job 100 intervals after its start, times in units of `h` seconds."""
    base = dict(
        now=100.0,
        started=0.0,
        returncode=None,
        stderr_tail=[],
        rss_mb=300.0,
        last_heartbeat_t=99.5,
        last_step=50,
        last_step_t=99.4,
        rate=300.0,
    )
    base.update(changes)
    for key in ("now", "started", "last_heartbeat_t", "last_step_t"):
        if base[key] is not None:
            base[key] *= h
    return Symptoms(**base)


# (symptoms in heartbeat intervals, expected class). With the tiny config: memory over
# 512 MB; hang after 6 silent intervals, stall after 8 intervals without a step, slow
# under 80 examples/s.
CASES = [
    ({}, None),
    ({"returncode": 0}, None),
    ({"returncode": -9}, "killed"),
    ({"returncode": -15}, "killed"),
    (
        {"returncode": 1, "stderr_tail": ["Traceback (most recent call last):", "  x", "E: y"]},
        "exception",
    ),
    ({"returncode": 3, "stderr_tail": ["error: bad"]}, "exited"),
    ({"rss_mb": 520.0}, "memory"),
    ({"rss_mb": 520.0, "returncode": -9}, "killed"),
    ({"last_heartbeat_t": 94.5}, None),  # 5.5 intervals: not yet a hang
    ({"last_heartbeat_t": 93.5, "last_step_t": 93.4}, "hang"),  # 6.5 intervals
    ({"last_heartbeat_t": None, "last_step_t": None, "last_step": 0}, None),  # starting
    ({"last_heartbeat_t": 99.5, "last_step_t": 92.0}, None),  # 7.5 intervals without a step
    ({"last_heartbeat_t": 99.5, "last_step_t": 91.0}, "stall"),  # 8.5 intervals
    # Progress stopped, heartbeats stopped too: a hang, not a stall.
    ({"last_heartbeat_t": 90.0, "last_step_t": 85.0}, "hang"),
    # Silent for 5 intervals, no step for 9: neither a hang yet nor a proven stall.
    ({"last_heartbeat_t": 95.0, "last_step_t": 91.0}, None),
    ({"rate": 79.0}, "slow"),
    ({"rate": 81.0}, None),
    ({"rate": None}, None),
    # Boundaries: a figure equal to its limit is not over it.
    ({"rss_mb": 512.0}, None),
    ({"rss_mb": 512.5}, "memory"),
    ({"last_heartbeat_t": 94.0, "last_step_t": 93.9}, None),  # exactly 6 silent intervals
    ({"last_heartbeat_t": 99.5, "last_step_t": 91.5}, None),  # exactly 8 without a step
    ({"rate": 80.0}, None),  # exactly the stated rate
    # Start-up: no heartbeat, or heartbeats but no step yet, for exactly 300 intervals
    # (the allowance) and for one more.
    ({"now": 300.0, "last_heartbeat_t": None, "last_step_t": None, "last_step": 0}, None),
    ({"now": 301.0, "last_heartbeat_t": None, "last_step_t": None, "last_step": 0}, "hang"),
    ({"last_step_t": None, "last_step": 0, "rate": None}, None),
    ({"now": 300.0, "last_heartbeat_t": 299.5, "last_step_t": None, "last_step": 0}, None),
    ({"now": 301.0, "last_heartbeat_t": 300.5, "last_step_t": None, "last_step": 0}, "stall"),
]


@pytest.mark.parametrize("h", [0.5, 0.25])
def test_classifier_matches_an_enumerated_table(h, evidence):
    config = Config.tiny()
    config = config.replace(
        heartbeat_interval_s=h,
        hang_timeout_s=6 * h,
        stall_timeout_s=8 * h,
        startup_timeout_s=300 * h,
    )
    got = [classify(_symptoms(h, **changes), config) for changes, _ in CASES]
    expected = [answer for _, answer in CASES]
    wrong = [(i, g, e) for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    assert evidence.record(
        "classifier = enumerated answers",
        f"heartbeat interval {h} s, {len(CASES)} cases",
        {"wrong": wrong, "classes": got},
        {"exact": True},
        not wrong,
    ), wrong


def _window_rate_reference(pairs, window, batch):
    """The newest pair at least `window` steps before the newest one, by a list filter."""
    if not pairs:
        return None
    step, t = pairs[-1]
    older = [(s, u) for s, u in pairs[:-1] if s <= step - window]
    if not older:
        return None
    old_step, old_t = older[-1]
    return (step - old_step) * batch / (t - old_t)


@settings(max_examples=80, derandomize=True, deadline=None, database=None)
@given(
    start_step=st.integers(0, 20),
    steps=st.lists(st.tuples(st.integers(1, 4), st.floats(0.01, 10.0)), max_size=10),
    t0=st.floats(0.0, 1000.0) | st.just(0.0),
    window=st.integers(1, 6),
    batch=st.integers(1, 64),
)
def test_window_rate_equals_a_list_filter(start_step, steps, t0, window, batch):
    pairs = [(start_step, t0)]
    for dstep, dt in steps:
        pairs.append((pairs[-1][0] + dstep, pairs[-1][1] + dt))
    got = diagnose.window_rate(pairs, window, batch)
    expected = _window_rate_reference(pairs, window, batch)
    if expected is None:
        assert got is None, (pairs, window, got)
    else:
        assert got == pytest.approx(expected, rel=1e-12, abs=0.0), (pairs, window, got)


@pytest.mark.parametrize(
    "pairs, window, expected",
    [
        ([], 3, None),
        ([(5, 1.0)], 3, None),  # exactly one report
        ([(0, 0.0), (3, 1.5)], 3, 3 * 16 / 1.5),  # exactly `window` steps apart
        ([(0, 0.0), (3, 1.5)], 4, None),  # one step short
        ([(0, 0.0), (1, 1.0), (4, 2.0)], 3, 3 * 16 / 1.0),  # the newest qualifying pair
    ],
)
def test_window_rate_boundaries(pairs, window, expected):
    assert diagnose.window_rate(pairs, window, 16) == expected


_EXIT_CLASSES = ("exception", "killed", "exited")


def _bound_reference(status, h, hang, stall, window, batch, min_rate):
    """The docstring's table: 2 intervals, plus the class's grace in intervals. A slow
    step runs at a quarter of the stated rate: batch / (min_rate / 4) seconds."""
    grace = {
        "memory": 6.0,
        "hang": hang / h,
        "stall": stall / h,
        "slow": window * (batch / (min_rate / 4)) / h,
    }
    return 2.0 + grace.get(status, 0.0)


_timing = st.fixed_dictionaries(
    {
        "h": st.floats(0.05, 3.0).filter(lambda h: abs(h - 1.0) > 1e-3) | st.just(0.25),
        "hang": st.floats(1.1, 20.0),
        "stall": st.floats(1.1, 20.0),
        "window": st.integers(1, 12),
        "batch": st.integers(1, 256),
        "min_rate": st.floats(1.0, 5000.0),
    }
)


def _timing_config(t: dict) -> Config:
    return Config.tiny().replace(
        steps_per_second=0.0,
        heartbeat_interval_s=t["h"],
        hang_timeout_s=t["hang"] * t["h"],
        stall_timeout_s=t["stall"] * t["h"],
        rate_window_steps=t["window"],
        batch_size=t["batch"],
        min_examples_per_s=t["min_rate"],
    )


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(t=_timing)
def test_detection_bounds_follow_the_table(t):
    config = _timing_config(t)
    args = (
        config.heartbeat_interval_s,
        config.hang_timeout_s,
        config.stall_timeout_s,
        t["window"],
        t["batch"],
        t["min_rate"],
    )
    for status in (*_EXIT_CLASSES, "memory", "hang", "stall", "slow"):
        expected = _bound_reference(status, *args)
        got = diagnose.bound_intervals(status, config)
        assert got == pytest.approx(expected, rel=1e-12), (status, got, expected)


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(
    t=_timing,
    status=st.sampled_from((*_EXIT_CLASSES, "memory", "hang", "stall", "slow")),
    beat_t=st.floats(0.0, 500.0) | st.just(0.0),
    fault_after_beat=st.floats(-5.0, 50.0),
    detect_after_fault=st.floats(0.0, 60.0),
)
def test_detection_figures_in_intervals(t, status, beat_t, fault_after_beat, detect_after_fault):
    config = _timing_config(t)
    h = config.heartbeat_interval_s
    fault_t = beat_t + fault_after_beat
    detected_t = fault_t + detect_after_fault
    s = _symptoms(1.0, last_heartbeat_t=beat_t)
    got = diagnose.detection(config, status, detected_t, {"t": fault_t}, s)
    since_fault = (detected_t - fault_t) / h
    bound = _bound_reference(
        status,
        h,
        config.hang_timeout_s,
        config.stall_timeout_s,
        t["window"],
        t["batch"],
        t["min_rate"],
    )
    assert got["heartbeat_interval_s"] == h
    assert got["intervals_since_fault"] == pytest.approx(since_fault, rel=1e-12, abs=1e-12)
    assert got["intervals_since_last_heartbeat"] == pytest.approx(
        (detected_t - beat_t) / h, rel=1e-12, abs=1e-12
    )
    assert got["bound_intervals"] == pytest.approx(bound, rel=1e-12)
    if abs(since_fault - bound) > 1e-9:
        assert got["within_bound"] is (since_fault < bound), (got, since_fault, bound)


@pytest.mark.parametrize(
    "detected_t, injected, beat_t, since_fault, since_beat, within",
    [
        (11.0, {"t": 10.0}, 4.0, 2.0, 14.0, True),  # exactly the bound of 2 intervals
        (11.25, {"t": 10.0}, 4.0, 2.5, 14.5, False),  # half an interval over it
        (10.5, {"t": 10.0}, 4.0, 1.0, 13.0, True),
        (11.0, None, 4.0, None, 14.0, None),  # no injected fault: nothing to judge
        (None, {"t": 10.0}, 4.0, None, None, None),  # not detected
        (11.0, {"t": 10.0}, None, 2.0, None, True),  # never a heartbeat
    ],
)
def test_detection_boundaries(detected_t, injected, beat_t, since_fault, since_beat, within):
    config = Config.tiny().replace(heartbeat_interval_s=0.5, hang_timeout_s=3.0)
    s = _symptoms(1.0, last_heartbeat_t=beat_t)
    got = diagnose.detection(config, "exception", detected_t, injected, s)
    assert (
        got["intervals_since_fault"],
        got["intervals_since_last_heartbeat"],
        got["bound_intervals"],
        got["within_bound"],
    ) == (since_fault, since_beat, 2.0, within)


@pytest.fixture(scope="module")
def drills(tmp_path_factory, jax_cache):
    out = tmp_path_factory.mktemp("drills")
    summary = run_drills(
        Config.tiny(), out, repeats=5, parallel=10, at_step=24, compilation_cache=jax_cache
    )
    return summary


def test_every_fault_is_classified_in_five_repetitions(drills, evidence):
    for kind, f in drills["per_fault"].items():
        assert evidence.record(
            "diagnosis = injected fault",
            f"{kind} x {f['runs']}, injected after steps 24, 26, 28, 30, 32",
            {"classifications": f["classifications"], "expected": diagnose.EXPECTED[kind]},
            {"exact": True},
            f["runs"] == 5 and f["correct"] == 5,
        ), (kind, f["classifications"])


def test_detection_is_within_its_bound_in_heartbeat_intervals(drills, evidence):
    for kind, f in drills["per_fault"].items():
        d = f["detection_intervals"]
        assert evidence.record(
            "detection time (intervals from the fault's onset) <= bound",
            kind,
            {"intervals": d, "max": max(d) if d else None},
            {"bound_intervals": f["bound_intervals"]},
            len(d) == 5 and max(d) <= f["bound_intervals"],
        ), (kind, d, f["bound_intervals"])


def test_no_process_of_a_failed_job_is_left(drills, evidence):
    """Looked up through psutil: no process of any drill's group, sidecars included."""
    pgids, sidecars = set(), set()
    for r in drills["results"]:
        incident = json.loads(Path(r["incident"]).read_text())
        pgids.add(incident["termination"]["pgid"])
        log = Path(incident["evidence"]["logs"]["stdout"]).read_text().splitlines()
        start = next(json.loads(line) for line in log if '"event": "start"' in line)
        sidecars.add(start["sidecar_pid"])
    left = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.pid in sidecars or os.getpgid(proc.pid) in pgids:
                left.append((proc.pid, proc.info["status"]))
        except (psutil.Error, ProcessLookupError):
            continue
    assert evidence.record(
        "no member of a drilled process group remains (psutil)",
        f"{len(pgids)} groups, {len(sidecars)} sidecars",
        {"left": left, "supervisor_left": drills["processes_left"]},
        {"exact": 0},
        not left and drills["processes_left"] == 0 and None not in sidecars,
    ), left


def test_incident_keeps_the_evidence_of_each_symptom(drills, evidence):
    checks = {}
    for r in drills["results"]:
        inc = json.loads(Path(r["incident"]).read_text())
        ev = inc["evidence"]
        kind = r["fault"]
        if kind == "kill":
            ok = ev["signal"] == "SIGKILL" and ev["returncode"] == -9
        elif kind == "exception":
            ok = ev["returncode"] == 1 and any(
                "RuntimeError: Injected fault" in line for line in ev["last_stderr_lines"]
            )
        elif kind == "hang":
            # The reporter thread is blocked inside `heartbeat`, waiting for the lock.
            ok = "in heartbeat" in ev["stack_dump"] and inc["termination"]["stack_dumped"]
        elif kind == "stall":
            ok = "in after_step" in ev["stack_dump"]  # The training loop waits there.
        elif kind == "slow":
            ok = "in train_and_evaluate" in ev["stack_dump"]  # Alive, still in the loop.
        else:  # memory
            ok = ev["rss_mb_at_detection"] > 512 and inc["termination"]["stack_dumped"]
        ok = ok and ev["last_progress"] is not None and inc["diagnosis"]
        checks.setdefault(kind, []).append(bool(ok))
    assert evidence.record(
        "each incident keeps the evidence of its symptom",
        "30 incidents",
        checks,
        None,
        all(all(v) for v in checks.values()),
    ), checks


def test_unknown_fault_name_is_a_clear_error(tmp_path):
    with pytest.raises(faults.FaultError, match="Unknown fault `segfault`"):
        faults.parse("segfault@3")
    runner = CliRunner()
    result = runner.invoke(main, ["run", "--fault", "segfault@3", "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 2 and "`segfault`" in result.output
    result = runner.invoke(
        main, ["drill", "--faults", "hang,segfault", "--out", str(tmp_path / "d")]
    )
    assert result.exit_code == 2 and "`segfault`" in result.output
    assert not (tmp_path / "w").exists() and not (tmp_path / "d").exists()
