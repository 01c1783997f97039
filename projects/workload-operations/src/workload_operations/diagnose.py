"""From symptoms to a diagnosis: the fault classifier and its detection bounds.

The classifier sees only what an operator could see: the exit status, the
last lines of standard error, the group's resident memory, the time of the
last heartbeat, the last step the heartbeats reported (and when the job says
it completed), and the rate over the last `rate_window_steps` steps. It never
sees which fault was injected.

Classes, and the bound on detection time (from the fault's onset, in
heartbeat intervals h; "grace" is the part the config chooses):

| class       | symptom                                             | bound          |
|-------------|-----------------------------------------------------|----------------|
| `exception` | non-zero exit status, a Python traceback on stderr  | 2              |
| `killed`    | ended by a signal the supervisor did not send       | 2              |
| `exited`    | non-zero exit status, no traceback                  | 2              |
| `memory`    | group resident memory above `memory_limit_mb`       | 2 + 6          |
| `hang`      | no heartbeat for `hang_timeout_s`                   | 2 + hang/h     |
| `stall`     | heartbeats go on, no new step for `stall_timeout_s` | 2 + stall/h    |
| `slow`      | rate over the last steps under `min_examples_per_s` | 2 + window/h   |

The 2 intervals cover the report's own period (a symptom is seen at the next
heartbeat at the latest) and the supervisor's poll. The memory grace covers
allocating and touching the memory; the slow window is `rate_window_steps`
slow steps. [claim:detection-bounds-table]
"""

import math
from dataclasses import dataclass

from workload_operations.config import Config

CLASSES = ("exception", "killed", "exited", "memory", "hang", "stall", "slow")
LIVE = {"memory", "hang", "stall", "slow"}  # The job is still running when diagnosed.
# What a drill's injected fault must be diagnosed as.
MEMORY_GRACE_INTERVALS = 6
EXPECTED = {
    "exception": "exception",
    "kill": "killed",
    "memory": "memory",
    "hang": "hang",
    "stall": "stall",
    "slow": "slow",
    "kill-during-save": "killed",
}


@dataclass(frozen=True)
class Symptoms:
    now: float  # time.monotonic() of this judgement
    started: float  # when the job was started
    returncode: int | None  # None while it runs; -N for signal N
    stderr_tail: list[str]
    rss_mb: float  # resident memory of the job's process group
    last_heartbeat_t: float | None  # the job's clock (CLOCK_MONOTONIC, as ours)
    last_step: int
    last_step_t: float | None  # when the job completed `last_step`
    rate: float | None  # examples/s over the last window of steps; None before a window


def window_rate(pairs: list[tuple[int, float]], window: int, batch_size: int) -> float | None:
    """Examples/s between the newest reported step and the newest one at least
    `window` steps older; None until such a pair exists. `pairs`: (step, step_t)
    [claim:window-rate]."""
    if not pairs:
        return None
    step, t = pairs[-1]
    for old_step, old_t in reversed(pairs[:-1]):
        if old_step <= step - window:
            return (step - old_step) * batch_size / max(t - old_t, 1e-9)
    return None


def classify(s: Symptoms, config: Config) -> str | None:
    """The diagnosis, or None while the job looks healthy (or finished cleanly).

    Rules, the first that applies wins; every limit is strict (a figure equal to
    its limit is not over it) [claim:classify-first-rule-wins] [claim:classify-limits-strict]:

    1. Exited: status 0 is None; a signal (`returncode < 0`) is `killed`; else a
       stderr line starting `Traceback (most recent call last)` is `exception`,
       none is `exited` [claim:classify-exit].
    2. `rss_mb` over `memory_limit_mb` is `memory` [claim:classify-memory].
    3. Start-up allowance: before the first heartbeat (`last_heartbeat_t` None),
       `hang` only once `now - started` exceeds `startup_timeout_s`, else None
       [claim:classify-startup-without-heartbeat].
    4. `now - last_heartbeat_t` over `hang_timeout_s` is `hang` [claim:classify-hang].
    5. Start-up allowance: heartbeats but no step yet (`last_step_t` None) is
       `stall` only once `now - started` exceeds `startup_timeout_s`, else None.
       Importing and compiling can take far longer than `stall_timeout_s`, so a
       first step that arrives late but inside the allowance is no stall
       [claim:classify-startup-without-step].
    6. `last_heartbeat_t - last_step_t` over `stall_timeout_s` is `stall` (a
       heartbeat after the stall window proves the process alive: a job silent
       since its last step is not yet a stall, it becomes a hang) [claim:classify-stall].
    7. `rate` under `min_examples_per_s` is `slow` (None before a full window)
       [claim:classify-slow].

    Cases (times in heartbeat intervals h from `started`; hang 6, stall 8,
    start-up allowance 300, memory 512 MB, rate 80; healthy: `now` 100, last
    heartbeat 99.5, last step 99.4, rate 300):
        healthy                                              -> None [claim:classify-healthy]
        returncode 0                                         -> None [claim:classify-exit]
        returncode -9 or -15                                 -> "killed" [claim:classify-exit]
        returncode 1, stderr "Traceback (most recent call last):" -> "exception"
          [claim:classify-exit]
        returncode 3, stderr "error: bad"                    -> "exited" [claim:classify-exit]
        rss 520 MB / 512 MB exactly / 520 MB and returncode -9 -> "memory" / None / "killed"
          [claim:classify-memory]
        last heartbeat 5.5 / 6 / 6.5 intervals ago           -> None / None / "hang"
          [claim:classify-hang]
        heartbeat 0.5 ago, step 7.5 / 8 / 8.5 before it      -> None / None / "stall"
          [claim:classify-stall]
        heartbeat 10 ago, step 15 ago                        -> "hang" [claim:classify-stall]
        heartbeat 5 ago, step 9 ago                          -> None [claim:classify-stall]
        rate 79 / 80 / 81 / None                             -> "slow" / None / None / None
          [claim:classify-slow]
        no heartbeat, no step, now 100 / 300 / 301           -> None / None / "hang"
          [claim:classify-startup-without-heartbeat]
        heartbeats, no step yet, now 100 / 300 / 301         -> None / None / "stall"
          [claim:classify-startup-without-step]
        heartbeats from 1, first step at 37, allowance 40    -> None (late, inside it)
          [claim:classify-startup-without-step]
        heartbeats from 1, no step by 40, allowance 40       -> "stall" just after 40
          [claim:classify-startup-without-step]
    """
    # --- exercise stage 2: Exit, memory, hang, stall, slow; first beat/step: startup_timeout_s. ---
    if s.returncode is not None:
        if s.returncode == 0:
            return None
        if s.returncode < 0:
            return "killed"
        if any(line.startswith("Traceback (most recent call last)") for line in s.stderr_tail):
            return "exception"
        return "exited"
    if s.rss_mb > config.memory_limit_mb:
        return "memory"
    if s.last_heartbeat_t is None:
        return "hang" if s.now - s.started > config.startup_timeout_s else None
    if s.now - s.last_heartbeat_t > config.hang_timeout_s:
        return "hang"
    if s.last_step_t is None:
        return "stall" if s.now - s.started > config.startup_timeout_s else None
    # A stall needs a heartbeat that proves the process alive after the stall window.
    if s.last_heartbeat_t - s.last_step_t > config.stall_timeout_s:
        return "stall"
    if s.rate is not None and s.rate < config.min_examples_per_s:
        return "slow"
    return None
    # --- end exercise ---


def bound_intervals(status: str, config: Config) -> float:
    """The detection bound of a class, in heartbeat intervals (see the table above)
    [claim:detection-bounds-table]."""
    h = config.heartbeat_interval_s
    grace = {
        "memory": MEMORY_GRACE_INTERVALS,
        "hang": config.hang_timeout_s / h,
        "stall": config.stall_timeout_s / h,
        "slow": config.rate_window_steps * 4 * config.batch_size / config.min_examples_per_s / h,
    }.get(status, 0.0)
    return 2.0 + grace


def detection(config: Config, status: str, detected_t, injected, s: Symptoms) -> dict:
    """Detection figures in heartbeat intervals: from the injected fault's onset
    (drills, where it is known) and from the last heartbeat [claim:detection-figures]."""
    h = config.heartbeat_interval_s
    since_fault = None
    if injected is not None and detected_t is not None:
        since_fault = (detected_t - injected["t"]) / h
    since_beat = None
    if s.last_heartbeat_t is not None and detected_t is not None:
        since_beat = (detected_t - s.last_heartbeat_t) / h
    bound = bound_intervals(status, config)
    return {
        "heartbeat_interval_s": h,
        "intervals_since_fault": since_fault,
        "intervals_since_last_heartbeat": since_beat,
        "bound_intervals": bound,
        "within_bound": None if since_fault is None else bool(since_fault <= bound),
    }


def explain(status: str, s: Symptoms, config: Config) -> str:
    """One sentence built from the figures that decided the class."""
    h = config.heartbeat_interval_s
    beat_age = None if s.last_heartbeat_t is None else (s.now - s.last_heartbeat_t) / h
    if status == "killed":
        return (
            f"Ended by signal {-s.returncode} that the supervisor did not send, after step "
            f"{s.last_step}; look for a preemption or the kernel's OOM killer."
        )
    if status == "exception":
        last = next((ln for ln in reversed(s.stderr_tail) if ln and not ln[0].isspace()), "")
        return f"Exited with status {s.returncode} after step {s.last_step}: `{last}`."
    if status == "exited":
        return f"Exited with status {s.returncode} after step {s.last_step} and no traceback."
    if status == "memory":
        return (
            f"Group resident memory {s.rss_mb:.0f} MB exceeded the limit of "
            f"{config.memory_limit_mb:.0f} MB at step {s.last_step}."
        )
    if status == "hang":
        age = "never" if beat_age is None else f"{beat_age:.1f} intervals ago"
        return (
            f"No heartbeat for more than {config.hang_timeout_s / h:g} intervals (last: {age}) "
            f"at step {s.last_step}; see the stack dump for the blocked threads."
        )
    if status == "stall":
        idle = (s.last_heartbeat_t - (s.last_step_t or s.started)) / h
        return (
            f"Heartbeats continue but step {s.last_step} has not advanced for {idle:.1f} "
            f"intervals (limit {config.stall_timeout_s / h:g}); see the stack dump."
        )
    if status == "slow":
        rate = s.rate if s.rate is not None else math.nan
        return (
            f"{rate:.1f} examples/s over the last {config.rate_window_steps} steps, under the "
            f"stated {config.min_examples_per_s:g} examples/s, at step {s.last_step}."
        )
    return f"Classified `{status}`."
