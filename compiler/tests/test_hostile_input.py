"""Hostile input: every kind of damage gives a located diagnostic, never a traceback.

Each test breaks a copy of the valid fixture in one way a careless edit or a
hostile file can (folders and symlink loops where files belong, deep
nesting, alias bombs, tags, dates, bad encodings, huge ids, paths that leave
the project) and checks the rule, the file and the exact line and column.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from catalog_compiler import cli
from catalog_compiler.limits import MAX_FILE_BYTES, MAX_ID_LENGTH
from catalog_compiler.source_text import Lines, byte_position
from catalog_compiler.toml_source import parse_toml
from catalog_compiler.yaml_source import parse_yaml
from conftest import run_cli, run_json

ROLE = "catalog/roles/demo-engineer.yaml"
TRACKS = "catalog/tracks.yaml"
MANIFEST = "projects/demo-project/project.toml"


def _codes(report: dict) -> list[tuple[str, str, int, int]]:
    return [(d["code"], d["file"], d["line"], d["column"]) for d in report["diagnostics"]]


def _only(root: Path) -> dict:
    """Run on ``root``; return its one diagnostic (and check the run failed cleanly)."""
    exit_code, report = run_json(root)
    assert exit_code == 1, report
    assert len(report["diagnostics"]) == 1, report["diagnostics"]
    assert "Traceback" not in run_cli("--root", root).output
    return report["diagnostics"][0]


# Folders, symlink loops and other non-files where a file belongs -----------


@pytest.mark.parametrize("target", [TRACKS, ROLE, "catalog/roles/zz.yaml"])
@pytest.mark.parametrize("kind", ["folder", "loop", "dangling"])
def test_a_non_file_where_a_yaml_file_belongs(valid_repo: Path, target: str, kind: str) -> None:
    path = valid_repo / target
    path.unlink(missing_ok=True)
    if kind == "folder":
        path.mkdir()
    elif kind == "loop":
        path.symlink_to(path.name)
    else:
        path.symlink_to("no-such-file.yaml")
    _, report = run_json(valid_repo)
    found = [d for d in report["diagnostics"] if d["code"] == "FIL004"]
    assert [(d["file"], d["line"], d["column"]) for d in found] == [(target, 1, 1)]
    word = {"folder": "is a folder", "loop": "loop", "dangling": "does not exist"}[kind]
    assert word in found[0]["message"]
    # Not "missing" (FIL001/FIL002), and the unreadable role is not "unlisted" (FIL003).
    assert not {"FIL001", "FIL002", "FIL003"} & {d["code"] for d in report["diagnostics"]}


def test_a_folder_where_a_manifest_belongs(valid_repo: Path) -> None:
    manifest = valid_repo / MANIFEST
    manifest.unlink()
    manifest.mkdir()
    codes = {d["code"]: d for d in run_json(valid_repo)[1]["diagnostics"]}
    assert "DSK001" not in codes  # The manifest is there; it is no file.
    assert (codes["FIL004"]["file"], codes["FIL004"]["line"]) == (MANIFEST, 1)


def test_a_pipe_where_a_role_file_belongs_does_not_block(valid_repo: Path) -> None:
    fifo = valid_repo / "catalog" / "roles" / "zz.yaml"
    os.mkfifo(fifo)
    d = _only(valid_repo)
    assert (d["code"], d["file"]) == ("FIL004", "catalog/roles/zz.yaml")
    assert "not a regular file" in d["message"]


def test_catalog_yaml_as_a_folder_is_a_diagnostic_not_a_usage_error(valid_repo: Path) -> None:
    catalog = valid_repo / "catalog" / "catalog.yaml"
    catalog.unlink()
    catalog.mkdir()
    exit_code, report = run_json(valid_repo)
    assert exit_code == 1
    assert ("FIL004", "catalog/catalog.yaml", 1, 1) in _codes(report)


# Nesting, aliases, size ------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "column"),
    # The 33rd level: the 30th `[` (the document, `tracks` and its item are three),
    # or the key inside the 29th mapping.
    [("[" * 10_000 + "]" * 10_000, 41), ("{a: " * 10_000 + "}" * 10_000, 125)],
)
def test_deep_yaml_nesting_stops_at_the_limit(valid_repo: Path, title: str, column: int) -> None:
    tracks = valid_repo / TRACKS
    tracks.write_text(tracks.read_text().replace("title: Image", f"title: {title}"))
    d = _only(valid_repo)
    assert (d["code"], d["file"], d["line"], d["column"]) == ("LIM001", TRACKS, 5, column)


def test_deep_block_nesting_stops_at_the_limit() -> None:
    text = "".join("  " * i + "- \n" for i in range(200)) + "  " * 200 + "x\n"
    doc, [d] = parse_yaml(text, "x.yaml")
    assert doc is None and d.code == "LIM001" and d.line <= 40


def test_deep_toml_nesting_stops_at_the_limit(valid_repo: Path) -> None:
    manifest = valid_repo / MANIFEST
    deep = "[" * 10_000 + "]" * 10_000
    text = manifest.read_text().replace("preparation = [", f"x = {deep}\npreparation = [")
    manifest.write_text(text)
    d = _only(valid_repo)
    assert (d["code"], d["file"], d["line"], d["column"]) == ("LIM001", MANIFEST, 4, 36)


def test_deep_dotted_toml_keys_are_refused() -> None:
    doc, [d] = parse_toml("a" + ".b" * 200 + " = 1\n", "p.toml")
    assert doc is None and d.code == "LIM001"


def test_billion_laughs_is_refused_by_the_alias_count(valid_repo: Path) -> None:
    lines = ["    a0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    tracks = valid_repo / TRACKS
    tracks.write_text(tracks.read_text() + "\n".join(lines) + "\n")
    d = _only(valid_repo)
    # The 65th alias: a7's fifth item (a1..a6 hold 60; `    a7: &a7 [` is 13 wide).
    assert (d["code"], d["file"], d["line"], d["column"]) == ("LIM002", TRACKS, 13, 34)


def test_a_file_over_the_size_limit_is_not_read(valid_repo: Path) -> None:
    lessons = valid_repo / "catalog" / "lessons.yaml"
    with open(lessons, "a", encoding="utf-8") as f:
        f.write("#" * MAX_FILE_BYTES + "\n")
    d = _only(valid_repo)
    assert (d["code"], d["file"], d["line"]) == ("LIM004", "catalog/lessons.yaml", 1)
    assert f"more than the {MAX_FILE_BYTES // 2**20} MiB" in d["message"]


# Tags, dates, directives -------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "code", "line", "column"),
    [
        ("title: Image", "title: !!int 'text'", "YML005", 5, 12),
        ("title: Image", "title: !!python/object:os.system [ls]", "YML005", 5, 12),
        ("title: Image", "title: !local Image", "YML005", 5, 12),
        ("title: Image", "title: 2001-12-14", "YML004", 5, 12),
        ("id: image", "id: 2001-12-14 10:00:00", "YML004", 4, 9),
        ("id: image", "id: 2001-13-45", "YML004", 4, 9),
        ("tracks:", "%YAML 1.2\n---\ntracks:", "YML005", 1, 1),
    ],
)
def test_tags_dates_and_directives(
    valid_repo: Path, old: str, new: str, code: str, line: int, column: int
) -> None:
    tracks = valid_repo / TRACKS
    tracks.write_text(tracks.read_text().replace(old, new))
    d = _only(valid_repo)
    assert (d["code"], d["file"], d["line"], d["column"]) == (code, TRACKS, line, column)
    if code == "YML004":
        assert "date" in d["message"] and "Quote" in d["hint"]


@pytest.mark.parametrize(
    ("value", "described"),
    [("1979-05-27", "the date `1979-05-27`"), ("07:32:00", "the value `07:32:00`")],
)
def test_toml_dates_and_times_where_text_belongs(
    valid_repo: Path, value: str, described: str
) -> None:
    manifest = valid_repo / MANIFEST
    manifest.write_text(manifest.read_text().replace('title = "Demo project"', f"title = {value}"))
    d = _only(valid_repo)
    assert (d["code"], d["file"], d["line"], d["pointer"]) == ("SCH003", MANIFEST, 2, "/title")
    assert described in d["message"]


def test_a_quoted_date_stays_text(valid_repo: Path) -> None:
    tracks = valid_repo / TRACKS
    tracks.write_text(tracks.read_text().replace("title: Image", "title: '2001-12-14'"))
    assert run_json(valid_repo)[0] == 0


# Encodings and line numbers ----------------------------------------------


@pytest.mark.parametrize(
    ("target", "insert", "where"),
    [
        (ROLE, b"\x00", b"title: Demo"),
        (ROLE, b"\xff", b"title: Demo"),
        (ROLE, b"\xc3(", b"title: Demo"),
        (MANIFEST, b"\x00", b'title = "Second'),
        (MANIFEST, b"\xfe", b'title = "Second'),
        (MANIFEST, b"\x1b", b'title = "Second'),
    ],
)
def test_encoding_faults_are_placed_at_their_line_and_column(
    valid_repo: Path, target: str, insert: bytes, where: bytes
) -> None:
    path = valid_repo / target
    data = path.read_bytes()
    at = data.index(where) + len(where)
    path.write_bytes(data[:at] + insert + data[at:])
    line = data[:at].count(b"\n") + 1
    column = at - (data.rfind(b"\n", 0, at) + 1) + 1  # ASCII before it: bytes = characters.
    d = _only(valid_repo)
    assert (d["code"], d["file"], d["line"], d["column"]) == ("FIL005", target, line, column)


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_unicode_line_separators_in_toml_strings_keep_line_numbers(
    valid_repo: Path, separator: str
) -> None:
    manifest = valid_repo / MANIFEST
    text = manifest.read_text(encoding="utf-8")
    text = text.replace('title = "First stage"', f'title = "First{separator}stage"')
    text = text.replace(
        'hardware = "cpu"\n\n[[stages]]\nid = "2"', 'hardware = "cpu"\n\n[[stages]]\nid = 2'
    )
    manifest.write_text(text, encoding="utf-8")
    [d] = run_json(valid_repo)[1]["diagnostics"]
    expected = text.split("\n").index("id = 2") + 1
    assert (d["code"], d["file"], d["line"], d["pointer"]) == (
        "SCH003",
        MANIFEST,
        expected,
        "/stages/1/id",
    )


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085", "\r"])
def test_unicode_line_separators_in_yaml_keep_line_numbers(separator: str) -> None:
    doc, found = parse_yaml(f"a: 'x{separator}y'\nb: [1, 2\n", "x.yaml")
    [d] = found
    assert (d.code, d.line) == ("YML001", 3)  # The flow sequence ends at the end of line 2.


def test_positions_count_characters_not_bytes() -> None:
    text = "é: [\nü\n"
    assert Lines(text).position(text.index("ü")) == Lines("x").position(0).__class__(2, 1)
    data = "aé\nüx".encode()
    assert byte_position(data, data.index(b"x")) == Lines("x").position(0).__class__(2, 2)


# Ids, test paths, stage references ------------------------------------------


def test_a_very_long_project_id_is_refused_before_it_becomes_a_file_name(
    valid_repo: Path,
) -> None:
    long_id = "p" * 251
    folder = valid_repo / "projects" / long_id
    folder.mkdir()
    source = (valid_repo / "projects" / "demo-extension" / "project.toml").read_text()
    (folder / "project.toml").write_text(
        source.replace('id = "demo-extension"', f'id = "{long_id}"').replace(
            'status = "ready"', 'status = "planned"'
        )
    )
    _, report = run_json(valid_repo)
    found = [d for d in report["diagnostics"] if d["code"] == "ID005"]
    assert [(d["file"], d["line"], d["column"]) for d in found] == [
        (f"projects/{long_id}/project.toml", 1, 6)
    ]
    assert f"{len(long_id)} characters" in found[0]["message"]
    assert len(found[0]["message"]) < 200


def test_id_of_the_maximum_length_is_accepted(valid_repo: Path) -> None:
    tracks = valid_repo / TRACKS
    tracks.write_text(tracks.read_text().replace("id: image", "id: " + "i" * MAX_ID_LENGTH))
    assert run_json(valid_repo)[0] == 0


@pytest.mark.parametrize("test", ["/etc/passwd", "../../catalog/catalog.yaml", "tests/../../x.py"])
def test_stage_test_paths_stay_inside_the_project(valid_repo: Path, test: str) -> None:
    manifest = valid_repo / MANIFEST
    manifest.write_text(
        manifest.read_text().replace('"tests/test_stage_1_first.py"', json.dumps(test))
    )
    d = _only(valid_repo)
    assert (d["code"], d["file"], d["line"], d["column"]) == ("DSK005", MANIFEST, 10, 10)


def test_a_symlink_out_of_the_project_is_outside(valid_repo: Path) -> None:
    project = valid_repo / "projects" / "demo-project"
    (project / "tests" / "test_stage_1_first.py").unlink()
    (project / "tests" / "test_stage_1_first.py").symlink_to(valid_repo / TRACKS)
    d = _only(valid_repo)
    assert (d["code"], d["file"], d["line"]) == ("DSK005", MANIFEST, 10)


def test_a_renamed_stage_points_at_the_manifest_too(valid_repo: Path) -> None:
    manifest = valid_repo / MANIFEST
    manifest.write_text(manifest.read_text().replace('id = "2"', 'id = "2b"'))
    d = _only(valid_repo)
    assert (d["code"], d["file"]) == ("REF005", ROLE)
    # The manifest's stage `2b` is on line 14.
    assert f"`{MANIFEST}:14`" in d["message"], d["message"]


# The command line ------------------------------------------------------------


def test_out_below_an_existing_file_is_a_usage_error(valid_repo: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = run_cli("--root", valid_repo, "--out", blocker / "build" / "site")
    assert result.exit_code == 2
    assert "Traceback" not in result.output and "a-file" in result.output
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_an_internal_error_exits_3_with_one_diagnostic(
    valid_repo: Path, monkeypatch, fmt: str
) -> None:
    def broken(root: Path, strict: bool = False):
        raise RecursionError("maximum recursion depth exceeded\nsecond line")

    monkeypatch.setattr("catalog_compiler.pipeline.compile_catalog", broken)
    monkeypatch.delenv("CATALOG_COMPILE_DEBUG", raising=False)
    result = run_cli("--root", valid_repo, "--format", fmt)
    assert result.exit_code == cli.EXIT_INTERNAL == 3
    assert "Traceback" not in result.output and "second line" not in result.output
    if fmt == "json":
        report = json.loads(result.output)
        [d] = report["diagnostics"]
        assert report["exitCode"] == 3
    else:
        first, hint, summary = result.output.splitlines()
        assert first.startswith("catalog-compile:1:1: error[INT001] ")
        assert "RecursionError: maximum recursion depth exceeded" in first
        assert hint.startswith("  hint: Report it as an issue")
        assert summary == "1 error, 0 warnings in 1 file. Nothing written."
    assert not (valid_repo / "build").exists()


def test_usage_errors_still_exit_2_through_the_boundary(tmp_path: Path) -> None:
    result = run_cli("--root", tmp_path)
    assert result.exit_code == 2 and "Traceback" not in result.output
