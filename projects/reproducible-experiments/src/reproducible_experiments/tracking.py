"""MLflow tracking that keeps failures: explicit stores, leases, honest end states.

What MLflow does on its own (3.17, SQLite): an exception raised outside
`with mlflow.start_run()` and `sys.exit(1)` both end the run as FINISHED (an
`atexit` hook ends any active run that way); SIGTERM and SIGKILL leave it
RUNNING forever. `TrackedRun` fixes each case:

  normal end, `sys.exit(0)`     -> FINISHED
  exception, `sys.exit(n != 0)` -> FAILED, with `error.type`, `error.message`
                                   and `error/traceback.txt`
  SIGTERM, Ctrl-C               -> KILLED, with `error.type` = `SIGTERM` / `KeyboardInterrupt`
  SIGKILL, power loss           -> left RUNNING; the next `TrackedRun` in the
                                   experiment finds it dead and marks it KILLED

A run tells the living from the dead with a lease: tags naming its host, pid
and the pid's start time, and `lease.expires_ms`, renewed by a heartbeat
thread. On the same host a run whose process is gone (or whose pid now
belongs to another process) is dead at once; elsewhere, when its lease has
expired. Nothing here deletes a run.

The store is always named explicitly (`resolve_uri`): MLflow otherwise falls
back to `./mlruns` or `MLFLOW_TRACKING_URI`, silently.
"""

import contextlib
import fcntl
import os
import signal
import socket
import sqlite3
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag, ViewType
from mlflow.exceptions import MlflowException

DEFAULT_EXPERIMENT = "digits"
DEFAULT_STORE = Path("runs") / "mlflow.db"
LEASE_S = 30.0
METRICS_PER_CALL = 1000  # MLflow's limit for one log_batch (MAX_METRICS_PER_BATCH).
TAGS_PER_CALL = 100  # MLflow's limit for params, and for tags, in one log_batch.
LOCK_RETRY_S = 60.0  # How long a write waits out SQLite lock conflicts.
# Store calls under way in this process, and a SIGTERM that arrived during one
# (one-element lists: module state the signal handler and the calls share).
_STORE_CALLS = [0]
_PENDING_TERMINATION = [False]


class TrackingError(ValueError):
    """A tracking store or record that cannot be used; the message says why."""


class Terminated(SystemExit):
    """Raised in the main thread by the SIGTERM handler; exits with 128 + 15."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


# STORE ---------------------------------------------------------------------


def resolve_uri(uri: str | os.PathLike[str] | None) -> str:
    """An explicit tracking URI: `None` gives the SQLite file `runs/mlflow.db`
    under the current directory; a plain path gives a SQLite file there; a URI
    with a scheme (`sqlite:///`, `http://`, `postgresql://`) is kept as is.
    Raises `TrackingError` for an empty URI."""
    if uri is None:
        uri = DEFAULT_STORE
    text = os.fspath(uri)
    if not text.strip():
        raise TrackingError(
            "The tracking URI is empty; give a SQLite path, `sqlite:///...` or `http://...`."
        )
    if "://" in text:
        return text
    return f"sqlite:///{Path(text).resolve()}"


def _check_sqlite_path(database: Path, *, create: bool) -> None:
    """Refuses a SQLite store path that cannot be (or, with `create=False`, is not)
    a tracking store, before MLflow opens it: MLflow would retry a directory for
    minutes, and would add its tables to any SQLite file it is given.

    The file itself is only ever read through SQLite: opening and closing it with
    another file descriptor would drop the POSIX locks that this process's SQLite
    connections hold on it, and let other writers corrupt it."""
    if database.is_dir():
        raise TrackingError(f"The tracking store `{database}` is a directory, not a SQLite file.")
    parent = database.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise TrackingError(
            f"The tracking store `{database}` cannot be created: `{parent}` is not a directory."
        )
    if not database.exists():
        if not create:
            raise TrackingError(
                f"There is no tracking store at `{database}`; check `--tracking-uri` "
                f"(a store is created by `train` or `compare`)."
            )
        return
    if database.stat().st_size == 0:
        if not create:
            raise TrackingError(f"The tracking store `{database}` is an empty file.")
        return  # SQLite turns an empty file into a new database; nothing is lost.
    tables = _sqlite_tables(database)
    if not create and "experiments" not in tables:
        raise _not_mlflow(database)


def _sqlite_tables(database: Path) -> set[str]:
    """The table names of an existing SQLite file, read through SQLite (which also
    refuses a file that is not a SQLite database); the connection only reads."""
    try:
        with contextlib.closing(sqlite3.connect(database, timeout=LOCK_RETRY_S)) as conn:
            return {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as err:
        raise TrackingError(
            f"The tracking store `{database}` is not a usable SQLite database ({err})."
        ) from None


def _not_mlflow(database: Path) -> TrackingError:
    return TrackingError(
        f"`{database}` is a SQLite database but not an MLflow tracking store "
        f"(it has no `experiments` table)."
    )


def is_sqlite(uri: str) -> bool:
    return uri.startswith("sqlite:")


def connect(uri: str | os.PathLike[str] | None, *, create: bool = True) -> MlflowClient:
    """A client bound to `uri`, with the schema created (or migrated) now.

    Safe when several processes start together on a fresh SQLite file: building
    an MLflow client creates and migrates the schema, so for SQLite the client
    is built only while holding an exclusive lock on a file beside the database
    (`<file>.lock`); the processes take turns, and the first one creates the
    schema for all.

    With `create=False` (the commands that only read a store) a SQLite store must
    already exist and hold MLflow's tables. Raises `TrackingError` for a store
    that cannot be used: a directory, a path under a file, a file that is not a
    SQLite database, or one MLflow refuses.
    """
    resolved = resolve_uri(uri)
    try:
        if is_sqlite(resolved):
            database = Path(resolved.removeprefix("sqlite:///"))
            _check_sqlite_path(database, create=create)
            database.parent.mkdir(parents=True, exist_ok=True)
            with open(f"{database}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if database.exists() and database.stat().st_size:
                    # Inside the lock no other process is creating the schema, so a
                    # database with tables but not MLflow's belongs to something else.
                    tables = _sqlite_tables(database)
                    if tables and "experiments" not in tables:
                        raise _not_mlflow(database)
                client = Client(tracking_uri=resolved)
                client.search_experiments(max_results=1)  # Creates the schema on first use.
                # WAL: readers and the writer no longer block each other (a setting
                # stored in the file, so every process that opens it gets it).
                with sqlite3.connect(database) as conn:
                    conn.execute("PRAGMA journal_mode=WAL")
        else:
            client = Client(tracking_uri=resolved)
            client.search_experiments(max_results=1)
    except MlflowException as err:
        raise TrackingError(
            f"Cannot open the tracking store `{resolved}`: {_first_line(err.message)}"
        ) from None
    except OSError as err:
        raise TrackingError(f"Cannot open the tracking store `{resolved}`: {err}") from None
    return client


def _first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0].strip() if lines else "no details"


def _locked(err: MlflowException) -> bool:
    return "database is locked" in str(err.message) or "database is busy" in str(err.message)


def _retrying(name: str) -> Any:
    """`MlflowClient.<name>`, retried while SQLite answers "database is locked"."""

    def method(self: "Client", *args: Any, **kwargs: Any) -> Any:
        _STORE_CALLS[0] += 1
        try:
            delay, deadline = 0.02, time.monotonic() + LOCK_RETRY_S
            while True:
                try:
                    return getattr(MlflowClient, name)(self, *args, **kwargs)
                except MlflowException as err:
                    if not _locked(err) or time.monotonic() > deadline:
                        raise
                    time.sleep(delay)
                    delay = min(2 * delay, 0.5)
        finally:
            _STORE_CALLS[0] -= 1
            if _STORE_CALLS[0] == 0 and _PENDING_TERMINATION[0]:
                _PENDING_TERMINATION[0] = False
                if threading.current_thread() is threading.main_thread():
                    raise Terminated()
                signal.raise_signal(signal.SIGTERM)  # The main thread's handler raises it.

    method.__name__ = name
    method.__doc__ = f"`MlflowClient.{name}`, retried while a SQLite store is locked."
    return method


class Client(MlflowClient):
    """An `MlflowClient` whose writes survive SQLite's lock conflicts.

    MLflow's SQLite sessions read, then write. When processes write at once,
    SQLite resolves a conflict between two such transactions by answering one
    of them "database is locked" immediately (a deadlock, which the busy
    timeout cannot wait out; in WAL mode, a stale snapshot). The transaction
    was rolled back, so trying again is safe; these writes are retried for up
    to `LOCK_RETRY_S` seconds. Other errors are raised at once.
    """

    create_experiment = _retrying("create_experiment")
    create_run = _retrying("create_run")
    log_batch = _retrying("log_batch")
    log_metric = _retrying("log_metric")
    set_tag = _retrying("set_tag")
    set_terminated = _retrying("set_terminated")
    delete_run = _retrying("delete_run")


def experiment_id(client: MlflowClient, name: str = DEFAULT_EXPERIMENT) -> str:
    """The id of experiment `name`, created if missing (safe when processes race).

    With a SQLite store, artifacts go to `artifacts/` beside the database file;
    with a tracking server, the server decides.
    """
    check_experiment_name(name)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    uri = client.tracking_uri
    if is_sqlite(uri):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "artifacts" / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:
        found = client.get_experiment_by_name(name)  # Another process created it first.
        if found is None:
            raise
        return found.experiment_id


def check_experiment_name(name: str) -> None:
    """Refuses a blank experiment name (MLflow would refuse `""` and accept `"  "`)."""
    if not name.strip():
        raise TrackingError(f"The experiment name `{name}` is blank; give `--experiment NAME`.")


def existing_experiment_id(client: MlflowClient, name: str) -> str:
    """The id of experiment `name`, which must exist: for the commands that only read."""
    check_experiment_name(name)
    found = client.get_experiment_by_name(name)
    if found is None:
        known = ", ".join(f"`{e.name}`" for e in client.search_experiments()) or "none"
        raise TrackingError(
            f"There is no experiment `{name}` in `{client.tracking_uri}`; experiments: {known}."
        )
    return found.experiment_id


# LEASES --------------------------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


def process_start(pid: int) -> str:
    """The start time of `pid` in clock ticks since boot (Linux `/proc`), or ``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def liveness(tags: dict[str, str], now_ms: int | None = None) -> str:
    """`alive`, `no lease`, or `dead: <reason>` for a RUNNING run's tags.

    On this host the holder's pid and its start time decide; elsewhere, the
    lease's expiry. A run without holder tags (started by other tools) has
    `no lease`: nobody can tell whether it is alive [claim:liveness-no-lease].

    Cases (the strings are exact):
      same host, `lease.pid` given -> `process_start(pid)` equal to `lease.pid_start`:
        "alive", even if the lease expired long ago; another or unknown start, or
        a pid `/proc` does not list: "dead: process gone" [claim:liveness-pid-and-start].
      same host, no `/proc` at all -> `os.kill(pid, 0)`: ProcessLookupError is
        "dead: process gone"; PermissionError or success falls back to the recorded
        start time, i.e. "alive" [claim:liveness-without-proc].
      another host (or no `lease.pid`) -> `lease.expires_ms` alone: `now_ms` after it
        "dead: lease expired", at or before it "alive"; no expiry tag "no lease"
        [claim:liveness-by-expiry].
      `now_ms` given -> that clock decides, never the wall clock [claim:liveness-given-clock].
    """
    if "lease.pid" not in tags and "lease.expires_ms" not in tags:
        return "no lease"
    now_ms = _now_ms() if now_ms is None else now_ms
    # --- exercise stage 2: Same host: the pid and its start time decide; else expiry. ---
    if tags.get("lease.host") == socket.gethostname() and "lease.pid" in tags:
        pid = int(tags["lease.pid"])
        started = process_start(pid)
        if not started and not Path("/proc").is_dir():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return "dead: process gone"
            except PermissionError:
                pass
            started = tags.get("lease.pid_start", "")
        if started != tags.get("lease.pid_start"):
            return "dead: process gone"
        return "alive"
    if "lease.expires_ms" not in tags:
        return "no lease"
    if now_ms > int(tags["lease.expires_ms"]):
        return "dead: lease expired"
    return "alive"
    # --- end exercise ---


def reconcile(client: MlflowClient, exp_id: str, by: str = "") -> list[str]:
    """Marks every RUNNING run of `exp_id` whose holder is dead as KILLED, with
    `reconciled.*` tags saying why and by whom; returns their ids. A run with no
    lease (started by other tools) is left alone: we cannot tell
    [claim:reconcile-kills-only-dead-runs]."""
    killed = []
    for run in iter_runs(client, exp_id, filter_string="attributes.status = 'RUNNING'"):
        if run.info.status != "RUNNING":
            continue
        state = liveness(run.data.tags)
        if not state.startswith("dead"):
            continue
        # Read the status again AFTER finding the holder dead: the search result may
        # predate a normal end (the process set FINISHED, then exited). A dead
        # process cannot change its run any more, so what we read now is final.
        if client.get_run(run.info.run_id).info.status != "RUNNING":
            continue
        last = int(run.data.tags.get("lease.heartbeat_ms", run.info.start_time))
        client.log_batch(
            run.info.run_id,
            tags=[
                RunTag("reconciled.reason", state.removeprefix("dead: ")),
                RunTag("reconciled.at_ms", str(_now_ms())),
                RunTag("reconciled.by", by or f"pid {os.getpid()}"),
            ],
        )
        client.set_terminated(run.info.run_id, status="KILLED", end_time=last)
        killed.append(run.info.run_id)
    return killed


def iter_runs(
    client: MlflowClient, exp_id: str, filter_string: str = "", page_size: int = 1000
) -> Iterator[Any]:
    """Every run of `exp_id`, deleted ones included, page by page (never just page one)
    [claim:iter-runs-every-page]."""
    token = None
    while True:
        page = client.search_runs(
            [exp_id],
            filter_string=filter_string,
            run_view_type=ViewType.ALL,
            max_results=page_size,
            order_by=["attributes.start_time ASC", "attributes.run_id ASC"],
            page_token=token,
        )
        yield from page
        token = page.token
        if not token:
            return


# METRICS -------------------------------------------------------------------


class MetricBuffer:
    """Collects metric values and writes them with `log_batch` (up to 1000 per
    call) instead of one call per value.

    Every `flush_every` values go out through MLflow's asynchronous logging
    (`log_batch(..., synchronous=False)`: a background thread writes while
    training goes on); `flush()` sends the rest and waits until the store holds
    every value. A run's end always flushes, so failed runs keep their curves.
    """

    def __init__(self, client: MlflowClient, run_id: str, flush_every: int = 300):
        self.client, self.run_id = client, run_id
        self.flush_every = min(flush_every, METRICS_PER_CALL)
        self.pending: list[Metric] = []
        self.operations: list[Any] = []
        self.logged = 0

    def log(self, values: dict[str, float], step: int) -> None:
        stamp = _now_ms()
        self.pending.extend(Metric(k, float(v), stamp, step) for k, v in values.items())
        if len(self.pending) >= self.flush_every:
            self._send(synchronous=False)

    def _send(self, synchronous: bool) -> None:
        while self.pending:
            chunk = self.pending[:METRICS_PER_CALL]
            del self.pending[: len(chunk)]
            operation = self.client.log_batch(self.run_id, metrics=chunk, synchronous=synchronous)
            if operation is not None:
                self.operations.append((operation, chunk))
            self.logged += len(chunk)

    def flush(self) -> None:
        """Writes everything still pending and waits for the asynchronous writes."""
        self._send(synchronous=True)
        operations, self.operations = self.operations, []
        for operation, chunk in operations:
            try:
                operation.wait()  # Raises if the asynchronous write failed.
            except MlflowException as err:
                if not _locked(err):
                    raise
                # That write was rolled back: send it again, synchronously, with retries.
                self.client.log_batch(self.run_id, metrics=chunk)


# RUNS ----------------------------------------------------------------------


@dataclass
class TrackedRun:
    """A run whose end state tells the truth. Use as a context manager:

        with TrackedRun(client, exp_id, "train", tags=...) as run:
            run.metrics.log({"loss": 0.1}, step=1)

    Entering reconciles dead RUNNING runs of the experiment, creates this run
    with its lease, starts the heartbeat and (in the main thread) a SIGTERM
    handler; leaving flushes metrics and sets FINISHED, FAILED or KILLED.
    """

    client: MlflowClient
    experiment_id: str
    run_name: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    parent_run_id: str | None = None
    lease_s: float = LEASE_S
    run_id: str = ""
    status: str = ""
    reconciled: list[str] = field(default_factory=list)
    outcome: str = ""  # What the store holds about the run's end, in one sentence.

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._old_handler: Any = None
        self.metrics: MetricBuffer

    def _lease_tags(self) -> list[RunTag]:
        now = _now_ms()
        return [
            RunTag("lease.heartbeat_ms", str(now)),
            RunTag("lease.expires_ms", str(now + int(self.lease_s * 1000))),
        ]

    def __enter__(self) -> "TrackedRun":
        self.reconciled = reconcile(self.client, self.experiment_id, by=f"pid {os.getpid()}")
        pid = os.getpid()
        # The whole lease (holder and expiry) goes into the run's first row, so the
        # run can be reconciled from the moment it exists.
        tags = {
            **self.tags,
            "lease.host": socket.gethostname(),
            "lease.pid": str(pid),
            "lease.pid_start": process_start(pid),
            **{tag.key: tag.value for tag in self._lease_tags()},
        }
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=tags)
        self.run_id = run.info.run_id
        self.metrics = MetricBuffer(self.client, self.run_id)
        params = [Param(k, str(v)) for k, v in self.params.items()]
        for start in range(0, len(params), TAGS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[start : start + TAGS_PER_CALL])
        self._heartbeat = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._heartbeat.start()
        if threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGTERM, _raise_terminated)
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                self.client.log_batch(self.run_id, tags=self._lease_tags())
            except Exception:  # noqa: BLE001 - a missed beat only shortens the lease.
                pass

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._old_handler is not None:
            signal.signal(signal.SIGTERM, self._old_handler)
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        status, tags = end_state(exc_type, exc)
        # The end state is written first; what fails after it (the traceback
        # artifact, say, in an unwritable artifact folder) is reported, and the
        # run still ends with the status it earned.
        problems: list[str] = []
        try:
            self.metrics.flush()
        except Exception as err:  # noqa: BLE001 - reported below, never hides the end state.
            problems.append(f"its last metrics were not written ({type(err).__name__}: {err})")
        try:
            if tags:
                self.client.log_batch(self.run_id, tags=tags)
        except Exception as err:  # noqa: BLE001
            problems.append(f"its error tags were not written ({type(err).__name__}: {err})")
        try:
            self.client.set_terminated(self.run_id, status=status)
            self.status = status
        except Exception as err:  # noqa: BLE001
            problems.append(f"its end state was not written ({type(err).__name__}: {err})")
        if status == "FAILED" and self.status:
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            try:
                self.client.log_text(self.run_id, text, "error/traceback.txt")
            except Exception as err:  # noqa: BLE001
                problems.append(
                    f"its traceback artifact was not written ({type(err).__name__}: {err})"
                )
                try:
                    self.client.set_tag(self.run_id, "error.traceback", "not written")
                except Exception:  # noqa: BLE001 - the problem is already in the message.
                    pass
        recorded = f"recorded as {self.status}" if self.status else "left RUNNING in the store"
        self.outcome = f"tracked run `{self.run_id}` {recorded}" + (
            "; " + "; ".join(problems) if problems else ""
        )
        if exc is not None and not (status == "FINISHED" and not problems):
            exc.add_note(self.outcome)
        elif exc is None and problems:
            raise TrackingError(self.outcome)
        return False  # Never swallow: the caller still sees the exception.


def end_state(exc_type: type[BaseException] | None, exc: BaseException | None) -> tuple[str, list]:
    """The status and `error.*` tags a run earns by how its body ended: normally or
    `sys.exit(0)` FINISHED; SIGTERM (`Terminated`) and Ctrl-C KILLED; any other
    exception, `sys.exit(n != 0)` included, FAILED with its type and message
    [claim:end-state-finished-on-clean-exit].

    Cases (tags are `RunTag`s):
      `Terminated` -> KILLED, `error.type` "SIGTERM" [claim:end-state-sigterm-killed].
      `KeyboardInterrupt` -> KILLED, `error.type` "KeyboardInterrupt"
        [claim:end-state-ctrl-c-killed].
      any other, `SystemExit(1)` included -> FAILED, `error.type` the class name
        [claim:end-state-failed-with-type] and `error.message` the first 5,000
        characters of `str(exc)`, or of `repr(exc)` when `str` is empty; those two
        tags exactly [claim:end-state-message-cut-at-5000].
    """
    if exc_type is None or (issubclass(exc_type, SystemExit) and exc.code in (0, None)):
        return "FINISHED", []
    # --- exercise stage 2: SIGTERM, Ctrl-C: KILLED; any other exception: FAILED, tagged. ---
    if issubclass(exc_type, Terminated):
        return "KILLED", [RunTag("error.type", "SIGTERM")]
    if issubclass(exc_type, KeyboardInterrupt):
        return "KILLED", [RunTag("error.type", "KeyboardInterrupt")]
    return "FAILED", [
        RunTag("error.type", exc_type.__name__),
        RunTag("error.message", str(exc)[:5000] or repr(exc)[:5000]),
    ]
    # --- end exercise ---


def _raise_terminated(signum: int, frame: Any) -> None:
    del signum, frame
    if _STORE_CALLS[0]:
        # Never interrupt a store write half-way: its open SQLite transaction would
        # hold the lock against the end-state write. Raise once the call returns.
        _PENDING_TERMINATION[0] = True
        return
    raise Terminated()


def terminal(status: str) -> bool:
    return RunStatus.is_terminated(RunStatus.from_string(status))
