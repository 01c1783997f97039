"""The context of a project page (``projects/<project-id>.html``).

Contract of :func:`project_context`: the project, whether it is the
exemplar, its size, the "Start this project" section (only for a ready
project with a folder and exercise regions), the lead of its own README
(:func:`readme_lead`), its reference evidence, where each stage last ran on
an accelerator, its preparation lessons and the routes and skills citing it.
Everything is data for an autoescaping template: nothing here is markup.
"""

from __future__ import annotations

import re
from pathlib import Path

from catalog_compiler.portfolio import dossier_module, project_roles
from catalog_compiler.site_hardware import accelerator_runs
from catalog_compiler.site_index import SiteIndex
from catalog_compiler.site_start import exemplar_id, project_size, size_text

README = "README.md"
FENCE = "```"
# Markdown kept as plain text: emphasis markers and link targets are dropped,
# inline code is kept apart so that a template can show it as code.
EMPHASIS = re.compile(r"\*{1,2}([^*\s](?:[^*]*[^*\s])?)\*{1,2}")
LINK = re.compile(r"\[([^\]]+)\]\([^)\s]+\)")
BULLET = re.compile(r"^\s{0,3}[-*] ")
HEADING = re.compile(r"^#{1,6}(?:\s|$)")


def project_context(project: dict, index: SiteIndex) -> dict:
    """The template context of ``projects/<project-id>.html`` (module docstring)."""
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
                        "href": index.route_href(role["id"], f"skill-{number}"),
                    }
                )
    folder = Path(project["folder"]) if project.get("folder") else None
    return {
        "project": project,
        "exemplar": project["id"] == exemplar_id(index),
        "size_text": size_text(project_size(project)),
        "preparation": preparation,
        "used_by": used_by,
        "starter": _starter_context(project),
        "lead": readme_lead(folder) if folder else [],
        "evidence": _evidence_context(project, index.catalog),
        "accelerator": accelerator_runs(project),
    }


def _inline(text: str) -> list[dict]:
    """``text`` as ``[{"text", "code"}]``: backtick spans are code, the rest plain."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans, the text as written
        parts = [text]
    segments = []
    for number, part in enumerate(parts):
        code = number % 2 == 1
        if not code:
            part = EMPHASIS.sub(r"\1", LINK.sub(r"\1", part))
        if part:
            segments.append({"text": part, "code": code})
    return segments


def readme_lead(folder: Path) -> list[dict]:
    """The lead of ``folder/README.md``: its blocks after the ``# `` title and before
    the next heading, ``[{"kind": "p" | "ul" | "pre", ...}]``.

    A paragraph (``"p"``) and a bulleted list (``"ul"``) have ``"items"``, each
    item the segments of :func:`_inline` (source lines joined by spaces); a
    fenced code block (``"pre"``) has its ``"text"`` as written. Empty without
    a README, a title or any text before the next heading.
    """
    path = folder / README
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith("# ")), None)
    if start is None:
        return []
    blocks: list[dict] = []
    current: dict | None = None  # the paragraph or list that a next line continues
    fenced: list[str] | None = None
    for line in lines[start + 1 :]:
        if fenced is not None:
            if line.strip().startswith(FENCE):
                blocks.append({"kind": "pre", "text": "\n".join(fenced)})
                fenced = None
            else:
                fenced.append(line)
            continue
        stripped = line.strip()
        if HEADING.match(line):
            break
        if stripped.startswith(FENCE):
            current, fenced = None, []
        elif not stripped:
            current = None
        elif BULLET.match(line):
            if current is None or current["kind"] != "ul":
                current = {"kind": "ul", "items": []}
                blocks.append(current)
            current["items"].append([stripped[2:].strip()])
        else:
            if current is None:
                current = {"kind": "p", "items": [[]]}
                blocks.append(current)
            current["items"][-1].append(stripped)
    for block in blocks:
        if block["kind"] != "pre":
            block["items"] = [_inline(" ".join(item)) for item in block["items"]]
    return blocks


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
    return {"data": data, "dossier": f"dossiers/{project['id']}/index.html"}


def _starter_context(project: dict) -> dict | None:
    """The "Start this project" section: only for a ready project with exercise regions.

    Each exercise's ``line`` is that of its opening marker in the starter (the
    learner's file, every region stripped), as ``build.site_inputs`` counts it.
    """
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
