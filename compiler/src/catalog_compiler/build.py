"""Build the published catalog from checked sources (only called without errors).

Contract: :func:`published_catalog` returns the dict that ``catalog.json``
serialises: ``schemaVersion``, ``roles`` in ``catalog.yaml`` order, then
``domains``; keys in the order of the reference catalog, defaults expanded,
and ``skillEvidence[].scope`` derived (catalog/README.md, "Derived fields").
"""

from __future__ import annotations

from pathlib import Path

from catalog_compiler.discover import Discovery
from catalog_compiler.exercises import (
    Region,
    RegionError,
    find_regions,
    source_files,
    strip_source,
)
from catalog_compiler.models import Defaults, Role, SkillEvidence
from catalog_compiler.sources import CatalogSources

REQUIRED = "Required route practice"


def scope(outside: int) -> str:
    """The scope text for a project with ``outside`` preparation lessons off the route.

    The published text keeps "lessons" even for one lesson.
    """
    if outside == 0:
        return REQUIRED
    return (
        f"Optional project extension; {outside} project preparation lessons "
        "lie outside the required route"
    )


def _evidence(item: SkillEvidence, defaults: Defaults, scope_text: str) -> dict:
    return {
        "skill": item.skill,
        "lessonIds": list(item.lessonIds),
        "projectId": item.projectId,
        "evidence": item.evidence,
        "reviewCriterion": item.reviewCriterion or defaults.reviewCriterion,
        "scope": scope_text,
        "stageIds": list(item.stageIds),
    }


def _role(role: Role, defaults: Defaults, preparation: dict[str, list[str]]) -> dict:
    data = role.model_dump(exclude={"scopeNote", "skillEvidence"})
    route = {phase for milestone in role.milestones for phase in milestone.phaseIds}
    evidence = []
    for item in role.skillEvidence:
        outside = sum(phase not in route for phase in preparation[item.projectId])
        evidence.append(_evidence(item, defaults, scope(outside)))
    data["scopeNote"] = role.scopeNote or defaults.scopeNote
    data["skillEvidence"] = evidence
    return data


def published_catalog(sources: CatalogSources, discovery: Discovery) -> dict:
    """Return the published catalog (see the module docstring)."""
    assert sources.root is not None  # Guaranteed by the caller: no errors.
    root = sources.root.obj
    lesson_phase = {e.obj.id: e.obj.phase for e in sources.lists["lessons"]}
    # Each project's preparation, as the phases of its lessons.
    preparation = {
        folder: [lesson_phase[lesson] for lesson in project.manifest.preparation]
        for folder, project in discovery.projects.items()
        if project.manifest is not None
    }
    return {
        "schemaVersion": root.schemaVersion,
        "roles": [_role(sources.roles[r].obj, root.defaults, preparation) for r in root.roles],
        "domains": [e.obj.model_dump() for e in sources.lists["domains"]],
    }


def _code_lines(text: str, region: Region) -> int:
    """The lines a learner writes for ``region``: its non-blank, non-comment body lines."""
    body = text.splitlines()[region.start : region.end - 1]
    return sum(1 for line in body if line.strip() and not line.lstrip().startswith("#"))


def _exercises(folder: Path, status: str) -> dict[str, list[dict]]:
    """A ready project's exercise regions by stage: ``{"file", "line", "hint", "lines"}`` each.

    ``line`` is the opening marker's line in the starter (the learner's file,
    every region stripped to one line), not in the reference; ``lines`` counts
    the region's code in the reference (:func:`_code_lines`). Empty for a
    planned project, and for one whose markers do not parse (the repository's
    contract tests report those, naming file and line).
    """
    if status != "ready":
        return {}
    by_stage: dict[str, list[dict]] = {}
    try:
        for source in source_files(folder):
            rel = source.relative_to(folder).as_posix()
            text = source.read_text(encoding="utf-8")
            starter = find_regions(strip_source(text, set(), rel), rel)
            for region, stub in zip(find_regions(text, rel), starter, strict=True):
                by_stage.setdefault(region.stage, []).append(
                    {
                        "file": rel,
                        "line": stub.start,
                        "hint": region.hint,
                        "lines": _code_lines(text, region),
                    }
                )
    except (RegionError, OSError, UnicodeDecodeError):
        return {}
    return by_stage


def site_inputs(sources: CatalogSources, discovery: Discovery) -> dict[str, list[dict]]:
    """Return the plain lists that ``site.write_site`` takes besides the catalog."""
    projects = [
        {
            **p.manifest.model_dump(),
            "folder": str(p.path),
            "exercises": _exercises(p.path, p.manifest.status),
        }
        for _, p in sorted(discovery.projects.items())
        if p.manifest is not None
    ]
    lists = {key: [e.obj.model_dump() for e in entries] for key, entries in sources.lists.items()}
    return {
        "projects": projects,
        "phases": lists["phases"],
        "lessons": lists["lessons"],
        "pathways": lists["pathways"],
        "tracks": lists["tracks"],
    }
