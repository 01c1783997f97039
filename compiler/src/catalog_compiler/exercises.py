"""Exercise regions: the code a learner writes for each stage of a project.

Syntax (LEARNING.md), in any ``.py`` file under a project's ``src/``::

    # --- exercise stage <id>: <one-sentence hint> ---
    <reference statements>
    # --- end exercise ---

Contract:
- :func:`find_regions` returns every region of one source text, in order, and
  raises :class:`RegionError` (with the line number) on a malformed marker: an
  opening without a closing, a closing without an opening, nested regions, a
  closing at another indentation, an empty region, or a region at module level.
- :func:`strip_source` returns the text with the bodies of the regions whose
  stage is not in ``keep`` replaced by one ``raise NotImplementedError(...)``
  line at the marker's indentation; both marker lines stay, so the learner
  sees where to write and a stripped region can be recognised again.
- :func:`project_regions` collects the regions of every source file of a
  project folder, with paths relative to that folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

OPEN = re.compile(
    r"^(?P<indent>[ \t]*)# --- exercise stage (?P<stage>[A-Za-z0-9_-]+): (?P<hint>.+?) ---\s*$"
)
CLOSE = re.compile(r"^(?P<indent>[ \t]*)# --- end exercise ---\s*$")
# Anything that looks like a marker but does not parse is an error, not code.
LOOSE = re.compile(r"^\s*# ---\s*(end\s+)?exercise\b")


class RegionError(ValueError):
    """A malformed exercise marker; ``line`` is 1-based."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line


@dataclass(frozen=True)
class Region:
    """One exercise region: marker lines ``start`` and ``end`` (1-based, inclusive)."""

    path: str
    stage: str
    hint: str
    indent: str
    start: int
    end: int

    @property
    def message(self) -> str:
        """The error text a stripped region raises (and the progression check looks for)."""
        return stage_message(self.stage, self.hint)


def stage_message(stage: str, hint: str) -> str:
    return f"Stage {stage} exercise: {hint}"


def stage_prefix(stage: str) -> str:
    """The part of every stripped region's message that names its stage."""
    return f"Stage {stage} exercise:"


def find_regions(text: str, path: str = "<source>") -> list[Region]:
    """Every region of ``text`` in order; see the module docstring for the errors."""
    regions: list[Region] = []
    lines = text.splitlines()
    current: re.Match[str] | None = None
    current_line = 0
    for number, line in enumerate(lines, start=1):
        if "# ---" not in line:  # No marker, loose or exact, lacks it: skip the patterns.
            continue
        opening, closing = OPEN.match(line), CLOSE.match(line)
        if opening:
            if current is not None:
                raise RegionError(
                    path, number, f"a region opens inside the one opened at line {current_line}"
                )
            if not opening["indent"]:
                raise RegionError(
                    path, number, "a region must sit inside a function body, not at module level"
                )
            if "---" in opening["hint"]:
                raise RegionError(path, number, "the hint must not contain `---`")
            current, current_line = opening, number
        elif closing:
            if current is None:
                raise RegionError(path, number, "`# --- end exercise ---` without an opening")
            if closing["indent"] != current["indent"]:
                raise RegionError(
                    path, number, f"the closing marker's indent differs from line {current_line}'s"
                )
            body = [x for x in lines[current_line : number - 1] if x.strip()]
            if not body:
                raise RegionError(path, current_line, "the region holds no code")
            regions.append(
                Region(
                    path,
                    current["stage"],
                    current["hint"].strip(),
                    current["indent"],
                    current_line,
                    number,
                )
            )
            current = None
        elif LOOSE.match(line):
            raise RegionError(path, number, f"malformed exercise marker `{line.strip()}`")
    if current is not None:
        raise RegionError(path, current_line, "the region is never closed (`--- end exercise ---`)")
    return regions


def strip_source(text: str, keep: set[str], path: str = "<source>") -> str:
    """``text`` with every region whose stage is not in ``keep`` replaced by a raise."""
    regions = find_regions(text, path)
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    index = 0
    for region in regions:
        out += lines[index : region.start]  # Up to and including the opening marker.
        if region.stage in keep:
            out += lines[region.start : region.end - 1]
        else:
            out.append(f"{region.indent}raise NotImplementedError({region.message!r})\n")
        index = region.end - 1  # The closing marker stays.
    out += lines[index:]
    return "".join(out)


def is_stripped(text: str, region: Region) -> bool:
    """Whether ``region`` of ``text`` still holds only the starter's raise."""
    body = [x.strip() for x in text.splitlines()[region.start : region.end - 1] if x.strip()]
    return body == [f"raise NotImplementedError({region.message!r})"]


def source_files(project: Path) -> list[Path]:
    """The Python files of a project's ``src/`` tree, sorted."""
    return sorted(p for p in (project / "src").rglob("*.py") if "__pycache__" not in p.parts)


def project_regions(project: Path) -> list[Region]:
    """Every region of every source file of ``project`` (paths relative to it)."""
    regions: list[Region] = []
    for source in source_files(project):
        rel = source.relative_to(project).as_posix()
        regions += find_regions(source.read_text(encoding="utf-8"), rel)
    return regions
