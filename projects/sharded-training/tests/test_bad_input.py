"""Bad input: every `sharded-training` command, and every library entry point a learner
calls with a file, an array or a config, refuses damaged input with one precise message
BEFORE anything starts: no job is launched, no process spawned, nothing trained.

CLI promise: exit code 2 (the project's `BadInput`, click's own usage error, or the
worker's exit code 2 for bad input), one line naming the file, field or value, no
traceback (`result.exception` is None or `SystemExit`), and nothing written (the watched
folder's file names and bytes are equal before and after). Library promise: a
`ValueError` (the project's errors subclass it) whose message names the field or value.

Every case here is refused by a check that runs before `jax.distributed`, before any
`subprocess.Popen` and before training; a case that slipped past its check would try
to start a job, which the watched folder, the exit code and the message would show.
The case count goes to `evidence/bad_input.json` at module end.
"""

import json
import math
import os
import re
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import click
import jax
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sharded_training import data, launch, sharding, train
from sharded_training.cli import main
from sharded_training.config import Config, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NAN, INF = math.nan, math.inf
SOME = settings(max_examples=30, derandomize=True, deadline=None, database=None)

LEDGER: dict[str, Any] = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}
COVERED_COMMANDS = {"train", "launch", "worker", "profile", "bench"}


@pytest.fixture(scope="module", autouse=True)
def _write_evidence():
    yield
    directory = Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence"))
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "cases": LEDGER["cases"],
        "tracebacks": LEDGER["tracebacks"],
        "commands": sorted(LEDGER["commands"]),
        "entry_points": sorted(LEDGER["entry_points"]),
    }
    (directory / "bad_input.json").write_text(json.dumps(record, indent=1) + "\n")


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def check_cli(args: list[str], watch: Path, token: str) -> None:
    """`sharded-training ARGS` must refuse with exit 2 and one line naming `token`."""
    before = _snapshot(watch)
    result = CliRunner().invoke(main, args)
    LEDGER["cases"] += 1
    LEDGER["commands"].add(args[0])
    crashed = not (result.exception is None or isinstance(result.exception, SystemExit))
    LEDGER["tracebacks"] += int(crashed or "Traceback" in result.output)
    assert not crashed, f"{args}: {type(result.exception).__name__}: {result.exception}"
    assert "Traceback" not in result.output
    assert result.exit_code == 2, (args, result.output)
    lines = [
        line
        for line in result.output.splitlines()
        if line.strip() and not line.startswith(("Usage:", "Try "))
    ]
    assert len(lines) == 1, (args, result.output)
    assert token in lines[0], (args, token, result.output)
    assert _snapshot(watch) == before, (args, "the command wrote files")


def check_api(name: str, call, token: str) -> None:
    """`call()` must raise a ValueError whose message names `token`."""
    LEDGER["cases"] += 1
    LEDGER["entry_points"].add(name)
    with pytest.raises(ValueError, match=re.escape(token)):
        call()


@pytest.fixture(scope="module", autouse=True)
def _nothing_may_start():
    """No case may get as far as starting a process or joining a job: either would
    fail the case (as a crash) instead of going unnoticed."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a bad-input case started something: {args[:1]}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess, "Popen", refuse)
        mp.setattr(jax.distributed, "initialize", refuse)
        yield


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny.json"
    path.write_text(Config.tiny().to_json())
    return path


@pytest.fixture
def blocker(tmp_path) -> Path:
    path = tmp_path / "blocker"
    path.write_text("a file, not a directory\n")
    return path


# --- configs: `--config` of train, launch, profile and worker; `load_config` -------------

BAD_FIELD_VALUES: dict[str, list[Any]] = {
    "seed": [-1, 2**32, 1.5, "0", True, None],
    "data_seed": [-1, 2**40, "x"],
    "num_examples": [0, -5, 10**7, 1.5],
    "num_features": [0, 5000, "16"],
    "hidden_size": [0, -32, 20000, 33],  # 33: not a multiple of the model axis (2)
    "num_classes": [1, 0, 2000],
    "dropout_rate": [1.0, -0.1, NAN, INF],
    "learning_rate": [0.0, -1e-3, NAN, INF, 11.0],
    "batch_size": [0, -16, 70000, 12, NAN],  # 12: not a multiple of the data axis (8)
    "num_steps": [0, -1, 10**7, NAN],
    "mesh_shape": [[8], [8, 1, 1], [0, 8], [-8, -1], [8.0, 1], "8x1", None],
    "checkpoint_every": [0, -3, 1.5],
    "max_to_keep": [1, 0, 101],
    "heartbeat_timeout_s": [0, 3601, NAN],
}
TINY = json.loads(Config.tiny().to_json())


@st.composite
def damaged_config(draw) -> tuple[str, bytes | None, str]:
    """(kind, bytes to write or None, the token the message must name)."""
    kind = draw(
        st.sampled_from(
            [
                "missing",
                "directory",
                "empty",
                "truncated",
                "non_utf8",
                "not_json",
                "wrong_type",
                "unknown_field",
                "bad_value",
            ]
        )
    )
    text = json.dumps(TINY)
    if kind in ("missing", "directory"):
        return kind, None, "config.json"
    if kind == "empty":
        return kind, b"", "config.json"
    if kind == "truncated":
        return kind, text[: draw(st.integers(1, len(text) - 2))].encode(), "config.json"
    if kind == "non_utf8":
        return kind, b"\xff\xfe" + text.encode("utf-16-le"), "config.json"
    if kind == "not_json":
        return kind, b"seed = 0\n", "config.json"
    if kind == "wrong_type":
        value = draw(st.sampled_from([[8, 1], "tiny", 3, None]))
        return kind, json.dumps(value).encode(), "config.json"
    if kind == "unknown_field":
        name = draw(st.sampled_from(["mesh", "lr", "steps", "Seed"]))
        return kind, json.dumps({**TINY, name: 1}).encode(), name
    field = draw(st.sampled_from(sorted(BAD_FIELD_VALUES)))
    value = draw(st.sampled_from(BAD_FIELD_VALUES[field]))
    return kind, json.dumps({**TINY, field: value}).encode(), field


@SOME
@given(damage=damaged_config())
def test_damaged_config_is_refused_by_every_reader(damage):
    kind, content, token = damage
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "config.json"
        if kind == "directory":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        check_api("load_config", lambda: load_config(path), token)
        if content is not None:
            text = content.decode("utf-8", errors="replace")
            check_api("Config.from_json", lambda: Config.from_json(text, str(path)), token)
        work = str(root / "run")
        check_cli(["train", "--config", str(path), "--workdir", work], root, token)
        check_cli(["launch", "--config", str(path), "--workdir", work], root, token)
        check_cli(["profile", "--config", str(path), "--out", work], root, token)
        check_cli(["worker", "--config", str(path), "--workdir", work], root, token)
        two = ["--num-processes", "2", "--coordinator", "127.0.0.1:1"]
        check_cli(["worker", "--config", str(path), "--workdir", work, *two], root, token)


# --- output folders: train --workdir, launch --workdir, profile --out, bench --out -------


@pytest.mark.parametrize(
    ("command", "option"),
    [("train", "--workdir"), ("launch", "--workdir"), ("profile", "--out")],
)
def test_output_folder_under_a_file_is_refused_first(tmp_path, tiny_file, blocker, command, option):
    args = [command, "--config", str(tiny_file), option, str(blocker / "run")]
    if command == "launch":
        args += ["--processes", "2", "--devices-per-process", "4"]
    check_cli(args, tmp_path, "blocker")


def test_train_run_refuses_a_workdir_under_a_file(tmp_path, blocker):
    check_api("train.run", lambda: train.run(Config.tiny(), blocker / "run"), "blocker")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]


@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["--out", "{blocker}/bench.json"], "blocker"),
        (["--out", "{tmp}/bench.png"], "bench.png"),
        (["--out", "{tmp}"], "--out"),
        (["--steps", "7"], "7"),
        (["--steps", "x"], "x"),
    ],
)
def test_bad_bench_options_are_refused(tmp_path, blocker, args, token):
    args = [a.format(blocker=blocker, tmp=tmp_path) for a in args]
    check_cli(["bench", *args], tmp_path, token)


# --- devices and meshes: train --devices, profile's 8 devices, `sharding.make_mesh` ------


@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["--devices", "4"], "--devices"),  # Config.default() needs a (4, 2) mesh: 8.
        (["--devices", "0"], "0"),
        (["--devices", "65"], "65"),
        (["--devices", "many"], "many"),
    ],
)
def test_bad_device_counts_are_refused(tmp_path, args, token):
    check_cli(["train", "--workdir", str(tmp_path / "run"), *args], tmp_path, token)


def test_profile_refuses_a_mesh_of_other_than_its_8_devices(tmp_path):
    config = tmp_path / "six.json"
    six = {**TINY, "mesh_shape": [3, 2], "batch_size": 12, "hidden_size": 32}
    config.write_text(json.dumps(six))
    check_cli(["profile", "--config", str(config), "--out", str(tmp_path / "p")], tmp_path, "6")
    check_cli(["profile", "--steps", "7", "--out", str(tmp_path / "p")], tmp_path, "7")


@pytest.mark.parametrize(
    ("shape", "token"),
    [((3, 2), "6"), ((0, 8), "0"), ((-2, -4), "-2"), ((8,), "(8,)"), ((2.5, 3.2), "2.5")],
)
def test_make_mesh_refuses_shapes_that_are_not_two_positive_sizes(shape, token):
    check_api("sharding.make_mesh", lambda: sharding.make_mesh(shape), token)


@pytest.mark.parametrize("batch_size", [0, -8, 12])
def test_check_batch_refuses_sizes_that_do_not_fill_the_data_axis(batch_size):
    mesh = sharding.make_mesh((8, 1))
    check_api("sharding.check_batch", lambda: sharding.check_batch(batch_size, mesh), "batch")


@pytest.mark.parametrize(
    ("args", "token"),
    [
        ((16, 2, 2), "process_index"),
        ((16, -1, 2), "process_index"),
        ((16, 0, 0), "process_count"),
        ((16, 0, -2), "process_count"),
        ((15, 0, 2), "batch_size"),
        ((0, 0, 1), "batch_size"),
    ],
)
def test_process_rows_refuses_impossible_splits(args, token):
    check_api("data.process_rows", lambda: data.process_rows(*args), token)


# --- launch: processes, devices, port, timeout --------------------------------------


@pytest.fixture(scope="module")
def busy_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


LAUNCH_DAMAGE = {
    "processes": [("0", "--processes"), ("-1", "--processes"), ("3", "needs 8"), ("x", "x")],
    "devices-per-process": [("0", "--devices-per-process"), ("3", "needs 8")],
    "port": [("0", "0"), ("-1", "-1"), ("70000", "70000"), ("busy", "in use")],
    "timeout": [("nan", "nan"), ("0", "--timeout"), ("-5", "-5"), ("inf", "inf")],
}


@SOME
@given(
    option=st.sampled_from(sorted(LAUNCH_DAMAGE)),
    pick=st.integers(0, 3),
)
def test_bad_launch_options_are_refused_before_any_process_starts(
    tiny_file, busy_port, option, pick
):
    value, token = LAUNCH_DAMAGE[option][pick % len(LAUNCH_DAMAGE[option])]
    value = str(busy_port) if value == "busy" else value
    options = {"processes": "2", "devices-per-process": "4", "port": None, "timeout": "60"}
    options[option] = value
    args = ["launch", "--config", str(tiny_file), "--workdir", str(tiny_file.parent / "run")]
    for name, given_value in options.items():
        if given_value is not None:
            args += [f"--{name}", given_value]
    check_cli(args, tiny_file.parent, token)
    kwargs: dict[str, Any] = {"processes": 2, "devices_per_process": 4, "timeout_s": 60.0}
    if value.lstrip("-").replace(".", "").isdigit() or value in ("nan", "inf"):
        number = float(value)
        key = {"processes": "processes", "devices-per-process": "devices_per_process"}
        if option in key:
            kwargs[key[option]] = int(number)
        elif option == "port":
            kwargs["port"] = int(number)
        else:
            kwargs["timeout_s"] = number
        check_api(
            "launch.launch",
            lambda: launch.launch(Config.tiny(), tiny_file.parent / "run", **kwargs),
            token if token != "--timeout" else "timeout",
        )


def test_batch_that_does_not_divide_over_the_processes_is_refused(tmp_path):
    config = tmp_path / "mesh24.json"
    config.write_text(json.dumps({**TINY, "mesh_shape": [2, 4], "batch_size": 6}))
    args = ["launch", "--config", str(config), "--workdir", str(tmp_path / "run")]
    check_cli([*args, "--processes", "4", "--devices-per-process", "2"], tmp_path, "`6`")


# --- worker: the options `launch` passes to every process --------------------------------

WORKER_DAMAGE: list[tuple[dict[str, str | None], str]] = [
    ({"--config": None}, "--config"),
    ({"--workdir": None}, "--workdir"),
    ({"--num-processes": "0"}, "--num-processes"),
    ({"--num-processes": "x"}, "x"),
    ({"--process-id": "2"}, "--process-id"),
    ({"--process-id": "-1"}, "--process-id"),
    ({"--devices-per-process": "0"}, "--devices-per-process"),
    ({"--coordinator": ""}, "HOST:PORT"),
    ({"--coordinator": "nohost"}, "nohost"),
    ({"--coordinator": "127.0.0.1:99999"}, "99999"),
    ({"--coordinator": "127.0.0.1:0"}, "127.0.0.1:0"),
    ({"--kill-at": "x"}, "--kill-at"),
    ({"--kill-at": "3:soon:0"}, "soon"),
    ({"--kill-at": "x:step:0"}, "--kill-at"),
    ({"--kill-at": "3:after_step:5"}, "--kill-at"),
    ({"--init-timeout": "0"}, "--init-timeout"),
    ({"--attempt": "-1"}, "--attempt"),
    ({"--bogus": "1"}, "--bogus"),
]


@pytest.mark.parametrize(("change", "token"), WORKER_DAMAGE)
def test_bad_worker_options_are_refused_before_joining(tmp_path, tiny_file, change, token):
    options: dict[str, str | None] = {
        "--config": str(tiny_file),
        "--workdir": str(tmp_path / "w"),
        "--process-id": "1",
        "--num-processes": "2",
        "--devices-per-process": "4",
        "--coordinator": "127.0.0.1:1",
        **change,
    }
    args = [part for name, value in options.items() if value is not None for part in (name, value)]
    check_cli(["worker", *args], tmp_path, token)


# --- coverage ----------------------------------------------------------------------


def _command_names(group: click.Group, prefix: str = "") -> set[str]:
    names = set()
    for name, command in group.commands.items():
        names.add(prefix + name)
        if isinstance(command, click.Group):
            names |= _command_names(command, f"{prefix}{name} ")
    return names


def test_every_command_has_bad_input_cases(request):
    """Read from the click group itself: a new command without cases fails here. When
    every test of this module was selected, what actually ran must cover them too."""
    assert _command_names(main) == COVERED_COMMANDS
    ran = {item.originalname for item in request.session.items if item.path == Path(__file__)}
    if ran >= {name for name in globals() if name.startswith("test_")}:
        assert LEDGER["commands"] == COVERED_COMMANDS
        assert LEDGER["tracebacks"] == 0 and LEDGER["cases"] > 0
