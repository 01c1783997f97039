"""The learner's tools on damaged files: `progress.py`, `hint`, `dossier`, `coverage`.

A starter of a small project (one stage whose test fails at once, and a
conftest that writes `evidence/stage_1.json` in place, as most projects'
do) gets one damaged file: `evidence/progress.json` or `evidence/stage_1.json`
as a JSON list, invalid JSON, a folder, a FIFO, a symbolic link to a file
outside the starter, a 50 MB file or a file without permissions (as root, the
command runs without the capabilities that override permissions, through
`setpriv`, so it meets the permission bits as any user does). Each command
runs as a subprocess with a timeout (a hang is a failure): it exits 0, 1 or 2,
never with a traceback; a file it cannot use is refused in one line on stderr
that names it; stamps that are not stamps are set aside with one line; and
the link's target keeps its bytes. `coverage` meets a FIFO named
`progress.json` and a path longer than the system allows.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from catalog_compiler.portfolio import progress_module
from catalog_compiler.starters import write_starter
from conftest import VALID

TIMEOUT = 60  # Seconds; every command here answers in a few.
SHAPES = '''\
import math


def area(r):
    """Area of a circle of radius ``r``."""
    # --- exercise stage 1: Multiply pi by the radius squared. ---
    return math.pi * r * r
    # --- end exercise ---
'''
TEST = '''\
from damage_demo.shapes import area


def test_area_of_the_unit_circle():
    """The unit circle's area is pi."""
    assert abs(area(1.0) - 3.14159) < 1e-3
'''
# Written in place, not through a temporary file: the way that would follow a link.
CONFTEST = """\
import json
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="module")
def evidence():
    yield
    folder = Path(__file__).resolve().parent.parent / "evidence"
    folder.mkdir(exist_ok=True)
    payload = {"stage": "1", "jax": "none", "records": []}
    (folder / "stage_1.json").write_text(json.dumps(payload) + "\\n", encoding="utf-8")
"""
MANIFEST = """\
id = "damage-demo"
title = "Damage demo"
status = "ready"

[[stages]]
id = "1"
title = "The area"
deliverable = "The area of a circle"
tests = ["tests/test_stage_1_area.py"]
"""
STAGE_TESTS = ["tests/test_stage_1_area.py"]
OUTSIDE = b'{"stages": {}, "note": "a file outside the starter"}\n'
CASES = ["list", "invalid", "folder", "fifo", "link", "huge", "no-permission"]
REFUSED = {"folder", "fifo", "link", "huge", "no-permission"}  # Unusable: one line, exit 2.


@pytest.fixture
def starter(tmp_path: Path) -> Path:
    project = tmp_path / "damage-demo"
    for rel, text in {
        "project.toml": MANIFEST,
        "README.md": "# Damage demo\n\nA circle.\n",
        "src/damage_demo/__init__.py": "",
        "src/damage_demo/shapes.py": SHAPES,
        "tests/conftest.py": CONFTEST,
        "tests/test_stage_1_area.py": TEST,
    }.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text, encoding="utf-8")
    folder = write_starter(project, tmp_path / "starter")
    (folder / "evidence").mkdir()
    return folder


def damage(path: Path, case: str, outside: Path) -> None:
    """Make ``path`` the damaged file of ``case``."""
    if case == "list":
        path.write_text("[1, 2, 3]\n", encoding="utf-8")
    elif case == "invalid":
        path.write_text('{"stages": {"1": ', encoding="utf-8")
    elif case == "folder":
        path.mkdir()
    elif case == "fifo":
        os.mkfifo(path)
    elif case == "link":
        outside.write_bytes(OUTSIDE)
        path.symlink_to(outside)
    elif case == "huge":
        with path.open("wb") as file:
            file.write(b"[" + b"1," * (25 * 2**20) + b"1]")  # 50 MB of valid JSON.
    elif case == "no-permission":
        if os.geteuid() == 0 and not SETPRIV:
            pytest.skip("root reads any file whatever its permissions, and no `setpriv`")
        path.write_text("{}\n", encoding="utf-8")
        path.chmod(0)


def answer(command: list[str], **options) -> subprocess.CompletedProcess:
    """``command``'s run, within :data:`TIMEOUT`; past it, the test fails and the
    command's whole process group is killed (a stage's pytest blocked on a FIFO
    would otherwise outlive it)."""
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **options,
    ) as process:
        try:
            out, err = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            pytest.fail(f"`{' '.join(command[1:])}` did not answer in {TIMEOUT} s (a hang)")
    return subprocess.CompletedProcess(command, process.returncode, out, err)


# Root reads a file of mode 0 through its capabilities to override permissions; a
# command run without them (util-linux's `setpriv`) meets the permission bits.
SETPRIV = shutil.which("setpriv")


def run(folder: Path, *args: str, case: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(folder / "src"), COLUMNS="200")
    env.pop("EVIDENCE_DIR", None)
    command = [sys.executable, "progress.py", *args]
    if case == "no-permission" and os.geteuid() == 0:
        drop = "-dac_override,-dac_read_search"
        command = [SETPRIV, "--bounding-set", drop, "--", *command]
    return answer(command, cwd=folder, env=env)


def stamp_stage_1(folder: Path) -> None:
    """Stage 1's region written and a passed stamp of it whose code hash is current,
    so that every command goes on to read the stage's evidence file (a stamp over
    an unwritten region is never current)."""
    shapes = folder / "src" / "damage_demo" / "shapes.py"
    lines = shapes.read_text(encoding="utf-8").splitlines()
    unwritten = [i for i, line in enumerate(lines) if "raise NotImplementedError(" in line]
    assert len(unwritten) == 1, lines
    lines[unwritten[0]] = "    return math.pi * r**2"
    shapes.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code = progress_module().stage_code_hash(folder, "1", STAGE_TESTS)
    record = {"result": "passed", "code_hash": code, "evidence_sha256": "0" * 64}
    record["ran_at"] = "2026-01-01T00:00:00+00:00"
    state = {"project": "damage-demo", "stages": {"1": record}}
    (folder / "evidence" / "progress.json").write_text(json.dumps(state), encoding="utf-8")


def check(done: subprocess.CompletedProcess, name: str, case: str, must_name: bool) -> None:
    said = done.stdout + done.stderr
    assert done.returncode in (0, 1, 2), said
    assert "Traceback" not in said, said
    if case in REFUSED:
        assert done.returncode == 2, said
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    if must_name:
        assert name in done.stderr, said


@pytest.mark.parametrize("command", ["run", "hint", "dossier"])
@pytest.mark.parametrize("case", CASES)
def test_damaged_stamps(starter: Path, tmp_path: Path, case: str, command: str):
    """`evidence/progress.json` damaged: refused in one line naming it when unusable,
    set aside with one line naming it when not stamps; a link's target unchanged."""
    path = starter / "evidence" / "progress.json"
    outside = tmp_path / "outside.json"
    damage(path, case, outside)
    done = run(starter, *([] if command == "run" else [command]), case=case)
    check(done, "evidence/progress.json", case, must_name=True)
    if case == "link":
        assert outside.read_bytes() == OUTSIDE
    if case in ("list", "invalid") and command != "dossier":
        # Set aside and written afresh, as stamps.
        assert isinstance(json.loads(path.read_text(encoding="utf-8"))["stages"], dict)


# A JSON list or invalid JSON as stage evidence is only hashed by `progress.py` and
# `hint` (the stage then runs, or is hinted at, again), which they always did: left out.
EVIDENCE_CASES = [
    (case, command)
    for case in CASES
    for command in ("run", "hint", "dossier")
    if case in REFUSED or command == "dossier"
]


@pytest.mark.parametrize(("case", "command"), EVIDENCE_CASES)
def test_damaged_stage_evidence(starter: Path, tmp_path: Path, case: str, command: str):
    """`evidence/stage_1.json` damaged. `progress.py` (no stamps: it runs stage 1, whose
    tests write that file) refuses to run while the file is unusable, so the tests
    never write through a link or block on a FIFO; `hint` and `dossier` (a current
    passed stamp: they read the file) refuse it or, when it is not evidence, the
    dossier says so in one line."""
    path = starter / "evidence" / "stage_1.json"
    outside = tmp_path / "outside.json"
    if command != "run":
        stamp_stage_1(starter)
    damage(path, case, outside)
    done = run(starter, *([] if command == "run" else [command]), case=case)
    check(done, "evidence/stage_1.json", case, must_name=True)
    if case == "link":
        assert outside.read_bytes() == OUTSIDE


def test_help_lists_every_command(starter: Path):
    done = run(starter, "--help")
    assert done.returncode == 0, done.stdout + done.stderr
    for command in ("--all", "hint [STAGE]", "watch", "--runs N", "dossier", "--out DIR"):
        assert command in done.stdout, done.stdout
    # An unknown command still exits 2, with the same list on stderr.
    done = run(starter, "--no-such-option")
    assert done.returncode == 2 and "hint [STAGE]" in done.stderr, done.stderr


def coverage(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "from catalog_compiler.cli import main; main()"]
    return answer([*command, "coverage", "--role", "demo-engineer", "--root", str(VALID), *args])


def test_coverage_on_a_fifo_named_progress_json(tmp_path: Path):
    folder = tmp_path / "evidence"
    folder.mkdir()
    os.mkfifo(folder / "progress.json")
    done = coverage(str(folder))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    named = [line for line in done.stdout.splitlines() if "progress.json" in line]
    assert len(named) == 1 and "COV001" in named[0] and "FIFO" in named[0], done.stdout


def deep_folder(top: Path, depth: int = 30) -> Path:
    """A folder ``depth`` levels of 200-character names below ``top``: its path (over
    6,000 characters) is longer than the system's limit, made one level at a time."""
    name = "d" * 200
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    return top.joinpath(*[name] * depth)


def test_coverage_on_a_path_too_long(tmp_path: Path):
    done = coverage(str(deep_folder(tmp_path)))
    said = done.stdout + done.stderr
    assert done.returncode in (1, 2), said
    assert "Traceback" not in said and "INT001" not in said, said
