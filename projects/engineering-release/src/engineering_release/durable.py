"""Serialized and durable changes to the release state.

The lock: every command that reads the state and then changes it (and every
procedure of `release`, and `ledger.append`) holds an exclusive advisory lock,
`fcntl.flock` on the file `lock` in the state directory, from its first read
to its last write. Without it, two commands that read the same log and each
write "the log plus my entry" lose one entry, while both report success.
The kernel drops the lock when the process that holds it dies, SIGKILL
included, so a killed command never leaves the state locked. Within a
process the lock is reentrant (a command holds it and calls procedures that
take it again), and its threads take turns; a forked child does not inherit
it as held.

Durability: a change is reported only after its bytes and its directory
entry are on disk. `write_atomic` writes a scratch file in the same
directory, fsyncs it, renames it over the target (the commit point: a reader
sees the old bytes or the new ones) and fsyncs the directory.
"""

import fcntl
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "lock"


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
        held.depth += 1
        try:
            yield
        finally:
            held.depth -= 1
            if held.depth == 0:
                fd, held.fd = held.fd, None
                os.close(fd)  # Closing the only descriptor releases the lock.


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
