"""A fork server for jobs: `python -m workload_operations.zygote`.

Importing JAX, optax and Grain costs a job about two CPU seconds, more than
the tiny job itself. The zygote imports them once, without starting a JAX
backend (forking a process whose backend runs is unsafe), and forks a job per
request. It forks twice: the intermediate process exits at once, so the job
is orphaned and adopted by the nearest child subreaper above it, the
supervisor's process (`supervisor.become_subreaper`). The supervisor is then
the job's parent: it reads the job's real exit status with `waitpid`, exactly
as for a job it had started itself.

Protocol: one JSON request per line on standard input,
`{"argv": [...], "stdout": PATH, "stderr": PATH}`; one reply per line,
`{"pid": PID}`. The job runs in a new session (its own process group) with its
standard input on /dev/null. End of input ends the zygote.
"""

import json
import os
import sys
import traceback


def preload() -> None:
    import grain  # noqa: F401
    import jax  # noqa: F401
    import numpy  # noqa: F401
    import optax  # noqa: F401

    from workload_operations import data, job, model, observe, train  # noqa: F401


def spawn(request: dict) -> int:
    """Forks the job described by `request` (double fork); returns its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            pid = os.fork()
            if pid == 0:
                os.close(write_end)
                _run_job(request)  # Never returns.
            os.write(write_end, str(pid).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 64):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(middle, 0)
    return int(b"".join(chunks))


def _run_job(request: dict) -> None:
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        from workload_operations import job

        code = job.main(request["argv"])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = {"pid": spawn(json.loads(line))}
        except (OSError, ValueError, KeyError) as err:
            reply = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
