"""Diagnostics: what every checker produces and every reporter consumes.

A diagnostic names one problem at one place: a rule code, a severity, the
repo-relative file, a 1-based line and column in that file's source, a JSON
pointer (RFC 6901) into the document, a one-sentence message that names the
offending value in backticks, and a hint that says how to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class Severity(StrEnum):
    """How bad a problem is; only errors fail a run (warnings too with --strict)."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Position:
    """A 1-based line and column in a source file."""

    line: int = 1
    column: int = 1


START = Position(1, 1)


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One problem found in one file (see the module docstring)."""

    code: str
    severity: Severity
    file: str
    line: int
    column: int
    pointer: str
    message: str
    hint: str

    def sort_key(self) -> tuple:
        return (self.file, self.line, self.column, self.code, self.pointer)

    def promoted(self) -> Diagnostic:
        """Return this diagnostic as an error (what --strict does to warnings)."""
        return replace(self, severity=Severity.ERROR)

    def to_json(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "pointer": self.pointer,
            "message": self.message,
            "hint": self.hint,
        }


def pointer(*parts: str | int) -> str:
    """Return the JSON pointer made of ``parts`` (``pointer("a", 0)`` is ``/a/0``).

    ``~`` and ``/`` inside a part are escaped as RFC 6901 requires.
    """
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
