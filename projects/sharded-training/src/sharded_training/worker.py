"""One training process: `python -m sharded_training.worker ...` (or `sharded-training worker`).

Sets the CPU device count and the gloo CPU collectives, joins the job with
`jax.distributed.initialize` when there are several processes, trains with
`train.run` and writes `final_p<i>.json` into the workdir. The same command runs
on real hosts: give every host the coordinator's address and its own
`--process-id`. Exit codes: 0 done, 1 training failed or the job lost a
process, 2 bad input or no job to join; errors print one message, never a
traceback. A process of a several-process job runs under a small supervisor
(`supervise`), so that the end the JAX runtime gives a process whose peer died
(SIGABRT with a native stack trace) becomes that one message and exit code 1.
"""

import argparse
import collections
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()


def environment() -> dict:
    """What a bitwise comparison depends on, recorded with every result."""
    import grain
    import jax
    import jaxlib
    import orbax.checkpoint

    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "orbax": orbax.checkpoint.__version__,
        "grain": getattr(grain, "__version__", "0.2.18"),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "machine": platform.machine(),
    }


def check_coordinator(address: str, process_id: int, timeout_s: float) -> str:
    """Empty when the job can be joined, else the reason. Process 0 must be able to
    listen on the port; every other process waits (up to `timeout_s`) until the
    coordinator accepts connections. Checked here because the JAX client aborts
    the whole process, with a C++ stack trace, when it cannot connect."""
    host, _, port_text = address.rpartition(":")
    if not host or not port_text.isdigit():
        return f"the coordinator address `{address}` is not of the form HOST:PORT."
    port = int(port_text)
    if process_id == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("" if host not in ("127.0.0.1", "localhost") else host, port))
            except OSError:
                return (
                    f"port `{port}` is in use, so process 0 cannot start the coordinator at "
                    f"`{address}`; choose another port."
                )
        return ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return ""
        except OSError:
            time.sleep(0.2)
    return (
        f"no coordinator answered at `{address}` within {timeout_s:g} s; start process 0 "
        f"first (it runs the coordinator) and check the address and port."
    )


SUPERVISED = "SHARDED_TRAINING_SUPERVISED"
# Lines after which the JAX runtime prints a native stack trace: kept in the
# process's tail, not shown.
_NATIVE_TRACE = re.compile(
    r"^(\*\*\* Check failure stack trace|terminate called|\*\*\* SIGABRT|"
    r"\*\*\* Aborted at|Fatal Python error|F\d{4} )"
)
_LOST = re.compile(
    r"stopped sending heartbeats|Terminating process because|Polled an error from coordination"
)


def _die_with_parent() -> None:
    """In the child: SIGKILL when the supervising process dies (Linux `prctl`)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(argv: list[str], process_id: int, heartbeat_timeout_s: int | None) -> int:
    """Runs the worker in a child process and reports how it ended.

    When a process of a `jax.distributed` job dies, the coordination service
    tells the others after the heartbeat timeout, and the JAX runtime then ends
    them with a fatal native log (SIGABRT and a C++ stack trace, which Python
    cannot catch). The supervisor turns that into one message and exit code 1.
    A child killed by SIGKILL is passed on as such (a kill is a kill); any other
    exit code is returned unchanged.
    """
    env = {**os.environ, SUPERVISED: "1"}
    child = subprocess.Popen(
        [sys.executable, "-m", "sharded_training.worker", *argv],
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=_die_with_parent,
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda sig, _: child.send_signal(sig))
    tail: collections.deque[str] = collections.deque(maxlen=400)
    hiding = False
    assert child.stderr is not None
    for raw in child.stderr:
        line = raw.decode("utf-8", "replace")
        tail.append(line)
        hiding = hiding or bool(_NATIVE_TRACE.match(line))
        if not hiding:
            sys.stderr.write(line)
            sys.stderr.flush()
    code = child.wait()
    if code >= 0:
        return code
    if code == -signal.SIGKILL:
        os.kill(os.getpid(), signal.SIGKILL)
    name = signal.Signals(-code).name
    said = "".join(tail)
    limit = f" = {heartbeat_timeout_s} s" if heartbeat_timeout_s is not None else ""
    if "stopped sending heartbeats" in said:
        reason = (
            f"the job lost a process: the coordination service saw no heartbeat from it "
            f"within heartbeat_timeout_s{limit}, and the JAX runtime ended this process "
            f"({name}). Relaunch the job to resume from its last checkpoint."
        )
    elif _LOST.search(said):
        reason = (
            f"the job's coordination service reported an error (a process of the job is "
            f"gone, or the coordinator, process 0, is unreachable), and the JAX runtime "
            f"ended this process ({name}). Relaunch the job to resume from its last "
            f"checkpoint."
        )
    else:
        reason = f"the JAX runtime ended this process with {name}."
    print(f"process {process_id}: stopped: {reason}", file=sys.stderr, flush=True)
    return 1


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block): exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


KILL_PHASES = ("step", "save", "idle")


def build_parser() -> argparse.ArgumentParser:
    """The worker's command line (what `launch` passes to every process)."""
    parser = _Parser(prog="sharded_training.worker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--devices-per-process", type=int, default=8)
    parser.add_argument("--coordinator", default="")
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--kill-at", default="", help="STEP:PHASE:PROCESS")
    parser.add_argument("--no-checkpoints", action="store_true")
    parser.add_argument("--init-timeout", type=int, default=60)
    parser.add_argument(
        "--compilation-cache",
        default="",
        help="Directory of JAX's persistent compilation cache (relaunches "
        "load the same executables instead of compiling them again).",
    )
    return parser


def check_args(args: argparse.Namespace) -> str:
    """Empty when the options can start a process of a job, else the reason: checked
    before the supervisor starts a child and before the job is joined."""
    if args.num_processes < 1:
        return f"`--num-processes` must be at least 1, not `{args.num_processes}`."
    if not 0 <= args.process_id < args.num_processes:
        return (
            f"`--process-id` must be from 0 to {args.num_processes - 1} for "
            f"{args.num_processes} processes, not `{args.process_id}`."
        )
    if args.devices_per_process < 1:
        return f"`--devices-per-process` must be at least 1, not `{args.devices_per_process}`."
    if args.init_timeout < 1:
        return f"`--init-timeout` must be at least 1 second, not `{args.init_timeout}`."
    if args.attempt < 0:
        return f"`--attempt` must be 0 or more, not `{args.attempt}`."
    if args.num_processes > 1:
        host, _, port = args.coordinator.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            return (
                f"the coordinator address `{args.coordinator}` is not of the form HOST:PORT "
                f"with a port from 1 to 65535."
            )
    if args.kill_at:
        parts = args.kill_at.split(":")
        if (
            len(parts) != 3
            or not parts[0].isdigit()
            or parts[1] not in KILL_PHASES
            or not parts[2].isdigit()
            or int(parts[2]) >= args.num_processes
        ):
            return (
                f"`--kill-at` must be STEP:PHASE:PROCESS with PHASE one of "
                f"{', '.join(KILL_PHASES)} and PROCESS below {args.num_processes}, "
                f"not `{args.kill_at}`."
            )
    return ""


def distributed_options(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """Keyword arguments of `jax.distributed.initialize` for this process of the job.

    The configured heartbeat timeout goes with them: JAX's own default (100 s) would
    leave the survivor of a dead peer waiting that long before it learns of it."""
    return dict(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=args.init_timeout,
        heartbeat_timeout_seconds=config.heartbeat_timeout_s,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Bad input is refused here, before a child process starts or the job is joined;
    # nothing has been initialised yet, so a plain return is a clean exit.
    from sharded_training.config import ConfigError, check_output_dir, load_config

    # (The mesh is checked against the devices after JAX starts: on GPU or TPU hosts
    # the real devices count, not `--devices-per-process`.)
    problem = check_args(args)
    try:
        config = load_config(args.config)
        check_output_dir(args.workdir, "`--workdir`")
    except ConfigError as err:
        problem = problem or str(err)
    if problem:
        print(f"process {args.process_id}: {problem}", file=sys.stderr, flush=True)
        return 2
    if args.num_processes > 1 and os.environ.get(SUPERVISED) != "1":
        heartbeat = config.heartbeat_timeout_s
        return supervise(sys.argv[1:] if argv is None else argv, args.process_id, heartbeat)

    import jax
    import numpy as np

    from sharded_training import train
    from sharded_training.checkpoint import CheckpointError
    from sharded_training.sharding import MeshError

    def fail(message: str, code: int) -> int:
        print(f"process {args.process_id}: {message}", file=sys.stderr, flush=True)
        # Skip interpreter shutdown: `jax.distributed`'s shutdown barrier would wait
        # for peers that may be gone.
        os._exit(code)

    jax.config.update("jax_num_cpu_devices", args.devices_per_process)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if args.compilation_cache:
        jax.config.update("jax_compilation_cache_dir", args.compilation_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if args.num_processes > 1:
        problem = check_coordinator(args.coordinator, args.process_id, args.init_timeout)
        if problem:
            return fail(problem, 2)
        try:
            jax.distributed.initialize(**distributed_options(args, config))
        except Exception as err:  # jaxlib raises its own error types.
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
            return fail(
                f"could not join the job at coordinator `{args.coordinator}` as process "
                f"{args.process_id} of {args.num_processes} within {args.init_timeout} s: is "
                f"the coordinator (process 0) running and the address right? ({first})",
                2,
            )
    kill = None
    if args.kill_at:
        step, phase, process = args.kill_at.split(":")
        kill = train.KillPoint(int(step), phase, int(process))
    workdir = Path(args.workdir)
    try:
        result = train.run(
            config,
            workdir,
            checkpoints=not args.no_checkpoints,
            attempt=args.attempt,
            kill=kill,
            progress=lambda line: print(
                f"[p{args.process_id} {time.perf_counter() - STARTED:6.2f}s] {line}",
                file=sys.stderr,
                flush=True,
            ),
        )
    except (CheckpointError, MeshError, ValueError) as err:
        return fail(str(err), 2)
    except Exception as err:  # A peer died or a collective failed: say so and stop.
        text = str(err).strip().splitlines()
        return fail(
            f"training stopped: a collective or a peer failed ({type(err).__name__}: "
            f"{text[0][:300] if text else ''}); when a process of the job is gone, relaunch "
            f"the job to resume from its last checkpoint.",
            1,
        )
    state = result.pop("state")
    params = {name: train.host_value(value) for name, value in state.params.items()}
    np.savez(workdir / f"final_params_p{args.process_id}.npz", **params)
    result["environment"] = environment()
    result["attempt"] = args.attempt
    path = workdir / f"final_p{args.process_id}.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.num_processes > 1:
        # Every process waits here until all are done: process 0 hosts the coordinator,
        # and a peer that still talks to it after it is gone would abort.
        jax.distributed.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
