"""Serialized and durable changes to the release state.

The lock: every command that reads the state and then changes it (and every
procedure of `release`, and `ledger.append`) holds an exclusive advisory lock,
`fcntl.flock` on the file `lock` in the state directory, from its first read
to its last write. Without it, two commands that read the same log and each
write "the log plus my entry" lose one entry, while both report success.
Commands hold it only for a commit: the reads that decide the change, the
checks that must hold when it is written, the write and its fsync. Work that
takes seconds (training, evaluating, loading a candidate, signing) runs before
it, and what that work assumed is checked again under the lock (see
`release`). The kernel drops the lock when the process that holds it dies,
SIGKILL included, so a killed command never leaves the state locked. Within a
process the lock is reentrant (a command holds it and calls procedures that
take it again), and its threads take turns; a forked child does not inherit
it as held.

With `ENGINEERING_RELEASE_LOCK_LOG` naming a file, each outermost hold appends
one JSON line to it: the process, how long it waited for the lock and how long
it held it, in seconds (`tests/lock_waits.py` runs 8 clients and sums them up).

Durability: a change is reported only after its bytes and its directory
entry are on disk. `write_atomic` writes a scratch file in the same
directory, fsyncs it, renames it over the target (the commit point: a reader
sees the old bytes or the new ones) and fsyncs the directory.
"""

import fcntl
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "lock"
LOCK_LOG_ENV = "ENGINEERING_RELEASE_LOCK_LOG"


class _Held:
    def __init__(self) -> None:
        self.turn = threading.RLock()  # Threads of one process take turns here.
        self.fd: int | None = None
        self.depth = 0


_guard = threading.Lock()
_held: dict[str, _Held] = {}


def _forget_in_child() -> None:
    # A forked child starts with no lock held: it closes its copies of the parent's
    # lock descriptors (the parent's lock stays: its own descriptor still holds it).
    global _guard
    for held in _held.values():
        if held.fd is not None:
            os.close(held.fd)
    _held.clear()
    _guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


@contextmanager
def locked(path: str | Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Holds the exclusive lock on the file `path` (created if missing) for the
    `with` block; blocks while another process holds it, calling `on_wait` once
    first. Reentrant within a thread."""
    key = os.path.abspath(path)
    with _guard:
        held = _held.setdefault(key, _Held())
    asked = time.monotonic()
    with held.turn:
        if held.depth == 0:
            fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if on_wait is not None:
                        on_wait()
                    fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            held.fd = fd
        got = time.monotonic()
        held.depth += 1
        try:
            yield
        finally:
            held.depth -= 1
            if held.depth == 0:
                fd, held.fd = held.fd, None
                os.close(fd)  # Closing the only descriptor releases the lock.
                _log_hold(got - asked, time.monotonic() - got)


def _log_hold(waited_s: float, held_s: float) -> None:
    """One line in the lock log, when `ENGINEERING_RELEASE_LOCK_LOG` names one; one
    `write` of an `O_APPEND` file, so lines of several processes never interleave."""
    path = os.environ.get(LOCK_LOG_ENV)
    if not path:
        return
    line = {"pid": os.getpid(), "waited_s": round(waited_s, 6), "held_s": round(held_s, 6)}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replaces the file `path` by `data` in one rename, durably (see the module)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
