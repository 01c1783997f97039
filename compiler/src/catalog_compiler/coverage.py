"""Milestone coverage of one route, from evidence gathered across projects.

``catalog-compile coverage --role <id> EVIDENCE_DIR...``: each folder is a
project's `evidence/` as `progress.py` leaves it: `progress.json` (the
stamps, naming the project) beside `stage_<id>.json` files. A stage counts as
**demonstrated** when its stamp says passed, its evidence file is the one
stamped (same sha256), the folder sits in a project folder (a `project.toml`
beside it) whose stage code hash is still the stamped one, and, in a learner's
starter (`hints.json` beside it), the stage's regions are the learner's own
(the starter's `authorship`: written, present, not the reference's line for
line). Anything else is **remaining**, with the reason: evidence with no code
beside it ("no code beside this evidence to check it against") proves nothing
about anyone's code.

A skill is covered when every stage it cites is demonstrated. Skills group
under the milestones whose phases hold their lessons; required route
practice and optional extensions are kept apart, as the catalog's scopes
say. A section with nothing in it is left out, and so is a count of nothing
(the skills and counts are worded by the starter's `route_coverage.py`, as
`progress.py coverage` words them). Evidence of a project the route does not
cite is said in one line ("evidence of <project> is not cited by route
<role>"), not dropped in silence. Evidence that cannot be read, or that names a project or stage the
catalog does not know, is a diagnostic (COV001-COV003), never a crash.
Every file is read as `progress.py` reads it (``read_bytes``): a link, a
folder, a FIFO or another special file, one too large or unreadable, or a
path too long for the system is a reason, never a hang or a traceback.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic
from catalog_compiler.portfolio import authorship_module, progress_module, route_coverage_module

REQUIRED = "Required route practice"
REMEDY = (
    "pass the `evidence/` folder that `progress.py` wrote, its `progress.json` a regular "
    "file, by a path this system accepts"
)


@dataclass
class StageState:
    demonstrated: bool
    reason: str
    source: str


@dataclass
class SkillCoverage:
    skill: str
    project: str
    scope: str
    required: bool
    demonstrated: list[str] = field(default_factory=list)
    remaining: list[tuple[str, str]] = field(default_factory=list)  # (stage, reason)

    @property
    def covered(self) -> bool:
        return not self.remaining


@dataclass
class MilestoneCoverage:
    title: str
    deliverable: str
    skills: list[SkillCoverage]


@dataclass
class Coverage:
    role: dict
    milestones: list[MilestoneCoverage]
    unplaced: list[SkillCoverage]  # skills whose lessons lie in no milestone's phase
    diagnostics: list[Diagnostic]
    folders: dict[str, Path]  # project id -> the evidence folder read for it
    uncited: list[str] = field(default_factory=list)  # projects read that the route cites not

    def skills(self) -> list[SkillCoverage]:
        """Every skill once (a skill whose lessons span two milestones shows in both)."""
        seen: dict[int, SkillCoverage] = {}
        for skill in [s for m in self.milestones for s in m.skills] + self.unplaced:
            seen.setdefault(id(skill), skill)
        return list(seen.values())


def read_evidence(
    folders: list[Path], projects: dict[str, dict]
) -> tuple[dict[tuple[str, str], StageState], list[Diagnostic], dict[str, Path]]:
    """The state of every stage the folders hold evidence for, the diagnostics, and
    which folder was read for each project."""
    progress = progress_module()
    states: dict[tuple[str, str], StageState] = {}
    problems: list[Diagnostic] = []
    read: dict[str, Path] = {}
    for folder in folders:
        shown = str(folder)
        stamps_path = folder / "progress.json"
        try:
            stamps = progress.read_json(stamps_path, REMEDY)
            if stamps is None:
                raise FileNotFoundError(2, os.strerror(2))
            if not isinstance(stamps, dict) or not isinstance(stamps.get("stages"), dict):
                raise ValueError("no `stages` mapping")
            project_id = stamps["project"]
            if not isinstance(project_id, str):
                raise ValueError("`project` is not text")
        except (OSError, ValueError, KeyError, UnicodeDecodeError) as error:
            reason = (getattr(error, "strerror", None) or str(error)).rstrip(".")
            problems.append(
                rules.EVIDENCE_UNREADABLE.at(
                    f"{shown}/progress.json", START, "", f"Cannot read the stamps: {reason}."
                )
            )
            continue
        manifest = projects.get(project_id)
        if manifest is None:
            problems.append(
                rules.EVIDENCE_UNKNOWN_PROJECT.at(
                    f"{shown}/progress.json",
                    START,
                    "/project",
                    f"The evidence names project `{project_id}`, which the catalog does not know.",
                )
            )
            continue
        read[project_id] = folder
        stages = {s["id"]: s for s in manifest["stages"]}
        code = folder.parent if _is_file(folder.parent / "project.toml") else None
        for stage_id, record in stamps["stages"].items():
            stage = stages.get(stage_id)
            if stage is None:
                problems.append(
                    rules.EVIDENCE_UNKNOWN_STAGE.at(
                        f"{shown}/progress.json",
                        START,
                        f"/stages/{stage_id}",
                        f"Project `{project_id}` has no stage `{stage_id}`.",
                    )
                )
                continue
            states[(project_id, stage_id)] = _stage_state(progress, folder, code, stage, record)
    return states, problems, read


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a regular file or a link to one; False when it cannot be
    examined at all (too long a path, no permission), unlike ``Path.is_file``."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _stage_state(progress, folder: Path, code: Path | None, stage: dict, record) -> StageState:
    source = str(folder)
    if not isinstance(record, dict) or record.get("result") != "passed":
        return StageState(False, "its last run did not pass", source)
    evidence = folder / f"stage_{stage['id']}.json"
    if not _is_file(evidence):
        return StageState(False, "no evidence file", source)
    if code is None:
        return StageState(False, "no code beside this evidence to check it against", source)
    try:
        if record.get("evidence_sha256") != progress.file_sha256(evidence):
            return StageState(False, "its evidence changed since the stamp", source)
        if record.get("code_hash") != progress.stage_code_hash(code, stage["id"], stage["tests"]):
            return StageState(False, "its code changed since the run that passed", source)
        authored = authorship_module().stage_authorship(code, stage["id"])
        if authored is not None:
            return StageState(False, f"{authored[0]}: {authored[1]}", source)
    except OSError as error:  # progress.Unreadable included: its message names the file.
        return StageState(False, str(error).rstrip("."), source)
    return StageState(True, "passed and current", source)


def role_coverage(
    role: dict, lessons: dict[str, dict], projects: dict[str, dict], folders: list[Path]
) -> Coverage:
    states, problems, read = read_evidence(folders, projects)
    phase_of = {lesson_id: lesson["phase"] for lesson_id, lesson in lessons.items()}
    milestones = [MilestoneCoverage(m["title"], m["deliverable"], []) for m in role["milestones"]]
    unplaced: list[SkillCoverage] = []
    for item in role["skillEvidence"]:
        skill = SkillCoverage(
            item["skill"], item["projectId"], item["scope"], item["scope"] == REQUIRED
        )
        for stage_id in item["stageIds"]:
            state = states.get((item["projectId"], stage_id))
            if state and state.demonstrated:
                skill.demonstrated.append(stage_id)
            else:
                skill.remaining.append((stage_id, state.reason if state else "no evidence given"))
        phases = {phase_of.get(lesson_id) for lesson_id in item["lessonIds"]}
        homes = [
            m
            for m, src in zip(milestones, role["milestones"], strict=True)
            if phases & set(src["phaseIds"])
        ]
        for home in homes:
            home.skills.append(skill)
        if not homes:
            unplaced.append(skill)
    cited = {item["projectId"] for item in role["skillEvidence"]}
    uncited = sorted(set(read) - cited)
    return Coverage(role, milestones, unplaced, problems, read, uncited)


def text_report(coverage: Coverage) -> str:
    words = route_coverage_module()
    role = coverage.role
    lines = [f"{role['title']}: milestone coverage", ""]
    for d in coverage.diagnostics:
        lines.append(f"{d.file}: {d.severity.value}[{d.code}] {d.message}")
    for project in coverage.uncited:
        lines.append(f"evidence of {project} is not cited by route {role['id']}")
    if coverage.diagnostics or coverage.uncited:
        lines.append("")

    def skill_lines(skill: SkillCoverage) -> list[str]:
        done = [(stage, "") for stage in skill.demonstrated]
        shown = words.skill_lines(f"{skill.skill} ({skill.project})", done, skill.remaining)
        return ["    " + line for line in shown]

    for title, required in ((words.REQUIRED, True), (words.OPTIONAL, False)):
        section = []
        for milestone in coverage.milestones:
            mine = [s for s in milestone.skills if s.required is required]
            if mine:
                section.append(f"  {milestone.title}: {milestone.deliverable}")
                for skill in mine:
                    section += skill_lines(skill)
        rest = [s for s in coverage.unplaced if s.required is required]
        if rest:
            section.append("  Beyond the milestones:")
            for skill in rest:
                section += skill_lines(skill)
        if section:  # A heading over nothing says nothing: it is left out.
            lines += [f"{title}:", *section, ""]
    empty = [m.title for m in coverage.milestones if not m.skills]
    if empty:
        lines.append("Milestones no project stage evidences yet: " + "; ".join(empty) + ".")
    skills = coverage.skills()
    counts = words.tally(
        "skills",
        [s.covered for s in skills if s.required],
        [s.covered for s in skills if not s.required],
    )
    if counts:
        lines.append(counts)
    lines.append(role["scopeNote"])
    return "\n".join(lines) + "\n"
