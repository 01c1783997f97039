"""The static HTML site of a published catalog.

:func:`write_site` renders, with the Jinja2 templates shipped in
``catalog_compiler/templates``:

- ``index.html``: the "Start here" path of every route (``site_start``), every
  route grouped by domain, then the projects (each with the hardware its
  stages need, ``site_hardware``) and phases;
- ``routes/<role-id>.html``: one page per role whose rendered text (a
  browser's ``document.body.innerText``) is :func:`route_text` of that role,
  line for line, with two differences: each practice line names its project,
  ``Practice project: <project title>, stages 1, 2.`` where the text has
  ``Practice project: stages 1, 2.``, and the capability map
  (``site_evidence``) follows the scope note that announces it, then the
  hardware each cited stage needs and where it last ran on an accelerator
  (``site_hardware``). Links sit inside that text and extra facts go in
  ``title`` attributes;
- ``projects/<project-id>.html`` (``site_project``): a project's status and
  size, its starter (download and set-up first, then what you write, at the
  starter's line numbers), the lead of its README, its stages, reference
  evidence, preparation lessons and the routes and skills that cite it;
- ``phases/<phase-id>.html``: a phase's lessons and the projects and routes
  that build on it;
- ``lessons/<lesson-id>.html``: the project stages that practise a lesson and
  its documentation links as the lesson data holds them;
- ``style.css``: the one stylesheet.

Every page has the same header: three links to the index (its top, its
routes, its "Start here" path) whose text runs together as the route text's
first line. Every link is relative, so the site works from ``file://`` and
from any server path. Every catalog string is HTML-escaped (autoescaping is
on for all templates and no template marks data as safe). The same inputs
give the same bytes.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

from catalog_compiler import route_text as text
from catalog_compiler.portfolio import dossier_module, roles_json
from catalog_compiler.site_evidence import capability_map, lesson_context
from catalog_compiler.site_hardware import hardware_text, route_hardware
from catalog_compiler.site_index import REQUIRED_SCOPE, SiteIndex, check_file_id
from catalog_compiler.site_project import project_context
from catalog_compiler.site_start import start_paths
from catalog_compiler.starters import starter_archive

STYLESHEET = "style.css"
# The words of the scope note that name the capability map; linked to it.
MAP_WORDS = "capability map"


def _environment() -> Environment:
    # select_autoescape decides by template file name and would not escape
    # templates loaded under other names; escaping is unconditional here.
    env = Environment(
        loader=PackageLoader("catalog_compiler", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals["text"] = text
    env.globals["figures"] = lambda value: dossier_module().figures(value)
    return env


def _scope_note(note: str) -> dict:
    """The scope note split around its first "capability map", which links to the map."""
    before, found, after = note.partition(MAP_WORDS)
    return {"before": before, "link": found, "after": after}


def _route_context(role: dict, index: SiteIndex) -> dict:
    skills = []
    for number, item in enumerate(role["skillEvidence"], start=1):
        project = index.projects.get(item["projectId"])
        lesson_ids = item.get("lessonIds", [])
        skills.append(
            {
                **item,
                "anchor": f"skill-{number}",
                "scope_kind": "required" if item["scope"] == REQUIRED_SCOPE else "optional",
                "lessons_hint": "Lessons: "
                + "; ".join(index.lesson_label(lesson_id) for lesson_id in lesson_ids)
                if lesson_ids
                else "",
                "lesson_href": index.lesson_href(lesson_ids[0]) if lesson_ids else None,
                "project_title": index.project_title(item["projectId"]),
                "project_href": index.project_href(item["projectId"]),
                "project_hint": f"{project['status']} project" if project else "",
                "stages": index.stage_links(item["projectId"], item["stageIds"]),
            }
        )
    milestones = []
    for milestone in role["milestones"]:
        phase_ids = milestone.get("phaseIds", [])
        milestones.append(
            {
                **milestone,
                "href": index.phase_href(phase_ids[0]) if phase_ids else None,
                "hint": "Phases: " + ", ".join(index.phase_title(p) for p in phase_ids)
                if phase_ids
                else "",
            }
        )
    pathway_titles = [
        index.pathways[p]["title"] if p in index.pathways else p for p in role.get("pathwayIds", [])
    ]
    track_titles = [
        index.tracks[t]["title"] if t in index.tracks else t
        for t in role.get("modalityTrackIds", [])
    ]
    hints = []
    if pathway_titles:
        hints.append("Pathways: " + ", ".join(pathway_titles))
    if track_titles:
        hints.append("Tracks: " + ", ".join(track_titles))
    return {
        "role": role,
        "skills": skills,
        "milestones": milestones,
        "route_hint": ". ".join(hints),
        "scope_note": _scope_note(role["scopeNote"]),
        "capability_map": capability_map(role, index),
        "hardware": route_hardware(role, index),
    }


def _phase_context(phase: dict, index: SiteIndex, lessons_by_phase: dict[str, list[dict]]) -> dict:
    lessons = lessons_by_phase.get(phase["id"], [])
    lesson_ids = {lesson["id"] for lesson in lessons}
    projects = []
    for project in index.projects.values():
        prepared = [lid for lid in project.get("preparation", []) if lid in lesson_ids]
        if prepared:
            projects.append(
                {"project": project, "lessons": prepared, "href": index.project_href(project["id"])}
            )
    routes = [
        {"role": role, "href": index.route_href(role["id"])}
        for role in index.catalog["roles"]
        if phase["id"] in index.route_phases(role)
    ]
    return {
        "phase": phase,
        "lessons": [{**lesson, "href": index.lesson_href(lesson["id"])} for lesson in lessons],
        "projects": projects,
        "routes": routes,
    }


def _index_context(index: SiteIndex, lessons_by_phase: dict[str, list[dict]]) -> dict:
    placed: set[str] = set()
    domains = []
    for domain in index.catalog.get("domains", []):
        roles = [index.roles[rid] for rid in domain.get("roleIds", []) if rid in index.roles]
        placed.update(role["id"] for role in roles)
        domains.append({"domain": domain, "roles": roles})
    # A role outside every domain is still published, so it is still listed.
    unplaced = [role for role in index.catalog["roles"] if role["id"] not in placed]
    phases = [
        {"phase": phase, "lesson_count": len(lessons_by_phase.get(phase["id"], []))}
        for phase in index.phases.values()
    ]
    return {
        "start": start_paths(index),
        "domains": domains,
        "unplaced": unplaced,
        "projects": [
            {"project": project, "hardware": hardware_text(project)}
            for project in index.projects.values()
        ],
        "phases": phases,
    }


def write_site(
    site_dir: Path,
    catalog: dict,
    projects: list[dict],
    phases: list[dict],
    lessons: list[dict],
    pathways: list[dict],
    tracks: list[dict],
) -> list[Path]:
    """Write the static site of ``catalog`` under ``site_dir``; return the paths written.

    ``catalog`` is the published catalog (``roles``, ``domains``) as plain
    JSON data. ``projects`` are ``{"id", "title", "status", "preparation":
    [lesson ids], "stages": [{"id", "title", "deliverable", "tests",
    "hardware"}]}``, optionally with ``"folder"`` (the project on disk: its
    starter archive and reference evidence are published) and
    ``"exercises"``: stage id -> ``[{"file", "line", "hint", "lines"}]``,
    ``line`` the opening marker's line in the starter and ``lines`` the code
    lines of the region in the reference. Every project gets a page,
    referenced or not. ``phases`` are ``{"id", "title"}``, ``lessons``
    ``{"id", "phase", "title"}`` (optionally ``"docs"``: ``[{"title",
    "url"}]``), ``pathways`` ``{"id", "title", "summary"}``, ``tracks``
    ``{"id", "title"}``; pages list them in the order given.

    A reference to something not in these inputs (a project, phase or lesson
    the caller did not pass) is rendered as plain text, never as a broken
    link. Role, project, phase and lesson ids must be kebab-case (they name
    files); otherwise ``ValueError`` is raised before anything is written.
    Existing files other than the ones written are left alone. Returns the
    written paths: the stylesheet, the index, then route, project (with their
    dossiers and starter archives), phase and lesson pages.
    """
    site_dir = Path(site_dir)
    for role in catalog["roles"]:
        check_file_id("role", role["id"])
    for project in projects:
        check_file_id("project", project["id"])
    for phase in phases:
        check_file_id("phase", phase["id"])
    for lesson in lessons:
        check_file_id("lesson", lesson["id"])

    index = SiteIndex(
        catalog=catalog,
        projects={p["id"]: p for p in projects},
        phases={p["id"]: p for p in phases},
        lessons={lesson["id"]: lesson for lesson in lessons},
        pathways={p["id"]: p for p in pathways},
        tracks={t["id"]: t for t in tracks},
    )
    lessons_by_phase: dict[str, list[dict]] = {}
    for lesson in lessons:
        lessons_by_phase.setdefault(lesson["phase"], []).append(lesson)

    env = _environment()
    written: list[Path] = []

    def emit(relative: str, content: str) -> None:
        path = site_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8", newline="\n")
        written.append(path)

    emit(
        STYLESHEET,
        resources.files("catalog_compiler").joinpath("templates", STYLESHEET).read_text("utf-8"),
    )
    emit(
        "index.html",
        env.get_template("index.html").render(root="", **_index_context(index, lessons_by_phase)),
    )
    route_template = env.get_template("route.html")
    for role in catalog["roles"]:
        context = _route_context(role, index)
        emit(f"routes/{role['id']}.html", route_template.render(root="../", **context))
    project_template = env.get_template("project.html")
    for project in projects:
        context = project_context(project, index)
        emit(f"projects/{project['id']}.html", project_template.render(root="../", **context))
        if context["evidence"]:
            out = site_dir / "dossiers" / project["id"]
            page = dossier_module().write(Path(project["folder"]), out, context["evidence"]["data"])
            written += sorted(out.iterdir())
            assert page in written
        if context["starter"]:
            # The learner's starter, linked from the project page.
            path = site_dir / context["starter"]["archive"]
            path.parent.mkdir(parents=True, exist_ok=True)
            roles = roles_json(catalog, project["id"])
            path.write_bytes(starter_archive(Path(project["folder"]), roles))
            written.append(path)
    phase_template = env.get_template("phase.html")
    for phase in phases:
        context = _phase_context(phase, index, lessons_by_phase)
        emit(f"phases/{phase['id']}.html", phase_template.render(root="../", **context))
    lesson_template = env.get_template("lesson.html")
    for lesson in lessons:
        context = lesson_context(lesson, index)
        emit(f"lessons/{lesson['id']}.html", lesson_template.render(root="../", **context))
    return written
