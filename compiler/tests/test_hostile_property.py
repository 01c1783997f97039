"""Property: no damage to the real catalog makes catalog-compile crash, hang or misplace.

A copy of the real catalog (``catalog/``) and of every project manifest
(``projects/*/project.toml``, with empty stand-ins for the stage test files
that exist) is damaged in one file per case, by one of the kinds below, and
compiled in-process through the command line. Every case must:

- exit 0, 1 or 2 (never 3, the internal-error status) and print no traceback;
- finish within ``PER_RUN_SECONDS`` (a hang detector: a run takes well under
  a second; the limits stop alias bombs and deep nesting in milliseconds);
- report every new error at a file of the damaged tree and a line that file
  has; and, for the kinds that damage one file's own content or form (the
  "local" kinds), report at least one error that names the damaged file,
  as its location or as ``file:line`` in its message (a renamed stage is
  reported at the role citing it, with the manifest's stage line).

Hypothesis runs ``CASES`` cases, derandomized (a fixed seed, no example
database), so every run of the suite tries the same damage. One working copy
is damaged and repaired again after each case, and unchanged files are parsed
once and their parse reused (keyed by their bytes): a case then costs the
parse of the damaged file plus the schema and rules passes over the whole
catalog, which keeps the 300 cases well within a minute on two cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from catalog_compiler import discover, sources
from catalog_compiler.cli import main
from catalog_compiler.limits import MAX_FILE_BYTES
from click.testing import CliRunner
from conftest import REPO
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

CASES = 300
PER_RUN_SECONDS = 10.0

YAML_VALUE = re.compile(r"^(\s*(?:- )?[A-Za-z]+: )(\S.*)$")
YAML_ID = re.compile(r"^(\s*(?:- )?id: )(\S.*)$")
TOML_VALUE = re.compile(r'^([A-Za-z]+ = )(".*"|\[.*\])$')
TOML_ID = re.compile(r'^(id = )"(.*)"$')
TOML_TEST = re.compile(r'"tests/[^"]*"')
# Every kind of damage; those of one file type name it in KINDS_FOR.
KINDS = ["folder", "loop", "delete", "truncate", "nul", "bad-utf8", "separator", "deep"]
KINDS += ["long-id", "oversize", "tab", "edit-insert", "edit-delete", "edit-duplicate"]
KINDS += ["edit-swap", "alias-bomb", "recursive-alias", "tag", "date", "test-path"]
KINDS += ["rename-stage"]
KINDS_FOR = {
    "alias-bomb": "yaml",
    "recursive-alias": "yaml",
    "tag": "yaml",
    "date": "yaml",
    "test-path": "toml",
    "rename-stage": "toml",
}
SPECIALS = [":", "- ", "[", "]", "{", "}", '"', "'", "#", "&a ", "*a", "!", "%", "|", ">", "\t"]
SPECIALS += ["\n", "  ", "=", "\\", "\u2028", "\u00e9", "\r", "---\n", "? ", ",", "0x1F", "~"]


def _template(dest: Path) -> list[str]:
    """Copy the real catalog and manifests to ``dest``; return the damageable files."""
    files = []
    for source in sorted((REPO / "catalog").rglob("*.yaml")):
        rel = source.relative_to(REPO).as_posix()
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest / rel)
        files.append(rel)
    for manifest in sorted((REPO / "projects").glob("*/project.toml")):
        rel = manifest.relative_to(REPO).as_posix()
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(manifest, dest / rel)
        files.append(rel)
        try:
            stages = tomllib.loads(manifest.read_text(encoding="utf-8")).get("stages", [])
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            continue
        for stage in stages if isinstance(stages, list) else []:
            for test in stage.get("tests", []) if isinstance(stage, dict) else []:
                real = manifest.parent / str(test)
                if real.is_file() and real.resolve().is_relative_to(manifest.parent.resolve()):
                    stand_in = dest / rel.rsplit("/", 1)[0] / str(test)
                    stand_in.parent.mkdir(parents=True, exist_ok=True)
                    stand_in.touch()
    return files


def _memoised(loader: Callable) -> Callable:
    """``loader`` with its result reused for a regular file whose bytes it has seen."""
    memo: dict[tuple[str, bytes], tuple] = {}

    def load(file: Path, path: str):
        try:
            plain = file.is_file() and not file.is_symlink()
            data = file.read_bytes() if plain and file.stat().st_size < 1 << 16 else None
        except OSError:
            data = None
        if data is None:
            return loader(file, path)
        if (path, data) not in memo:
            memo[path, data] = loader(file, path)
        doc, found = memo[path, data]
        return doc, list(found)

    return load


@dataclass
class Damage:
    file: str
    kind: str
    local: bool  # At least one error must name the damaged file.
    must_fail: bool  # The damage is an error by itself.
    note: str = ""


def _lines_matching(lines: list[str], pattern: re.Pattern[str]) -> list[int]:
    """Lines that match ``pattern`` and whose value does not go on (a multi-line scalar)."""
    found = []
    for i, line in enumerate(lines):
        if match := pattern.match(line):
            key_column = len(match.group(1)) - len(match.group(1).lstrip(" -"))
            following = next((x for x in lines[i + 1 :] if x.strip()), "")
            if len(following) - len(following.lstrip(" ")) <= key_column:
                found.append(i)
    return found


def _insert(data: bytes, at: int, piece: bytes) -> bytes:
    return data[:at] + piece + data[at:]


def _damage(draw, root: Path, files: list[str]) -> Damage:  # noqa: C901 - one branch per kind
    """Draw one damage, apply it under ``root`` and describe it."""
    kind = draw(st.sampled_from(KINDS))
    suffix = {"yaml": ".yaml", "toml": ".toml"}.get(KINDS_FOR.get(kind, ""), "")
    rel = draw(st.sampled_from([f for f in files if f.endswith(suffix)]))
    path = root / rel
    is_yaml = rel.endswith(".yaml")
    data = path.read_bytes()
    text = data.decode("utf-8")
    lines = text.split("\n")
    position = draw(st.integers(0, max(0, len(data) - 1)))
    new: bytes | str | None = None
    local, must_fail = True, True

    if kind in ("folder", "loop"):
        path.unlink()
        path.mkdir() if kind == "folder" else path.symlink_to(path.name)
        return Damage(rel, kind, local, must_fail)
    if kind == "delete":
        path.unlink()
        return Damage(rel, kind, False, True)
    if kind == "truncate":
        new, local, must_fail = data[:position], False, False
    elif kind == "nul":
        new = _insert(data, position, b"\x00")
    elif kind == "bad-utf8":
        new = _insert(data, position, draw(st.sampled_from([b"\xff", b"\xfe", b"\xc3(", b"\x80"])))
    elif kind == "separator":
        piece = draw(st.sampled_from(["\u2028", "\u2029", "\u0085"]))
        at = draw(st.integers(0, len(text)))
        new, local, must_fail = text[:at] + piece + text[at:], False, False
    elif kind == "oversize":
        new = data + b"#" * (MAX_FILE_BYTES + 1 - len(data)) + b"\n"
    elif kind.startswith("edit-"):
        local, must_fail = False, False
        how = kind.removeprefix("edit-")
        if how == "insert":
            at = draw(st.integers(0, len(text)))
            new = text[:at] + draw(st.sampled_from(SPECIALS)) + text[at:]
        elif how == "delete":
            end = draw(st.integers(position, min(len(text), position + 40)))
            new = text[:position] + text[end:]
        else:
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if how == "duplicate":
                lines.insert(i, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            new = "\n".join(lines)
    elif kind == "tab":
        indented = [i for i, line in enumerate(lines) if line.startswith("  ")]
        if not indented:
            return _unchanged(rel)
        i = draw(st.sampled_from(indented))
        lines[i] = "\t" + lines[i][2:]
        # YAML forbids a tab in indentation; TOML takes it as whitespace (an indented
        # line of a multi-line array stays valid), so only YAML must fail.
        new, must_fail = "\n".join(lines), is_yaml
    elif kind == "deep":
        candidates = _lines_matching(lines, YAML_VALUE if is_yaml else TOML_VALUE)
        if not candidates:
            return _unchanged(rel)
        i = draw(st.sampled_from(candidates))
        n = draw(st.integers(33, 5000))
        opener = draw(st.sampled_from(["[", "{a: "] if is_yaml else ["[", "[{a = "]))
        closer = {"[": "]", "{a: ": "}", "[{a = ": "}]"}[opener]
        prefix = (YAML_VALUE if is_yaml else TOML_VALUE).match(lines[i]).group(1)
        lines[i] = prefix + opener * n + "1" + closer * n
        new = "\n".join(lines)
    elif kind == "long-id":
        candidates = _lines_matching(lines, YAML_ID if is_yaml else TOML_ID)
        if not candidates:
            return _unchanged(rel)
        i = draw(st.sampled_from(candidates))
        long_id = "-".join(["x" * 9] * draw(st.integers(7, 30)))  # 69 to 299 characters.
        prefix = (YAML_ID if is_yaml else TOML_ID).match(lines[i]).group(1)
        lines[i] = prefix + (long_id if is_yaml else json.dumps(long_id))
        new = "\n".join(lines)
    elif kind == "alias-bomb":
        width = draw(st.integers(8, 12))
        bomb = [f"zz0: &zz0 [{', '.join(['lol'] * width)}]"]
        bomb += [f"zz{i}: &zz{i} [{', '.join([f'*zz{i - 1}'] * width)}]" for i in range(1, 10)]
        new = text.rstrip("\n") + "\n" + "\n".join(bomb) + "\n"
    elif kind == "recursive-alias":
        new = text.rstrip("\n") + "\nzz: &loop [a, [*loop]]\n"
    elif kind in ("tag", "date"):
        candidates = _lines_matching(lines, YAML_VALUE)
        if not candidates:
            return _unchanged(rel)
        i = draw(st.sampled_from(candidates))
        match = YAML_VALUE.match(lines[i])
        if kind == "tag":
            tag = draw(st.sampled_from(["!!int ", "!!str ", "!!python/object:os.system ", "! "]))
            lines[i] = match.group(1) + tag + match.group(2)
        else:
            date = draw(st.sampled_from(["2001-12-14", "2001-12-14 21:59:43.10 -5", "2024-1-9"]))
            lines[i] = match.group(1) + date
        new = "\n".join(lines)
    elif kind == "test-path":
        found = list(TOML_TEST.finditer(text))
        if not found:
            return _unchanged(rel)
        hit = draw(st.sampled_from(found))
        outside = draw(st.sampled_from(["/etc/passwd", "../../catalog/catalog.yaml", "../x.py"]))
        new = text[: hit.start()] + json.dumps(outside) + text[hit.end() :]
    elif kind == "rename-stage":
        stage_lines = _lines_matching(lines, TOML_ID)[1:]  # The first `id` is the project's.
        if not stage_lines:
            return _unchanged(rel)
        i = draw(st.sampled_from(stage_lines))
        lines[i] = lines[i][:-1] + 'b"'
        new, must_fail = "\n".join(lines), False  # An error only if a role cites it.
    path.unlink()  # A fresh file: never write through to the template.
    path.write_bytes(new if isinstance(new, bytes) else new.encode("utf-8"))
    return Damage(rel, kind, local, must_fail)


def _restore(original: Path, damaged: Path) -> None:
    """Put the template's ``original`` back at ``damaged`` (whatever is there now)."""
    if damaged.is_dir() and not damaged.is_symlink():
        shutil.rmtree(damaged)
    elif os.path.lexists(damaged):
        damaged.unlink()
    os.link(original, damaged)


def _unchanged(rel: str) -> Damage:
    return Damage(rel, "none", False, False)


def _line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n") + 1 if path.is_file() else 1
    except OSError:
        return 1


def _names(d: dict, damage: Damage, root: Path) -> bool:
    """True if diagnostic ``d`` names the damaged file (location, or ``file:line`` text)."""
    if d["file"] == damage.file:
        return True
    for line in re.findall(re.escape(damage.file) + r":(\d+)", d["message"]):
        if 1 <= int(line) <= _line_count(root / damage.file):
            return True
    return False


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, list[str], set[tuple]]:
    """The undamaged copy, its damageable files and the diagnostics it already has."""
    root = tmp_path_factory.mktemp("template")
    files = _template(root)
    result = CliRunner().invoke(main, ["--root", str(root), "--format", "json", "--check"])
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.output)
    base = {(d["code"], d["file"], d["message"]) for d in report["diagnostics"]}
    return root, files, base


def test_damaged_catalogs_never_crash_hang_or_misplace(template, monkeypatch) -> None:
    root, files, base = template
    # One working copy (hard links to the template), repaired after each case.
    work = Path(tempfile.mkdtemp(prefix="damaged-")) / "repo"
    build = work.parent / "build"
    shutil.copytree(root, work, copy_function=os.link, symlinks=True)
    monkeypatch.setattr(sources, "load_yaml", _memoised(sources.load_yaml))
    monkeypatch.setattr(discover, "load_toml", _memoised(discover.load_toml))
    monkeypatch.delenv("CATALOG_COMPILE_DEBUG", raising=False)
    seconds: list[float] = []
    kinds: dict[str, int] = {}

    @settings(
        max_examples=CASES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def check(data) -> None:
        damage = _damage(data.draw, work, files)
        kinds[damage.kind] = kinds.get(damage.kind, 0) + 1
        try:
            start = time.perf_counter()
            result = CliRunner().invoke(
                main,
                ["--root", str(work), "--format", "json", "--out", str(build)],
                catch_exceptions=False,
            )
            seconds.append(elapsed := time.perf_counter() - start)
            assert result.exit_code in (0, 1, 2), (damage, result.output)
            assert "Traceback" not in result.output, damage
            assert elapsed < PER_RUN_SECONDS, (damage, elapsed)
            if result.exit_code == 2:
                assert damage.kind in ("folder", "loop", "delete"), (damage, result.output)
                return  # catalog.yaml itself is gone: a usage error, by design.
            report = json.loads(result.output)
            new = [
                d
                for d in report["diagnostics"]
                if d["severity"] == "error" and (d["code"], d["file"], d["message"]) not in base
            ]
            for d in new:
                where = work / d["file"]
                assert os.path.lexists(where) or d["file"] == damage.file, (damage, d)
                assert 1 <= d["line"] <= _line_count(where) and d["column"] >= 1, (damage, d)
            if damage.must_fail:
                assert result.exit_code == 1 and new, (damage, report["diagnostics"])
            if damage.local and new:
                assert any(_names(d, damage, work) for d in new), (damage, new)
        finally:
            _restore(root / damage.file, work / damage.file)
            shutil.rmtree(build, ignore_errors=True)

    try:
        check()
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)
    assert len(seconds) >= CASES
    print(
        f"{len(seconds)} damaged catalogs, slowest run {max(seconds):.2f} s, "
        f"median {sorted(seconds)[len(seconds) // 2]:.3f} s; kinds {dict(sorted(kinds.items()))}"
    )
