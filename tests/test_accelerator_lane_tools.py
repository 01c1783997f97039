"""The accelerator lane's own tools, checked without an accelerator.

`lane_skips` (the lane's pytest plugin) must turn exactly the failures caused by
a refused socket, or by a child process that could not open the chip the test
process holds, into skips that name the reason: a pytest run over a file with a
refused socket raised in a test and in a fixture, a child's stderr naming the
held chip, an ordinary failure and a pass must report 3 skipped, 1 failed and 1
passed, with each reason in the JUnit XML. `accelerator_survey.classify` must
put each kind of failure the lane has met in its class, and an unknown one in
none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import accelerator_survey  # noqa: E402

TESTS = """
import pytest

def test_socket_refused():
    raise OSError(97, "Address family not supported by protocol")

@pytest.fixture
def server():
    assert False, "<Result OSError(97, 'Address family not supported by protocol')>"

def test_server_refused(server):
    pass

def test_child_could_not_open_the_chip():
    stderr = "RuntimeError: Unable to initialize backend 'tpu': ABORTED: Internal error"
    assert 1 == 0, stderr

def test_wrong_answer():
    assert 1 + 1 == 3

def test_right_answer():
    assert 1 + 1 == 2
"""


def test_lane_skips_turns_only_machine_limits_into_skips(tmp_path: Path):
    (tmp_path / "test_sample.py").write_text(TESTS)
    xml = tmp_path / "junit.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "lane_skips",
            f"--junitxml={xml}",
            "test_sample.py",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT / "scripts" / "lane_plugin"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stdout
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        skipped, failed = case.find("skipped"), case.find("failure")
        outcomes[case.get("name")] = (
            ("skipped", skipped.get("message"))
            if skipped is not None
            else ("failed", None)
            if failed is not None
            else ("passed", None)
        )
    reason = "needs a network socket; this machine refuses them (errno 97, EAFNOSUPPORT)"
    held = (
        "runs JAX in a second process, which cannot open the chip this test process "
        "holds (one program holds a TPU at a time)"
    )
    assert outcomes == {
        "test_socket_refused": ("skipped", reason),
        "test_server_refused": ("skipped", reason),
        "test_child_could_not_open_the_chip": ("skipped", held),
        "test_wrong_answer": ("failed", None),
        "test_right_answer": ("passed", None),
    }


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("OSError: [Errno 97] Address family not supported by protocol", "sockets refused"),
        ("failed on setup with \"ImportError: Please install 'flatbuffers'", "package"),
        ("importlib.metadata.PackageNotFoundError: No package metadata", "package"),
        ("MeshError: The mesh shape `(4, 2)` needs 8 devices, but there are `1`", "devices"),
        ("AssertionError: ('exited', 1) assert 'exited' == 'completed'", "child process"),
        ("json.decoder.JSONDecodeError: Expecting value: line 1 column 1", "child process"),
        ("ServerStartError: The server did not start listening:", "child process"),
        ("AssertionError: {'cpu_s': 0.8, 'exit': 0, 'killed': False, ...}", "child process"),
        ("AssertionError:    Aborted!    assert 1 == 0", "time limit"),
        ("hypothesis.errors.FailedHealthCheck: Input generation is slow", "Hypothesis"),
        ("Not equal to tolerance rtol=1e-05, atol=1e-05", "numerical comparison"),
        ("assert False  +  where False = allclose('forward pass', ...)", "numerical comparison"),
        ("RecursionError: maximum recursion depth exceeded", "other"),
    ],
)
def test_survey_classes(message: str, expected: str):
    assert expected in accelerator_survey.classify(message)


def test_survey_counts_stages_from_the_manifest(tmp_path: Path):
    """A run of one stage alone is reported against all the stages the project
    declares, not against the one stage it ran."""
    stage = {"passed": 1, "failed": 0, "skipped": 0, "seconds": 1.0, "skips": [], "failures": []}
    run = {"mode": "auto", "exit_code": 0, "wall_seconds": 1.0, "stages": {"3": stage}}
    lane = {"machine": {}, "project": "deployment-audit", "written_at": 0, "runs": [run]}
    (tmp_path / "lane-run-deployment-audit-1.json").write_text(json.dumps(lane))
    manifest = (ROOT / "projects" / "deployment-audit" / "project.toml").read_text()
    declared = manifest.count("[[stages]]")
    rows = accelerator_survey.survey(tmp_path)
    assert declared > 1
    assert f"| 3 of {declared} |" in accelerator_survey.markdown(rows, {})
