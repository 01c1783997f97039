"""Starts N real worker processes on this machine, one `jax.distributed` job.

`launch(...)` picks a free port on 127.0.0.1 for the coordinator (or refuses a
port already in use), starts `python -m sharded_training.worker` once per
process, and watches them: every process has a deadline, and by default when
one dies the others are SIGKILLed too (a preempted job). With
`kill_survivors=False` the survivors are left to notice on their own, which is
how the heartbeat timeout is tested.
"""

import math
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sharded_training.config import Config, ConfigError, check_output_dir

PROGRESS_EVERY_S = 5.0  # How often `echo` gets each process's newest progress line.


class LaunchError(RuntimeError):
    """The job could not be started or did not finish in time; the message says why."""


class BadLaunch(LaunchError, ValueError):
    """Launch arguments that cannot start a job: refused before any process starts."""


@dataclass
class LaunchResult:
    returncodes: list[int]
    wall_s: float
    port: int
    first_death_s: float | None = None  # When the first process died (non-zero exit).
    exit_s: list[float] = field(default_factory=list)  # When each process exited.


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise BadLaunch(f"`--port` must be from 1 to 65535, not `{port}`.")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise BadLaunch(
                f"Port `{port}` on 127.0.0.1 is in use, so the coordinator cannot listen "
                f"there; choose another `--port` or leave it out to pick a free one."
            ) from None


def worker_command(
    config_path: Path,
    workdir: Path,
    process: int,
    processes: int,
    devices: int,
    coordinator: str,
    attempt: int = 0,
    kill_at: str = "",
    checkpoints: bool = True,
    compilation_cache: Path | None = None,
    init_timeout_s: int = 60,
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "sharded_training.worker",
        "--config",
        str(config_path),
        "--workdir",
        str(workdir),
        "--process-id",
        str(process),
        "--num-processes",
        str(processes),
        "--devices-per-process",
        str(devices),
        "--coordinator",
        coordinator,
        "--attempt",
        str(attempt),
        "--init-timeout",
        str(init_timeout_s),
    ]
    if kill_at:
        command += ["--kill-at", kill_at]
    if not checkpoints:
        command.append("--no-checkpoints")
    if compilation_cache is not None:
        command += ["--compilation-cache", str(compilation_cache)]
    return command


def launch(
    config: Config,
    workdir: str | Path,
    *,
    processes: int = 2,
    devices_per_process: int = 4,
    port: int | None = None,
    attempt: int = 0,
    kill_at: str = "",
    kill_survivors: bool = True,
    checkpoints: bool = True,
    timeout_s: float = 120.0,
    compilation_cache: str | Path | None = None,
    echo=None,
) -> LaunchResult:
    """Runs the job to the end (or to its deaths); output in `workdir/logs/`.
    With `echo`, every `PROGRESS_EVERY_S` seconds each process's newest progress
    line (joined, compiled, step n/N ...) is passed to it.

    `compilation_cache` (default `workdir/jax-cache`) is JAX's persistent cache:
    a relaunch loads the executables the first launch compiled."""
    if processes < 1 or devices_per_process < 1:
        raise BadLaunch(
            f"`--processes` (`{processes}`) and `--devices-per-process` "
            f"(`{devices_per_process}`) must both be at least 1."
        )
    data, model = config.mesh_shape
    if data * model != processes * devices_per_process:
        raise BadLaunch(
            f"The mesh shape `({data}, {model})` needs {data * model} devices, but "
            f"{processes} processes x {devices_per_process} devices give "
            f"`{processes * devices_per_process}`."
        )
    if config.batch_size % processes:
        raise BadLaunch(
            f"`batch_size` = `{config.batch_size}` does not divide over `{processes}` "
            f"processes; use a multiple of {processes}."
        )
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise BadLaunch(f"`--timeout` must be a positive number of seconds, not `{timeout_s}`.")
    try:
        check_output_dir(workdir, "The workdir")
    except ConfigError as err:
        raise BadLaunch(str(err)) from None
    if port is None:
        port = free_port()
    else:
        check_port(port)
    workdir = Path(workdir).absolute()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    config_path = workdir / "config.json"
    config_path.write_text(config.to_json(), encoding="utf-8")
    coordinator = f"127.0.0.1:{port}"
    start = time.perf_counter()
    procs, outputs = [], []
    for index in range(processes):
        out = open(workdir / "logs" / f"attempt_{attempt}_p{index}.out", "w")
        outputs.append(out)
        command = worker_command(
            config_path,
            workdir,
            index,
            processes,
            devices_per_process,
            coordinator,
            attempt,
            kill_at,
            checkpoints,
            Path(compilation_cache).absolute() if compilation_cache else workdir / "jax-cache",
            # Joining may take as long as the job may: on a busy machine process 0
            # can need more than a minute to start the coordinator.
            max(60, int(timeout_s)),
        )
        procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT))
    exit_s: list[float | None] = [None] * processes
    first_death = None
    shown: list[str] = [""] * processes
    next_progress = PROGRESS_EVERY_S
    try:
        while any(t is None for t in exit_s):
            now = time.perf_counter() - start
            if echo and now >= next_progress:
                next_progress = now + PROGRESS_EVERY_S
                for index in range(processes):
                    line = _last_progress_line(workdir, attempt, index)
                    if line and line != shown[index]:
                        shown[index] = line
                        echo(f"[{now:6.1f}s] {line}")
            if now > timeout_s:
                raise LaunchError(
                    f"The job did not finish within {timeout_s:.0f} s; its processes were "
                    f"killed. Logs: `{workdir / 'logs'}`."
                )
            for index, proc in enumerate(procs):
                if exit_s[index] is None and proc.poll() is not None:
                    exit_s[index] = now
                    if proc.returncode != 0 and first_death is None:
                        first_death = now
                        if echo:
                            echo(f"process {index} exited with code {proc.returncode}")
                        if kill_survivors:
                            for other in procs:
                                if other.poll() is None:
                                    other.kill()
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for out in outputs:
            out.close()
    return LaunchResult(
        [p.returncode for p in procs],
        time.perf_counter() - start,
        port,
        first_death,
        [float(t) for t in exit_s],
    )


def _last_progress_line(workdir: Path, attempt: int, process: int) -> str:
    """The newest progress line (`[p<i> ...] ...`) a worker has written, or ``."""
    lines = [
        ln for ln in read_output(workdir, attempt, process).splitlines() if ln.startswith("[p")
    ]
    return lines[-1] if lines else ""


def read_output(workdir: str | Path, attempt: int, process: int) -> str:
    path = Path(workdir) / "logs" / f"attempt_{attempt}_p{process}.out"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def summarize(workdir: str | Path, processes: int) -> dict:
    """Reads every process's `final_p<i>.json` and `collectives.json`: losses, whether
    the processes' sample IDs cover each global batch exactly once, the gradient
    all-reduce size."""
    import json

    workdir = Path(workdir)
    finals = [json.loads((workdir / f"final_p{i}.json").read_text()) for i in range(processes)]
    config = Config.from_json((workdir / "config.json").read_text())
    from sharded_training import data

    covered = True
    for step in finals[0]["ids"]:
        owned = [i for f in finals for i in f["ids"][step] if i != data.PAD_ID]
        expected = data.global_ids_for_step(config, int(step) - 1)
        covered &= sorted(owned) == sorted(expected) and len(set(owned)) == len(owned)
    collectives = json.loads((workdir / "collectives.json").read_text())["collectives"]
    reduces = [c["bytes"] for c in collectives if c["op"] == "all-reduce"]
    losses = finals[0]["losses"]
    return {
        "losses": losses,
        "final_loss": losses[max(losses, key=int)] if losses else float("nan"),
        "ids_cover_each_batch_once": bool(covered),
        "gradient_all_reduce_bytes": max(reduces, default=0),
        "digests_agree": len({f["digest"] for f in finals}) == 1,
    }
