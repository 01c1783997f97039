"""Benchmark: how the compile time grows with the size of the catalog.

Run from the repository root::

    PYTHONPATH=compiler/src python compiler/bench_compile.py [--scales 1 10 100] [--repeats 5]

It builds synthetic catalogs 1x, 10x and 100x the real one in a temporary
folder (phases, lessons, projects and roles replicated under new ids, each
copy a self-consistent slice of the catalog), times the compile (load,
schema pass, discovery, rules pass, build; the median of ``--repeats``
runs), prints a table, and fits the slope of log(time) against log(scale):
about 1 means the time grows linearly, 2 quadratically. It writes the
figures to a JSON report (``--report``, default ``build/bench_compile.json``).
Expect well under a second at 1x and some tens of seconds at 100x on a
2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
import tomllib
from copy import deepcopy
from pathlib import Path

import yaml
from catalog_compiler.cli import find_root
from catalog_compiler.pipeline import compile_catalog
from catalog_compiler.report import counts


def _load(file: Path):
    return yaml.safe_load(file.read_text(encoding="utf-8"))


def _dump(data, file: Path) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, default_flow_style=False, width=4096, sort_keys=False)


def _toml_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # A JSON string is a valid TOML basic string.


def _write_manifest(manifest: dict, file: Path) -> None:
    lines = [f"{key} = {_toml_string(manifest[key])}" for key in ("id", "title", "status")]
    lines.append("preparation = [" + ", ".join(map(_toml_string, manifest["preparation"])) + "]")
    for stage in manifest["stages"]:
        lines += ["", "[[stages]]"]
        lines += [f"{k} = {_toml_string(stage[k])}" for k in ("id", "title", "deliverable")]
        lines.append("tests = [" + ", ".join(map(_toml_string, stage["tests"])) + "]")
        lines.append(f"hardware = {_toml_string(stage['hardware'])}")
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")


def synthesize(source: Path, dest: Path, scale: int) -> dict[str, int]:
    """Write a catalog ``scale`` times the size of ``source`` into ``dest``.

    Copy ``j`` renames every phase, lesson, project and role id with the
    suffix ``-rj`` (copy 0 keeps the real ids) and points only at its own
    copies, so the catalog stays valid. Every project is ``planned``: the
    synthetic tree has no test files, and planned projects need none.
    """
    cat = source / "catalog"
    root = _load(cat / "catalog.yaml")
    phases = _load(cat / "phases.yaml")["phases"]
    lessons = _load(cat / "lessons.yaml")["lessons"]
    roles = {r: _load(cat / "roles" / f"{r}.yaml") for r in root["roles"]}
    manifests = [
        tomllib.loads(p.read_text(encoding="utf-8"))
        for p in sorted((source / "projects").glob("*/project.toml"))
    ]
    phase_ids = {p["id"] for p in phases}

    def sfx(value: str, j: int) -> str:
        return value if j == 0 else f"{value}-r{j}"

    def lesson(value: str, j: int) -> str:  # `<phase>-NN` must stay `<phase'>-NN`.
        phase, number = value.rsplit("-", 1)
        return f"{sfx(phase, j)}-{number}"

    out_phases, out_lessons, out_roles = [], [], []
    for j in range(scale):
        out_phases += [{**p, "id": sfx(p["id"], j)} for p in phases]
        out_lessons += [
            {**deepcopy(x), "id": lesson(x["id"], j), "phase": sfx(x["phase"], j)} for x in lessons
        ]
        for m in manifests:
            copy = {**m, "id": sfx(m["id"], j), "status": "planned"}
            copy["preparation"] = [lesson(x, j) for x in m["preparation"]]
            _write_manifest(copy, dest / "projects" / copy["id"] / "project.toml")
        for role_id, role in roles.items():
            new = dict(role, id=sfx(role_id, j))
            new["milestones"] = [
                {**m, "phaseIds": [sfx(p, j) for p in m["phaseIds"]]} for m in role["milestones"]
            ]
            new["startingPointChecks"] = [
                {**c, "phaseId": sfx(c["phaseId"], j)} for c in role["startingPointChecks"]
            ]
            new["skillEvidence"] = [
                {
                    **e,
                    "projectId": sfx(e["projectId"], j),
                    "lessonIds": [lesson(x, j) for x in e["lessonIds"]],
                }
                for e in role["skillEvidence"]
            ]
            _dump(new, dest / "catalog" / "roles" / f"{new['id']}.yaml")
            out_roles.append(new["id"])
    assert phase_ids  # The real catalog has phases; an empty one would time nothing.
    _dump({**root, "roles": out_roles}, dest / "catalog" / "catalog.yaml")
    _dump({"phases": out_phases}, dest / "catalog" / "phases.yaml")
    _dump({"lessons": out_lessons}, dest / "catalog" / "lessons.yaml")
    for name in ("domains", "pathways", "tracks"):
        _dump(_load(cat / f"{name}.yaml"), dest / "catalog" / f"{name}.yaml")
    return {
        "roles": len(out_roles),
        "lessons": len(out_lessons),
        "projects": scale * len(manifests),
    }


def time_compile(root: Path, repeats: int) -> tuple[float, int]:
    """Return the median compile time in seconds and the number of errors."""
    times, errors = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        result = compile_catalog(root)
        times.append(time.perf_counter() - start)
        errors = counts(result.diagnostics)[0]
    return statistics.median(times), errors


def loglog_slope(scales: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(scale)."""
    xs, ys = [math.log(s) for s in scales], [math.log(t) for t in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def run(source: Path, scales: list[int], repeats: int, report: Path) -> dict:
    """Synthesize, time and report every scale; return the report's data."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="catalog-bench-") as tmp:
        for scale in scales:
            dest = Path(tmp) / f"x{scale}"
            sizes = synthesize(source, dest, scale)
            seconds, errors = time_compile(dest, repeats)
            rows.append({"scale": scale, **sizes, "median_s": seconds, "errors": errors})
            print(
                f"{scale:>6}x  roles {sizes['roles']:>6}  lessons {sizes['lessons']:>7}  "
                f"projects {sizes['projects']:>6}  median {seconds * 1000:9.1f} ms"
                + (f"  ({errors} errors)" if errors else ""),
                flush=True,
            )
    slope = loglog_slope([r["scale"] for r in rows], [r["median_s"] for r in rows])
    print(f"log-log slope: {slope:.2f} (1 = linear growth, 2 = quadratic)")
    data = {"repeats": repeats, "rows": rows, "slope": slope}
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="the catalog repository")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    root = args.root or find_root(Path.cwd())
    if root is None:
        parser.error("run inside the repository or pass --root")
    if len(set(args.scales)) < 2:
        parser.error("--scales needs at least two different scales to fit a slope")
    run(root, args.scales, args.repeats, args.report or root / "build" / "bench_compile.json")


if __name__ == "__main__":
    main()
