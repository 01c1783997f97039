"""Whose code a stage's passing run rests on, as far as a local check can tell.

A stamp in `evidence/progress.json` says a stage passed with code of a given
hash; anyone can write one, and the hash of the starter's own unwritten code is
as easy to compute as any other. So before the dossier or `coverage` calls a
stage demonstrated, the regions themselves are read:

- a region of the stage that still raises the starter's error means the stage
  cannot have passed here: **not yet**, whatever the stamp says;
- a region whose marker or file is gone leaves **no code** to check the
  evidence against;
- when every region of the stage is, line for line, the reference's own code
  (the starter ships it, compressed, in `hints.json` for the hint ladder), the
  run demonstrates the reference, not the learner: **reference code**.

Regions are compared token by token (Python's tokenizer, without comments,
blank lines or indentation), so re-indenting, re-spacing or annotating the
reference does not make it the learner's. What
no local check can prove: who typed code that differs from the reference, or
that it was not copied from elsewhere; the dossier says so.
"""

from __future__ import annotations

import io
import textwrap
import tokenize
from pathlib import Path

import hints
import progress

NOT_YET, NO_CODE, REFERENCE = "not yet", "no code", "reference code"


_LAYOUT = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def _normal(lines: list[str]) -> list[str]:
    """The code tokens of ``lines``: no comment, line break or indentation. Text the
    tokenizer refuses is compared line by line, stripped, without blank lines."""
    text = textwrap.dedent("\n".join(lines)) + "\n"
    try:
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        return [t.string for t in tokens if t.type not in _LAYOUT]
    except (tokenize.TokenError, SyntaxError):
        return [s for s in (line.strip() for line in lines) if s]


def stage_authorship(folder: Path, stage_id: str) -> tuple[str, str] | None:
    """(status, reason) when the stage's regions do not show the learner's own
    passing code (see the module docstring); None when they do, or when the
    starter ships no reference to compare with."""
    unwritten = progress.unwritten_regions(folder).get(stage_id, [])
    if unwritten:
        return NOT_YET, (
            f"the stamp says passed, but {len(unwritten)} exercise region(s) still raise "
            "the starter's error"
        )
    regions = [r for r in hints.load_regions(folder) if r["stage"] == stage_id]
    same = 0
    for region in regions:
        text = progress.read_text(folder / region["path"])
        if text is None:
            return NO_CODE, f"{region['path']} is not here to check its evidence against"
        lines = text.splitlines()
        try:
            start = hints.marker_line(lines, region)
        except LookupError:
            return NO_CODE, f"an exercise marker of {region['path']} is gone"
        _, body = hints.region_lines(lines, start)
        same += _normal(body) == _normal(hints.reference_lines(region))
    if regions and same == len(regions):
        return REFERENCE, (
            "every exercise region of it is the reference's own code, line for line "
            "(hints.json): a run of the reference, not a demonstration of your code"
        )
    return None
