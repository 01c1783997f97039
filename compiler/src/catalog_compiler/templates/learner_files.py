"""The learner's files, taken as untrusted: read only when regular, written only atomically.

`progress.py`, `hints.py` and `dossier.py` read every stamp, evidence file,
manifest and source through :func:`read_bytes`: a symbolic link (unless the
caller follows it), a folder, a FIFO or another special file, a file over
:data:`MAX_BYTES`, or one that cannot be read is :class:`Unreadable`, whose
message is one line naming the file (relative to the project) and what to do.
:func:`write_atomic` writes through a new file renamed over the old one, so a
crash leaves the old file and a link is replaced, never written through;
:func:`check_evidence` refuses to let a stage's tests run while its evidence
file is a link, a special file or not writable, since the tests write it in place.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Stamps and evidence hold records, not arrays: the largest reference evidence
# file is 154 kB, so a file 50 times that is damage, not data.
MAX_BYTES = 8 * 2**20
AFRESH = "move it away or delete it and run the command again (it is written afresh)"
RESTORE = "restore it from the starter (the project's zip)"


class Unreadable(OSError):
    """A file the learner's tools will not read or write; its message is one line that
    names the file and says what to do."""


def shown(path: Path, folder: Path = HERE) -> str:
    """``path`` as the learner typed it: relative to the project folder when inside."""
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        return str(path)


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in words (None for a regular file)."""
    kinds = [
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ]
    if stat.S_ISREG(mode):
        return None
    return next((words for test, words in kinds if test(mode)), "a device or special file")


def regular_file(
    path: Path, remedy: str = AFRESH, follow: bool = False, limit: int | None = MAX_BYTES
) -> os.stat_result | None:
    """``path``'s status when it is a regular file of at most ``limit`` bytes, None when
    there is no such file; else :class:`Unreadable`. A symbolic link is refused
    unless ``follow`` (then its target must be a regular file)."""
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        problem = f"cannot be examined ({error.strerror})"
        raise Unreadable(f"{shown(path)} {problem}: {remedy}.") from None
    kind = _kind(info.st_mode)
    if kind:
        raise Unreadable(f"{shown(path)} is {kind}, not a regular file: {remedy}.")
    if limit is not None and info.st_size > limit:
        raise Unreadable(
            f"{shown(path)} holds {info.st_size / 2**20:.0f} MB, more than the "
            f"{limit / 2**20:.0f} MB such a file may hold: {remedy}."
        )
    return info


def read_bytes(path: Path, remedy: str = AFRESH, follow: bool = False) -> bytes | None:
    """The bytes of ``path``, None when there is none; :class:`Unreadable` when it is
    not a regular file of at most :data:`MAX_BYTES` (:func:`regular_file`) or cannot
    be read. Never opens a FIFO or device for reading: it is examined first, then
    opened without blocking and examined again, in case it was swapped meanwhile."""
    if regular_file(path, remedy, follow) is None:
        return None
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        raise Unreadable(f"{shown(path)} cannot be read ({error.strerror}): {remedy}.") from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Unreadable(f"{shown(path)} changed while being read: {remedy}.")
        data = file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise Unreadable(f"{shown(path)} grew past {MAX_BYTES >> 20} MB while read: {remedy}.")
    return data


def read_text(path: Path, remedy: str = RESTORE, follow: bool = True) -> str | None:
    """The UTF-8 text of ``path`` (:func:`read_bytes`): sources, tests, the manifest."""
    data = read_bytes(path, remedy, follow)
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable(f"{shown(path)} is not UTF-8 text: {remedy}.") from None


def read_json(path: Path, remedy: str = AFRESH) -> object:
    """The JSON value in ``path`` (None when there is no file). :class:`Unreadable` as
    :func:`read_bytes` (links refused); ``ValueError`` when it is not JSON."""
    data = read_bytes(path, remedy)
    if data is None:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:  # A deeply nested array is not stamps either.
        raise ValueError("nested too deeply") from None


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write ``content`` to ``path`` through a new file beside it, renamed over it: a
    crash mid-write leaves the old file, never half of one, and a symbolic link at
    ``path`` is replaced, never written through (its target stays as it was).
    :class:`Unreadable` when ``path`` is a folder or its folder cannot be written."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        if not path.is_symlink() and path.is_dir():
            raise IsADirectoryError(21, "Is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise Unreadable(
            f"{shown(path)} cannot be written ({error.strerror or error}): {AFRESH}."
        ) from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # As a plain open() would have made it.
        os.replace(tmp, path)  # A crash mid-write leaves the old file, never half a file.
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise Unreadable(
                f"{shown(path)} cannot be written ({error.strerror or error}): {AFRESH}."
            ) from None
        raise


def check_evidence(folder: Path, stage_id: str) -> None:
    """Before a stage's tests run: its evidence files (`evidence/stage_<id>*`) must be
    regular files the learner can write, and `evidence/` a folder, for the tests write
    them in place; a link there would be written through. :class:`Unreadable` if not."""
    evidence = folder / "evidence"
    try:
        info = os.lstat(evidence)
    except FileNotFoundError:
        return
    except OSError as error:
        raise Unreadable(f"{shown(evidence)} cannot be examined ({error.strerror}).") from None
    if not stat.S_ISDIR(info.st_mode):
        kind = _kind(info.st_mode) or "a file"
        raise Unreadable(f"{shown(evidence)} is {kind}, not a folder: {AFRESH}.")
    named = evidence / f"stage_{stage_id}.json"
    for path in sorted({named, *evidence.glob(f"stage_{stage_id}[._]*")}):
        limit = MAX_BYTES if path == named else None
        if regular_file(path, limit=limit) and not os.access(path, os.R_OK | os.W_OK):
            raise Unreadable(
                f"{shown(path)} cannot be read and written (permission denied): give "
                f"yourself access (`chmod u+rw {shown(path)}`) or {AFRESH}."
            )
