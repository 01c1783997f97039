"""Exercise regions and learner starters (LEARNING.md): parsing, stripping, archives."""

from __future__ import annotations

import ast
import base64
import io
import json
import tomllib
import zipfile
import zlib
from pathlib import Path

import pytest
from catalog_compiler.exercises import (
    RegionError,
    find_regions,
    is_stripped,
    project_regions,
    strip_source,
)
from catalog_compiler.starters import starter_archive, starter_files, write_starter

SOURCE = '''\
import math


def area(r):
    """Area of a circle."""
    # --- exercise stage 1: Multiply pi by the radius squared. ---
    value = math.pi * r * r
    return value
    # --- end exercise ---


class Shape:
    def scale(self, k):
        # --- exercise stage 2: Return a copy scaled by k. ---
        return Shape()
        # --- end exercise ---
'''


def test_regions_are_found_with_stage_hint_and_lines():
    regions = find_regions(SOURCE, "shapes.py")
    assert [(r.stage, r.hint, r.start, r.end) for r in regions] == [
        ("1", "Multiply pi by the radius squared.", 6, 9),
        ("2", "Return a copy scaled by k.", 14, 16),
    ]


@pytest.mark.parametrize(
    ("keep", "written", "raising"),
    [(set(), [], ["1", "2"]), ({"1"}, ["1"], ["2"]), ({"1", "2"}, ["1", "2"], [])],
)
def test_strip_replaces_only_the_regions_not_kept(keep, written, raising):
    stripped = strip_source(SOURCE, keep, "shapes.py")
    ast.parse(stripped)  # Still a valid module.
    regions = find_regions(stripped, "shapes.py")  # Markers survive stripping.
    assert sorted(r.stage for r in regions if not is_stripped(stripped, r)) == written
    assert sorted(r.stage for r in regions if is_stripped(stripped, r)) == raising
    namespace: dict = {}
    exec(compile(stripped, "shapes.py", "exec"), namespace)  # noqa: S102 - our own fixture
    if "1" in raising:
        with pytest.raises(NotImplementedError, match="Stage 1 exercise: Multiply pi"):
            namespace["area"](2.0)
    else:
        assert namespace["area"](2.0) == pytest.approx(12.566370614359172)


def test_keeping_every_stage_gives_the_reference_back():
    assert strip_source(SOURCE, {"1", "2"}) == SOURCE


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("def f():\n    # --- exercise stage 1: a. ---\n    return 1\n", 2, "never closed"),
        ("def f():\n    return 1\n    # --- end exercise ---\n", 3, "without an opening"),
        (
            "def f():\n    # --- exercise stage 1: a. ---\n    # --- exercise stage 2: b. ---\n"
            "    return 1\n    # --- end exercise ---\n    # --- end exercise ---\n",
            3,
            "opens inside",
        ),
        (
            "def f():\n    # --- exercise stage 1: a. ---\n    return 1\n# --- end exercise ---\n",
            4,
            "indent differs",
        ),
        ("# --- exercise stage 1: a. ---\nx = 1\n# --- end exercise ---\n", 1, "module level"),
        (
            "def f():\n    # --- exercise stage 1: a. ---\n    # --- end exercise ---\n",
            2,
            "no code",
        ),
        ("def f():\n    # --- exercise 1: a ---\n    return 1\n", 2, "malformed"),
    ],
)
def test_malformed_markers_are_errors_with_their_line(text, line, message):
    with pytest.raises(RegionError, match=message) as caught:
        find_regions(text, "bad.py")
    assert caught.value.line == line
    assert str(caught.value).startswith(f"bad.py:{line}:")


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "demo"
    (project / "src" / "demo").mkdir(parents=True)
    (project / "src" / "demo" / "__init__.py").write_text("")
    (project / "src" / "demo" / "shapes.py").write_text(SOURCE)
    (project / "README.md").write_text("# Demo\n\nText.\n")
    (project / "runs").mkdir()
    (project / "runs" / "big.bin").write_bytes(b"x" * 10)
    (project / "src" / "demo" / "__pycache__").mkdir()
    (project / "src" / "demo" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    return project


def test_starter_strips_sources_adds_progress_and_leaves_outputs_behind(tmp_path):
    project = _project(tmp_path)
    assert [r.path for r in project_regions(project)] == ["src/demo/shapes.py"] * 2
    dest = write_starter(project, tmp_path / "out" / "demo")
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "authorship.py",
        "dossier.py",
        "failed_check.py",
        "hints.json",
        "hints.py",
        "learner_files.py",
        "progress.py",
        "route_coverage.py",
        "src/demo/__init__.py",
        "src/demo/shapes.py",
    ]
    stripped = (dest / "src/demo/shapes.py").read_text()
    assert "raise NotImplementedError('Stage 1 exercise:" in stripped
    assert (dest / "README.md").read_text().startswith("# Demo\n\n> **Starter.**")
    # The original is untouched.
    assert (project / "src/demo/shapes.py").read_text() == SOURCE


def test_starter_archive_is_reproducible_and_holds_the_starter(tmp_path):
    project = _project(tmp_path)
    first, second = starter_archive(project), starter_archive(project)
    assert first == second
    with zipfile.ZipFile(io.BytesIO(first)) as archive:
        names = archive.namelist()
        assert names == sorted(f"demo/{name}" for name in starter_files(project))
        shapes = archive.read("demo/src/demo/shapes.py").decode()
    assert shapes == strip_source(SOURCE, set())
    (project / "src/demo/shapes.py").write_text(SOURCE.replace("radius", "r"))
    assert starter_archive(project) != first


def test_a_bad_marker_stops_the_starter_before_anything_is_written(tmp_path):
    project = _project(tmp_path)
    (project / "src/demo/bad.py").write_text("def f():\n    # --- exercise stage 1: a. ---\n")
    dest = tmp_path / "out"
    with pytest.raises(RegionError, match="never closed"):
        write_starter(project, dest)
    assert not dest.exists()


BUGS = """\
[[bugs]]
id = "no-pi"
stage = "1"
file = "src/demo/shapes.py"
find = '    value = math.pi * r * r'
replace = '    value = r * r'
why = "Drops pi: the \\"area\\" is off by 3.14."
tests = ["tests/test_a.py::test_area"]
"""


def test_the_starter_holds_no_solution_but_the_hint_ladder_s_last_level(tmp_path):
    """Only hints.json carries the reference (compressed), one entry per region, and
    the seeded bugs keep their reasons but lose their code."""
    project = _project(tmp_path)
    (project / "seeded_bugs.toml").write_text(BUGS)
    files = starter_files(project)
    solution = ["value = math.pi * r * r", "return value", "return Shape()", "r * r"]
    for name, content in files.items():
        text = content.decode("utf-8")
        leaked = [line for line in solution if line in text]
        assert not leaked, (name, leaked)
    bugs = tomllib.loads(files["seeded_bugs.toml"].decode())["bugs"]
    assert bugs == [
        {
            "id": "no-pi",
            "stage": "1",
            "file": "src/demo/shapes.py",
            "why": 'Drops pi: the "area" is off by 3.14.',
            "tests": ["tests/test_a.py::test_area"],
        }
    ]
    regions = json.loads(files["hints.json"])["regions"]
    assert [(r["path"], r["index"], r["stage"], r["hint"]) for r in regions] == [
        ("src/demo/shapes.py", 0, "1", "Multiply pi by the radius squared."),
        ("src/demo/shapes.py", 1, "2", "Return a copy scaled by k."),
    ]
    bodies = [zlib.decompress(base64.b64decode(r["reference"])).decode() for r in regions]
    assert bodies == ["    value = math.pi * r * r\n    return value\n", "        return Shape()\n"]
