"""Load and schema-check every catalog source file under ``catalog/``.

Contract: :func:`load_catalog` reads ``catalog.yaml``, the list files and
every ``roles/*.yaml``; it returns a :class:`CatalogSources` holding the
typed objects that passed the schema pass, the ids that exist (also those of
entries that failed it, so one broken entry does not make every reference to
it a second error) and all diagnostics. A path that exists but is no readable
regular file (a folder, a symlink loop) is FIL004, not "missing". It never
raises on bad input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic, pointer
from catalog_compiler.models import LIST_FILES, CatalogRoot, Role
from catalog_compiler.schema import expect_mapping, validate
from catalog_compiler.source_text import exists
from catalog_compiler.yaml_source import Document, load_yaml

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    """A typed object and where it came from: document and JSON pointer."""

    obj: T
    doc: Document
    ptr: str = ""


@dataclass
class CatalogSources:
    """Everything read from ``catalog/`` (see the module docstring).

    ``known[kind]`` is the set of ids defined for ``kind`` (``lessons``,
    ``roles``, ...), or ``None`` when the file could not be read, in which
    case references to that kind are not checked.
    """

    root: Entry[CatalogRoot] | None = None
    roles: dict[str, Entry[Role]] = field(default_factory=dict)
    lists: dict[str, list[Entry[Any]]] = field(default_factory=dict)
    known: dict[str, set[str] | None] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    # False when some role file did not load or validate: its references are
    # then unknown, so "nobody references this project" cannot be decided.
    roles_complete: bool = True
    # The names (without .yaml) of the files in catalog/roles/.
    role_files: set[str] = field(default_factory=set)
    # Those of them that are no readable file (FIL004 says so; FIL002/FIL003 stay quiet).
    unreadable_roles: set[str] = field(default_factory=set)


def _read(file: Path, rel: str, out: CatalogSources) -> Document | None:
    if not exists(file):
        message = f"The catalog file `{rel}` does not exist."
        out.diagnostics.append(rules.MISSING_FILE.at(rel, START, "", message))
        return None
    doc, found = load_yaml(file, rel)
    out.diagnostics += found
    return doc


def _load_list(catalog: Path, name: str, out: CatalogSources) -> None:
    key, model = LIST_FILES[name]
    out.lists[key], out.known[key] = [], None
    doc = _read(catalog / name, f"catalog/{name}", out)
    if doc is None:
        return
    data, found = expect_mapping(doc, (key,), f"catalog/{name}")
    out.diagnostics += found
    items = data.get(key) if data else None
    if not isinstance(items, list):
        return
    known: set[str] = set()
    for index, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            known.add(item["id"])
        obj, found = validate(model, item, doc, pointer(key, index))
        out.diagnostics += found
        if obj is not None:
            out.lists[key].append(Entry(obj, doc, pointer(key, index)))
    out.known[key] = known


def load_catalog(root: Path) -> CatalogSources:
    """Read and schema-check ``<root>/catalog`` (see the module docstring)."""
    out = CatalogSources()
    catalog = root / "catalog"
    doc = _read(catalog / "catalog.yaml", "catalog/catalog.yaml", out)
    if doc is not None:
        obj, found = validate(CatalogRoot, doc.data, doc)
        out.diagnostics += found
        out.root = Entry(obj, doc) if obj else None
    for name in LIST_FILES:
        _load_list(catalog, name, out)
    role_dir = catalog / "roles"
    files = sorted(role_dir.glob("*.yaml")) if role_dir.is_dir() else []
    out.known["roles"] = set()
    out.role_files = {file.stem for file in files}
    if exists(role_dir) and not role_dir.is_dir():
        message = "`catalog/roles` is not a folder (or a symbolic link that leads nowhere)."
        out.diagnostics.append(rules.UNREADABLE_FILE.at("catalog/roles", START, "", message))
        out.roles_complete = False
        if out.root is not None:  # Their files cannot be looked for: no FIL002 either.
            out.role_files = out.unreadable_roles = set(out.root.obj.roles)
    for file in files:
        rel = f"catalog/roles/{file.name}"
        role_doc, found = load_yaml(file, rel)
        out.diagnostics += found
        if role_doc is None:
            out.known["roles"].add(file.stem)  # Its id is unknown; the name is the best guess.
            out.roles_complete = False
            if any(d.code == rules.UNREADABLE_FILE.code for d in found):
                out.unreadable_roles.add(file.stem)
            continue
        raw_id = role_doc.data.get("id") if isinstance(role_doc.data, dict) else None
        out.known["roles"].add(raw_id if isinstance(raw_id, str) else file.stem)
        role, found = validate(Role, role_doc.data, role_doc)
        out.diagnostics += found
        if role is None:
            out.roles_complete = False
        else:
            out.roles[file.stem] = Entry(role, role_doc)
    return out
