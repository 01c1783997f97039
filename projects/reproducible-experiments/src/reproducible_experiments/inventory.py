"""A complete inventory of an experiment: every run, its status, counts by status.

Every page of `search_runs` is read (MLflow returns at most `max_results`
runs per call, so reading only the first page silently loses runs), and
deleted runs are listed with `lifecycle = deleted` rather than hidden. A
RUNNING run is also checked against its lease (`tracking.liveness`): a dead
one is shown as such; the next `TrackedRun` in the experiment marks it KILLED.
"""

import datetime
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from mlflow import MlflowClient

from reproducible_experiments.tracking import iter_runs, liveness


@dataclass
class Row:
    run_id: str
    run_name: str
    status: str
    lifecycle: str  # `active` or `deleted`
    liveness: str  # for RUNNING runs: `alive`, `dead: ...`, `no lease`; else ``
    start: str
    end: str
    parent_run_id: str
    error: str


@dataclass
class Inventory:
    experiment: str
    experiment_id: str
    rows: list[Row]

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(row.status for row in self.rows).items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "experiment_id": self.experiment_id,
            "total": len(self.rows),
            "counts": self.counts(),
            "deleted": sum(row.lifecycle == "deleted" for row in self.rows),
            "running_dead": sum(row.liveness.startswith("dead") for row in self.rows),
            "runs": [asdict(row) for row in self.rows],
        }


def _when(ms: int | None) -> str:
    if not ms:
        return ""
    stamp = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M:%S")


def inventory(
    client: MlflowClient, experiment: str, exp_id: str, page_size: int = 1000
) -> Inventory:
    rows = []
    for run in iter_runs(client, exp_id, page_size=page_size):
        tags = run.data.tags
        error = tags.get("error.type", "")
        if tags.get("reconciled.reason"):
            error = f"reconciled: {tags['reconciled.reason']}"
        rows.append(
            Row(
                run_id=run.info.run_id,
                run_name=run.info.run_name or "",
                status=run.info.status,
                lifecycle=run.info.lifecycle_stage,
                liveness=liveness(tags) if run.info.status == "RUNNING" else "",
                start=_when(run.info.start_time),
                end=_when(run.info.end_time),
                parent_run_id=tags.get("mlflow.parentRunId", ""),
                error=error,
            )
        )
    return Inventory(experiment, exp_id, rows)


def render(inv: Inventory) -> str:
    """A plain-text table, one run per line, then the counts."""
    lines = [f"experiment `{inv.experiment}` (id {inv.experiment_id}): {len(inv.rows)} runs"]
    header = f"{'run id':<32}  {'status':<8}  {'start (UTC)':<19}  {'name':<24}  note"
    lines += [header, "-" * len(header)]
    for row in inv.rows:
        note = ", ".join(
            part
            for part in (
                row.liveness,
                row.error,
                "deleted" if row.lifecycle == "deleted" else "",
                f"parent {row.parent_run_id[:8]}" if row.parent_run_id else "",
            )
            if part
        )
        lines.append(
            f"{row.run_id:<32}  {row.status:<8}  {row.start:<19}  {row.run_name[:24]:<24}  {note}"
        )
    counts = ", ".join(f"{status} {n}" for status, n in inv.counts().items()) or "none"
    lines.append(f"counts: {counts}; total {len(inv.rows)}")
    return "\n".join(lines)
