"""Reporters: turn diagnostics into text for people or JSON for tools.

Reporters only format; they never decide the exit code (see cli.py).
"""

from __future__ import annotations

import json

from catalog_compiler.diagnostics import Diagnostic, Severity


def counts(diagnostics: list[Diagnostic]) -> tuple[int, int]:
    """Return ``(errors, warnings)``."""
    errors = sum(d.severity is Severity.ERROR for d in diagnostics)
    return errors, len(diagnostics) - errors


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def text_report(diagnostics: list[Diagnostic], outcome: str) -> str:
    """``file:line:col: severity[CODE] message`` + hint lines, then a summary line."""
    lines = []
    for d in sorted(diagnostics, key=Diagnostic.sort_key):
        lines.append(f"{d.file}:{d.line}:{d.column}: {d.severity.value}[{d.code}] {d.message}")
        lines.append(f"  hint: {d.hint}")
    errors, warnings = counts(diagnostics)
    files = len({d.file for d in diagnostics})
    summary = f"{_plural(errors, 'error')}, {_plural(warnings, 'warning')}"
    summary += f" in {_plural(files, 'file')}." if diagnostics else "."
    lines.append(f"{summary} {outcome}".rstrip())
    return "\n".join(lines) + "\n"


def json_report(diagnostics: list[Diagnostic], outcome: str, exit_code: int) -> str:
    """A JSON object: ``diagnostics`` (sorted), ``errors``, ``warnings``, ``outcome``,
    ``exitCode``."""
    errors, warnings = counts(diagnostics)
    return (
        json.dumps(
            {
                "diagnostics": [d.to_json() for d in sorted(diagnostics, key=Diagnostic.sort_key)],
                "errors": errors,
                "warnings": warnings,
                "outcome": outcome,
                "exitCode": exit_code,
            },
            indent=2,
            ensure_ascii=False,
        )
        + "\n"
    )
