"""Discover the projects on disk: every folder under ``projects/``.

Contract: :func:`discover_projects` returns one :class:`Project` per folder
(sorted by name; hidden folders and caches skipped), with its manifest
parsed and schema-checked when ``project.toml`` exists, and the diagnostics
of doing so (TML001, SCH*, LIM*, FIL004/FIL005 for a manifest that is no
regular UTF-8 file, DSK001 for a folder without a manifest). It never raises
on bad input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic
from catalog_compiler.models import Manifest
from catalog_compiler.schema import validate
from catalog_compiler.source_text import exists
from catalog_compiler.toml_source import load_toml
from catalog_compiler.yaml_source import Document

MANIFEST = "project.toml"


@dataclass(frozen=True, slots=True)
class Project:
    """A folder under ``projects/``; ``manifest`` is None if absent or invalid."""

    folder: str
    path: Path
    has_manifest: bool
    manifest: Manifest | None = None
    doc: Document | None = None

    @property
    def manifest_file(self) -> str:
        return f"projects/{self.folder}/{MANIFEST}"


@dataclass
class Discovery:
    projects: dict[str, Project] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)


def discover_projects(root: Path) -> Discovery:
    """Scan ``<root>/projects`` (see the module docstring)."""
    out = Discovery()
    base = root / "projects"
    folders = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    for folder in folders:
        if folder.name.startswith((".", "_")):
            continue
        file = folder / MANIFEST
        rel = f"projects/{folder.name}/{MANIFEST}"
        if not exists(file):
            message = f"The project folder `projects/{folder.name}` has no `{MANIFEST}`."
            out.diagnostics.append(rules.NO_MANIFEST.at(rel, START, "", message))
            out.projects[folder.name] = Project(folder.name, folder, False)
            continue
        doc, found = load_toml(file, rel)
        out.diagnostics += found
        manifest = None
        if doc is not None:
            manifest, found = validate(Manifest, doc.data, doc)
            out.diagnostics += found
        out.projects[folder.name] = Project(folder.name, folder, True, manifest, doc)
    return out
