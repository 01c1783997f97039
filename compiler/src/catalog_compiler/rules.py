"""The rule registry: every diagnostic the compiler can emit, by stable code.

A rule is metadata (code, name, default severity, one-line summary, default
hint); the checkers that find problems live in the pipeline modules and build
their diagnostics through :meth:`Rule.at`. Codes are grouped by family, as
ruff does: ``YML`` YAML source, ``TML`` TOML source, ``SCH`` shape and types,
``FIL`` catalog files, ``ID`` identifiers, ``REF`` cross-references, ``DSK``
catalog versus projects on disk, ``LIM`` loading limits, ``CHK`` ``--check``
comparisons, ``COV`` evidence read by ``coverage``, ``INT`` failures of the compiler itself.

``compiler/RULES.md`` documents every code (``python -m
catalog_compiler.rules`` prints it); a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass

from catalog_compiler.diagnostics import Diagnostic, Position, Severity
from catalog_compiler.limits import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_ID_LENGTH,
    MAX_VALUES,
)

E = Severity.ERROR
W = Severity.WARNING


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: its code never changes once published."""

    code: str
    name: str
    severity: Severity
    summary: str
    hint: str

    def at(
        self, file: str, pos: Position, ptr: str, message: str, hint: str | None = None
    ) -> Diagnostic:
        """Return a diagnostic of this rule at ``file``/``pos``/``ptr``."""
        return Diagnostic(
            self.code, self.severity, file, pos.line, pos.column, ptr, message, hint or self.hint
        )


REGISTRY: dict[str, Rule] = {}


def _rule(code: str, name: str, severity: Severity, summary: str, hint: str) -> Rule:
    assert code not in REGISTRY, code  # A code is registered once, at import.
    REGISTRY[code] = rule = Rule(code, name, severity, summary, hint)
    return rule


# fmt: off
YAML_SYNTAX = _rule(
    "YML001", "yaml-syntax", E, "A catalog file is not valid YAML.",
    "Fix the YAML syntax at the reported position (check indentation, colons and quotes).")
DUPLICATE_KEY = _rule(
    "YML002", "duplicate-key", E, "A YAML mapping has the same key twice.",
    "Keep one of the two entries; YAML loaders silently drop one of them.")
TAB_INDENT = _rule(
    "YML003", "tab-indentation", E, "A YAML line is indented with a tab.",
    "Indent with spaces only; YAML forbids tabs in indentation.")
IMPLICIT_TYPE = _rule(
    "YML004", "implicit-scalar-type", E,
    "An unquoted YAML value reads as a boolean, number, date or null where text is expected.",
    "Quote the value (e.g. `'1'` or `'NO'`) so every YAML reader sees a string.")
YAML_TAG = _rule(
    "YML005", "yaml-tag", E,
    "A YAML file uses an explicit tag (`!!int`, `!!python/object:...`) or a directive.",
    "Remove the tag or `%YAML`/`%TAG` line; the catalog is plain YAML 1.1 "
    "(quote a value to make it text).")
TOML_SYNTAX = _rule(
    "TML001", "toml-syntax", E, "A project manifest is not valid TOML.",
    "Fix the TOML syntax at the reported position.")
UNKNOWN_KEY = _rule(
    "SCH001", "unknown-key", E, "A mapping has a key that its schema does not define.",
    "Remove the key or correct its spelling.")
MISSING_KEY = _rule(
    "SCH002", "missing-key", E, "A mapping lacks a required key.",
    "Add the key with a value.")
WRONG_TYPE = _rule(
    "SCH003", "wrong-type", E, "A value has the wrong type (e.g. a number where a list belongs).",
    "Give the value the type the schema expects.")
INVALID_VALUE = _rule(
    "SCH004", "invalid-value", E,
    "A value has the right type but is not allowed (unknown choice, empty text).",
    "Use one of the allowed values.")
MISSING_FILE = _rule(
    "FIL001", "missing-catalog-file", E, "A required catalog file does not exist.",
    "Create the file (catalog/README.md describes each file).")
ROLE_FILE_MISSING = _rule(
    "FIL002", "role-file-missing", E, "catalog.yaml lists a role that has no role file.",
    "Create catalog/roles/<id>.yaml or remove the id from catalog.yaml `roles`.")
ROLE_FILE_UNLISTED = _rule(
    "FIL003", "role-file-unlisted", E, "A role file is not listed in catalog.yaml `roles`.",
    "Add the role id to `roles` in catalog/catalog.yaml, or delete the file.")
UNREADABLE_FILE = _rule(
    "FIL004", "not-a-regular-file", E,
    "A catalog file or project manifest is a folder, a symlink loop, a device or unreadable.",
    "Replace the path with a regular file (or remove it).")
NOT_TEXT = _rule(
    "FIL005", "not-utf8-text", E,
    "A catalog file or project manifest is not UTF-8 text or holds a control character.",
    "Save the file as UTF-8 and remove the character at the reported position.")
DUPLICATE_ID = _rule(
    "ID001", "duplicate-id", E, "An id is defined or listed twice where ids must be unique.",
    "Give each entry its own id, or remove the repeated one.")
NOT_KEBAB = _rule(
    "ID002", "id-not-kebab-case", E,
    "An id is not kebab-case (lowercase letters and digits joined by single hyphens).",
    "Rename the id in kebab-case, e.g. `training-engineer`.")
LESSON_PHASE = _rule(
    "ID003", "lesson-id-phase-mismatch", E,
    "A lesson id is not `<phase>-NN` for the phase the lesson belongs to.",
    "Name the lesson `<phase>-NN` (two digits) after its `phase`, or correct the phase.")
NAME_MISMATCH = _rule(
    "ID004", "id-name-mismatch", E,
    "A role's id differs from its file name, or a manifest's id from its folder name.",
    "Make the id equal to the file or folder name.")
ID_TOO_LONG = _rule(
    "ID005", "id-too-long", E,
    f"An id is longer than {MAX_ID_LENGTH} characters (ids become file names of the build).",
    f"Shorten the id to at most {MAX_ID_LENGTH} characters.")
UNKNOWN_PATHWAY = _rule(
    "REF001", "unknown-pathway", E, "A pathway id does not name a pathway in pathways.yaml.",
    "Use an id from catalog/pathways.yaml or add the pathway there.")
UNKNOWN_TRACK = _rule(
    "REF002", "unknown-track", E, "A modality track id does not name a track in tracks.yaml.",
    "Use an id from catalog/tracks.yaml or add the track there.")
UNKNOWN_PHASE = _rule(
    "REF003", "unknown-phase", E, "A phase id does not name a phase in phases.yaml.",
    "Use an id from catalog/phases.yaml or add the phase there.")
UNKNOWN_PROJECT = _rule(
    "REF004", "unknown-project", E,
    "A project id does not name a project folder with a manifest under projects/.",
    "Use the id of a folder under projects/ that has a project.toml.")
UNKNOWN_STAGE = _rule(
    "REF005", "unknown-stage", E, "A stage id is not declared in the project's manifest.",
    "Use a stage id from the project's project.toml or declare the stage there.")
UNKNOWN_LESSON = _rule(
    "REF006", "unknown-lesson", E, "A lesson id does not name a lesson in lessons.yaml.",
    "Use an id from catalog/lessons.yaml or add the lesson there.")
UNKNOWN_ROLE = _rule(
    "REF007", "unknown-role", E, "A role id does not name a role listed in catalog.yaml.",
    "Use a role id listed in catalog/catalog.yaml `roles`.")
DEFAULT_PATHWAY = _rule(
    "REF008", "default-pathway-unlisted", E,
    "A `defaultPathwayId` is not one of the same entry's `pathwayIds`.",
    "Add the default pathway to `pathwayIds` or choose one that is listed.")
PLANNED_PROJECT = _rule(
    "REF009", "planned-project-referenced", W,
    "Skill evidence points at a project whose status is `planned` (a warning).",
    "Finish the project and set `status = \"ready\"` in its project.toml; "
    "--strict treats this as an error.")
EVIDENCE_SKILL = _rule(
    "REF010", "evidence-skill-unlisted", E,
    "A skill evidence entry names a skill that is not in the role's `skills`.",
    "Write the skill exactly as in the role's `skills` list, or add it there.")
NO_MANIFEST = _rule(
    "DSK001", "project-without-manifest", E, "A folder under projects/ has no project.toml.",
    "Add projects/<id>/project.toml (catalog/README.md, 'Project manifests') or remove the folder.")
UNREFERENCED = _rule(
    "DSK002", "project-unreferenced", E, "No role's skill evidence references a project.",
    "Reference the project from a role's `skillEvidence`, or remove the folder.")
STAGE_WITHOUT_TEST = _rule(
    "DSK003", "stage-without-test", E, "A stage of a `ready` project declares no test file.",
    "List the stage's test files in `tests`, or set the project's status to `planned`.")
TEST_FILE_MISSING = _rule(
    "DSK004", "test-file-missing", E, "A `ready` project declares a test file that does not exist.",
    "Create the test file or correct its path (relative to the project folder).")
TEST_PATH_OUTSIDE = _rule(
    "DSK005", "test-path-outside-project", E,
    "A stage test path is absolute or leads out of its project folder.",
    "Give the path relative to the project folder, without `..` (e.g. `tests/test_stage_1.py`).")
NESTING_TOO_DEEP = _rule(
    "LIM001", "nesting-too-deep", E,
    f"A source file nests lists or mappings deeper than {MAX_DEPTH} levels.",
    "Flatten the structure; catalog files nest a few levels at most.")
TOO_MANY_ALIASES = _rule(
    "LIM002", "alias-limit", E,
    f"A YAML file uses more than {MAX_ALIASES} aliases, or an alias that contains itself.",
    "Write the values out instead of using anchors and aliases.")
EXPANSION_TOO_LARGE = _rule(
    "LIM003", "expansion-too-large", E,
    f"A YAML file holds (with its aliases expanded) more than {MAX_VALUES} values.",
    "Write the values out instead of using aliases, or split the data.")
FILE_TOO_LARGE = _rule(
    "LIM004", "file-too-large", E,
    f"A source file is larger than {MAX_FILE_BYTES // 2**20} MiB.",
    "Shorten the file; catalog files and manifests are a few kilobytes.")
BUILD_MISSING = _rule(
    "CHK001", "build-file-missing", E, "--check: an expected output file is missing.",
    "Run catalog-compile without --check to rebuild the outputs.")
BUILD_EXTRA = _rule(
    "CHK002", "build-file-extra", E,
    "--check: the build folder has a file the compiler would not write.",
    "Run catalog-compile without --check to rebuild the outputs, or delete the file.")
BUILD_DIFFERS = _rule(
    "CHK003", "build-file-differs", E,
    "--check: an output file differs from what the compiler writes.",
    "Run catalog-compile without --check to rebuild the outputs.")
EVIDENCE_UNREADABLE = _rule(
    "COV001", "evidence-unreadable", E,
    "coverage: an evidence folder has no readable `progress.json` stamps naming a project.",
    "Pass a project's `evidence/` folder after `python progress.py` has run in that project.")
EVIDENCE_UNKNOWN_PROJECT = _rule(
    "COV002", "evidence-unknown-project", E,
    "coverage: the evidence names a project the catalog does not know.",
    "Pass evidence of a project under projects/, or correct `project` in progress.json.")
EVIDENCE_UNKNOWN_STAGE = _rule(
    "COV003", "evidence-unknown-stage", E,
    "coverage: the evidence stamps a stage the project's manifest does not declare.",
    "Rerun `python progress.py` in a copy of the current project; its stamps name its stages.")
INTERNAL_ERROR = _rule(
    "INT001", "internal-error", E,
    "catalog-compile itself failed (a bug, not a problem of the catalog); exit status 3.",
    "Report it as an issue of this repository with the command line and this message.")
# fmt: on


def rules_markdown() -> str:
    """Return the text of compiler/RULES.md: one bullet per registered rule."""
    lines = [
        "# catalog-compile rules",
        "",
        "Every diagnostic carries one of these codes. Generated by",
        "`python -m catalog_compiler.rules`; a test checks this list against the registry.",
        "",
    ]
    for rule in REGISTRY.values():
        lines.append(
            f"- **{rule.code}** `{rule.name}` ({rule.severity.value}): {rule.summary} "
            f"Remedy: {rule.hint}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(rules_markdown(), end="")
