"""Which project stages give evidence: per role (the capability map) and per lesson.

Contract:

- :func:`capability_map` is the section the scope note's "capability map
  below" points to on a route page: the role's skill evidence split into
  required route practice and optional extensions (by each entry's ``scope``),
  each skill with its project, the stages that evidence it (links to the
  project page's stage rows) and its lessons; and the role's ``skills`` that
  no skill evidence names.
- :func:`lesson_context` is a lesson page: its phase, the project stages
  that practise it (every skill evidence that lists the lesson, grouped by
  project, with the routes and skills citing them), the projects that list it
  as preparation, the routes whose milestones require its phase, and its
  documentation links, only as the lesson data holds them (``docs``: a list
  of ``{"title", "url"}`` with an ``http(s)`` URL); none are made up.
"""

from __future__ import annotations

from catalog_compiler.site_index import REQUIRED_SCOPE, SiteIndex

GROUPS = (
    ("required", "Required route practice"),
    ("optional", "Optional extensions"),
)


def _lessons(lesson_ids: list[str], index: SiteIndex) -> list[dict]:
    return [
        {
            "id": lesson_id,
            "title": index.lessons[lesson_id]["title"] if lesson_id in index.lessons else "",
            "href": index.lesson_href(lesson_id),
        }
        for lesson_id in lesson_ids
    ]


def capability_map(role: dict, index: SiteIndex) -> dict:
    """``{"groups": [{"kind", "title", "skills"}], "unevidenced": [skill names]}``."""
    grouped: dict[str, list[dict]] = {kind: [] for kind, _ in GROUPS}
    for number, item in enumerate(role["skillEvidence"], start=1):
        kind = "required" if item["scope"] == REQUIRED_SCOPE else "optional"
        grouped[kind].append(
            {
                "skill": item["skill"],
                "anchor": f"skill-{number}",
                "scope": item["scope"],
                "project": {
                    "title": index.project_title(item["projectId"]),
                    "href": index.project_href(item["projectId"]),
                },
                "stages": index.stage_links(item["projectId"], item["stageIds"]),
                "lessons": _lessons(item.get("lessonIds", []), index),
            }
        )
    named = {item["skill"] for item in role["skillEvidence"]}
    return {
        "groups": [
            {"kind": kind, "title": title, "skills": grouped[kind]} for kind, title in GROUPS
        ],
        "unevidenced": [skill for skill in role.get("skills", []) if skill not in named],
    }


def _docs(lesson: dict) -> list[dict]:
    docs = []
    for doc in lesson.get("docs") or []:
        url = doc.get("url", "") if isinstance(doc, dict) else ""
        if isinstance(url, str) and url.startswith(("https://", "http://")):
            docs.append({"title": doc.get("title") or url, "url": url})
    return docs


def lesson_context(lesson: dict, index: SiteIndex) -> dict:
    """The template context of ``lessons/<lesson-id>.html`` (module docstring)."""
    practice: dict[str, dict] = {}
    for role in index.catalog["roles"]:
        for number, item in enumerate(role["skillEvidence"], start=1):
            if lesson["id"] not in item.get("lessonIds", []):
                continue
            project_id = item["projectId"]
            entry = practice.setdefault(
                project_id,
                {
                    "title": index.project_title(project_id),
                    "href": index.project_href(project_id),
                    "stage_ids": [],
                    "cited_by": [],
                },
            )
            entry["stage_ids"] += [s for s in item["stageIds"] if s not in entry["stage_ids"]]
            entry["cited_by"].append(
                {
                    "role": role["title"],
                    "skill": item["skill"],
                    "href": index.route_href(role["id"], f"skill-{number}"),
                }
            )
    for project_id, entry in practice.items():
        declared = [s["id"] for s in (index.projects.get(project_id) or {}).get("stages", [])]
        # Manifest order; stage ids the manifest lacks keep their cited order, last.
        ordered = [s for s in declared if s in entry["stage_ids"]]
        ordered += [s for s in entry.pop("stage_ids") if s not in declared]
        entry["stages"] = index.stage_links(project_id, ordered)
    preparation_for = [
        {"title": project["title"], "href": index.project_href(project["id"])}
        for project in index.projects.values()
        if lesson["id"] in project.get("preparation", [])
    ]
    routes = [
        {"title": role["title"], "href": index.route_href(role["id"])}
        for role in index.catalog["roles"]
        if lesson["phase"] in index.route_phases(role)
    ]
    return {
        "lesson": lesson,
        "phase": {
            "title": index.phase_title(lesson["phase"]),
            "href": index.phase_href(lesson["phase"]),
        },
        "practice": list(practice.values()),
        "preparation_for": preparation_for,
        "routes": routes,
        "docs": _docs(lesson),
    }
