"""Stage 1: an observed workload.

Independent checks: the observer's counts against a Python tally of the same
steps (and a heartbeat before any step: no loss, the loss gauge never set);
the scraped Prometheus counters against the job's own final counts, the step
count the run must reach, and the heartbeat lines counted in its log; the
supervisor's psutil resource figures against /proc read directly. Changed
conditions: another batch size and heartbeat interval.
"""

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import jax.numpy as jnp
import psutil
import pytest
from click.testing import CliRunner
from conftest import job_log
from hypothesis import given, settings
from hypothesis import strategies as st

from workload_operations import observe
from workload_operations.cli import main
from workload_operations.config import Config, ConfigError
from workload_operations.observe import Observer
from workload_operations.supervisor import Supervisor, _group_processes, resources, resources_of


@pytest.mark.claims(
    "heartbeats-and-metrics-from-counters",
    "step-done-examples-summed",
    "step-done-prometheus-counters",
    "step-done-time-and-loss",
    "heartbeat-record-fields",
    "heartbeat-loss-as-float",
    "heartbeat-counter-and-gauges",
)
@pytest.mark.parametrize("batch", [16, 5])
def test_heartbeat_reports_what_the_loop_counted(batch, evidence):
    """Heartbeat and Prometheus counts equal a Python tally of the steps, for batch sizes 16, 5."""
    observer = Observer(10.0, out=io.StringIO(), serve=False)
    losses = [0.9, 0.7, 0.6, 0.55, 0.5, 0.45, 0.4]
    for step, loss in enumerate(losses, 1):
        observer.step_done(step, batch, jnp.float32(loss))
    beat = observer.heartbeat()
    tally = {"step": len(losses), "examples": sum(batch for _ in losses)}  # Python reference.
    registry = observer.registry
    scraped = {
        "steps": registry.get_sample_value("workload_steps_total"),
        "examples": registry.get_sample_value("workload_examples_total"),
        "heartbeats": registry.get_sample_value("workload_heartbeats_total"),
        "loss": registry.get_sample_value("workload_loss"),
    }
    ok = (
        beat["step"] == tally["step"]
        and beat["examples"] == tally["examples"]
        and beat["loss"] == pytest.approx(losses[-1], rel=1e-6)
        and beat["examples_per_s"] > 0
        and beat["seq"] == 1
        and beat["step_t"] is not None
        and scraped["steps"] == tally["step"]
        and scraped["examples"] == tally["examples"]
        and scraped["heartbeats"] == 1
        and scraped["loss"] == pytest.approx(losses[-1], rel=1e-6)
    )
    assert evidence.record(
        "heartbeat and metrics equal a Python tally of the steps",
        f"batch {batch}, {len(losses)} steps",
        {"heartbeat": beat, "scraped": scraped, "tally": tally},
        {"exact": True},
        ok,
    ), (beat, scraped, tally)


@pytest.mark.claims("heartbeat-loss-none-before-first-step")
def test_heartbeat_loss_is_none_before_the_first_step(evidence, monkeypatch):
    """A heartbeat before any step reports `loss` None and leaves the loss gauge unset.

    The gauge's `set` is watched: the first heartbeat (no step yet) calls it
    never and the scraped `workload_loss` keeps its initial 0.0; after one step
    with loss 0.25 the next heartbeat reports 0.25 and sets the gauge once."""
    observer = Observer(10.0, out=io.StringIO(), serve=False)
    gauge_sets: list[float] = []
    real_set = observer.loss_gauge.set
    monkeypatch.setattr(
        observer.loss_gauge, "set", lambda value: (gauge_sets.append(value), real_set(value))[1]
    )
    before = observer.heartbeat()
    scraped_before = observer.registry.get_sample_value("workload_loss")
    sets_before = list(gauge_sets)
    observer.step_done(1, 8, jnp.float32(0.25))
    after = observer.heartbeat()
    scraped_after = observer.registry.get_sample_value("workload_loss")
    observed = {
        "loss_before": before["loss"],
        "gauge_sets_before": sets_before,
        "scraped_before": scraped_before,
        "loss_after": after["loss"],
        "gauge_sets_after": gauge_sets,
        "scraped_after": scraped_after,
    }
    ok = (
        before["loss"] is None
        and "loss" in before
        and sets_before == []
        and scraped_before == 0.0
        and after["loss"] == 0.25
        and gauge_sets == [0.25]
        and scraped_after == 0.25
    )
    assert evidence.record(
        "heartbeat before the first step",
        "one heartbeat with no step, then one after a step with loss 0.25",
        observed,
        {"loss_before": None, "gauge_sets_before": 0},
        ok,
    ), observed


class _Clock:
    """A monotonic clock the test sets by hand."""

    def __init__(self, t: float):
        self.t = t

    def monotonic(self) -> float:
        return self.t


# Per heartbeat: the batch sizes of the steps before it, then the seconds since the
# previous reading (1 ms and more, or 0: two readings at one instant).
_beats = st.lists(
    st.tuples(
        st.lists(st.integers(1, 64), max_size=5),
        st.floats(1e-3, 50.0, allow_nan=False) | st.sampled_from([0.0, 0.25, 1.0]),
    ),
    min_size=1,
    max_size=4,
)


@pytest.mark.claims(
    "heartbeat-rate",
    "heartbeat-record-fields",
    "step-done-time-and-loss",
    "heartbeat-counter-and-gauges",
)
@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(start=st.floats(0.0, 5000.0, allow_nan=False) | st.just(0.0), beats=_beats)
def test_heartbeat_rate_is_examples_over_elapsed_time(start, beats):
    """A heartbeat's rate is examples over seconds on a hand-set clock, over drawn batches and gaps.

    Examples since the previous heartbeat over the seconds since it (the observer's
    creation for the first); a zero interval divides by 1e-9 s instead of zero. Drawn:
    clock origins, batch sizes, 0 to 50 s between heartbeats. Each step lands 0.125 s
    after the one before, so `step_t` must be the clock at the LAST step (None before
    the first), neither the heartbeat's time nor the first step's.
    """
    clock = _Clock(start)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(observe, "time", SimpleNamespace(monotonic=clock.monotonic))
        observer = Observer(1.0, out=io.StringIO(), serve=False)
        prev_examples, prev_t, total, step, step_t = 0, start, 0, 0, None
        for seq, (batches, dt) in enumerate(beats, 1):
            for batch in batches:
                step += 1
                total += batch
                clock.t += 0.125
                step_t = clock.t
                observer.step_done(step, batch, 0.5)
            clock.t += dt
            beat = observer.heartbeat()
            elapsed = clock.t - prev_t
            expected = (total - prev_examples) / (elapsed if elapsed > 0 else 1e-9)
            assert beat["examples_per_s"] == pytest.approx(expected, rel=1e-12, abs=0.0), (
                beat,
                expected,
            )
            assert observer.registry.get_sample_value(
                "workload_examples_per_second"
            ) == pytest.approx(expected, rel=1e-12, abs=0.0)
            assert (beat["seq"], beat["step"], beat["examples"], beat["t"], beat["step_t"]) == (
                seq,
                step,
                total,
                clock.t,
                step_t,
            )
            prev_examples, prev_t = total, clock.t


def _proc_status(pid: int) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of /proc/<pid>/stat (fields 14 and 15, in clock ticks), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # After the command name in parentheses.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The child starts `threads - 1` sleeping threads, touches 64 MB, spends system time
# copying 512 MB from /dev/zero, then sleeps: its figures hold still while they are read.
_CHILD = (
    "import sys, threading, time\n"
    "for _ in range(int(sys.argv[1]) - 1):\n"
    "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "buf = bytearray(64 * 2**20)\n"
    "for i in range(0, len(buf), 4096): buf[i] = 1\n"
    "with open('/dev/zero', 'rb') as f:\n"
    "    for _ in range(32): f.readinto(memoryview(buf)[: 16 * 2**20])\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.claims("supervisor-adds-resource-signals", "resources-of-the-group")
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("threads", [1, 4])
def test_resource_signals_match_proc(threads, evidence):
    """psutil's memory, CPU and thread figures equal /proc read directly, for 1 and 4 threads.

    Resident memory to one page (VmRSS), CPU seconds to one tick (utime + stime, with
    system time really spent), threads exactly (/proc/<pid>/task).
    """
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(threads)], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout.readline().strip() == "ready"
            sample = resources(proc.pid)
            status = _proc_status(proc.pid)
            proc_rss_mb = int(status["VmRSS"].split()[0]) / 1024
            proc_threads = len(os.listdir(f"/proc/{proc.pid}/task"))
            proc_cpu_s = _proc_cpu_s(proc.pid)
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
            proc_stime = int(stat[stat.rindex(")") + 2 :].split()[12])
        finally:
            proc.kill()
    tick = 1 / os.sysconf("SC_CLK_TCK")
    ok = (
        sample["processes"] == 1
        and sample["threads"] == proc_threads == threads
        and abs(sample["rss_mb"] - proc_rss_mb) <= 4 / 1024  # one 4 kB page
        and sample["rss_mb"] >= 64
        and abs(sample["cpu_s"] - proc_cpu_s) <= tick + 1e-9
        and proc_stime >= 2  # system time really was spent, so user/system slips show
    )
    assert evidence.record(
        "psutil resources equal /proc/<pid>/status, /proc/<pid>/stat and /proc/<pid>/task",
        f"{threads} thread(s), 64 MB touched, 512 MB read from /dev/zero",
        {
            "psutil": sample,
            "proc_rss_mb": proc_rss_mb,
            "proc_threads": proc_threads,
            "proc_cpu_s": proc_cpu_s,
            "proc_stime_ticks": proc_stime,
        },
        {"rss_mb_abs": 4 / 1024, "cpu_s_abs": tick, "threads": "exact"},
        ok,
    ), (sample, proc_rss_mb, proc_threads, proc_cpu_s, proc_stime)


@pytest.mark.claims("resources-of-the-group")
def test_resource_totals_skip_a_process_that_is_gone():
    """Group totals skip a member that has exited and equal the live member's /proc figures.

    The gone member comes first, so the members after it must still count; a group of
    only gone members totals zero.
    """
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_proc = psutil.Process(gone.pid)
    gone.wait()
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, "2"], stdout=subprocess.PIPE, text=True
    ) as live:
        try:
            assert live.stdout.readline().strip() == "ready"
            sample = resources_of([gone_proc, psutil.Process(live.pid)])
            proc_rss_mb = int(_proc_status(live.pid)["VmRSS"].split()[0]) / 1024
            proc_cpu_s = _proc_cpu_s(live.pid)
        finally:
            live.kill()
    assert sample["processes"] == 1 and sample["threads"] == 2, sample
    assert abs(sample["rss_mb"] - proc_rss_mb) <= 4 / 1024, (sample, proc_rss_mb)
    assert abs(sample["cpu_s"] - proc_cpu_s) <= 1 / os.sysconf("SC_CLK_TCK") + 1e-9, sample
    assert resources_of([gone_proc]) == {"processes": 0, "rss_mb": 0.0, "threads": 0, "cpu_s": 0.0}


# One level of a process tree: level L starts L + 1 sleeping threads (L + 2 in all),
# touches (16 + 8 L) MB, starts level L + 1 if L < depth, then writes its pid to
# `<folder>/<L>.pid` (atomically, by rename) and sleeps: its figures hold still.
_TREE = """\
import os, subprocess, sys, threading, time
level, depth, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for _ in range(level + 1):
    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
buf = bytearray((16 + 8 * level) * 2**20)
for i in range(0, len(buf), 4096): buf[i] = 1
if level < depth:
    child = subprocess.Popen([sys.executable, __file__, str(level + 1), str(depth), folder])
tmp = os.path.join(folder, f"{level}.tmp")
with open(tmp, "w") as f: f.write(str(os.getpid()))
os.replace(tmp, os.path.join(folder, f"{level}.pid"))
time.sleep(120)
"""


def _wait_for_files(paths: list[Path], proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Returns once every file exists; fails if the root exits or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, f"the tree's root exited with {proc.returncode}"
        assert time.monotonic() < deadline, [str(p) for p in paths if not p.exists()]
        time.sleep(0.01)


def _kill_and_reap(proc: subprocess.Popen, pids: list[int], timeout_s: float = 10.0) -> None:
    """SIGKILL to the tree's own process group (its session), then every member gone.

    Members orphaned by the root's death are reparented to init, or to this process if
    an earlier test made it a child subreaper: those are reaped here."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                if not psutil.pid_exists(pid):
                    break
            time.sleep(0.01)


@pytest.mark.claims("supervisor-adds-resource-signals", "resources-of-the-group")
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_resources_count_every_descendant(depth, tmp_path, evidence):
    """The group's resources include children, grandchildren and great-grandchildren.

    A root that starts a child that starts a grandchild ... `depth` levels below it
    (depth 1, 2, 3); level L holds L + 2 threads and touches 16 + 8 L MB, and writes its
    own pid (`os.getpid()`) to a file once it is set up. `resources(root)`, what the
    supervisor samples a job's group with, against the pids the processes reported
    (the group listed is exactly that set), /proc read directly for each of them
    (VmRSS summed, to one page per process; /proc/<pid>/task counted; utime + stime to
    one tick per process) and the known thread count and allocations. Started in its
    own session like a job, killed as a group, every member reaped.
    """
    script = tmp_path / "tree.py"
    script.write_text(_TREE, encoding="utf-8")
    files = [tmp_path / f"{level}.pid" for level in range(depth + 1)]
    pids: list[int] = []
    proc = subprocess.Popen(
        [sys.executable, str(script), "0", str(depth), str(tmp_path)], start_new_session=True
    )
    try:
        _wait_for_files(files, proc)
        pids = [int(f.read_text()) for f in files]
        listed = sorted(p.pid for p in _group_processes(proc.pid))
        sample = resources(proc.pid)
        proc_rss_mb = sum(int(_proc_status(p)["VmRSS"].split()[0]) for p in pids) / 1024
        proc_threads = sum(len(os.listdir(f"/proc/{p}/task")) for p in pids)
        proc_cpu_s = sum(_proc_cpu_s(p) for p in pids)
    finally:
        _kill_and_reap(proc, pids)
    levels = range(depth + 1)
    allocated_mb = sum(16 + 8 * level for level in levels)
    known_threads = sum(level + 2 for level in levels)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    ok = (
        pids[0] == proc.pid
        and listed == sorted(pids)
        and sample["processes"] == depth + 1
        and sample["threads"] == proc_threads == known_threads
        and abs(sample["rss_mb"] - proc_rss_mb) <= (depth + 1) * 4 / 1024  # a page each
        and sample["rss_mb"] >= allocated_mb
        and abs(sample["cpu_s"] - proc_cpu_s) <= (depth + 1) * tick + 1e-9
    )
    assert evidence.record(
        "group resources include every descendant: pids, /proc/<pid>/status, task, stat",
        f"a tree {depth} level(s) below the root; {allocated_mb} MB touched, "
        f"{known_threads} threads in all",
        {
            "psutil": sample,
            "pids_reported": pids,
            "pids_listed": listed,
            "proc_rss_mb": proc_rss_mb,
            "proc_threads": proc_threads,
            "proc_cpu_s": proc_cpu_s,
            "allocated_mb": allocated_mb,
        },
        {"rss_mb_abs": (depth + 1) * 4 / 1024, "cpu_s_abs": (depth + 1) * tick, "threads": "exact"},
        ok,
    ), (sample, pids, listed, proc_rss_mb, proc_threads, proc_cpu_s)


def _supervised(config: Config, workdir: Path, cache: Path, results: dict, key: str) -> None:
    results[key] = Supervisor(config, workdir, detect=False, compilation_cache=cache).run()


@pytest.mark.claims("heartbeats-and-metrics-from-counters", "supervisor-scrapes-metrics")
def test_scraped_counters_agree_with_the_jobs_own_count(tmp_path, jax_cache, evidence):
    """A supervised job's final scrape equals its own count and num_steps, at two batch sizes.

    Batch 16 with 1 s heartbeats and batch 8 with 0.25 s ones. Steps, examples and
    heartbeats against the job's `finished` record, `num_steps`,
    `num_steps * batch_size` and the heartbeat lines counted in its log; mid-run scrapes
    never go back and never lag a step a heartbeat had already reported.
    """
    configs = {
        "batch16-h1": Config.tiny(),
        "batch8-h0.25": Config.tiny().replace(
            batch_size=8, heartbeat_interval_s=0.25, num_steps=30, min_examples_per_s=40.0
        ),
    }
    results: dict = {}
    threads = [
        threading.Thread(target=_supervised, args=(c, tmp_path / k, jax_cache, results, k))
        for k, c in configs.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, config in configs.items():
        outcome = results[key]
        assert outcome.status == "completed", (
            f"{key}: the job ended `{outcome.status}` (exit status {outcome.returncode}), "
            f"not `completed`\n{job_log(tmp_path / key)}"
        )
        log = (tmp_path / key / "logs" / "attempt_0.out").read_text().splitlines()
        records = [json.loads(line) for line in log]
        beats = sum(r.get("event") == "heartbeat" for r in records)
        final = outcome.final_scrape["values"]
        finished = outcome.finished
        reference = {
            "steps": config.num_steps,
            "examples": config.num_steps * config.batch_size,
            "heartbeats": beats,
        }
        own = {k: finished[k] for k in ("steps_done", "examples", "heartbeats")}
        scraped = {
            "steps": final["workload_steps_total"],
            "examples": final["workload_examples_total"],
            "heartbeats": final["workload_heartbeats_total"],
        }
        agree = (
            scraped["steps"] == own["steps_done"] == reference["steps"]
            and scraped["examples"] == own["examples"] == reference["examples"]
            and scraped["heartbeats"] == own["heartbeats"] == reference["heartbeats"]
        )
        # Mid-run scrapes: counters never go back, and never lag the progress that
        # a heartbeat had already reported before the scrape was sent.
        mid = [s for s in outcome.scrapes if "values" in s]
        steps_seen = [s["values"]["workload_steps_total"] for s in mid]
        monotone = all(a <= b for a, b in zip(steps_seen, steps_seen[1:], strict=False))
        not_lagging = all(
            s["values"]["workload_steps_total"] >= (s["step_before"] or 0) for s in mid
        )
        assert evidence.record(
            "final scrape = job's own count = reference count",
            key,
            {"scraped": scraped, "own": own, "reference": reference, "mid_scrapes": len(mid)},
            {"exact": True},
            agree and monotone and not_lagging and len(mid) >= 2,
        ), (scraped, own, reference, steps_seen)
        port_event = next(r for r in records if r.get("event") == "metrics")
        assert 1024 <= port_event["port"] < 65536
        samples = outcome.resources
        assert all(s["processes"] == 1 for s in samples[3:]), "no sidecar: one process"
        assert samples[-1]["final"] and samples[-1]["threads"] >= 3, samples[-1]
        assert samples[-1]["rss_mb"] > 50, samples[-1]


@pytest.mark.claims("observation-cost-measured")
def test_observation_cost_bench_runs_on_a_tiny_size(tmp_path, evidence):
    """The bench's ratios are reciprocal and each measurement has 3 repetitions (no speed asserted).

    Speed is the bench's business (README); this checks only that it runs end to end on
    a tiny size and reports consistent figures.
    """
    from workload_operations.bench import observation_cost

    result = observation_cost(Config.tiny(), reps=3, chunk=20)
    ratios = result["ratios"]
    ok = (
        set(ratios) >= {"observed_vs_unobserved", "unobserved_vs_observed"}
        and abs(ratios["observed_vs_unobserved"] * ratios["unobserved_vs_observed"] - 1) < 1e-9
        and all(m["n"] == 3 for m in result["measurements"].values())
    )
    assert evidence.record(
        "bench reports consistent ratios (not a speed assertion)",
        "3 reps x 20 steps",
        {"ratios": ratios, "per_step": result["per_step"]},
        None,
        ok,
    )


def test_heartbeat_interval_not_shorter_than_timeout_is_refused(tmp_path):
    """A heartbeat interval not shorter than a timeout is refused by name, by the API and the CLI.

    The CLI exits with status 2 and writes nothing under `runs/`.
    """
    with pytest.raises(ConfigError, match="`heartbeat_interval_s` = `7.0` is not shorter"):
        Config.tiny().replace(heartbeat_interval_s=7.0)
    bad = tmp_path / "bad.json"
    bad.write_text(
        Config.tiny()
        .to_json()
        .replace('"heartbeat_interval_s": 1.0', '"heartbeat_interval_s": 9.0')
    )
    result = CliRunner().invoke(main, ["supervise", "--config", str(bad)])
    assert result.exit_code == 2
    assert "`heartbeat_interval_s` = `9.0`" in result.output
    assert not (tmp_path / "runs").exists()
