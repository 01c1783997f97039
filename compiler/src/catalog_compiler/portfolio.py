"""What a project's evidence means for the routes that cite it.

- :func:`project_roles` is the `roles.json` a starter ships: every route
  whose skill evidence points at the project, with those skills (stages,
  scope, evidence, review criterion), the route's review questions, its
  portfolio and the scope note.
- :func:`progress_module`, :func:`dossier_module` and
  :func:`route_coverage_module` load the starter's own `progress.py`,
  `dossier.py` and `route_coverage.py` (the templates shipped in this
  package), so the compiler judges evidence, renders a sample dossier and
  words a route's coverage with exactly the code a learner runs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import cache
from importlib import resources
from types import ModuleType


def project_roles(catalog: dict, project_id: str) -> dict:
    """The routes citing ``project_id``, as `roles.json` holds them (see the module doc)."""
    roles = []
    scope_note = ""
    for role in catalog["roles"]:
        skills = [
            {
                "skill": item["skill"],
                "stageIds": list(item["stageIds"]),
                "scope": item["scope"],
                "evidence": item["evidence"],
                "reviewCriterion": item["reviewCriterion"],
            }
            for item in role["skillEvidence"]
            if item["projectId"] == project_id
        ]
        if skills:
            scope_note = scope_note or role["scopeNote"]
            roles.append(
                {
                    "id": role["id"],
                    "title": role["title"],
                    "portfolio": role["portfolio"],
                    "reviewQuestions": list(role["reviewQuestions"]),
                    "skills": skills,
                }
            )
    return {"project": project_id, "scopeNote": scope_note, "roles": roles}


def roles_json(catalog: dict, project_id: str) -> bytes:
    return (json.dumps(project_roles(catalog, project_id), indent=1) + "\n").encode("utf-8")


def _template_module(name: str) -> ModuleType:
    path = resources.files("catalog_compiler").joinpath("templates", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    # `dossier` imports `progress` by name, as it does inside a starter.
    previous = sys.modules.get(name)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
        raise
    return module


@cache
def progress_module() -> ModuleType:
    # `progress` imports these by name, as in a starter.
    _template_module("learner_files")
    _template_module("failed_check")
    return _template_module("progress")


@cache
def authorship_module() -> ModuleType:
    progress_module()
    _template_module("hints")  # `authorship` imports `hints` and `progress` by name.
    return _template_module("authorship")


@cache
def dossier_module() -> ModuleType:
    authorship_module()  # `dossier` imports `authorship` by name.
    return _template_module("dossier")


@cache
def route_coverage_module() -> ModuleType:
    dossier_module()  # `route_coverage` imports `progress` and `dossier` by name.
    return _template_module("route_coverage")
