"""What this project's stages evidence for one route: `python progress.py coverage`.

    python progress.py coverage --role ID   # the route's skills this project evidences

For the route ID of `roles.json` (the routes that cite this project, shipped
with the starter) it lists each skill the route cites this project for,
required route practice first, then optional extensions, and each of the
skill's stages as demonstrated or remaining, with the reason. A stage is
demonstrated exactly when the dossier shows it so (:func:`dossier.stage_status`:
its last run passed and neither its code nor its evidence changed since); a
skill is covered when all its stages are. `roles.json` does not say which of
the route's milestones each skill serves, so the report groups by skill and
says so; the whole route, milestone by milestone and across its projects, is
`catalog-compile coverage` in the catalog repository. A section with nothing
in it is left out, and so is a count of nothing.

It runs no test and reads only `roles.json`, `project.toml`, the stamps, the
evidence files and the code, each as `progress.py` reads them. Without
`--role` it lists the routes of `roles.json`; an unknown route is named with
the known ones; a `roles.json` that is missing or not of the shape the
starter ships is said in one line. Exit status: 0 when every stage the route
cites here is demonstrated, 1 when one remains, 2 for those usage problems
or an unusable file.

The repository's `catalog-compile coverage` renders its skills and counts
with :func:`skill_lines` and :func:`tally`, so both say the same in the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import dossier
import progress

REQUIRED, OPTIONAL = "Required route practice", "Optional extensions"
USAGE = "usage: python progress.py coverage --role ID"
NO_MILESTONES = (
    "roles.json does not say which of the route's milestones each skill serves; "
    "`catalog-compile coverage --role {id}` in the catalog repository groups the "
    "whole route by milestone."
)


def skill_lines(
    label: str, demonstrated: list[tuple[str, str]], remaining: list[tuple[str, str]]
) -> list[str]:
    """One skill: its mark (covered when nothing remains), then each stage with its
    reason, demonstrated ones first; the reason is left out when it is empty."""
    lines = [f"- [{'remaining' if remaining else 'covered'}] {label}"]
    for word, stages in (("demonstrated", demonstrated), ("remaining", remaining)):
        for stage, reason in stages:
            lines.append(f"    {word}: stage {stage}" + (f" ({reason})" if reason else ""))
    return lines


def tally(noun: str, required: list[bool], optional: list[bool]) -> str:
    """``Required <noun> covered: n of m; optional: n of m.`` for the parts that have
    any (each list holds one covered flag per item); "" when neither has."""
    parts = [
        f"{name} {noun} covered: {sum(flags)} of {len(flags)}"
        for name, flags in (("Required", required), ("Optional", optional))
        if flags
    ]
    return "; ".join(parts) + "." if parts else ""


def load_roles(folder: Path) -> dict:
    """`roles.json` as the starter ships it, each route with its `id`; else
    :class:`progress.Unreadable` with one line (missing, not JSON, another shape)."""
    path = folder / "roles.json"
    try:
        roles = progress.read_json(path, progress.RESTORE)
    except ValueError as error:
        raise progress.Unreadable(
            f"{progress.shown(path, folder)} is not valid JSON ({error}): {progress.RESTORE}."
        ) from None
    if roles is None:
        raise progress.Unreadable(f"{progress.shown(path, folder)} is missing: {progress.RESTORE}.")
    problem = dossier._roles_problem(roles)
    if problem is None and not all(isinstance(r.get("id"), str) for r in roles["roles"]):
        problem = "holds a route without its id"
    if problem:
        raise progress.Unreadable(f"{progress.shown(path, folder)} {problem}: {progress.RESTORE}.")
    return roles


def report(folder: Path, role: dict, scope_note: str = "") -> tuple[int, str]:
    """(exit status, text) of the route ``role`` (one entry of `roles.json`) for the
    project in ``folder``; see the module docstring."""
    project = progress.manifest(folder)
    state = progress.load_state(folder)
    stages = {stage["id"]: stage for stage in project["stages"]}
    judged: dict[str, tuple[str, str]] = {}  # stage id -> (status, reason)
    for stage_id in dict.fromkeys(sid for s in role["skills"] for sid in s["stageIds"]):
        stage = stages.get(stage_id)
        if stage is None:
            judged[stage_id] = ("missing", f"project `{project['id']}` has no such stage")
        else:
            judged[stage_id] = dossier.stage_status(folder, stage, state["stages"].get(stage_id))
    lines = [f"{role['title']}: what project `{project['id']}` evidences for it", ""]
    covered: dict[bool, list[bool]] = {True: [], False: []}
    for title, required in ((REQUIRED, True), (OPTIONAL, False)):
        mine = [s for s in role["skills"] if (s["scope"] == REQUIRED) is required]
        if not mine:
            continue
        lines.append(f"{title}:")
        for skill in mine:
            done, left = [], []
            for sid in skill["stageIds"]:
                status, reason = judged[sid]
                if status == dossier.DEMONSTRATED:
                    done.append((sid, reason))
                else:
                    left.append((sid, f"{status}: {reason}"))
            covered[required].append(not left)
            lines += ["  " + line for line in skill_lines(skill["skill"], done, left)]
        lines.append("")
    demonstrated = sum(status == dossier.DEMONSTRATED for status, _ in judged.values())
    counts = tally("skills", covered[True], covered[False])
    if counts:
        lines.append(counts)
    lines.append(
        f"Stages this route cites here: {demonstrated} demonstrated, "
        f"{len(judged) - demonstrated} remaining."
    )
    lines.append(NO_MILESTONES.format(id=role["id"]))
    if scope_note:
        lines.append(scope_note)
    return (0 if demonstrated == len(judged) else 1), "\n".join(lines)


def main(argv: list[str], folder: Path = progress.HERE) -> int:
    roles = load_roles(folder)
    known = [r["id"] for r in roles["roles"]]
    listed = ", ".join(known) or "none"
    role_id = None
    if len(argv) == 2 and argv[0] == "--role":
        role_id = argv[1]
    elif len(argv) == 1 and argv[0].startswith("--role="):
        role_id = argv[0].split("=", 1)[1]
    if role_id is None:
        print(f"{USAGE}  (routes citing this project: {listed})", file=sys.stderr)
        return 2
    role = next((r for r in roles["roles"] if r["id"] == role_id), None)
    if role is None:
        print(
            f"progress.py coverage: no route `{role_id}` in roles.json; known: {listed}.",
            file=sys.stderr,
        )
        return 2
    note = roles.get("scopeNote")
    code, text = report(folder, role, note if isinstance(note, str) else "")
    print(text)
    return code
