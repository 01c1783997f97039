"""A synthetic job for the stage 2 tests: heartbeats, completed steps, an exit and
a memory jump at chosen times, judged by the classifier at polls every quarter
heartbeat interval, the way the supervisor polls a real job. Every figure the
classifier sees (last heartbeat, the step it reported, the window rate) is
computed here from the chosen times, never by the supervisor. `faulty_job`
builds a healthy job that shows one class's symptom from a chosen onset.

Times are seconds after the job's start, which sits at `ORIGIN` on the monotonic
clock (not 0, so that a rule reading `now` for `now - started` shows). The tests
use heartbeat intervals that are powers of two and times that are multiples of
h/8, so every sum and difference is exact in binary floating point and a poll
lands exactly on a limit where the test puts one.
"""

from bisect import bisect_right
from dataclasses import dataclass, field

from workload_operations.config import Config
from workload_operations.diagnose import Symptoms, classify

ORIGIN = 1024.0


def window_rate_reference(pairs, window, batch):
    """The newest pair at least `window` steps before the newest one, by a list filter."""
    if not pairs:
        return None
    step, t = pairs[-1]
    older = [(s, u) for s, u in pairs[:-1] if s <= step - window]
    if not older:
        return None
    old_step, old_t = older[-1]
    return (step - old_step) * batch / (t - old_t)


def every(first: float, spacing: float, until: float) -> list[float]:
    """`first`, `first + spacing`, ... up to `until` (each computed by one multiplication)."""
    count = int((until - first) // spacing) + 1 if until >= first else 0
    return [first + i * spacing for i in range(count)]


@dataclass
class Timeline:
    """One job: heartbeats emitted at `beats`, step i + 1 completed at `steps[i]`;
    from `exit_at` on it has exited with `returncode` and `stderr`; from `rss_from`
    on its group holds `rss_high_mb` instead of `rss_mb`."""

    beats: list[float]
    steps: list[float]
    batch: int
    window: int
    exit_at: float | None = None
    returncode: int | None = None
    stderr: list[str] = field(default_factory=list)
    rss_mb: float = 300.0
    rss_from: float | None = None
    rss_high_mb: float = 600.0

    def symptoms(self, t: float) -> Symptoms:
        """What the supervisor would know at `t`: each heartbeat reports the newest step
        completed by its own time, and a pair (step, step_t) is kept per new step."""
        pairs: list[tuple[int, float]] = []
        seen = [b for b in self.beats if b <= t]
        for b in seen:
            done = bisect_right(self.steps, b)  # `steps` is in time order.
            if done and (not pairs or pairs[-1][0] != done):
                pairs.append((done, self.steps[done - 1]))
        exited = self.exit_at is not None and t >= self.exit_at
        high = self.rss_from is not None and t >= self.rss_from
        return Symptoms(
            now=ORIGIN + t,
            started=ORIGIN,
            returncode=self.returncode if exited else None,
            stderr_tail=list(self.stderr) if exited else [],
            rss_mb=self.rss_high_mb if high else self.rss_mb,
            last_heartbeat_t=ORIGIN + seen[-1] if seen else None,
            last_step=pairs[-1][0] if pairs else 0,
            last_step_t=ORIGIN + pairs[-1][1] if pairs else None,
            rate=window_rate_reference(pairs, self.window, self.batch),
        )


def first_verdict(job: Timeline, config: Config, until: float) -> tuple[str | None, float | None]:
    """(class, time) at the first poll, every h/4 after the start, at which the classifier
    gives a class; (None, None) when every poll up to `until` finds the job healthy."""
    quarter = config.heartbeat_interval_s / 4
    k = 1
    while k * quarter <= until:
        verdict = classify(job.symptoms(k * quarter), config)
        if verdict is not None:
            return verdict, k * quarter
        k += 1
    return None, None


TRACEBACK = ["Traceback (most recent call last):", '  File "train.py"', "RuntimeError: x"]


def faulty_job(cls: str, onset: float, config: Config, until: float) -> Timeline:
    """A healthy job (heartbeats every h from h, steps every h/8 from 2h) that shows the
    symptom of `cls` from `onset` on: an exit with a traceback, SIGKILL, 600 MB of a
    512 MB limit, silence (no heartbeat, no step), heartbeats with no step, or steps at
    a quarter of the stated rate (the pace the bound's slow window assumes)."""
    h = config.heartbeat_interval_s
    beats, steps = every(h, h, until), every(2 * h, h / 8, until)
    early = {"beats": [b for b in beats if b < onset], "steps": [u for u in steps if u < onset]}
    job = {"beats": beats, "steps": steps}
    if cls == "exception":
        job = {**early, "exit_at": onset, "returncode": 1, "stderr": TRACEBACK}
    elif cls == "killed":
        job = {**early, "exit_at": onset, "returncode": -9}
    elif cls == "memory":
        job["rss_from"] = onset
    elif cls == "hang":
        job = early
    elif cls == "stall":
        job["steps"] = early["steps"]
    else:  # slow
        slow_step_s = config.batch_size / (config.min_examples_per_s / 4)
        job["steps"] = early["steps"] + every(onset + slow_step_s, slow_step_s, until)
    return Timeline(batch=config.batch_size, window=config.rate_window_steps, **job)
