"""Reading what was kept: the incident list and a drill's report (Markdown + PNG).

A kept file that cannot be read (not UTF-8, not JSON, a field missing or of the
wrong type) is a `ReportError` naming the file and the field, before anything
is written.
"""

import json
from pathlib import Path
from typing import Any

NUMBER = (int, float)
INCIDENT_FIELDS = {"id": str, "classification": str, "diagnosis": str}
DETECTION_FIELDS = {"intervals_since_fault": NUMBER, "bound_intervals": NUMBER}
SUMMARY_FIELDS = {"verdict": str, "per_fault": dict, "config": dict, "runs": int, "wall_s": NUMBER}
PER_FAULT_FIELDS = {
    "runs": int,
    "correct": int,
    "classifications": list,
    "detection_intervals": list,
    "bound_intervals": (*NUMBER, type(None)),
    "processes_left": int,
}


class ReportError(ValueError):
    """A kept record that cannot be read or reported; the message names the file."""


def read_record(path: Path) -> Any:
    """The JSON value of a kept file; `ReportError` if unreadable or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ReportError(f"Cannot read `{path}`: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise ReportError(f"`{path}` is not UTF-8 text (byte {err.start}).") from None
    except ValueError as err:
        raise ReportError(f"`{path}` is not valid JSON: {err}.") from None


def check_fields(path: Path, where: str, value: Any, fields: dict) -> None:
    """Refuses `value` unless it is an object holding `fields` with their types."""
    if not isinstance(value, dict):
        raise ReportError(f"`{path}`: {where} must be a JSON object, not `{_short(value)}`.")
    for name, kind in fields.items():
        if name not in value:
            raise ReportError(f"`{path}`: {where} lacks the field `{name}`.")
        item = value[name]
        if not isinstance(item, kind) or (isinstance(item, bool) and bool not in _tuple(kind)):
            raise ReportError(
                f"`{path}`: {where} field `{name}` has the wrong type: `{_short(item)}`."
            )


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _short(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def find_incidents(root: str | Path) -> list[dict]:
    """Every incident record under `root`, oldest first; `ReportError` for a damaged one."""
    records = []
    for path in sorted(Path(root).rglob("incidents/*.json")):
        record = read_record(path)
        check_fields(path, "the incident", record, INCIDENT_FIELDS)
        detection = record.get("detection")
        if detection is not None:
            check_fields(path, "`detection`", detection, {})
            if detection.get("intervals_since_fault") is not None:
                check_fields(path, "`detection`", detection, DETECTION_FIELDS)
        record["path"] = str(path)
        records.append(record)
    return records


def incident_rows(records: list[dict]) -> list[list[str]]:
    rows = []
    for r in records:
        d = r.get("detection") or {}
        since = d.get("intervals_since_fault")
        rows.append(
            [
                r["id"],
                r["classification"],
                "-" if since is None else f"{since:.1f}/{d['bound_intervals']:.1f}",
                r["diagnosis"],
            ]
        )
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def drill_report(drill_dir: str | Path) -> str:
    """Markdown for a drill folder's `summary.json`; writes `detection.png` beside it."""
    drill_dir = Path(drill_dir)
    path = drill_dir / "summary.json"
    summary = read_record(path)
    check_fields(path, "the summary", summary, SUMMARY_FIELDS)
    check_fields(path, "`config`", summary["config"], {"heartbeat_interval_s": NUMBER})
    for kind, fault in summary["per_fault"].items():
        check_fields(path, f"`per_fault.{kind}`", fault, PER_FAULT_FIELDS)
        if not all(
            isinstance(d, NUMBER) and not isinstance(d, bool) for d in fault["detection_intervals"]
        ):
            raise ReportError(
                f"`{path}`: `per_fault.{kind}.detection_intervals` must list numbers."
            )
        if not all(isinstance(c, str) for c in fault["classifications"]):
            raise ReportError(f"`{path}`: `per_fault.{kind}.classifications` must list names.")
    rows = []
    for kind, f in summary["per_fault"].items():
        d = f["detection_intervals"]
        rows.append(
            [
                kind,
                f"{f['correct']}/{f['runs']}",
                ", ".join(sorted(set(f["classifications"]))),
                "-" if not d else f"{min(d):.1f} / {sorted(d)[len(d) // 2]:.1f} / {max(d):.1f}",
                f"{f['bound_intervals']:.1f}" if f["bound_intervals"] is not None else "-",
                str(f["processes_left"]),
            ]
        )
    plot_detection(summary, drill_dir / "detection.png")
    header = [
        "fault",
        "correct",
        "classified as",
        "detection min/median/max (intervals)",
        "bound",
        "processes left",
    ]
    return "\n".join(
        [
            f"# Drill report: {drill_dir.name}",
            "",
            summary["verdict"],
            "",
            table(header, rows),
            "",
            f"Heartbeat interval {summary['config']['heartbeat_interval_s']} s; "
            f"{summary['runs']} jobs in {summary['wall_s']:.0f} s. Plot: detection.png",
            "",
        ]
    )


def plot_detection(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(summary["per_fault"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, kind in enumerate(kinds):
        f = summary["per_fault"][kind]
        ax.scatter([i] * len(f["detection_intervals"]), f["detection_intervals"], color="C0")
        if f["bound_intervals"] is not None:
            ax.hlines(f["bound_intervals"], i - 0.3, i + 0.3, color="C3")
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel("detection (heartbeat intervals)")
    ax.set_title("Detection time per fault (dots) and its bound (red)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
