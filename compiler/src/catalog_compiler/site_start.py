"""The index's "Start here" path: per route, its projects in the order a learner meets them.

Contract:

- :func:`route_projects` lists each project a role's skill evidence cites,
  once. A required project (scope ``Required route practice``) sits at the
  milestone that completes its preparation: the latest milestone, in the
  role's milestone order, that first cites the phase of one of its
  preparation lessons (the first milestone when none does). Projects at one
  milestone keep the order in which the skill evidence first cites them.
  Optional projects (any other scope) follow, in citation order; so does a
  project that was not passed in.
- :func:`exemplar_id`: no catalog file and no project manifest designates an
  exemplar (the manifest schema has no such field), so the exemplar is the
  first project, passed in, on the first published route's path.
- :func:`start_paths` gives every route its path with the exemplar first,
  marked as such (also on a route that cites none of its stages), and each
  project's size measured from its reference source: its stage count, its
  exercise regions and the lines of code they hold (the ``lines`` of each
  region, counted by ``build.site_inputs``). No working time is estimated:
  nothing in the catalog or the projects measures one.
"""

from __future__ import annotations

from catalog_compiler.site_index import REQUIRED_SCOPE, SiteIndex

SIZE_NOTE = (
    "Size is counted in each project's reference source: its stages, its exercise regions "
    "(the code the starter leaves for you to write) and the non-blank, non-comment lines "
    "that code takes in the reference. No working time is given: nothing measures one."
)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def project_size(project: dict | None) -> dict | None:
    """``{"stages", "regions", "lines"}`` of a passed-in project; None otherwise."""
    if project is None:
        return None
    exercises = [e for stage in (project.get("exercises") or {}).values() for e in stage]
    return {
        "stages": len(project.get("stages", [])),
        "regions": len(exercises),
        "lines": sum(int(e.get("lines", 0)) for e in exercises),
    }


def size_text(size: dict | None) -> str:
    """``3 stages · 5 exercise regions · 61 lines to write`` (or what is known of it)."""
    if size is None:
        return "not in this build"
    parts = [_plural(size["stages"], "stage")]
    if size["regions"]:
        parts += [_plural(size["regions"], "exercise region"), _plural(size["lines"], "line")]
        parts[-1] += " to write"
    else:
        parts.append("no exercise regions")
    return " · ".join(parts)


def route_projects(role: dict, index: SiteIndex) -> list[dict]:
    """The projects of ``role`` in path order (module docstring), one entry each:
    ``{"id", "milestone"}``, ``milestone`` the 0-based index or None (optional)."""
    route = index.route_phases(role)
    cited: dict[str, bool] = {}  # project id -> required, in first-citation order
    for item in role["skillEvidence"]:
        required = item["scope"] == REQUIRED_SCOPE and item["projectId"] in index.projects
        cited[item["projectId"]] = cited.get(item["projectId"], True) and required
    placed = []
    for order, (project_id, required) in enumerate(cited.items()):
        milestone = None
        if required:
            phases = [
                index.lessons[lesson_id]["phase"]
                for lesson_id in index.projects[project_id].get("preparation", [])
                if lesson_id in index.lessons
            ]
            milestone = max((route[p] for p in phases if p in route), default=0)
        placed.append((milestone is None, milestone or 0, order, project_id, milestone))
    return [{"id": entry[3], "milestone": entry[4]} for entry in sorted(placed)]


def exemplar_id(index: SiteIndex) -> str | None:
    """The first passed-in project on the first route's path; None without one."""
    roles = index.catalog["roles"]
    if not roles:
        return None
    path = route_projects(roles[0], index)
    return next((e["id"] for e in path if e["id"] in index.projects), None)


def _entry(project_id: str, milestone: int | None, role: dict, index: SiteIndex, **marks) -> dict:
    project = index.projects.get(project_id)
    size = project_size(project)
    if milestone is not None:
        place = f"milestone {milestone + 1}: {role['milestones'][milestone]['title']}"
    elif marks.get("cited", True):
        place = "optional extension"
    else:
        place = "not cited by this route: the structure every project shares"
    return {
        "id": project_id,
        "title": index.project_title(project_id),
        "href": index.project_href(project_id),
        "status": project["status"] if project else "",
        "place": place,
        "size": size,
        "size_text": size_text(size),
        "exemplar": marks.get("exemplar", False),
    }


def start_paths(index: SiteIndex) -> dict:
    """The "Start here" section: ``{"exemplar", "note", "paths"}``; each path
    ``{"role", "href", "map_href", "projects", "total_text"}``."""
    exemplar = exemplar_id(index)
    paths = []
    for role in index.catalog["roles"]:
        path = route_projects(role, index)
        entries = []
        if exemplar is not None:
            own = next((e for e in path if e["id"] == exemplar), None)
            milestone = own["milestone"] if own else None
            entries.append(
                _entry(exemplar, milestone, role, index, exemplar=True, cited=own is not None)
            )
        entries += [
            _entry(e["id"], e["milestone"], role, index) for e in path if e["id"] != exemplar
        ]
        sizes = [e["size"] for e in entries if e["size"] is not None]
        total = {key: sum(s[key] for s in sizes) for key in ("stages", "regions", "lines")}
        paths.append(
            {
                "role": role,
                "href": index.route_href(role["id"]),
                "map_href": index.route_href(role["id"], "capability-map"),
                "projects": entries,
                "total_text": _plural(len(sizes), "project") + ": " + size_text(total),
            }
        )
    return {
        "exemplar": {"id": exemplar, "title": index.project_title(exemplar)} if exemplar else None,
        "first_route": index.catalog["roles"][0]["title"] if index.catalog["roles"] else "",
        "note": SIZE_NOTE,
        "paths": paths,
    }
