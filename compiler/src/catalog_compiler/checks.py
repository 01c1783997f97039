"""The rules pass: cross-reference checks on the typed objects.

Each check is a small function registered with :func:`check`; it reads the
:class:`Context` (catalog sources plus projects on disk) and yields
diagnostics. Checks never stop a run: :func:`run_checks` runs them all and
returns everything they found. Only objects that passed the schema pass are
checked, and a reference is only checked against a kind whose file could be
read, so one broken file does not cascade into errors elsewhere.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic, pointer
from catalog_compiler.discover import Discovery, Project
from catalog_compiler.limits import MAX_ID_LENGTH
from catalog_compiler.rules import Rule
from catalog_compiler.source_text import exists
from catalog_compiler.sources import CatalogSources
from catalog_compiler.yaml_source import Document

KEBAB = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


@dataclass
class Context:
    """What the checks read: the catalog sources and the projects on disk."""

    sources: CatalogSources
    discovery: Discovery
    _known: dict[str, set[str] | None] = field(default_factory=dict)

    def known(self, kind: str) -> set[str] | None:
        """The ids of ``kind`` that exist, or None if they cannot be known (cached)."""
        if kind not in self._known:
            if kind == "projects":
                found = {f for f, p in self.discovery.projects.items() if p.has_manifest}
            elif kind == "roles" and self.sources.root is not None:
                found = set(self.sources.root.obj.roles)
            else:
                found = self.sources.known.get(kind)
            self._known[kind] = found
        return self._known[kind]


Check = Callable[[Context], Iterable[Diagnostic]]
CHECKS: list[Check] = []


def check(function: Check) -> Check:
    """Register ``function`` as a check of the rules pass."""
    CHECKS.append(function)
    return function


def run_checks(context: Context) -> list[Diagnostic]:
    """Run every registered check and return all their diagnostics."""
    return [d for function in CHECKS for d in function(context)]


# Helpers -------------------------------------------------------------------

_KIND_WORD = {
    "pathways": "pathway",
    "tracks": "modality track",
    "phases": "phase",
    "projects": "project",
    "lessons": "lesson",
    "roles": "role",
}
_KIND_RULE = {
    "pathways": rules.UNKNOWN_PATHWAY,
    "tracks": rules.UNKNOWN_TRACK,
    "phases": rules.UNKNOWN_PHASE,
    "projects": rules.UNKNOWN_PROJECT,
    "lessons": rules.UNKNOWN_LESSON,
    "roles": rules.UNKNOWN_ROLE,
}


def unknown_ref(
    rule: Rule, word: str, value: str, known: Iterable[str], doc: Document, ptr: str
) -> Diagnostic:
    """A "no such id" diagnostic that suggests the closest known id."""
    close = difflib.get_close_matches(value, sorted(known), n=1, cutoff=0.6)
    message = f"The {word} `{value}` does not exist" + (
        f"; did you mean `{close[0]}`?" if close else "."
    )
    hint = f"Replace it with `{close[0]}`." if close else None
    return rule.at(doc.path, doc.pos(ptr), ptr, message, hint)


def ref(ctx: Context, kind: str, value: str, doc: Document, ptr: str) -> Iterator[Diagnostic]:
    """Check that the single id ``value`` (at ``ptr``) names a known ``kind``."""
    known = ctx.known(kind)
    if known is not None and value not in known:
        yield unknown_ref(_KIND_RULE[kind], _KIND_WORD[kind], value, known, doc, ptr)


def refs(
    ctx: Context, kind: str, values: list[str], doc: Document, base: str
) -> Iterator[Diagnostic]:
    """Check each id of the list ``values`` (at ``base/<i>``): known, listed once."""
    seen: set[str] = set()
    for index, value in enumerate(values):
        ptr = f"{base}/{index}"
        if value in seen:
            message = f"The {_KIND_WORD[kind]} `{value}` is listed twice."
            yield rules.DUPLICATE_ID.at(doc.path, doc.pos(ptr), ptr, message)
        seen.add(value)
        yield from ref(ctx, kind, value, doc, ptr)


def definitions(word: str, items: Iterable[tuple[str, Document, str]]) -> Iterator[Diagnostic]:
    """Check defined ids ``(id, doc, ptr-of-id)``: kebab-case (ID002), unique (ID001),
    at most MAX_ID_LENGTH characters (ID005)."""
    first: dict[str, str] = {}
    for value, doc, ptr in items:
        if len(value) > MAX_ID_LENGTH:
            message = (
                f"The {word} id `{value[:40]}...` is {len(value)} characters long, "
                f"more than {MAX_ID_LENGTH}."
            )
            yield rules.ID_TOO_LONG.at(doc.path, doc.pos(ptr), ptr, message)
        if not KEBAB.fullmatch(value):
            shown = value if len(value) <= MAX_ID_LENGTH else value[:40] + "..."
            message = f"The {word} id `{shown}` is not kebab-case."
            yield rules.NOT_KEBAB.at(doc.path, doc.pos(ptr), ptr, message)
        where = f"{doc.path}:{doc.pos(ptr).line}"
        if value in first:
            message = f"The {word} id `{value}` is defined twice (first at {first[value]})."
            yield rules.DUPLICATE_ID.at(doc.path, doc.pos(ptr), ptr, message)
        else:
            first[value] = where


# Identifiers ---------------------------------------------------------------


@check
def catalog_role_listing(ctx: Context) -> Iterator[Diagnostic]:
    """FIL002/FIL003/ID001/ID002: catalog.yaml `roles` and the role files agree."""
    root = ctx.sources.root
    if root is None:
        return
    doc, listed = root.doc, root.obj.roles
    yield from definitions("role", ((r, doc, pointer("roles", i)) for i, r in enumerate(listed)))
    files = ctx.sources.role_files
    for index, role_id in enumerate(listed):
        if role_id not in files and role_id not in ctx.sources.unreadable_roles:
            ptr = pointer("roles", index)
            close = difflib.get_close_matches(role_id, sorted(files - set(listed)), n=1)
            message = (
                f"The role `{role_id}` is listed but `catalog/roles/{role_id}.yaml` does not exist"
                + (f"; did you mean `{close[0]}`?" if close else ".")
            )
            hint = f"Replace it with `{close[0]}`." if close else None
            yield rules.ROLE_FILE_MISSING.at(doc.path, doc.pos(ptr), ptr, message, hint)
    for role_id in sorted(files - set(listed) - ctx.sources.unreadable_roles):
        rel = f"catalog/roles/{role_id}.yaml"
        message = f"The role file `{rel}` is not listed in catalog.yaml `roles`."
        yield rules.ROLE_FILE_UNLISTED.at(rel, START, "", message)


@check
def role_file_names(ctx: Context) -> Iterator[Diagnostic]:
    """ID004: a role's `id` equals its file name."""
    for stem, entry in ctx.sources.roles.items():
        if entry.obj.id != stem:
            message = f"The role id `{entry.obj.id}` differs from its file name `{stem}.yaml`."
            hint = f"Set `id: {stem}` or rename the file to `{entry.obj.id}.yaml`."
            yield rules.NAME_MISMATCH.at(entry.doc.path, entry.doc.pos("/id"), "/id", message, hint)


@check
def list_definitions(ctx: Context) -> Iterator[Diagnostic]:
    """ID001/ID002 for domains, pathways, phases, tracks and lessons."""
    for kind, entries in ctx.sources.lists.items():
        word = _KIND_WORD.get(kind, kind.rstrip("s"))
        yield from definitions(word, ((e.obj.id, e.doc, e.ptr + "/id") for e in entries))


@check
def lesson_ids(ctx: Context) -> Iterator[Diagnostic]:
    """ID003 and REF003: a lesson's id is `<phase>-NN` and its phase exists."""
    for entry in ctx.sources.lists.get("lessons", []):
        lesson, doc = entry.obj, entry.doc
        yield from ref(ctx, "phases", lesson.phase, doc, entry.ptr + "/phase")
        if not re.fullmatch(re.escape(lesson.phase) + r"-\d\d", lesson.id):
            ptr = entry.ptr + "/id"
            message = f"The lesson id `{lesson.id}` does not match its phase `{lesson.phase}`."
            hint = f"Name it `{lesson.phase}-NN` (two digits), or correct its `phase`."
            yield rules.LESSON_PHASE.at(doc.path, doc.pos(ptr), ptr, message, hint)


@check
def manifests(ctx: Context) -> Iterator[Diagnostic]:
    """ID001/ID002/ID004/REF006: a manifest's ids and preparation lessons."""
    for folder, project in ctx.discovery.projects.items():
        manifest, doc = project.manifest, project.doc
        if manifest is None or doc is None:
            continue
        yield from definitions("project", [(manifest.id, doc, "/id")])
        if manifest.id != folder:
            message = f"The manifest id `{manifest.id}` differs from its folder name `{folder}`."
            hint = f'Set `id = "{folder}"` or rename the folder.'
            yield rules.NAME_MISMATCH.at(doc.path, doc.pos("/id"), "/id", message, hint)
        stages = ((s.id, doc, pointer("stages", i, "id")) for i, s in enumerate(manifest.stages))
        yield from definitions("stage", stages)
        yield from refs(ctx, "lessons", manifest.preparation, doc, "/preparation")


# References ----------------------------------------------------------------


@check
def role_references(ctx: Context) -> Iterator[Diagnostic]:
    """REF001-REF006, REF008-REF010, ID001/ID002: what a role points at resolves."""
    for entry in ctx.sources.roles.values():
        role, doc = entry.obj, entry.doc
        yield from definitions("role", [(role.id, doc, "/id")])
        yield from refs(ctx, "pathways", role.pathwayIds, doc, "/pathwayIds")
        yield from ref(ctx, "pathways", role.defaultPathwayId, doc, "/defaultPathwayId")
        if role.defaultPathwayId not in role.pathwayIds:
            yield _default_pathway(role.defaultPathwayId, doc, "/defaultPathwayId")
        yield from refs(ctx, "tracks", role.modalityTrackIds, doc, "/modalityTrackIds")
        for i, milestone in enumerate(role.milestones):
            yield from refs(
                ctx, "phases", milestone.phaseIds, doc, pointer("milestones", i, "phaseIds")
            )
        for i, start in enumerate(role.startingPointChecks):
            yield from ref(
                ctx, "phases", start.phaseId, doc, pointer("startingPointChecks", i, "phaseId")
            )
        for i, evidence in enumerate(role.skillEvidence):
            base = pointer("skillEvidence", i)
            if evidence.skill not in role.skills:
                message = f"The skill `{evidence.skill}` is not one of this role's `skills`."
                yield rules.EVIDENCE_SKILL.at(
                    doc.path, doc.pos(base + "/skill"), base + "/skill", message
                )
            yield from refs(ctx, "lessons", evidence.lessonIds, doc, base + "/lessonIds")
            yield from _project_reference(ctx, evidence.projectId, evidence.stageIds, doc, base)


def _default_pathway(value: str, doc: Document, ptr: str) -> Diagnostic:
    message = f"The default pathway `{value}` is not one of `pathwayIds`."
    return rules.DEFAULT_PATHWAY.at(doc.path, doc.pos(ptr), ptr, message)


def _project_reference(
    ctx: Context, project_id: str, stage_ids: list[str], doc: Document, base: str
) -> Iterator[Diagnostic]:
    """REF004/REF005/ID001 for one skill evidence entry at ``base``."""
    ptr = base + "/projectId"
    project = ctx.discovery.projects.get(project_id)
    if project is None:
        yield unknown_ref(
            rules.UNKNOWN_PROJECT, "project", project_id, ctx.known("projects"), doc, ptr
        )
        return
    if not project.has_manifest:
        message = f"The project `{project_id}` has a folder but no `project.toml`."
        hint = f"Add `projects/{project_id}/project.toml`."
        yield rules.UNKNOWN_PROJECT.at(doc.path, doc.pos(ptr), ptr, message, hint)
        return
    manifest = project.manifest
    if manifest is None:
        return  # Its manifest has schema errors of its own; stages are unknown.
    declared = [s.id for s in manifest.stages]
    seen: set[str] = set()
    for index, stage in enumerate(stage_ids):
        sptr = f"{base}/stageIds/{index}"
        if stage in seen:
            message = f"The stage `{stage}` is listed twice."
            yield rules.DUPLICATE_ID.at(doc.path, doc.pos(sptr), sptr, message)
        seen.add(stage)
        if stage not in declared:
            has = ", ".join(declared) or "none"
            where = _stage_list(project, stage, declared)
            message = (
                f"The project `{project_id}` declares no stage `{stage}` (it has {has}); "
                f"its stages are declared at `{where}`."
            )
            hint = f"Use a stage id of `{project.manifest_file}`, or declare stage `{stage}` there."
            yield rules.UNKNOWN_STAGE.at(doc.path, doc.pos(sptr), sptr, message, hint)


def _stage_list(project: Project, stage: str, declared: list[str]) -> str:
    """``file:line`` of the manifest's stage closest to ``stage`` (or of its first)."""
    close = difflib.get_close_matches(stage, declared, n=1, cutoff=0.5)
    if close:
        ptr = pointer("stages", declared.index(close[0]), "id")
    else:
        ptr = pointer("stages", 0) if declared else ""
    line = project.doc.pos(ptr).line if project.doc is not None else 1
    return f"{project.manifest_file}:{line}"


@check
def domain_references(ctx: Context) -> Iterator[Diagnostic]:
    """REF001/REF007/REF008: what a domain points at resolves."""
    for entry in ctx.sources.lists.get("domains", []):
        domain, doc, base = entry.obj, entry.doc, entry.ptr
        yield from refs(ctx, "roles", domain.roleIds, doc, base + "/roleIds")
        yield from refs(ctx, "pathways", domain.pathwayIds, doc, base + "/pathwayIds")
        yield from ref(ctx, "pathways", domain.defaultPathwayId, doc, base + "/defaultPathwayId")
        if domain.defaultPathwayId not in domain.pathwayIds:
            yield _default_pathway(domain.defaultPathwayId, doc, base + "/defaultPathwayId")


@check
def planned_projects(ctx: Context) -> Iterator[Diagnostic]:
    """REF009 (warning): a referenced project is `planned`; reported once per project.

    Reported at its first reference in published role order: the remedy is
    in the project, so one warning per reference would only repeat it.
    """
    root = ctx.sources.root
    rank = {role_id: i for i, role_id in enumerate(root.obj.roles)} if root else {}
    roles = sorted(ctx.sources.roles.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))
    references: dict[str, list[tuple[Document, str]]] = {}
    for _, entry in roles:
        for i, evidence in enumerate(entry.obj.skillEvidence):
            references.setdefault(evidence.projectId, []).append(
                (entry.doc, pointer("skillEvidence", i, "projectId"))
            )
    for project_id, places in references.items():
        project = ctx.discovery.projects.get(project_id)
        if project is None or project.manifest is None or project.manifest.status != "planned":
            continue
        doc, ptr = places[0]
        users = _plural(len(places), "skill evidence entry", "skill evidence entries")
        message = f"The project `{project_id}` is `planned`, not `ready` (referenced by {users})."
        yield rules.PLANNED_PROJECT.at(doc.path, doc.pos(ptr), ptr, message)


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


# Disk ----------------------------------------------------------------------


@check
def unreferenced_projects(ctx: Context) -> Iterator[Diagnostic]:
    """DSK002: every project with a manifest is referenced by some role."""
    if not ctx.sources.roles_complete:
        return  # A role that failed to load may be the one that references it.
    used = {e.projectId for r in ctx.sources.roles.values() for e in r.obj.skillEvidence}
    for folder, project in ctx.discovery.projects.items():
        if project.has_manifest and folder not in used:
            message = f"No role's skill evidence references the project `{folder}`."
            yield rules.UNREFERENCED.at(project.manifest_file, START, "", message)


def _outside(folder: Path, test: str) -> bool:
    """True if the stage test path ``test`` is absolute or leads out of ``folder``.

    Lexically first (absolute, ``..``); then through symbolic links, resolving
    only when one of its components is a link (most paths have none).
    """
    pure = PurePosixPath(test)
    if pure.is_absolute() or ".." in pure.parts:
        return True
    try:
        current = folder
        for part in pure.parts:
            current = current / part
            if current.is_symlink():
                return not (folder / test).resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError, ValueError):
        return False  # Unresolvable (a symlink loop, a NUL): DSK004 reports it as missing.
    return False


@check
def stage_test_paths(ctx: Context) -> Iterator[Diagnostic]:
    """DSK005: every stage test path stays inside its project folder."""
    for project in ctx.discovery.projects.values():
        manifest, doc = project.manifest, project.doc
        if manifest is None or doc is None:
            continue
        for i, stage in enumerate(manifest.stages):
            for j, test in enumerate(stage.tests):
                if _outside(project.path, test):
                    ptr = pointer("stages", i, "tests", j)
                    message = (
                        f"The test path `{test}` of stage `{stage.id}` leads out of "
                        f"`projects/{project.folder}`."
                    )
                    yield rules.TEST_PATH_OUTSIDE.at(doc.path, doc.pos(ptr), ptr, message)


@check
def ready_project_tests(ctx: Context) -> Iterator[Diagnostic]:
    """DSK003/DSK004: a `ready` project has an existing test file for every stage."""
    for project in ctx.discovery.projects.values():
        manifest, doc = project.manifest, project.doc
        if manifest is None or doc is None or manifest.status != "ready":
            continue
        for i, stage in enumerate(manifest.stages):
            ptr = pointer("stages", i, "tests")
            if not stage.tests:
                message = (
                    f"The stage `{stage.id}` of the ready project `{project.folder}` "
                    "lists no test file."
                )
                yield rules.STAGE_WITHOUT_TEST.at(doc.path, doc.pos(ptr), ptr, message)
            for j, test in enumerate(stage.tests):
                if _outside(project.path, test):
                    continue  # DSK005 says so.
                path = project.path / test
                if not path.is_file():
                    tptr = f"{ptr}/{j}"
                    what = "is not a file" if exists(path) else "does not exist"
                    message = (
                        f"The test file `{test}` of stage `{stage.id}` {what} "
                        f"in `projects/{project.folder}`."
                    )
                    yield rules.TEST_FILE_MISSING.at(doc.path, doc.pos(tptr), tptr, message)
