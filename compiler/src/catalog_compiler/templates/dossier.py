"""Your dossier: what your own runs of this project's stage tests retained.

    python progress.py dossier [--out DIR]     # DIR/index.html and DIR/dossier.md

For each stage it shows the status of your evidence, then every check the
stage's tests recorded (`evidence/stage_<id>.json`): the changed condition,
the observed figures, the tolerance and the verdict, and the plots the stage
wrote. A stage is **demonstrated** only when its last run passed and neither
its code (its exercise regions, its test files and the test harness) nor its
evidence file changed since (`evidence/progress.json`, written by
`progress.py`). Otherwise it is **stale** (changed since), **failed**,
**missing** (passed, but no evidence file) or **not yet** (never run here, or
its exercise regions are still to write).

It closes with the skills and review questions of every route whose skill
evidence points at this project (`roles.json`, written with the starter),
each question beside the stages whose evidence bears on it.

Files are read as `progress.py` reads them (its module docstring): an
evidence file or `roles.json` that is not JSON of the shape expected is
shown as none, said in one line on stderr; one that is a link, a folder, a
FIFO, too large or unreadable stops the dossier with one line (exit 2).
"""

from __future__ import annotations

import argparse
import datetime
import html
import sys
from pathlib import Path

import authorship
import progress
from failed_check import figures  # noqa: F401  (also `dossier.figures` for the site)

DEMONSTRATED, STALE, FAILED, MISSING, NOT_YET = (
    "demonstrated",
    "stale",
    "failed",
    "missing",
    "not yet",
)
HONESTY = (
    "This dossier is self-run evidence: the figures come from the learner's own code, "
    "run on the learner's own machine by the project's stage tests. It is not independent "
    "review or hardware qualification. A reviewer re-runs any figure with the command, "
    "code hash and environment shown beside it. A local check can tell that a stage's "
    "regions are written and are not the reference's code line for line; it cannot tell "
    "who wrote code that differs from the reference."
)
PLOTS = (".png", ".svg")
# Words too common in review questions and skill texts to relate one to another.
_COMMON = set(
    "about after against again before being between could every explain first their there "
    "these those through under using where which while would should other state show shows "
    "check checks".split()
)


def _stems(text: str) -> set[str]:
    """Five-letter stems of the words of five letters or more, less the common ones."""
    words = "".join(c.lower() if c.isalnum() else " " for c in text).split()
    return {w[:5] for w in words if len(w) >= 5 and w not in _COMMON}


def bearing(question: str, skills: list[dict]) -> list[dict]:
    """The skills (of one route, for this project) whose name or evidence text shares a
    word stem with ``question``: the evidence that bears on it."""
    asked = _stems(question)
    return [s for s in skills if asked & _stems(f"{s['skill']} {s.get('evidence', '')}")]


UNRELATED = (
    "none of this project's cited skills speaks to it; a reviewer asks it of the "
    "route's other projects"
)


def stage_status(folder: Path, stage: dict, record: dict | None) -> tuple[str, str]:
    """(status, reason) of one stage's evidence; see the module docstring."""
    evidence = folder / "evidence" / f"stage_{stage['id']}.json"
    if not record:
        return NOT_YET, "no run of its tests is recorded here"
    if record.get("result") != "passed":
        left = len(progress.unwritten_regions(folder).get(stage["id"], []))
        if left:
            return NOT_YET, f"{left} exercise region(s) still to write; its tests fail"
        return FAILED, f"its tests failed at {record.get('ran_at', '?')}"
    current = progress.stage_code_hash(folder, stage["id"], stage["tests"])
    if record.get("code_hash") != current:
        return STALE, "its code or tests changed since the run that passed"
    if not evidence.is_file():
        return MISSING, "its tests passed but left no evidence file"
    if record.get("evidence_sha256") != progress.file_sha256(evidence):
        return STALE, "its evidence file changed since the run that passed"
    authored = authorship.stage_authorship(folder, stage["id"])
    if authored is not None:
        return authored
    return DEMONSTRATED, f"passed at {record.get('ran_at', '?')}, unchanged since"


def load_evidence(folder: Path, stage_id: str) -> dict | None:
    """A stage's evidence with its records (each an object), or None when there is no
    file or it is not such evidence (said on stderr)."""
    path = folder / "evidence" / f"stage_{stage_id}.json"
    try:
        data = progress.read_json(path)
    except ValueError as error:
        data, problem = None, f"is not valid JSON ({error})"
    else:
        problem = "is not an object with a `records` list"
    if data is None and not path.is_file():
        return None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        rerun = f"a run of stage {stage_id} rewrites it"
        _warn(path, folder, f"{problem}: shown as no evidence; {rerun}")
        return None
    return dict(data, records=[r for r in data["records"] if isinstance(r, dict)])


def _warn(path: Path, folder: Path, problem: str) -> None:
    print(f"progress.py dossier: {progress.shown(path, folder)} {problem}.", file=sys.stderr)


def _roles_problem(roles: object) -> str | None:
    """Why ``roles`` is not `roles.json` as the starter ships it, or None."""
    if not isinstance(roles, dict) or not isinstance(roles.get("roles"), list):
        return "is not an object with a `roles` list"
    for role in roles["roles"]:
        if not (
            isinstance(role, dict)
            and all(isinstance(role.get(k), str) for k in ("title", "portfolio"))
            and isinstance(role.get("reviewQuestions"), list)
            and isinstance(role.get("skills"), list)
            and all(
                isinstance(skill, dict)
                and all(isinstance(skill.get(k), str) for k in ("skill", "scope"))
                and isinstance(skill.get("stageIds"), list)
                for skill in role["skills"]
            )
        ):
            return "holds a route without its title, portfolio, skills or questions"
    return None


def collect(folder: Path, roles: dict | None = None, generated_at: str | None = None) -> dict:
    """Everything the dossier shows, as plain data (the renderers only format it).
    ``roles`` replaces the folder's `roles.json`; ``generated_at`` the clock."""
    project = progress.manifest(folder)
    state = progress.load_state(folder)
    stages = []
    for stage in project["stages"]:
        record = state["stages"].get(stage["id"])
        status, reason = stage_status(folder, stage, record)
        evidence = load_evidence(folder, stage["id"])
        plots = sorted(
            p.name for p in (folder / "evidence").glob(f"stage_{stage['id']}*") if p.suffix in PLOTS
        )
        stages.append(
            {
                "stage": stage,
                "status": status,
                "reason": reason,
                "record": record or {},
                "code_hash": progress.stage_code_hash(folder, stage["id"], stage["tests"]),
                "command": " ".join(progress.test_command(stage["tests"])),
                "records": (evidence or {}).get("records", []),
                "plots": plots,
            }
        )
    if roles is None:
        path = folder / "roles.json"
        try:
            roles = progress.read_json(path, progress.RESTORE)
            problem = None if roles is None else _roles_problem(roles)
        except ValueError as error:
            problem = f"is not valid JSON ({error})"
        if problem:
            _warn(path, folder, f"{problem}: the capability map is left out; {progress.RESTORE}")
        if roles is None or problem:
            roles = {"roles": []}
    return {
        "project": project,
        "stages": stages,
        "roles": roles.get("roles", []),
        "scope_note": roles.get("scopeNote", ""),
        "generated_at": generated_at
        or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(data: dict) -> str:
    p = data["project"]
    out = [f"# {p['title']}: dossier", "", f"> {HONESTY}", ""]
    out += [f"Project `{p['id']}`, generated {data['generated_at']}.", ""]
    out += ["| Stage | Title | Status | Code hash | Last run |", "|---|---|---|---|---|"]
    for s in data["stages"]:
        out.append(
            f"| {s['stage']['id']} | {_cell(s['stage']['title'])} | **{s['status']}**: "
            f"{_cell(s['reason'])} | `{s['code_hash'][:12]}` | {s['record'].get('ran_at', '')} |"
        )
    for s in data["stages"]:
        stage = s["stage"]
        out += ["", f"## Stage {stage['id']}: {stage['title']} ({s['status']})", ""]
        out += [f"{stage['deliverable']}.", "", f"Status: **{s['status']}**, {s['reason']}.", ""]
        env = s["record"].get("environment", {})
        out += [
            f"Re-run: `{s['command']}` (code `{s['code_hash']}`; seeds are fixed in the "
            "test files; same seed, same CPU, same bits).",
            "",
        ]
        if env:
            out += ["Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()) + ".", ""]
        if s["records"]:
            out += [
                "| Check | Condition | Observed | Tolerance | Verdict |",
                "|---|---|---|---|---|",
            ]
            for r in s["records"]:
                verdict = "passed" if r.get("passed") else "FAILED"
                out.append(
                    f"| {_cell(r.get('check', ''))} | {_cell(r.get('condition', ''))} | "
                    f"{_cell(figures(r.get('observed')))} | "
                    f"{_cell(figures(r.get('tolerance')))} | {verdict} |"
                )
        else:
            out.append("No evidence recorded for this stage.")
        out += [f"![{name}]({name})" for name in s["plots"]]
    # The catalog's scope note speaks of "the capability map below": this section is it.
    out += ["", "## Capability map: the routes that cite this project", ""]
    if data["scope_note"]:
        out += [f"> {data['scope_note']}", ""]
    if not data["roles"]:
        out.append("No route's skill evidence points at this project.")
    by_id = {s["stage"]["id"]: s for s in data["stages"]}
    for role in data["roles"]:
        out += [f"### {role['title']}", "", f"Portfolio: {role['portfolio']}", ""]
        for skill in role["skills"]:
            shown = ", ".join(
                f"{sid} ({by_id[sid]['status']})" for sid in skill["stageIds"] if sid in by_id
            )
            out.append(f"- **{skill['skill']}** ({skill['scope']}): stages {shown}.")
        out += ["", "Review questions, each with the evidence that bears on it:", ""]
        for question in role["reviewQuestions"]:
            cited = sorted(
                {sid for sk in bearing(question, role["skills"]) for sid in sk["stageIds"]}
                & set(by_id)
            )
            shown = ", ".join(f"stage {sid} ({by_id[sid]['status']})" for sid in cited)
            out.append(f"- {question} Evidence: {shown or UNRELATED}.")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


# Long hashes, paths and figures wrap anywhere: no table is wider than the page.
CSS = """body{font-family:system-ui,sans-serif;max-width:64rem;margin:2rem auto;padding:0 1rem;
line-height:1.45;color:#1d2329}table{border-collapse:collapse;width:100%;margin:.5rem 0 1rem}
th,td{border:1px solid #d5dbe1;padding:.3rem .5rem;text-align:left;vertical-align:top;
overflow-wrap:anywhere}th{background:#f2f5f8}code{font-size:.9em;overflow-wrap:anywhere}
.note{border-left:4px solid #c58b00;padding:.4rem .8rem;
background:#fff8e6}.demonstrated{color:#1a7f37;font-weight:600}.stale,.failed,.missing{color:#b42318;
font-weight:600}.not-yet{color:#6b7785;font-weight:600}img{max-width:100%}"""


def html_page(data: dict) -> str:
    e = html.escape
    p = data["project"]
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">',
        f"<title>{e(p['title'])}: dossier</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{e(p['title'])}: dossier</h1>",
        f'<p class="note" id="honesty">{e(HONESTY)}</p>',
    ]
    parts.append(
        f"<p>Project <code>{e(p['id'])}</code>, generated {e(data['generated_at'])}. "
        'The same, as Markdown: <a href="dossier.md">dossier.md</a>.</p>'
    )
    parts.append(
        "<table><thead><tr><th>Stage</th><th>Title</th><th>Status</th><th>Code hash</th>"
        "<th>Last run</th></tr></thead><tbody>"
    )
    for s in data["stages"]:
        sid = e(s["stage"]["id"])
        css = s["status"].replace(" ", "-")
        parts.append(
            f'<tr><td><a href="#stage-{sid}">{sid}</a></td><td>{e(s["stage"]["title"])}</td>'
            f'<td><span class="{css}">{e(s["status"])}</span>: {e(s["reason"])}</td>'
            f"<td><code>{e(s['code_hash'][:12])}</code></td>"
            f"<td>{e(s['record'].get('ran_at', ''))}</td></tr>"
        )
    parts.append("</tbody></table>")
    for s in data["stages"]:
        stage = s["stage"]
        sid = e(stage["id"])
        css = s["status"].replace(" ", "-")
        parts.append(
            f'<section id="stage-{sid}"><h2>Stage {sid}: {e(stage["title"])}</h2>'
            f"<p>{e(stage['deliverable'])}.</p>"
            f'<p>Status: <span class="{css}">{e(s["status"])}</span>, {e(s["reason"])}.</p>'
            f"<p>Re-run: <code>{e(s['command'])}</code> (code <code>{e(s['code_hash'])}</code>;"
            " seeds are fixed in the test files; same seed, same CPU, same bits).</p>"
        )
        env = s["record"].get("environment", {})
        if env:
            shown = ", ".join(f"{k} {v}" for k, v in env.items())
            parts.append(f"<p>Environment: {e(shown)}.</p>")
        if s["records"]:
            parts.append(
                "<table><thead><tr><th>Check</th><th>Condition</th><th>Observed</th>"
                "<th>Tolerance</th><th>Verdict</th></tr></thead><tbody>"
            )
            for r in s["records"]:
                verdict = "passed" if r.get("passed") else "FAILED"
                parts.append(
                    f"<tr><td>{e(str(r.get('check', '')))}</td>"
                    f"<td>{e(str(r.get('condition', '')))}</td>"
                    f"<td>{e(figures(r.get('observed')))}</td>"
                    f"<td>{e(figures(r.get('tolerance')))}</td><td>{verdict}</td></tr>"
                )
            parts.append("</tbody></table>")
        else:
            parts.append("<p>No evidence recorded for this stage.</p>")
        parts += [f'<img src="{e(name)}" alt="{e(name)}">' for name in s["plots"]]
        parts.append("</section>")
    parts.append(
        '<section id="routes"><h2 id="capability-map">Capability map: the routes that cite '
        "this project</h2>"
    )
    if data["scope_note"]:
        parts.append(f'<p class="note">{e(data["scope_note"])}</p>')
    if not data["roles"]:
        parts.append("<p>No route's skill evidence points at this project.</p>")
    by_id = {s["stage"]["id"]: s for s in data["stages"]}

    def stage_link(sid: str) -> str:
        css = by_id[sid]["status"].replace(" ", "-")
        return (
            f'<a href="#stage-{e(sid)}">stage {e(sid)}</a> '
            f'(<span class="{css}">{e(by_id[sid]["status"])}</span>)'
        )

    for role in data["roles"]:
        parts.append(f"<h3>{e(role['title'])}</h3><p>Portfolio: {e(role['portfolio'])}</p><ul>")
        for skill in role["skills"]:
            shown = ", ".join(stage_link(sid) for sid in skill["stageIds"] if sid in by_id)
            parts.append(
                f"<li><strong>{e(skill['skill'])}</strong> ({e(skill['scope'])}): {shown}</li>"
            )
        parts.append("</ul><p>Review questions, each with the evidence that bears on it:</p><ul>")
        for question in role["reviewQuestions"]:
            cited = sorted(
                {sid for sk in bearing(question, role["skills"]) for sid in sk["stageIds"]}
                & set(by_id)
            )
            shown = ", ".join(stage_link(sid) for sid in cited) or e(UNRELATED)
            parts.append(f"<li>{e(question)} Evidence: {shown}</li>")
        parts.append("</ul>")
    parts.append("</section></body></html>")
    return "\n".join(parts) + "\n"


def write(folder: Path, out: Path, data: dict | None = None) -> Path:
    """Write ``out``/index.html, dossier.md and the stages' plots; return the page.
    ``data`` is what :func:`collect` returns (default: collected now)."""
    data = data or collect(folder)
    for s in data["stages"]:
        for name in s["plots"]:  # Read and written as any evidence: never through a link.
            plot = progress.read_bytes(folder / "evidence" / name)
            if plot is not None:
                progress.write_atomic(out / name, plot)
    progress.write_atomic(out / "dossier.md", markdown(data))
    page = out / "index.html"
    progress.write_atomic(page, html_page(data))
    return page


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="progress.py dossier", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=progress.HERE / "dossier")
    args = parser.parse_args(argv)
    data = collect(progress.HERE)
    page = write(progress.HERE, args.out, data)
    for s in data["stages"]:
        print(f"stage {s['stage']['id']:<4} {s['status']:<13} {s['reason']}")
    print(f"wrote {page} and {page.with_name('dossier.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
