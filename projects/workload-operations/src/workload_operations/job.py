"""The supervised training job: `python -m workload_operations.job --config C --workdir W`.

Order matters: the stack-dump handler and the heartbeat reporter start before
JAX is imported, so start-up is observed too. Then the job trains
(`train.train_and_evaluate`), stops reporting, writes a final heartbeat and a
`finished` line with its own counts, and, with `--hold`, keeps its metrics
endpoint up until it receives SIGTERM (after the supervisor's final scrape).

Output: JSON lines on standard output (events and heartbeats), tracebacks and
stack dumps on standard error. Exit status: 0 done, 1 the training failed
(traceback on standard error), 2 bad input (one message).
"""

import argparse
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from workload_operations import faults
from workload_operations.config import ConfigError, load
from workload_operations.observe import Observer

SIDECAR_CODE = "import time\nwhile True:\n    time.sleep(1)\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workload_operations.job")
    parser.add_argument("--config", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--fault", default="")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--compilation-cache", default="")
    args = parser.parse_args(argv)

    # A supervisor sends SIGUSR1 to a process it is about to kill: every thread's stack.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.enable()
    try:
        config = load(args.config)
        fault = faults.parse(args.fault) if args.fault else None
        if fault is not None:
            faults.check(fault, config)
    except (ConfigError, faults.FaultError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    observer = Observer(config.heartbeat_interval_s)
    observer.start()
    sidecar = None
    if config.sidecar:
        sidecar = subprocess.Popen([sys.executable, "-c", SIDECAR_CODE])
    observer.emit(
        {
            "event": "start",
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "sidecar_pid": None if sidecar is None else sidecar.pid,
            "attempt": args.attempt,
            "fault": args.fault or None,
            "t": time.monotonic(),
        }
    )

    import jax

    if args.compilation_cache:
        # JAX's persistent cache: a job after the first loads its executables.
        jax.config.update("jax_compilation_cache_dir", args.compilation_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

    from workload_operations import train

    expected_errors: tuple = ()
    if config.checkpoint_every:  # Orbax is imported only by jobs that checkpoint.
        from workload_operations.checkpoint import CheckpointError

        expected_errors = (CheckpointError,)

    injector = faults.Injector(fault, config, observer, observer.emit)
    try:
        result = train.train_and_evaluate(
            config,
            Path(args.workdir),
            observer=observer,
            injector=injector,
            resume=args.resume,
            attempt=args.attempt,
        )
    except expected_errors as err:
        print(f"error: {err}", file=sys.stderr)
        observer.close()
        return 2
    observer.stop_reporting()
    observer.emit(observer.heartbeat())
    observer.emit(
        {
            "event": "finished",
            "t": time.monotonic(),
            "steps": observer.step,
            "steps_done": observer.step - result["start_step"],
            "start_step": result["start_step"],
            "examples": observer.examples,
            "heartbeats": observer.seq,
            "final_heldout": result["final_heldout"],
            "set_aside": result["set_aside"],
        }
    )
    if args.hold:
        wait_for_release()
    if sidecar is not None:
        sidecar.kill()
        sidecar.wait()
    observer.close()
    return 0


def wait_for_release() -> None:
    """Holds (metrics still served) until SIGTERM: the supervisor's final scrape is done."""
    released = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: released.set())
    while not released.wait(0.05):
        pass


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # Exit at once: a slow interpreter teardown would look like silence, not an exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
