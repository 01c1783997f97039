"""Bad input: every `workload-operations` command and the entry points a learner
calls with a file, a config or a kept record refuse a damaged input cleanly,
before any job starts.

- CLI (in-process `CliRunner`): exit code 2, one `Error:` line naming the file,
  field or value, no traceback, and nothing written (the workspace's file
  names and bytes are equal before and after). The job, the supervisor, every
  drill, the bench, the verifier's judgement and the report's plot are
  replaced by tripwires: no child job is launched here, and an input that is
  silently accepted fails its case instead of starting one.
- Library: a `ValueError` subclass of the project (`ConfigError`,
  `FaultError`, `CheckpointError`, `ReportError`) whose message names the
  input.

Cases are drawn by hypothesis (the damage, the field, the value) with a fixed
derandomized seed, plus enumerations where a list is clearer. The count goes to
`evidence/bad_input.json` when the module ends.
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from workload_operations import bench as bench_module
from workload_operations import checkpoint, drill, faults, job, report, supervisor, verifier
from workload_operations.cli import main
from workload_operations.config import Config, ConfigError, load, load_dict

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TINY = PROJECT_ROOT / "configs" / "tiny.json"
FEW = settings(max_examples=30, derandomize=True, deadline=None, database=None)
TALLY: dict[str, Any] = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}
REAL = {
    "supervise": supervisor.supervise,
    "run_drills": drill.run_drills,
    "bench": bench_module.bench,
}
FIELDS = sorted(Config.model_fields)
# Invalid for every field of `Config` (strict: no string or null for a number, no
# number for a bool, no float for an int; no NaN or infinity; every float bounded
# below 1e9 or refused there by a cross-field rule).
GENERIC_BAD = [float("nan"), float("inf"), float("-inf"), "0.1", None, [], {}, -1e9, 1e9]


class Tripwire(AssertionError):
    """Raised when work starts although its input was damaged."""


def _tripwire(name: str):
    def fire(*args: object, **kwargs: object) -> None:
        raise Tripwire(f"{name} started on a damaged input")

    return fire


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The workspace every case runs in (cwd too, so default outputs under `runs/`
    land here). Everything that would start a job is a tripwire."""
    root = tmp_path_factory.mktemp("bad_input")
    (root / "a_file").write_text("not a folder\n")
    (root / "a_folder").mkdir()
    previous = os.getcwd()
    os.chdir(root)
    patch = pytest.MonkeyPatch()
    patch.setattr(job, "main", _tripwire("the job"))
    patch.setattr(supervisor, "supervise", _tripwire("the supervisor"))
    patch.setattr(supervisor, "Supervisor", _tripwire("a supervised job"))
    patch.setattr(drill, "drill_one", _tripwire("a drill"))
    patch.setattr(drill, "Supervisor", _tripwire("a drilled job"))
    patch.setattr(bench_module, "bench", _tripwire("the bench"))
    patch.setattr(bench_module, "observation_cost", _tripwire("the bench's timed steps"))
    patch.setattr(verifier, "judge", _tripwire("judging a checkpoint"))
    patch.setattr(report, "plot_detection", _tripwire("the drill report's plot"))
    yield root
    patch.undo()
    os.chdir(previous)


@pytest.fixture(scope="module", autouse=True)
def _write_evidence():
    yield
    directory = Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence"))
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "cases": TALLY["cases"],
        "tracebacks": TALLY["tracebacks"],
        "commands": sorted(TALLY["commands"]),
        "entry_points": sorted(TALLY["entry_points"]),
    }
    (directory / "bad_input.json").write_text(json.dumps(payload, indent=1) + "\n")


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def cli(ws: Path, args: list[Any], *needles: str) -> str:
    """Runs one damaged command; checks the refusal; returns its error line."""
    args = [str(a) for a in args]
    before = snapshot(ws)
    result = CliRunner().invoke(main, args)
    after = snapshot(ws)
    TALLY["cases"] += 1
    TALLY["commands"].add(args[0])
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    if crashed or "Traceback" in result.output:
        TALLY["tracebacks"] += 1
    assert not crashed, f"{args}: {result.exception!r}"
    assert result.exit_code == 2, (args, result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], (args, result.output)
    for needle in needles:
        assert needle in errors[0], (args, needle, errors[0])
    assert after == before, f"{args} wrote {set(after) ^ set(before) or 'changed bytes'}"
    return errors[0]


def refused(entry_point: str, error: type[ValueError], needle: str, call, *args, **kwargs):
    """Calls a library entry point on a damaged input; it must raise `error` naming it."""
    TALLY["cases"] += 1
    TALLY["entry_points"].add(entry_point)
    with pytest.raises(error) as info:
        call(*args, **kwargs)
    assert issubclass(error, ValueError)
    assert needle in str(info.value), (entry_point, needle, str(info.value))
    return str(info.value)


# --- damaged config files (run, supervise, drill, bench) -----------------------------------

FILE_DAMAGE = [
    "missing",
    "empty",
    "truncated",
    "non-utf8",
    "not-json",
    "json-list",
    "json-string",
    "json-null",
    "folder",
]


def damaged_file(ws: Path, kind: str, name: str, good: str) -> Path:
    """`ws/<kind>-<name>`: a file with the damage `kind` (made from the good text), a
    folder, or nothing."""
    path = ws / f"{kind}-{name}"
    if kind == "folder":
        path.mkdir(exist_ok=True)
        return path
    if kind == "missing":
        return path
    content = {
        "empty": b"",
        "truncated": good.encode()[: len(good) // 2],
        "non-utf8": b"\xff\xfe{\x00\x93",
        "not-json": b"seed = 0\nnum_steps = 60\n",
        "json-list": b"[1, 2, 3]",
        "json-string": b'"configs/tiny.json"',
        "json-null": b"null",
    }[kind]
    path.write_bytes(content)
    return path


config_damage = st.one_of(
    st.tuples(st.just("file"), st.sampled_from(FILE_DAMAGE), st.none()),
    st.tuples(st.just("field"), st.sampled_from(FIELDS), st.sampled_from(GENERIC_BAD)),
    st.tuples(st.just("unknown"), st.sampled_from(["colour", "Seed", "fault", ""]), st.none()),
)


def config_file(ws: Path, damage: tuple[str, str, Any]) -> tuple[Path, str]:
    """The damaged config file and what its error message must name."""
    kind, what, value = damage
    good = Config.tiny().model_dump(mode="json")
    if kind == "file":
        return damaged_file(ws, what, "config.json", json.dumps(good)), "config.json"
    good[what] = value if kind == "field" else 1
    path = ws / "config.json"
    path.write_text(json.dumps(good))
    return path, f"`{what}`"


@FEW
@given(command=st.sampled_from(["run", "supervise", "drill", "bench"]), damage=config_damage)
def test_commands_refuse_a_damaged_config(ws, command, damage):
    path, needle = config_file(ws, damage)
    cli(ws, [command, "--config", path], needle)


@FEW
@given(damage=config_damage)
def test_load_refuses_a_damaged_config(ws, damage):
    path, needle = config_file(ws, damage)
    refused("config.load", ConfigError, needle, load, path)


OUT_OF_RANGE = [
    ({"seed": -1}, "`seed`"),
    ({"num_examples": 0}, "`num_examples`"),
    ({"num_classes": 1}, "`num_classes`"),
    ({"batch_size": 300}, "`batch_size`"),
    ({"learning_rate": 0.0}, "`learning_rate`"),
    ({"num_steps": 0}, "`num_steps`"),
    ({"steps_per_second": -1.0}, "`steps_per_second`"),
    ({"heartbeat_interval_s": 6.0}, "`heartbeat_interval_s`"),
    ({"heartbeat_interval_s": 9.0, "hang_timeout_s": 10.0}, "`stall_timeout_s`"),
    ({"min_examples_per_s": 100.0}, "`min_examples_per_s`"),
    ({"memory_limit_mb": 0.0}, "`memory_limit_mb`"),
    ({"memory_limit_mb": 2e6}, "`memory_limit_mb`"),
    ({"checkpoint_every": -3}, "`checkpoint_every`"),
    ({"checkpoint_every": 1.5}, "`checkpoint_every`"),
    ({"sidecar": "yes"}, "`sidecar`"),
    ({"rate_window_steps": 0}, "`rate_window_steps`"),
]


@pytest.mark.parametrize(("change", "needle"), OUT_OF_RANGE)
def test_out_of_range_fields_are_refused(ws, change, needle):
    (ws / "range.json").write_text(json.dumps({**Config.tiny().model_dump(mode="json"), **change}))
    cli(ws, ["run", "--config", "range.json"], needle, "range.json")
    base = Config.tiny().model_dump()
    refused("load_dict", ConfigError, needle, load_dict, {**base, **change})
    refused("Config.from_json", ConfigError, needle, Config.from_json,
            json.dumps({**Config.tiny().model_dump(mode="json"), **change}))  # fmt: skip


# --- faults -----------------------------------------------------------------------------

FAULT_DAMAGE = [
    ("nope@3", "`nope`"),
    ("KILL@3", "`KILL`"),
    ("@3", "Unknown fault ``"),
    ("kill@", "`kill@`"),
    ("kill@0", "`0`"),
    ("kill@-2", "`-2`"),
    ("kill@x", "`x`"),
    ("kill@3@4", "`3@4`"),
    ("kill@60", "`num_steps` = `60`"),
    ("kill@100000", "`num_steps`"),
    ("kill-during-save@10", "`checkpoint_every` = `0`"),
]


@pytest.mark.parametrize("command", ["run", "supervise"])
@pytest.mark.parametrize(("fault", "needle"), FAULT_DAMAGE)
def test_run_and_supervise_refuse_a_damaged_fault(ws, command, fault, needle):
    cli(ws, [command, "--config", TINY, "--fault", fault], needle)


@pytest.mark.parametrize(("fault", "needle"), FAULT_DAMAGE)
def test_fault_parse_and_check_refuse_a_damaged_fault(fault, needle):
    def parse_and_check(text: str) -> None:
        faults.check(faults.parse(text), Config.tiny())

    refused("faults.parse+check", faults.FaultError, needle, parse_and_check, fault)


def test_a_slow_fault_too_close_to_the_stall_limit_is_refused():
    config = Config.tiny().replace(min_examples_per_s=8.0, stall_timeout_s=9.0)
    refused("faults.check", faults.FaultError, "`stall_timeout_s`", faults.check,
            faults.Fault("slow", 10), config)  # fmt: skip


# --- workdirs and output paths ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--workdir", "a_file/run"], "`a_file` is a file"),
        (["run", "--workdir", "a_file"], "a_file"),
        (["run", "--workdir", "fresh", "--resume"], "holds no checkpoint folder"),
        (["run", "--workdir", "a_folder", "--resume"], "holds no checkpoint folder"),
        (["supervise", "--workdir", "a_file/run"], "`a_file` is a file"),
        (["supervise", "--workdir", "a_file"], "a_file"),
        (["supervise", "--restarts", "-1"], "'--restarts'"),
        (["supervise", "--restarts", "101"], "'--restarts'"),
        (["drill", "--out", "a_file/drill"], "`a_file` is a file"),
        (["drill", "--faults", ""], "names no fault"),
        (["drill", "--faults", " , "], "names no fault"),
        (["drill", "--faults", "kill,nope"], "`nope`"),
        (["drill", "--faults", "kill-during-save"], "`kill-during-save`"),
        (["drill", "--repeats", "0"], "'--repeats'"),
        (["drill", "--parallel", "65"], "'--parallel'"),
        (["drill", "--at-step", "0"], "'--at-step'"),
        (["drill", "--at-step", "59"], "`num_steps` = `60`"),
        (["drill", "--at-step", "52", "--repeats", "5"], "`num_steps` = `60`"),
        (["bench", "--out", "a_file/bench.json"], "`a_file` is a file"),
        (["bench", "--out", "a_folder"], "a_folder"),
        (["bench", "--out", "taken.json"], "taken-drills"),
        (["bench", "--reps", "2"], "'--reps'"),
        (["bench", "--chunk", "9"], "'--chunk'"),
        (["bench", "--detection-repeats", "-1"], "'--detection-repeats'"),
    ],
)
def test_commands_refuse_damaged_options_before_any_job(ws, args, needle):
    (ws / "taken-drills").write_text("a file where the bench's drills folder would go\n")
    try:
        config = ["--config", TINY] if args[0] in ("run", "supervise") else []
        cli(ws, [*args, *config], needle)
    finally:
        (ws / "taken-drills").unlink()


def test_library_runs_refuse_bad_input_before_any_job(ws):
    tiny = Config.tiny()
    refused("supervise", ConfigError, "`Config`", REAL["supervise"], tiny.model_dump(), ws / "w")
    refused("supervise", faults.FaultError, "`nope`", REAL["supervise"], tiny, ws / "w",
            fault="nope@3")  # fmt: skip
    refused("supervise", ConfigError, "`a_file` is a file", REAL["supervise"], tiny,
            "a_file/run")  # fmt: skip
    refused("run_drills", ConfigError, "`Config`", REAL["run_drills"], {"seed": 0}, ws / "d")
    refused("run_drills", faults.FaultError, "`num_steps`", REAL["run_drills"], tiny, "drills",
            at_step=59)  # fmt: skip
    refused("run_drills", faults.FaultError, "`repeats`", REAL["run_drills"], tiny, "drills",
            repeats=0)  # fmt: skip
    refused("run_drills", ConfigError, "`a_file` is a file", REAL["run_drills"], tiny,
            "a_file/drills")  # fmt: skip
    refused("bench", ConfigError, "`Config`", REAL["bench"], "tiny", Path("b.json"))
    refused("bench", ConfigError, "`a_file` is a file", REAL["bench"], tiny,
            Path("a_file/b.json"))  # fmt: skip
    assert not (ws / "drills").exists() and not (ws / "w").exists()


# --- kept records: incidents, drill reports, ledgers -----------------------------------------

GOOD_INCIDENT = {
    "id": "20260101-000000-kill",
    "classification": "died",
    "diagnosis": "the job was killed by SIGKILL",
    "detection": {"intervals_since_fault": 1.5, "bound_intervals": 3.0},
}
INCIDENT_DAMAGE = {
    "not json": (b"{", "not valid JSON"),
    "non-utf8": (b"\xff\xfe", "not UTF-8"),
    "a list": (b"[]", "must be a JSON object"),
    "no id": ({k: v for k, v in GOOD_INCIDENT.items() if k != "id"}, "`id`"),
    "id a number": ({**GOOD_INCIDENT, "id": 7}, "`id`"),
    "no diagnosis": ({k: v for k, v in GOOD_INCIDENT.items() if k != "diagnosis"}, "`diagnosis`"),
    "detection a list": ({**GOOD_INCIDENT, "detection": [1]}, "`detection`"),
    "no bound": (
        {**GOOD_INCIDENT, "detection": {"intervals_since_fault": 2.0}},
        "`bound_intervals`",
    ),
    "bound a string": (
        {**GOOD_INCIDENT, "detection": {"intervals_since_fault": 2.0, "bound_intervals": "3"}},
        "`bound_intervals`",
    ),
}


@pytest.mark.parametrize("damage", sorted(INCIDENT_DAMAGE))
def test_incidents_refuses_a_damaged_incident_record(ws, damage):
    content, needle = INCIDENT_DAMAGE[damage]
    root = ws / "kept" / damage.replace(" ", "-")
    (root / "run" / "incidents").mkdir(parents=True, exist_ok=True)
    (root / "run" / "incidents" / "good.json").write_text(json.dumps(GOOD_INCIDENT))
    path = root / "run" / "incidents" / "x-damaged.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    message = cli(ws, ["incidents", root], needle)
    assert "x-damaged.json" in message, message
    refused("find_incidents", report.ReportError, needle, report.find_incidents, root)


@pytest.mark.parametrize(("root", "needle"), [("nowhere", "`nowhere`"), ("a_file", "`a_file`")])
def test_incidents_refuses_a_root_that_is_not_a_folder(ws, root, needle):
    cli(ws, ["incidents", root], needle)


GOOD_SUMMARY = {
    "verdict": "6 of 6 classifications correct",
    "runs": 1,
    "wall_s": 10.0,
    "config": {"heartbeat_interval_s": 1.0},
    "per_fault": {
        "kill": {
            "runs": 1,
            "correct": 1,
            "classifications": ["died"],
            "detection_intervals": [1.2],
            "bound_intervals": 3.0,
            "processes_left": 0,
        }
    },
}
SUMMARY_DAMAGE = {
    "not json": b"{",
    "non-utf8": b"\xff\xfe",
    "a list": b"[]",
    "no per_fault": {k: v for k, v in GOOD_SUMMARY.items() if k != "per_fault"},
    "no verdict": {k: v for k, v in GOOD_SUMMARY.items() if k != "verdict"},
    "runs a string": {**GOOD_SUMMARY, "runs": "1"},
    "config without interval": {**GOOD_SUMMARY, "config": {}},
    "per_fault entry a list": {**GOOD_SUMMARY, "per_fault": {"kill": []}},
    "detection not numbers": {
        **GOOD_SUMMARY,
        "per_fault": {"kill": {**GOOD_SUMMARY["per_fault"]["kill"], "detection_intervals": ["x"]}},
    },
    "bound a string": {
        **GOOD_SUMMARY,
        "per_fault": {"kill": {**GOOD_SUMMARY["per_fault"]["kill"], "bound_intervals": "3"}},
    },
}
SUMMARY_NEEDLE = {
    "not json": "not valid JSON",
    "non-utf8": "not UTF-8",
    "a list": "must be a JSON object",
    "no per_fault": "`per_fault`",
    "no verdict": "`verdict`",
    "runs a string": "`runs`",
    "config without interval": "`heartbeat_interval_s`",
    "per_fault entry a list": "`per_fault.kill`",
    "detection not numbers": "`per_fault.kill.detection_intervals`",
    "bound a string": "`bound_intervals`",
}


@pytest.mark.parametrize("damage", sorted(SUMMARY_DAMAGE))
def test_report_refuses_a_damaged_drill_summary(ws, damage):
    content = SUMMARY_DAMAGE[damage]
    folder = ws / "drills" / damage.replace(" ", "-")
    folder.mkdir(parents=True, exist_ok=True)
    text = content if isinstance(content, bytes) else json.dumps(content).encode()
    (folder / "summary.json").write_bytes(text)
    message = cli(ws, ["report", folder], SUMMARY_NEEDLE[damage])
    assert "summary.json" in message, message
    refused("drill_report", report.ReportError, SUMMARY_NEEDLE[damage], report.drill_report,
            folder)  # fmt: skip


def test_report_refuses_a_folder_without_summary_or_with_report_taken(ws):
    cli(ws, ["report", "a_folder"], "no `summary.json`")
    cli(ws, ["report", "nowhere"], "no `summary.json`")
    folder = ws / "drills" / "taken"
    (folder / "report.md").mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(GOOD_SUMMARY))
    cli(ws, ["report", folder], "report.md")


def _request(step: int) -> dict:
    return {
        "step": step,
        "t": 100.0 + step,
        "checksums": {"['params']": "0" * 64},
        "data_state_sha256": "0" * 64,
        "heldout": {"loss_bits": "3f800000", "predictions_sha256": "0" * 64},
    }


LEDGER_DAMAGE = {
    "not json mid-file": (
        "requested",
        [b'{"step": 3, "t": 1}', b"{cut", b'{"step": 6, "t": 2}'],
        "Line 2",
    ),  # fmt: skip
    "non-utf8": ("requested", [b"\xff\xfe"], "not UTF-8"),
    "a list line": ("requested", [b"[3]"], "JSON list"),
    "no step": ("requested", [b'{"t": 1.0}'], "`step`"),
    "step a string": ("requested", [b'{"step": "3", "t": 1.0}'], "`step`"),
    "step a bool": ("requested", [b'{"step": true, "t": 1.0}'], "`step`"),
    "negative step": ("requested", [b'{"step": -3, "t": 1.0}'], "negative `step`"),
    "no t": ("verdicts", [b'{"step": 3, "accepted": true, "reasons": []}'], "`t`"),
    "verdict accepted a string": (
        "verdicts",
        [b'{"step": 3, "t": 1.0, "accepted": "yes", "reasons": []}'],
        "`accepted`",
    ),
    "verdict without reasons": (
        "verdicts",
        [b'{"step": 3, "t": 1.0, "accepted": true}'],
        "`reasons`",
    ),  # fmt: skip
    "request without checksums": ("requested", [b'{"step": 3, "t": 1.0}'], "`checksums`"),
    "request heldout without loss": (
        "requested",
        [json.dumps({**_request(3), "heldout": {"predictions_sha256": "0" * 64}}).encode()],
        "`heldout` lacks the field `loss_bits`",
    ),
}


def _ledger_workdir(ws: Path, name: str, kind: str, lines: list[bytes]) -> Path:
    workdir = ws / "ledgers" / name.replace(" ", "-")
    (workdir / "ledger").mkdir(parents=True, exist_ok=True)
    (workdir / "checkpoints").mkdir(exist_ok=True)
    (workdir / "config.json").write_text(Config.tiny_recovery().to_json())
    if kind != "requested":
        (workdir / "ledger" / "requested.jsonl").write_text(json.dumps(_request(3)) + "\n")
    (workdir / "ledger" / checkpoint.LEDGER_FILES[kind]).write_bytes(b"\n".join(lines) + b"\n")
    return workdir


@pytest.mark.parametrize("damage", sorted(LEDGER_DAMAGE))
def test_verify_refuses_a_damaged_ledger_before_judging(ws, damage):
    kind, lines, needle = LEDGER_DAMAGE[damage]
    workdir = _ledger_workdir(ws, damage, kind, lines)
    cli(ws, ["verify", "--workdir", workdir], needle)
    refused("verifier.verify", checkpoint.CheckpointError, needle, verifier.verify, workdir)
    if "request" not in damage:  # The ledger itself is refused by every reader.
        refused("latest_accepted", checkpoint.CheckpointError, needle,
                checkpoint.latest_accepted, workdir)  # fmt: skip


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        ("nothing", "holds no checkpoint folder"),
        ("no ledger", "holds no checkpoint folder"),
        ("no config", "config.json"),
        ("config not json", "config.json"),
        ("config of another kind", "`num_steps`"),
    ],
)
def test_verify_refuses_a_workdir_it_cannot_read(ws, setup, needle):
    workdir = _ledger_workdir(ws, "setup-" + setup, "requested", [json.dumps(_request(3)).encode()])
    if setup == "nothing":
        workdir = ws / "ledgers" / "absent"
    elif setup == "no ledger":
        for path in (workdir / "ledger").iterdir():
            path.unlink()
        (workdir / "ledger").rmdir()
    elif setup == "no config":
        (workdir / "config.json").unlink()
    elif setup == "config not json":
        (workdir / "config.json").write_text("{")
    else:
        (workdir / "config.json").write_text(json.dumps({"num_steps": "15"}))
    cli(ws, ["verify", "--workdir", workdir], needle)


# --- every command has its cases ---------------------------------------------------------------

CASES_OF_COMMAND = {
    "run": (test_commands_refuse_a_damaged_config, test_run_and_supervise_refuse_a_damaged_fault),
    "supervise": (test_run_and_supervise_refuse_a_damaged_fault,),
    "drill": (test_commands_refuse_damaged_options_before_any_job,),
    "bench": (test_commands_refuse_damaged_options_before_any_job,),
    "incidents": (test_incidents_refuses_a_damaged_incident_record,),
    "report": (test_report_refuses_a_damaged_drill_summary,),
    "verify": (test_verify_refuses_a_damaged_ledger_before_judging,),
}


def test_every_command_of_the_group_has_bad_input_cases():
    assert set(main.commands) == set(CASES_OF_COMMAND), (
        f"commands without bad-input cases: {set(main.commands) ^ set(CASES_OF_COMMAND)}"
    )
    assert all(CASES_OF_COMMAND.values())
