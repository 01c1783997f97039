"""The HTML page of one route's milestone coverage (``coverage --format html``).

Written to ``out/coverage-<role>.html`` with the site's stylesheet beside it;
each demonstrated stage links to the evidence file it rests on (a relative
path, so the page works from ``file://``), and every string is escaped. As
in the text report, a section with nothing in it is left out, the count
line names only the parts that have skills, and evidence of a project the
route does not cite is named.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from catalog_compiler import route_text
from catalog_compiler.coverage import Coverage, SkillCoverage
from catalog_compiler.portfolio import route_coverage_module
from catalog_compiler.site import STYLESHEET, _environment


def _skill(skill: SkillCoverage, out: Path, folders: dict[str, Path]) -> dict:
    demonstrated = []
    for stage in skill.demonstrated:
        folder = folders.get(skill.project)
        evidence = folder / f"stage_{stage}.json" if folder else None
        href = os.path.relpath(evidence, out) if evidence and evidence.is_file() else None
        demonstrated.append({"id": stage, "href": href})
    return {
        "skill": skill.skill,
        "project": skill.project,
        "scope": skill.scope,
        "covered": skill.covered,
        "demonstrated": demonstrated,
        "remaining": skill.remaining,
    }


def write(out: Path, coverage: Coverage) -> Path:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    by_project = {k: v.resolve() for k, v in coverage.folders.items()}
    groups = []
    for title, required, anchor in (
        ("Required route practice", True, "required"),
        ("Optional extensions", False, "optional"),
    ):
        blocks = []
        for milestone in coverage.milestones:
            mine = [_skill(s, out, by_project) for s in milestone.skills if s.required is required]
            if mine:
                blocks.append(
                    {"title": milestone.title, "deliverable": milestone.deliverable, "skills": mine}
                )
        rest = [_skill(s, out, by_project) for s in coverage.unplaced if s.required is required]
        if rest:
            blocks.append({"title": "Beyond the milestones", "deliverable": "", "skills": rest})
        if blocks:  # A heading over nothing says nothing: it is left out.
            groups.append({"title": title, "anchor": anchor, "blocks": blocks})
    skills = coverage.skills()
    # The same count line as the text report: only the parts that have skills.
    lede = route_coverage_module().tally(
        "skills",
        [s.covered for s in skills if s.required],
        [s.covered for s in skills if not s.required],
    )
    page = out / f"coverage-{coverage.role['id']}.html"
    html = (
        _environment()
        .get_template("coverage.html")
        .render(
            role=coverage.role,
            brand=route_text.HEADER_ITEMS[0],
            groups=groups,
            diagnostics=coverage.diagnostics,
            empty=[m.title for m in coverage.milestones if not m.skills],
            uncited=coverage.uncited,
            lede=lede,
        )
    )
    page.write_text(html, encoding="utf-8", newline="\n")
    css = resources.files("catalog_compiler").joinpath("templates", STYLESHEET)
    (out / STYLESHEET).write_text(css.read_text("utf-8"), encoding="utf-8", newline="\n")
    return page
