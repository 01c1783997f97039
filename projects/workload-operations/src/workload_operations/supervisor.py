"""The supervisor: starts the job as a child, watches it, diagnoses and cleans up.

`Supervisor(config, workdir).run()` starts `python -m workload_operations.job`
in a new session (its own process group), then polls five times per
heartbeat interval:

- reads the job's JSON lines (heartbeats with progress, events);
- samples the group's resources with psutil (resident memory, CPU, threads);
- scrapes the job's Prometheus endpoint once per interval;
- with `detect=True`, hands the symptoms to `diagnose.classify`.

On a diagnosis it keeps the evidence (exit status or signal, the last log
lines, the last progress, every thread's stack of a live process via SIGUSR1
and `faulthandler`), kills the whole process group, reaps every member (it is
a child subreaper, so members orphaned by the job's death are reparented to it,
not to init) and writes an incident record under `<workdir>/incidents/`.
When the job finishes, a last scrape is taken while the job holds, then its
standard input is closed and it exits.
"""

import atexit
import ctypes
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from workload_operations import diagnose, faults
from workload_operations.config import Config, ConfigError, check_output_path

PR_SET_CHILD_SUBREAPER = 36
_subreaper_lock = threading.Lock()
_subreaper = None


def become_subreaper() -> bool:
    """Makes this process the reaper of its orphaned descendants (Linux only)."""
    global _subreaper
    with _subreaper_lock:
        if _subreaper is None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                _subreaper = False
        return _subreaper


def group_members(pgid: int) -> list[dict]:
    """Every process whose process group is `pgid`, read from /proc: pid and state."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces) are after the last ')'.
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append({"pid": int(name), "state": fields[0]})
    return members


def _reap(pid: int, timeout_s: float) -> str:
    """Waits for `pid` to disappear, reaping it if it was adopted by this process."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return "reaped"
        except ChildProcessError:
            if not os.path.exists(f"/proc/{pid}"):
                return "gone"
        time.sleep(0.01)
    return "left"


def resources(pid: int) -> dict:
    """psutil's view of the job and its descendants: RSS, CPU seconds, threads
    [claim:resources-of-the-group]."""
    return resources_of(_group_processes(pid))


def resources_of(procs: list) -> dict:
    rss = threads = alive = 0
    cpu = 0.0
    for proc in procs:
        try:
            with proc.oneshot():
                rss += proc.memory_info().rss
                threads += proc.num_threads()
                times = proc.cpu_times()
            cpu += times.user + times.system
            alive += 1
        except psutil.Error:
            continue
    return {"processes": alive, "rss_mb": rss / 2**20, "threads": threads, "cpu_s": cpu}


def _group_processes(pid: int) -> list:
    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def _rss_mb(procs: list) -> float:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def scrape(port: int, timeout_s: float) -> dict[str, float]:
    """The job's metric samples by name (`workload_steps_total`, ...).

    Raises OSError (ConnectionError for a reply cut short) when the job cannot
    answer: a job that dies mid-reply is a failed scrape, not a crash of the
    supervisor [claim:scrape-failure-is-an-os-error]."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as reply:
            text = reply.read().decode()
    except http.client.HTTPException as err:  # IncompleteRead, BadStatusLine, ...
        raise ConnectionError(f"{type(err).__name__}: {err!r}") from err
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("workload_")
    }


class Child:
    """A job process this process is the parent of (started, or adopted from the
    zygote): `poll`/`wait` read its exit status with `waitpid`, like `Popen`."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if done == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return self.returncode


class Zygote:
    """The fork server (see `zygote`), one per supervising process, started lazily."""

    _lock = threading.Lock()
    _instance: "Zygote | None" = None

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workload_operations.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
        )
        ready = json.loads(self.proc.stdout.readline() or "{}")
        if not ready.get("ready"):
            raise RuntimeError("The job fork server did not start; see its standard error.")

    @classmethod
    def shared(cls) -> "Zygote":
        with cls._lock:
            if cls._instance is None or cls._instance.proc.poll() is not None:
                cls._instance = cls()
                atexit.register(cls._instance.close)
            return cls._instance

    def spawn(self, argv: list[str], stdout: Path, stderr: Path) -> Child:
        request = {"argv": argv, "stdout": str(stdout), "stderr": str(stderr)}
        with self._lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            reply = json.loads(self.proc.stdout.readline() or "{}")
        if "pid" not in reply:
            raise RuntimeError(f"The job fork server failed: {reply.get('error', 'no reply')}.")
        return Child(reply["pid"])

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.proc.stdout.close()


@dataclass
class Outcome:
    """What one supervised attempt ended with, and what was seen on the way."""

    status: str  # "completed", or the diagnosis (see `diagnose.CLASSES`)
    returncode: int | None
    attempt: int
    workdir: str
    heartbeats: list = field(default_factory=list)
    scrapes: list = field(default_factory=list)
    resources: list = field(default_factory=list)
    events: list = field(default_factory=list)
    finished: dict | None = None
    final_scrape: dict | None = None
    injected: dict | None = None
    incident: dict | None = None
    incident_path: str | None = None
    termination: dict | None = None


class Supervisor:
    def __init__(
        self,
        config: Config,
        workdir: str | Path,
        *,
        fault: str = "",
        detect: bool = True,
        resume: bool = False,
        attempt: int = 0,
        compilation_cache: str | Path | None = None,
        use_zygote: bool = True,
        say=None,
    ):
        self.config = config
        # Jobs are forked from a fork server that has imported JAX once; the
        # subreaper needed to adopt them is Linux-only.
        self.use_zygote = use_zygote and become_subreaper()
        self.workdir = Path(workdir).absolute()
        self.fault = fault
        self.detect = detect
        self.resume = resume
        self.attempt = attempt
        self.say = say or (lambda _: None)
        self.h = config.heartbeat_interval_s
        # JAX's persistent compilation cache, shared by every attempt and drill: a job
        # after the first loads its executables instead of compiling them.
        self.compilation_cache = (
            Path(compilation_cache).absolute()
            if compilation_cache is not None
            else self.workdir.parent / "jax-cache"
        )

    def job_args(self) -> list[str]:
        cmd = [
            "--config",
            str(self.workdir / "config.json"),
            "--workdir",
            str(self.workdir),
            "--attempt",
            str(self.attempt),
            "--hold",
            "--compilation-cache",
            str(self.compilation_cache),
        ]
        if self.fault:
            cmd += ["--fault", self.fault]
        if self.resume:
            cmd.append("--resume")
        return cmd

    def run(self) -> Outcome:
        become_subreaper()
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (self.workdir / "config.json").write_text(self.config.to_json(), encoding="utf-8")
        out_path = logs / f"attempt_{self.attempt}.out"
        err_path = logs / f"attempt_{self.attempt}.err"
        started = time.monotonic()
        if self.use_zygote:
            proc = Zygote.shared().spawn(self.job_args(), out_path, err_path)
        else:
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "workload_operations.job", *self.job_args()],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    env=cache_env(self.compilation_cache),
                )
        pgid = proc.pid  # A new session: the job leads its own process group.
        outcome = Outcome("running", None, self.attempt, str(self.workdir))
        watch = _Watch(self, proc, out_path, err_path, started, outcome)
        try:
            watch.loop()
        finally:
            if proc.poll() is None and outcome.status == "running":
                outcome.status = "interrupted"
            outcome.termination = terminate(
                proc,
                pgid,
                err_path,
                dump=outcome.status in diagnose.LIVE,
                wait_s=max(2.0, 4 * self.h),
            )
            outcome.returncode = proc.returncode
            if outcome.status not in ("completed", "running", "interrupted"):
                outcome.incident = build_incident(self, outcome, watch, out_path, err_path)
                outcome.incident_path = str(write_incident(self.workdir, outcome.incident))
            self._write_log(outcome)
        return outcome

    def _write_log(self, outcome: Outcome) -> None:
        path = self.workdir / f"supervisor_attempt_{self.attempt}.json"
        payload = {k: v for k, v in asdict(outcome).items()}
        path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")


class _Watch:
    """The polling loop of one attempt (state kept between polls)."""

    def __init__(self, sup: Supervisor, proc, out_path, err_path, started, outcome: Outcome):
        self.sup, self.proc = sup, proc
        self.out_path, self.err_path = out_path, err_path
        self.started = started
        self.outcome = outcome
        self.offset = 0
        self.buffer = b""
        self.port: int | None = None
        self.pairs: list[tuple[int, float]] = []  # (step, step_t) as heartbeats reported them
        self.last_heartbeat: dict | None = None
        self.detected_t: float | None = None
        self.rss_mb = 0.0
        self.group: list = []

    def read_lines(self) -> None:
        with open(self.out_path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            self.on_record(record)

    def on_record(self, record: dict) -> None:
        event = record.get("event")
        out = self.outcome
        if event == "heartbeat":
            out.heartbeats.append(record)
            self.last_heartbeat = record
            if record["step_t"] is not None and (
                not self.pairs or record["step"] != self.pairs[-1][0]
            ):
                self.pairs.append((record["step"], record["step_t"]))
        elif event == "metrics":
            self.port = record["port"]
            out.events.append(record)
        elif event == "fault":
            out.injected = record  # Ground truth for drills; never shown to the classifier.
        elif event == "finished":
            out.finished = record
        else:
            out.events.append(record)

    def symptoms(self, now: float) -> diagnose.Symptoms:
        return diagnose.Symptoms(
            now=now,
            started=self.started,
            returncode=self.proc.returncode,
            # Read only once the job has exited: the tail is for the exit's diagnosis.
            stderr_tail=[] if self.proc.returncode is None else tail_lines(self.err_path, 40),
            rss_mb=self.rss_mb,
            last_heartbeat_t=None if self.last_heartbeat is None else self.last_heartbeat["t"],
            last_step=0 if not self.pairs else self.pairs[-1][0],
            last_step_t=None if not self.pairs else self.pairs[-1][1],
            rate=diagnose.window_rate(
                self.pairs, self.sup.config.rate_window_steps, self.sup.config.batch_size
            ),
        )

    def loop(self) -> None:
        sup, out = self.sup, self.outcome
        poll_s = sup.h / 5
        next_sample = 0.0
        while True:
            time.sleep(poll_s)
            now = time.monotonic()
            self.read_lines()
            if out.finished is not None:
                self.finish()
                out.status = "completed" if self.proc.returncode == 0 else "exited"
                return
            if now >= next_sample:
                # Once per interval: the whole group (a scan of all processes).
                next_sample = now + sup.h
                self.group = _group_processes(self.proc.pid)
                sample = resources_of(self.group)
                self.rss_mb = sample["rss_mb"]
                out.resources.append({"t": now, **sample})
                if self.port is not None:
                    out.scrapes.append(self.take_scrape())
            else:
                # Every poll: the resident memory of the processes known to the group.
                self.rss_mb = _rss_mb(self.group)
            self.proc.poll()
            if self.proc.returncode is not None:
                self.read_lines()  # The last lines a dying job wrote.
                if out.finished is not None:
                    continue
            if sup.detect:
                status = diagnose.classify(self.symptoms(time.monotonic()), sup.config)
                if status is not None:
                    self.detected_t = time.monotonic()
                    out.status = status
                    return
            elif self.proc.returncode is not None:
                out.status = "exited"
                return

    def take_scrape(self) -> dict:
        before = None if self.last_heartbeat is None else self.last_heartbeat["step"]
        try:
            values = scrape(self.port, timeout_s=max(1.0, self.sup.h))
            return {"t": time.monotonic(), "step_before": before, "values": values}
        except OSError as err:
            return {"t": time.monotonic(), "step_before": before, "error": str(err)}

    def finish(self) -> None:
        """The job finished and holds: last scrape and resources, then release it."""
        out = self.outcome
        if self.port is not None:
            out.final_scrape = self.take_scrape()
        out.resources.append({"t": time.monotonic(), "final": True, **resources(self.proc.pid)})
        try:
            os.kill(self.proc.pid, signal.SIGTERM)  # The release the holding job waits for.
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=max(30.0, 10 * self.sup.h))
        except subprocess.TimeoutExpired:
            pass
        self.read_lines()


def tail_lines(path: Path, count: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-count:]


def terminate(proc, pgid: int, err_path: Path, *, dump: bool, wait_s: float) -> dict:
    """Stack dump of a live job (optional), SIGKILL to its group, every member reaped
    [claim:failed-group-killed-and-reaped]."""
    dumped = False
    if dump and proc.poll() is None:
        before = err_path.stat().st_size if err_path.exists() else 0
        try:
            os.kill(proc.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not dumped:
            time.sleep(0.05)
            with open(err_path, "rb") as f:
                f.seek(before)
                dumped = b"most recent call first" in f.read()
        time.sleep(0.1)  # Let the dump of the remaining threads finish.
    members = group_members(pgid)
    try:
        os.killpg(pgid, signal.SIGKILL)
        signalled = True
    except ProcessLookupError:
        signalled = False
    proc.wait()
    reaped = {m["pid"]: _reap(m["pid"], wait_s) for m in members if m["pid"] != proc.pid}
    left = group_members(pgid)
    return {
        "pgid": pgid,
        "members_before": members,
        "group_signalled": signalled,
        "stack_dumped": dumped,
        "reaped": reaped,
        "left": left,
        "zombies": [m for m in left if m["state"] == "Z"],
    }


def stack_dump(err_path: Path) -> str:
    text = err_path.read_text(errors="replace") if err_path.exists() else ""
    start = text.find("Thread 0x")
    if start < 0:
        start = text.find("Current thread 0x")
    return text[start:] if start >= 0 else ""


def build_incident(sup: Supervisor, outcome: Outcome, watch: _Watch, out_path, err_path) -> dict:
    """The kept evidence and its diagnosis; see `diagnose.explain` for the sentence."""
    symptoms = watch.symptoms(watch.detected_t or time.monotonic())
    rc = outcome.returncode
    injected = outcome.injected
    detection = diagnose.detection(sup.config, outcome.status, watch.detected_t, injected, symptoms)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    return {
        "id": f"{stamp}-job{watch.proc.pid}-{sup.attempt}-{outcome.status}",
        "workdir": str(sup.workdir),
        "attempt": sup.attempt,
        "classification": outcome.status,
        "diagnosis": diagnose.explain(outcome.status, symptoms, sup.config),
        "injected": injected,
        "evidence": {
            "returncode": rc,
            "signal": signal.Signals(-rc).name if rc is not None and rc < 0 else None,
            "last_stdout_lines": tail_lines(out_path, 20),
            "last_stderr_lines": tail_lines(err_path, 40),
            "last_heartbeat": watch.last_heartbeat,
            "last_progress": None
            if not watch.pairs
            else {"step": watch.pairs[-1][0], "step_t": watch.pairs[-1][1]},
            "rss_mb_at_detection": symptoms.rss_mb,
            "resources_last": outcome.resources[-5:],
            "stack_dump": stack_dump(err_path),
            "logs": {"stdout": str(out_path), "stderr": str(err_path)},
        },
        "detection": detection,
        "termination": outcome.termination,
    }


def write_incident(workdir: Path, incident: dict) -> Path:
    path = Path(workdir) / "incidents" / f"{incident['id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(incident, indent=1) + "\n", encoding="utf-8")
    return path


def cache_env(compilation_cache: Path) -> dict:
    return {
        **os.environ,
        "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
        "JAX_COMPILATION_CACHE_DIR": str(compilation_cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }


def run_verifier(workdir: Path, compilation_cache: Path | None = None) -> dict:
    """The acceptance judgement in its own process (see `verifier`); its JSON summary."""
    workdir = Path(workdir).absolute()
    cache = Path(compilation_cache) if compilation_cache else workdir.parent / "jax-cache"
    done = subprocess.run(
        [sys.executable, "-m", "workload_operations.verifier", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        env=cache_env(cache),
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"The verifier failed with status {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def supervise(
    config: Config,
    workdir: str | Path,
    *,
    fault: str = "",
    restarts: int = 1,
    compilation_cache: str | Path | None = None,
    say=None,
) -> dict:
    """Runs the job to completion, restarting it up to `restarts` times after an
    incident. With checkpoints, the verifier judges the recovery points after
    every attempt, and a restart continues from the latest accepted step only."""
    say = say or (lambda _: None)
    if not isinstance(config, Config):
        raise ConfigError(f"`config` must be a `Config`, not a `{type(config).__name__}`.")
    if fault:
        faults.check(faults.parse(fault), config)
    workdir = check_output_path(workdir, directory=True, what="The workdir").absolute()
    outcomes, verifications = [], []
    for attempt in range(restarts + 1):
        sup = Supervisor(
            config,
            workdir,
            fault=fault if attempt == 0 else "",
            resume=attempt > 0 and config.checkpoint_every > 0,
            attempt=attempt,
            compilation_cache=compilation_cache,
            say=say,
        )
        outcome = sup.run()
        outcomes.append(outcome)
        say(f"attempt {attempt}: {outcome.status}")
        if outcome.incident is not None:
            say(f"  incident: {outcome.incident['diagnosis']}")
        if config.checkpoint_every and (workdir / "ledger").is_dir():
            verification = run_verifier(workdir, sup.compilation_cache)
            verifications.append(verification)
            say(
                f"  verifier: latest accepted step {verification['latest_accepted']}; "
                + ", ".join(
                    f"{v['step']} {'accepted' if v['accepted'] else 'rejected'}"
                    for v in verification["verdicts"]
                )
            )
        if outcome.status == "completed":
            break
    return {"outcomes": outcomes, "verifications": verifications}
