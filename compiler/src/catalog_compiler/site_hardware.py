"""The hardware each project stage needs, and where its tests last ran on an accelerator.

Contract:

- :func:`accelerator_runs` is, per stage id of a project with a ``folder``,
  the summary of its accelerator report (``accelerator.stage_summaries``:
  verdict, device, date, commit, counts per mode, seeded bugs, ``current``);
  empty without a folder or a report.
- :func:`hardware_text` is one line naming the hardware a project's stages
  declare (their manifest ``hardware``): ``needs: cpu`` when every stage
  declares the same, else ``needs: cpu (stages 1, 2), tpu (stage 3)`` in the
  order of the stages.
- :func:`route_hardware` is the rows of a route page's hardware table: each
  project stage the role's skill evidence cites, once, in the order of first
  citation, with its hardware (``None`` for a project or stage not passed to
  ``write_site``) and its accelerator run (``None`` without one).
"""

from __future__ import annotations

from pathlib import Path

from catalog_compiler import accelerator
from catalog_compiler.site_index import SiteIndex


def accelerator_runs(project: dict) -> dict[str, dict]:
    """Stage id -> where its tests last ran on an accelerator (module docstring)."""
    folder = Path(project["folder"]) if project.get("folder") else None
    return (accelerator.stage_summaries(folder) if folder else None) or {}


def hardware_text(project: dict) -> str:
    """The hardware the project's stages need, as one line (module docstring)."""
    stages: dict[str, list[str]] = {}
    for stage in project.get("stages", []):
        stages.setdefault(stage["hardware"], []).append(stage["id"])
    if not stages:
        return "no stages"
    if len(stages) == 1:
        return f"needs: {next(iter(stages))}"
    parts = [
        f"{hardware} (stage{'s' if len(ids) > 1 else ''} {', '.join(ids)})"
        for hardware, ids in stages.items()
    ]
    return "needs: " + ", ".join(parts)


def route_hardware(role: dict, index: SiteIndex) -> list[dict]:
    """``[{"project": {"title", "href"}, "stage": {"id", "title", "href"}, "hardware",
    "run"}]``: the role's cited stages (module docstring)."""
    rows: list[dict] = []
    seen: set[tuple[str, str]] = set()
    runs: dict[str, dict[str, dict]] = {}
    for item in role["skillEvidence"]:
        project_id = item["projectId"]
        project = index.projects.get(project_id)
        if project is not None and project_id not in runs:
            runs[project_id] = accelerator_runs(project)
        for link in index.stage_links(project_id, item["stageIds"]):
            if (project_id, link["id"]) in seen:
                continue
            seen.add((project_id, link["id"]))
            stage = index.stage(project_id, link["id"])
            rows.append(
                {
                    "project": {
                        "title": index.project_title(project_id),
                        "href": index.project_href(project_id),
                    },
                    "stage": link,
                    "hardware": stage["hardware"] if stage else None,
                    "run": runs.get(project_id, {}).get(link["id"]),
                }
            )
    return rows
