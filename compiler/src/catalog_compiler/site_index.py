"""Look-ups and links shared by every page of the static site.

Contract: :class:`SiteIndex` is built once from ``write_site``'s inputs and
answers, for any id, its entity and its page. Every href it returns is
relative to the site root (``projects/mlp-classifier.html#stage-1``); a
template prefixes the page's ``root`` (``""`` on the index, ``"../"`` one
folder down). A reference to something not passed in gives ``None``, and the
page then shows it as plain text, never as a broken link.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

REQUIRED_SCOPE = "Required route practice"

# Ids become file names; anything but kebab-case could escape the site folder
# or break a relative link, so it is refused before anything is written.
_FILE_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def check_file_id(kind: str, value: object) -> str:
    """``value`` if it is a kebab-case string; ``ValueError`` naming ``kind`` otherwise."""
    if not isinstance(value, str) or not _FILE_ID.match(value):
        raise ValueError(f"{kind} id {value!r} is not kebab-case; it cannot name a site page")
    return value


@dataclass
class SiteIndex:
    """The catalog and the lists of ``write_site``, keyed by id."""

    catalog: dict
    projects: dict[str, dict]
    phases: dict[str, dict]
    lessons: dict[str, dict]
    pathways: dict[str, dict]
    tracks: dict[str, dict]
    roles: dict[str, dict] = field(init=False)

    def __post_init__(self) -> None:
        self.roles = {role["id"]: role for role in self.catalog["roles"]}

    def project_href(self, project_id: str) -> str | None:
        return f"projects/{project_id}.html" if project_id in self.projects else None

    def stage(self, project_id: str, stage_id: str) -> dict | None:
        """The stage ``stage_id`` of project ``project_id`` as its manifest declares it."""
        project = self.projects.get(project_id) or {}
        return next((s for s in project.get("stages", []) if s["id"] == stage_id), None)

    def stage_href(self, project_id: str, stage_id: str) -> str | None:
        href = self.project_href(project_id)
        if href is None or self.stage(project_id, stage_id) is None:
            return None
        return f"{href}#stage-{stage_id}"

    def project_title(self, project_id: str) -> str:
        """The project's title; its id when the project was not passed in."""
        project = self.projects.get(project_id)
        return project["title"] if project else project_id

    def phase_href(self, phase_id: str) -> str | None:
        return f"phases/{phase_id}.html" if phase_id in self.phases else None

    def phase_title(self, phase_id: str) -> str:
        phase = self.phases.get(phase_id)
        return phase["title"] if phase else phase_id

    def lesson_href(self, lesson_id: str) -> str | None:
        return f"lessons/{lesson_id}.html" if lesson_id in self.lessons else None

    def lesson_label(self, lesson_id: str) -> str:
        lesson = self.lessons.get(lesson_id)
        return f"{lesson_id} {lesson['title']}" if lesson else lesson_id

    def route_href(self, role_id: str, anchor: str = "") -> str:
        return f"routes/{role_id}.html" + (f"#{anchor}" if anchor else "")

    def stage_links(self, project_id: str, stage_ids: list[str]) -> list[dict]:
        """``{"id", "title", "href"}`` per stage id, in the order given."""
        links = []
        for stage_id in stage_ids:
            stage = self.stage(project_id, stage_id)
            links.append(
                {
                    "id": stage_id,
                    "title": stage["title"] if stage else "",
                    "href": self.stage_href(project_id, stage_id),
                }
            )
        return links

    def route_phases(self, role: dict) -> dict[str, int]:
        """Each phase of ``role``'s required route -> the index of the first milestone citing it."""
        first: dict[str, int] = {}
        for number, milestone in enumerate(role["milestones"]):
            for phase_id in milestone.get("phaseIds", []):
                first.setdefault(phase_id, number)
        return first
