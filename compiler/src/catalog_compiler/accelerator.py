"""A project's accelerator report: where its stage tests last ran on a lent accelerator.

``projects/<id>/accelerator-report.json`` is written by
``scripts/accelerator_report.py`` from the JSON that ``scripts/accelerator_lane.py``
writes on the accelerator machine. It records the device (kind, backend, jax,
jaxlib and libtpu versions), the commit that ran and, per stage, the code hash
of what ran (``scripts/mutants.stage_hash``, the identity the mutation reports
use), each run's counts per stage (one run per execution mode, e.g. kernels
compiled and interpreted) with every skip's reason and every failure's message,
and the seeded bugs run on the chip with their outcome.

Contract:
- :class:`AcceleratorReport` validates the file: strict, no unknown keys, every
  skip names its reason, each stage's counts agree with its lists, and every run
  covers the same stages as the code hashes.
- :func:`stage_verdict` is ``passed`` (no failure in any run, at least one test
  passed), ``skipped`` (every test skipped, each with its reason) or ``failed``.
- :func:`stage_summaries` pairs each verdict with whether it is still current:
  the report's code hash for the stage equals the project's mutation report's
  (which the repository's tests keep equal to the code on disk); a stage whose
  code has changed since is ``stale``, and the page says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

REPORT = "accelerator-report.json"
Text = Annotated[str, StringConstraints(min_length=1)]
Hash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Device(_Strict):
    backend: Text
    device_kind: Text
    device_count: int = Field(ge=1)
    jax: Text
    jaxlib: Text
    libtpu: Text | None


class Skip(_Strict):
    test: Text
    reason: Text


class Failure(_Strict):
    test: Text
    message: str


class StageRun(_Strict):
    passed: int = Field(ge=0)
    failed: int = Field(ge=0)
    skipped: int = Field(ge=0)
    seconds: float = Field(ge=0)
    skips: list[Skip]
    failures: list[Failure]

    @model_validator(mode="after")
    def _counts_match_lists(self) -> StageRun:
        if len(self.skips) != self.skipped or len(self.failures) != self.failed:
            raise ValueError(
                f"{self.skipped} skipped and {self.failed} failed, but {len(self.skips)} "
                f"skips and {len(self.failures)} failures listed"
            )
        return self


class ModeRun(_Strict):
    mode: Text
    exit_code: int | Literal["timeout"]
    wall_seconds: float = Field(ge=0)
    stages: dict[str, StageRun]


class BugRun(_Strict):
    """One seeded bug applied on the accelerator. `untestable`: every test the bug
    names was skipped on that machine in the report's own run (so its passing says
    nothing); `reason` then holds those skips' reason, and only then."""

    id: Text
    stage: Text
    outcome: Literal["caught", "survived", "broken", "stale", "untestable"]
    seconds: float = Field(ge=0)
    reason: Text | None = None

    @model_validator(mode="after")
    def _reason_exactly_when_untestable(self) -> BugRun:
        if (self.outcome == "untestable") != (self.reason is not None):
            raise ValueError(f"bug `{self.id}`: a reason goes with `untestable` only")
        return self


class AcceleratorReport(_Strict):
    schema_version: Literal[1]
    project: Text
    device: Device
    commit: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
    ran_on: Annotated[str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}$")]
    command: Text
    code_hashes: dict[str, Hash]
    runs: list[ModeRun] = Field(min_length=1)
    seeded_bugs: list[BugRun]

    @model_validator(mode="after")
    def _runs_cover_the_hashed_stages(self) -> AcceleratorReport:
        for run in self.runs:
            if set(run.stages) != set(self.code_hashes):
                raise ValueError(
                    f"run `{run.mode}` covers stages {sorted(run.stages)}, the code hashes "
                    f"{sorted(self.code_hashes)}"
                )
        return self


def load(folder: Path) -> AcceleratorReport | None:
    """The project's report, or None where it has none (ValidationError if malformed)."""
    path = folder / REPORT
    if not path.is_file():
        return None
    return AcceleratorReport.model_validate(json.loads(path.read_text(encoding="utf-8")))


def stage_verdict(report: AcceleratorReport, stage: str) -> str:
    runs = [run.stages[stage] for run in report.runs]
    if any(r.failed for r in runs) or any(run.exit_code == "timeout" for run in report.runs):
        return "failed"
    if all(r.passed == 0 for r in runs):
        return "skipped" if all(r.skipped for r in runs) else "failed"
    return "passed"


def stage_summaries(folder: Path) -> dict[str, dict] | None:
    """Per stage id: verdict, counts per mode, device, date, commit and `current`
    (the code hash equals the mutation report's); None without a report."""
    report = load(folder)
    if report is None:
        return None
    mutation = folder / "mutation-report.json"
    hashes = {}
    if mutation.is_file():
        stages = json.loads(mutation.read_text(encoding="utf-8")).get("stages", {})
        hashes = {sid: entry.get("code_hash") for sid, entry in stages.items()}
    return {
        stage: {
            "verdict": stage_verdict(report, stage),
            "current": hashes.get(stage) == code_hash,
            "device": report.device.device_kind,
            "ran_on": report.ran_on,
            "commit": report.commit[:7],
            "modes": [
                {
                    "mode": run.mode,
                    "passed": run.stages[stage].passed,
                    "skipped": run.stages[stage].skipped,
                    "failed": run.stages[stage].failed,
                }
                for run in report.runs
            ],
            "bugs_caught": sum(
                b.outcome == "caught" for b in report.seeded_bugs if b.stage == stage
            ),
            "bugs_run": sum(
                b.stage == stage and b.outcome != "untestable" for b in report.seeded_bugs
            ),
            "bugs_untestable": sum(
                b.stage == stage and b.outcome == "untestable" for b in report.seeded_bugs
            ),
        }
        for stage, code_hash in report.code_hashes.items()
    }
