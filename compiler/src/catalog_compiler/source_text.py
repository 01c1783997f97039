"""Read a source file as text, refusing what is not a small regular UTF-8 file.

Contract: :func:`read_text` never raises on bad input. It returns the text,
or ``None`` with one diagnostic: FIL004 when the path is a folder, a symlink
loop, a device or unreadable; LIM004 when the file is larger than
:data:`~catalog_compiler.limits.MAX_FILE_BYTES` (decided from its size, before
reading it); FIL005 when it is not UTF-8 or holds a control character, placed
at the line and column of the offending character.

Lines and columns are counted the way editors show them: a line ends at
``\\n`` (so ``\\r\\n`` too), and U+2028, U+2029 and U+0085 are characters
within a line. :class:`Lines` turns a character offset into that position.
"""

from __future__ import annotations

import bisect
import errno
import os
import re
import stat
from pathlib import Path

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic, Position
from catalog_compiler.limits import MAX_FILE_BYTES

# Control characters no catalog text needs (TOML forbids them in strings and
# comments; YAML applies its own, wider rule, see yaml_source).
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class Lines:
    """Offsets of the line starts of ``text``, to place a character offset."""

    __slots__ = ("starts", "bom")

    def __init__(self, text: str) -> None:
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.bom = text.startswith("\ufeff")

    def position(self, index: int) -> Position:
        """Return the 1-based line and column of character ``index``."""
        line = bisect.bisect_right(self.starts, index)
        column = index - self.starts[line - 1] + 1
        if self.bom and line == 1:
            column = max(1, column - 1)  # Editors do not show the byte order mark.
        return Position(line, column)


def byte_position(data: bytes, offset: int) -> Position:
    """Return the line and column of byte ``offset`` of UTF-8 ``data``.

    The bytes before ``offset`` must decode (a decoding error names the first
    byte that does not).
    """
    line_start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode("utf-8", errors="replace")) + 1
    if line_start == 0 and data.startswith(b"\xef\xbb\xbf"):
        column = max(1, column - 1)
    return Position(data.count(b"\n", 0, offset) + 1, column)


def _unreadable(path: str, reason: str) -> Diagnostic:
    return rules.UNREADABLE_FILE.at(path, START, "", f"`{path}` {reason}.")


def read_text(
    file: Path, path: str, forbidden: re.Pattern[str] = CONTROL
) -> tuple[str | None, Diagnostic | None]:
    """Read ``file`` (shown as repo-relative ``path``); see the module docstring.

    ``forbidden`` matches the characters that make the text unacceptable.
    """
    try:
        info = file.stat()
        if stat.S_ISDIR(info.st_mode):
            return None, _unreadable(path, "is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            return None, _unreadable(path, "is not a regular file (a device, socket or pipe)")
        if info.st_size > MAX_FILE_BYTES:
            size = info.st_size / 2**20
            message = (
                f"`{path}` is {size:.1f} MiB, more than the {MAX_FILE_BYTES // 2**20} MiB "
                "a source file may have; it was not read."
            )
            return None, rules.FILE_TOO_LARGE.at(path, START, "", message)
        with open(file, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return None, _unreadable(path, "is a symbolic link that leads back to itself (a loop)")
        if error.errno == errno.ENOENT and os.path.islink(file):
            return None, _unreadable(path, "is a symbolic link to a file that does not exist")
        reason = error.strerror or type(error).__name__
        return None, _unreadable(path, f"cannot be read ({reason.lower()})")
    if len(data) > MAX_FILE_BYTES:  # It grew while being read.
        message = f"`{path}` is larger than {MAX_FILE_BYTES // 2**20} MiB; it was not read."
        return None, rules.FILE_TOO_LARGE.at(path, START, "", message)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        pos = byte_position(data, error.start)
        message = (
            f"`{path}` is not UTF-8 text: the byte `0x{data[error.start]:02x}` at line "
            f"{pos.line}, column {pos.column} cannot be decoded."
        )
        return None, rules.NOT_TEXT.at(path, pos, "", message)
    if found := forbidden.search(text):
        pos = Lines(text).position(found.start())
        message = (
            f"`{path}` holds the control character `U+{ord(found.group()):04X}` at line "
            f"{pos.line}, column {pos.column}."
        )
        return None, rules.NOT_TEXT.at(path, pos, "", message)
    return text, None


def exists(file: Path) -> bool:
    """True if something (even a broken or looping symlink) is at ``file``."""
    return os.path.lexists(file)
