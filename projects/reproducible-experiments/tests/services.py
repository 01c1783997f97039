"""Throwaway services for the tests: a PostgreSQL cluster and an `mlflow server`.

`postgres_cluster()` runs `initdb` into a temporary directory, starts the
cluster with `pg_ctl` on a free 127.0.0.1 port and creates a database; the
context exit stops it and deletes the directory. `initdb` refuses to run as
root, so when the tests run as root the PostgreSQL binaries run as the
`postgres` system user (`runuser -u postgres --`), which owns the directory.

`mlflow_server(backend_uri)` starts `mlflow server` on a free 127.0.0.1 port
backed by that database, with artifacts proxied into a temporary directory,
waits until `/health` answers, and stops it (the whole process group) at exit.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

PG_VERSIONS = ("17", "16", "15", "14", "13")


def pg_bin_dir() -> Path | None:
    """The directory holding `initdb` and `pg_ctl`: Debian's versioned
    `/usr/lib/postgresql/<v>/bin`, else wherever `initdb` is on PATH."""
    for version in PG_VERSIONS:
        candidate = Path(f"/usr/lib/postgresql/{version}/bin")
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser") is None:
        raise RuntimeError("Running as root, but `runuser` is missing: cannot drop to `postgres`.")
    return ["runuser", "-u", "postgres", "--", *cmd]


@contextlib.contextmanager
def postgres_cluster(bin_dir: Path, dbname: str = "mlflow") -> Iterator[str]:
    """Yields a `postgresql://` URI of a fresh database on 127.0.0.1."""
    root = Path(tempfile.mkdtemp(prefix="re-pg-"))
    datadir, logfile = root / "data", root / "server.log"
    if os.geteuid() == 0:
        import pwd

        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
    port = free_port()
    started = False
    try:
        subprocess.run(
            _as_postgres(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(datadir),
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=600,
        )
        # Listen on 127.0.0.1 only; the Unix socket goes into our own directory.
        options = f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off"
        subprocess.run(
            _as_postgres(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(datadir),
                    "-l",
                    str(logfile),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=600,
        )
        started = True
        subprocess.run(
            _as_postgres(
                [
                    str(bin_dir / "createdb"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-U",
                    "postgres",
                    dbname,
                ]
            ),
            check=True,
            capture_output=True,
            timeout=600,
        )
        # SQLAlchemy 2.1 defaults `postgresql://` to psycopg 3; name the psycopg2 driver.
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{dbname}"
    except subprocess.CalledProcessError as err:
        log = logfile.read_text() if logfile.exists() else ""
        raise RuntimeError(
            f"PostgreSQL set-up failed: `{' '.join(err.cmd)}` exited {err.returncode}:\n"
            f"{err.stderr.decode(errors='replace')}\n{log}"
        ) from None
    finally:
        if started:
            subprocess.run(
                _as_postgres(
                    [str(bin_dir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "-w", "stop"]
                ),
                capture_output=True,
                timeout=600,
                check=False,
            )
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def mlflow_server(backend_uri: str, timeout_s: float = 900.0) -> Iterator[str]:
    """Yields the `http://127.0.0.1:<port>` URI of a running `mlflow server`."""
    port = free_port()
    artifacts = Path(tempfile.mkdtemp(prefix="re-mlflow-artifacts-"))
    log = tempfile.TemporaryFile()
    mlflow_cli = Path(sys.executable).parent / "mlflow"
    cmd = [
        str(mlflow_cli),
        "server",
        "--backend-store-uri",
        backend_uri,
        "--artifacts-destination",
        str(artifacts),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(
                    f"`mlflow server` exited {proc.returncode}:\n{log.read().decode()[-4000:]}"
                )
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"`mlflow server` did not answer within {timeout_s:.0f} s.")
            time.sleep(0.3)
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=2)  # A throwaway server: a short grace, then SIGKILL.
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()
        shutil.rmtree(artifacts, ignore_errors=True)
