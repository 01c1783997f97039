"""Reading what was kept: the incident list and a drill's report (Markdown + PNG)."""

import json
from pathlib import Path


def find_incidents(root: str | Path) -> list[dict]:
    """Every incident record under `root`, oldest first."""
    records = []
    for path in sorted(Path(root).rglob("incidents/*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
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
    summary = json.loads((drill_dir / "summary.json").read_text(encoding="utf-8"))
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
