"""Typed shapes of the source files (the schema pass validates against these).

Every model is strict (no coercion: a number is not text) and forbids
unknown keys. Field order follows the published catalog
(``shared/reference/catalog.json``) so the models double as its key order.
List files (``lessons.yaml`` and the like) are validated item by item by
``schema.py``, so one broken entry does not hide the ids of the others.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)
from pydantic_core import PydanticCustomError

Text = Annotated[str, StringConstraints(min_length=1)]
"""Non-empty text; ids are checked further by the rules pass (kebab-case)."""


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Defaults(Strict):
    """Catalog-wide texts every role repeats on output (unless it overrides them)."""

    reviewCriterion: Text
    scopeNote: Text


class CatalogRoot(Strict):
    """``catalog/catalog.yaml``: schema version, defaults, published role order."""

    # An int range, not Literal[1]: strict Literal accepts `true` (True == 1).
    schemaVersion: Annotated[int, Field(ge=1, le=1)]
    defaults: Defaults
    roles: list[Text]


class Milestone(Strict):
    title: Text
    phaseIds: list[Text]
    deliverable: Text
    criteria: list[Text]


class StartingPointCheck(Strict):
    phaseId: Text
    question: Text


class SkillEvidence(Strict):
    """One skill's evidence; ``scope`` is derived, ``reviewCriterion`` defaulted."""

    skill: Text
    lessonIds: list[Text]
    projectId: Text
    evidence: Text
    reviewCriterion: Text | None = None
    stageIds: list[Text]


class Role(Strict):
    """``catalog/roles/<id>.yaml``; ``scopeNote`` defaults to the catalog's."""

    id: Text
    title: Text
    headline: Text
    description: Text
    defaultPathwayId: Text
    pathwayIds: list[Text]
    responsibilities: list[Text]
    skills: list[Text]
    portfolio: Text
    readiness: Text
    background: Text
    milestones: list[Milestone]
    startingPointChecks: list[StartingPointCheck]
    workExample: Text
    modalityTrackIds: list[Text]
    reviewQuestions: list[Text]
    scopeNote: Text | None = None
    skillEvidence: list[SkillEvidence]


class Domain(Strict):
    id: Text
    title: Text
    headline: Text
    description: Text
    skills: list[Text]
    pathwayIds: list[Text]
    defaultPathwayId: Text
    roleIds: list[Text]
    artifact: Text


class Pathway(Strict):
    id: Text
    title: Text
    summary: Text


class Phase(Strict):
    id: Text
    title: Text


class Track(Strict):
    id: Text
    title: Text


def _https_url(value: str) -> str:
    """Accept ``value`` only as an absolute ``https://`` address with a host name.

    Anything else (``http://``, a relative path, a bare host, whitespace inside)
    is refused with a message that names the rule, so a lesson page never links
    an insecure or broken address.
    """
    parts = urlsplit(value)
    if parts.scheme != "https" or not parts.hostname or any(c.isspace() for c in value):
        raise PydanticCustomError(
            "https_url",
            "it must be an absolute https:// address with a host name "
            "(for example https://docs.jax.dev/en/latest/)",
        )
    return value


HttpsUrl = Annotated[str, AfterValidator(_https_url)]
"""Text that is an absolute ``https://`` URL with a host name (see ``_https_url``)."""


class LessonDoc(Strict):
    """One documentation page a lesson page links: its title and https address."""

    title: Text
    url: HttpsUrl


class Lesson(Strict):
    """A ``lessons.yaml`` entry; ``docs`` lists the documentation to read (optional).

    Contract: ``docs`` entries are :class:`LessonDoc` and no two of them share a
    URL; an entry without a title or with a non-https URL is refused.
    """

    id: Text
    phase: Text
    title: Text
    docs: list[LessonDoc] = []

    @field_validator("docs")
    @classmethod
    def _distinct_urls(cls, docs: list[LessonDoc]) -> list[LessonDoc]:
        urls = [doc.url for doc in docs]
        repeated = sorted({url for url in urls if urls.count(url) > 1})
        if repeated:
            raise PydanticCustomError(
                "duplicate_doc_url",
                "each documentation link must appear once, but {urls} repeats",
                {"urls": ", ".join(repeated)},
            )
        return docs


class Stage(Strict):
    id: Text
    title: Text
    deliverable: Text
    tests: list[Text]
    hardware: Literal["cpu", "cpu-multi-device", "tpu", "gpu"]


class Manifest(Strict):
    """``projects/<id>/project.toml``."""

    id: Text
    title: Text
    status: Literal["planned", "ready"]
    preparation: list[Text]
    stages: list[Stage]


# Keys that a source file must not contain because the compiler derives or
# expands them; mapped to the hint that says so.
DERIVED_KEYS = {
    "scope": "`scope` is derived from the project's preparation lessons; remove it.",
}

# The list files: file name -> (top-level key, item model).
LIST_FILES: dict[str, tuple[str, type[Strict]]] = {
    "domains.yaml": ("domains", Domain),
    "pathways.yaml": ("pathways", Pathway),
    "phases.yaml": ("phases", Phase),
    "tracks.yaml": ("tracks", Track),
    "lessons.yaml": ("lessons", Lesson),
}
