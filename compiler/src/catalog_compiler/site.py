"""The static HTML site of a published catalog.

:func:`write_site` renders, with the Jinja2 templates shipped in
``catalog_compiler/templates``:

- ``index.html``: every route grouped by domain, then the projects and phases;
- ``routes/<role-id>.html``: one page per role whose rendered text (a
  browser's ``document.body.innerText``) equals :func:`route_text` of that
  role, line for line; links sit inside that text and extra facts go in
  ``title`` attributes, never in visible text;
- ``projects/<project-id>.html``: a project's status, stages, preparation
  lessons and the routes and skills that cite it;
- ``phases/<phase-id>.html``: a phase's lessons and the projects and routes
  that build on it;
- ``style.css``: the one stylesheet.

Every link is relative, so the site works from ``file://`` and from any
server path. Every catalog string is HTML-escaped (autoescaping is on for all
templates and no template marks data as safe).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

from catalog_compiler import route_text as text
from catalog_compiler.portfolio import dossier_module, project_roles, roles_json
from catalog_compiler.starters import starter_archive

STYLESHEET = "style.css"
REQUIRED_SCOPE = "Required route practice"

# Ids become file names; anything but kebab-case could escape the site folder
# or break a relative link, so it is refused before anything is written.
_FILE_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


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


def _check_file_id(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _FILE_ID.match(value):
        raise ValueError(f"{kind} id {value!r} is not kebab-case; it cannot name a site page")
    return value


@dataclass
class _Index:
    """Look-ups shared by all pages, built once from write_site's inputs."""

    catalog: dict
    projects: dict[str, dict]
    phases: dict[str, dict]
    lessons: dict[str, dict]
    pathways: dict[str, dict]
    tracks: dict[str, dict]
    roles: dict[str, dict] = field(init=False)

    def __post_init__(self) -> None:
        self.roles = {role["id"]: role for role in self.catalog["roles"]}

    # Hrefs are relative to a page one folder below the site root.
    def project_href(self, project_id: str) -> str | None:
        return f"../projects/{project_id}.html" if project_id in self.projects else None

    def phase_href(self, phase_id: str) -> str | None:
        return f"../phases/{phase_id}.html" if phase_id in self.phases else None

    def lesson_href(self, lesson_id: str) -> str | None:
        lesson = self.lessons.get(lesson_id)
        if lesson is None or lesson["phase"] not in self.phases:
            return None
        return f"../phases/{lesson['phase']}.html#{lesson_id}"

    def lesson_label(self, lesson_id: str) -> str:
        lesson = self.lessons.get(lesson_id)
        return f"{lesson_id} {lesson['title']}" if lesson else lesson_id

    def phase_title(self, phase_id: str) -> str:
        phase = self.phases.get(phase_id)
        return phase["title"] if phase else phase_id


def _route_context(role: dict, index: _Index) -> dict:
    skills = []
    for number, item in enumerate(role["skillEvidence"], start=1):
        project = index.projects.get(item["projectId"])
        stages_by_id = {stage["id"]: stage for stage in (project or {}).get("stages", [])}
        project_href = index.project_href(item["projectId"])
        stages = []
        for stage_id in item["stageIds"]:
            stage = stages_by_id.get(stage_id)
            stages.append(
                {
                    "id": stage_id,
                    "href": f"{project_href}#stage-{stage_id}" if project_href and stage else None,
                    "hint": stage["title"] if stage else "",
                }
            )
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
                "project_href": project_href,
                "project_hint": (
                    f"{project['title']} ({project['status']})" if project else item["projectId"]
                ),
                "stages": stages,
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
    }


def _project_context(project: dict, index: _Index) -> dict:
    preparation = [
        {
            "id": lesson_id,
            "title": index.lessons[lesson_id]["title"] if lesson_id in index.lessons else "",
            "phase": index.phase_title(index.lessons[lesson_id]["phase"])
            if lesson_id in index.lessons
            else "",
            "href": index.lesson_href(lesson_id),
        }
        for lesson_id in project.get("preparation", [])
    ]
    used_by = []
    for role in index.catalog["roles"]:
        for number, item in enumerate(role["skillEvidence"], start=1):
            if item["projectId"] == project["id"]:
                used_by.append(
                    {
                        "role": role,
                        "skill": item["skill"],
                        "scope": item["scope"],
                        "stage_ids": item["stageIds"],
                        "href": f"../routes/{role['id']}.html#skill-{number}",
                    }
                )
    return {
        "project": project,
        "preparation": preparation,
        "used_by": used_by,
        "starter": _starter_context(project),
        "evidence": _evidence_context(project, index.catalog),
    }


def _evidence_context(project: dict, catalog: dict) -> dict | None:
    """The reference's own evidence (what its stage tests retained, with the stamps of
    the run that wrote it), as the sample dossier shows it; None without any."""
    folder = Path(project["folder"]) if project.get("folder") else None
    if folder is None or not (folder / "evidence" / "progress.json").is_file():
        return None
    stamps = dossier_module().progress.load_state(folder)["stages"].values()
    # The newest stamp, not the clock: the same evidence gives the same pages.
    newest = max((r.get("ran_at", "") for r in stamps), default="") or "never"
    data = dossier_module().collect(folder, project_roles(catalog, project["id"]), newest)
    return {"data": data, "dossier": f"../dossiers/{project['id']}/index.html"}


def _starter_context(project: dict) -> dict | None:
    """The "Start this project" section: only for a ready project with exercise regions."""
    exercises = project.get("exercises") or {}
    if project.get("status") != "ready" or not exercises or not project.get("folder"):
        return None
    return {
        "archive": f"learn/{project['id']}.zip",
        "stages": [
            {"stage": stage, "exercises": exercises.get(stage["id"], [])}
            for stage in project.get("stages", [])
        ],
    }


def _phase_context(phase: dict, index: _Index, lessons_by_phase: dict[str, list[dict]]) -> dict:
    lessons = lessons_by_phase.get(phase["id"], [])
    lesson_ids = {lesson["id"] for lesson in lessons}
    projects = []
    for project in index.projects.values():
        prepared = [lid for lid in project.get("preparation", []) if lid in lesson_ids]
        if prepared:
            projects.append(
                {
                    "project": project,
                    "lessons": prepared,
                    "href": f"../projects/{project['id']}.html",
                }
            )
    routes = [
        {"role": role, "href": f"../routes/{role['id']}.html"}
        for role in index.catalog["roles"]
        if any(phase["id"] in m.get("phaseIds", []) for m in role["milestones"])
    ]
    return {"phase": phase, "lessons": lessons, "projects": projects, "routes": routes}


def _index_context(index: _Index, lessons_by_phase: dict[str, list[dict]]) -> dict:
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
        "domains": domains,
        "unplaced": unplaced,
        "projects": list(index.projects.values()),
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
    "hardware"}]}``; every project gets a page, referenced or not.
    ``phases`` are ``{"id", "title"}``, ``lessons`` ``{"id", "phase",
    "title"}``, ``pathways`` ``{"id", "title", "summary"}``, ``tracks``
    ``{"id", "title"}``; pages list them in the order given.

    A reference to something not in these inputs (a project, phase or lesson
    the caller did not pass) is rendered as plain text, never as a broken
    link. Role, project and phase ids must be kebab-case (they name files);
    otherwise ``ValueError`` is raised before anything is written. Existing
    files other than the ones written are left alone. Returns the written
    paths: the stylesheet, the index, then route, project and phase pages.
    """
    site_dir = Path(site_dir)
    for role in catalog["roles"]:
        _check_file_id("role", role["id"])
    for project in projects:
        _check_file_id("project", project["id"])
    for phase in phases:
        _check_file_id("phase", phase["id"])

    index = _Index(
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
        context = _project_context(project, index)
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
    return written
