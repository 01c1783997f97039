"""The text of a published route page.

A route page's text is what a reader sees of one role, line by line, in a
fixed order. The static site renders the same lines as HTML (see
``site.py``); a browser's ``innerText`` of that page equals this text.
"""

from __future__ import annotations

# The page header: three inline items (two links and a label) that a browser
# runs together on one line because nothing separates them but styling.
HEADER_ITEMS = ("JAX Pathways", "All career routes", "Career learning guide")

SECTION_WORK = "The work"
SECTION_PREPARATION = "Preparation"
SECTION_PORTFOLIO = "Your portfolio"
SECTION_SKILLS = "Skills and evidence"
SECTION_MILESTONES = "Milestones"
SECTION_READINESS = "Review your readiness"

PRACTICE_PROJECT = "Practice project"
QUESTION_PREFIX = "- "


def stages_phrase(stage_ids: list[str]) -> str:
    """Return the text after ``Practice project`` for a list of stage ids.

    ``["1", "2"]`` gives ``": stages 1, 2."``; the word stays plural for a
    single stage, as on the published pages.
    """
    return ": stages " + ", ".join(stage_ids) + "."


def route_lines(role: dict) -> list[str]:
    """Return the lines of a role's route page, in page order.

    ``role`` is one entry of the published catalog's ``roles`` (a plain JSON
    dict). Every line is one string field of the role, a fixed section
    heading, or a composed line (the header, the practice project line, a
    review question with its ``- `` prefix). No line contains a newline as
    long as the role's strings contain none.
    """
    lines: list[str] = ["".join(HEADER_ITEMS), role["title"], role["description"]]
    lines += [SECTION_WORK, role["workExample"]]
    lines += [SECTION_PREPARATION, role["background"]]
    lines += [SECTION_PORTFOLIO, role["portfolio"]]
    lines.append(SECTION_SKILLS)
    for item in role["skillEvidence"]:
        lines += [item["skill"], item["scope"], item["evidence"], item["reviewCriterion"]]
        lines.append(PRACTICE_PROJECT + stages_phrase(item["stageIds"]))
    lines.append(SECTION_MILESTONES)
    for milestone in role["milestones"]:
        lines += [milestone["title"], milestone["deliverable"]]
    lines += [SECTION_READINESS, role["readiness"]]
    lines += [QUESTION_PREFIX + question for question in role["reviewQuestions"]]
    lines.append(role["scopeNote"])
    return lines


def route_text(role: dict) -> str:
    """Return the route page text of ``role``, byte for byte as published.

    The lines of :func:`route_lines` joined with ``\\n``, with no trailing
    newline (the published text ends with the scope note's last character).
    """
    return "\n".join(route_lines(role))
