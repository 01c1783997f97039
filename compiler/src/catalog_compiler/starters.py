"""Learner starters: a project folder with its exercise regions left for the learner.

Contract:
- :func:`write_starter` copies a project folder (sources, tests, configs;
  never environments, outputs or caches) to ``dest`` with every exercise
  region whose stage is not in ``keep`` stripped (:mod:`exercises`), adds
  ``progress.py`` (the learner's one command: the current stage, its failing
  check), ``hints.py`` (``progress.py hint`` and ``watch``) with
  ``hints.json`` (each region's hint and its reference, compressed, for the
  ladder's last level), ``dossier.py`` (``progress.py dossier``),
  ``failed_check.py`` (a failed check's figures against its limit, and the
  stage's known mistakes), ``route_coverage.py`` (``progress.py coverage``:
  what the learner's stages evidence for one route of ``roles.json``),
  ``authorship.py`` (whether a passing stage rests on the learner's own regions:
  written, present, not the reference's line for line), ``learner_files.py``
  (how they all read and write the learner's files) and the ``roles.json`` it
  is given, and puts a short note at the top of the README.
  ``seeded_bugs.toml`` keeps each mistake's stage, file, reason and tests but
  not its code (``find``/``replace`` quote the reference). It raises
  ``RegionError`` on a malformed marker before writing anything.
- :func:`starter_archive` returns the bytes of a zip of the full starter
  (nothing kept): the same files give the same bytes (sorted entries, fixed
  dates and modes), so a site build is reproducible.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import tomllib
import zipfile
import zlib
from importlib import resources
from pathlib import Path

from catalog_compiler.exercises import find_regions, source_files, strip_source

# What a starter leaves behind: environments, outputs and caches, never sources.
IGNORED = shutil.ignore_patterns(
    ".venv",
    "runs",
    "evidence",
    "learn",
    "build",
    "__pycache__",
    "*.egg-info",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    "*.pyc",
    "mlruns",
    "*.db",
    # The mutation report, its config and the correct reformulations quote the
    # reference's lines, a hardware probe times hand-written kernels of the
    # stages' own kind, and the accelerator report describes a run of the
    # reference's code.
    "mutation-report.json",
    "mutation.toml",
    "reformulations.toml",
    "probes",
    "accelerator-report.json",
)
# The learner's commands a starter ships (templates/), in import order: `hints`
# and `dossier` import `progress`, which imports `failed_check` and
# `learner_files`; `failed_check` imports `learner_files`; `route_coverage`
# imports `progress` and `dossier`.
LEARNER_TOOLS = (
    "learner_files.py",
    "failed_check.py",
    "progress.py",
    "hints.py",
    "authorship.py",
    "dossier.py",
    "route_coverage.py",
)
NOTE = """\
> **Starter.** This is the learner's copy of `{id}`: the code of each stage
> is yours to write. Every exercise region (`# --- exercise stage N: hint ---`)
> raises `NotImplementedError` naming its stage and hint until you write it.
> Install with the README's first command below (`python3 -m venv .venv && ...`)
> and activate the environment with its second (`. .venv/bin/activate`, in each
> new shell); then, from this folder:
> `python progress.py` runs the current stage and shows its first failing
> check; `python progress.py hint` gives the next hint (ask again for more);
> `python progress.py watch` reruns the stage on every save;
> `python progress.py dossier` writes what your runs demonstrated;
> `python progress.py coverage --role <id>` shows what they demonstrate for a
> route that cites this project (`roles.json` lists them; run it without
> `--role` to see their ids).

"""


def copy_project(project: Path, dest: Path) -> Path:
    """Copy ``project`` to ``dest`` (which must not exist), sources and tests only."""
    shutil.copytree(project, dest, ignore=IGNORED, symlinks=True)
    return dest


def project_files(project: Path) -> list[Path]:
    """The files a copy of ``project`` holds (what ``copy_project`` copies), sorted."""
    found: list[Path] = []

    def walk(folder: Path) -> None:
        names = sorted(p.name for p in folder.iterdir())
        skipped = IGNORED(str(folder), names)
        for name in names:
            path = folder / name
            if name in skipped:
                continue
            if path.is_dir() and not path.is_symlink():
                walk(path)
            elif path.is_file():
                found.append(path)

    walk(project)
    return found


def write_sources(project: Path, dest: Path, keep: set[str]) -> None:
    """Rewrite every source file of ``dest`` from ``project``, regions of ``keep`` written."""
    stripped = {
        source.relative_to(project): strip_source(
            source.read_text(encoding="utf-8"), keep, source.relative_to(project).as_posix()
        )
        for source in source_files(project)
    }
    for rel, text in stripped.items():
        (dest / rel).write_text(text, encoding="utf-8")


def starter_files(
    project: Path, keep: set[str] = frozenset(), roles: bytes | None = None
) -> dict[str, bytes]:
    """Relative path -> bytes of every file of ``project``'s starter (see the module doc);
    ``roles`` is the `roles.json` of the routes citing the project (`portfolio`)."""
    sources = set(source_files(project))
    files: dict[str, bytes] = {}
    for path in project_files(project):
        rel = path.relative_to(project).as_posix()
        if path in sources:
            text = strip_source(path.read_text(encoding="utf-8"), set(keep), rel)
            files[rel] = text.encode("utf-8")
        else:
            files[rel] = path.read_bytes()
    for name in LEARNER_TOOLS:
        files[name] = resources.files("catalog_compiler").joinpath("templates", name).read_bytes()
    files["hints.json"] = hints_json(project)
    if "seeded_bugs.toml" in files:
        files["seeded_bugs.toml"] = mistakes_only(files["seeded_bugs.toml"])
    if roles is not None:
        files["roles.json"] = roles
    if "README.md" in files:
        title, _, rest = files["README.md"].decode("utf-8").partition("\n")
        note = NOTE.format(id=project.name)
        files["README.md"] = f"{title}\n\n{note}{rest.lstrip()}".encode()
    return dict(sorted(files.items()))


def hints_json(project: Path) -> bytes:
    """Every region of ``project``: file, index among the file's markers, stage,
    hint and its reference lines (zlib, then base64: not readable by accident)."""
    regions = []
    for source in source_files(project):
        rel = source.relative_to(project).as_posix()
        lines = source.read_text(encoding="utf-8").splitlines()
        for index, region in enumerate(find_regions("\n".join(lines), rel)):
            body = "\n".join(lines[region.start : region.end - 1]) + "\n"
            packed = base64.b64encode(zlib.compress(body.encode("utf-8"), 9)).decode("ascii")
            regions.append(
                {
                    "path": rel,
                    "index": index,
                    "stage": region.stage,
                    "hint": region.hint,
                    "reference": packed,
                }
            )
    return (json.dumps({"regions": regions}, indent=1) + "\n").encode("utf-8")


def mistakes_only(text: bytes) -> bytes:
    """``seeded_bugs.toml`` without the code of each mistake (its ``find`` and
    ``replace`` quote the reference): id, stage, file, why and tests stay."""
    bugs = tomllib.loads(text.decode("utf-8")).get("bugs", [])
    out = [
        "# Plausible mistakes: write each into your code, one at a time; the tests",
        "# listed must then fail. (The reference's seeded bugs, without their code.)",
        "",
    ]
    for bug in bugs:
        out.append("[[bugs]]")
        for key in ("id", "stage", "file", "why"):
            if key in bug:
                out.append(f"{key} = {json.dumps(str(bug[key]), ensure_ascii=False)}")
        if "tests" in bug:
            out.append(f"tests = {json.dumps(list(bug['tests']), ensure_ascii=False)}")
        out.append("")
    return "\n".join(out).encode("utf-8")


def write_starter(
    project: Path, dest: Path, keep: set[str] = frozenset(), roles: bytes | None = None
) -> Path:
    """The starter of ``project`` at ``dest`` (replaced if present); see the module doc."""
    files = starter_files(project, keep, roles)  # Parses every marker before touching `dest`.
    if dest.exists():
        shutil.rmtree(dest)
    for rel, content in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return dest


def zip_files(files: dict[str, bytes], name: str) -> bytes:
    """A zip of ``files`` under the top folder ``name``; bytes depend only on the files."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for rel in sorted(files):
            info = zipfile.ZipInfo(f"{name}/{rel}", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, files[rel])
    return buffer.getvalue()


def zip_folder(folder: Path, name: str) -> bytes:
    """A zip of every file under ``folder``, as :func:`zip_files` writes it."""
    files = {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }
    return zip_files(files, name)


def starter_archive(project: Path, roles: bytes | None = None) -> bytes:
    """The zip of ``project``'s full starter (every region stripped)."""
    return zip_files(starter_files(project, roles=roles), project.name)
