"""Bad input: every `reproducible-experiments` command, and every library entry point
a learner calls with a file, a record, an array or a config, refuses damaged input with
one precise message.

CLI promise: exit code 2 (the project's `BadInput`, or click's own usage error), one
line naming the file, field or value, no traceback (`result.exception` is None or
`SystemExit`), and nothing written: the work folder's files (the store's artifacts
included) and the store's rows (read with `sqlite3`, not MLflow) are equal before and
after. Library promise: a `ValueError` (the project's errors subclass it) naming it.

Nothing here trains and no server is started: every store is a SQLite file under the
module's temporary folder, and damaged records are written with the MLflow client
directly. Positive controls (`test_undamaged_*`) show that the undamaged record, parent
run and spec are accepted, so each refusal comes from its damage alone. The case count
goes to `evidence/bad_input.json` at module end.
"""

import json
import math
import os
import re
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import click
import jax
import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from reproducible_experiments import comparison, data, record, tracking
from reproducible_experiments.cli import main
from reproducible_experiments.config import Config, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NAN, INF = math.nan, math.inf
SOME = settings(max_examples=25, derandomize=True, deadline=None, database=None)
# Cases that read a record back through MLflow (about 0.1 s of CPU per read).
FEW = settings(max_examples=15, derandomize=True, deadline=None, database=None)

LEDGER: dict[str, Any] = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}
COVERED_COMMANDS = {"train", "show", "inventory", "compare", "analyze", "reproduce", "bench"}
STORE_TABLES = ("experiments", "experiment_tags", "runs", "tags", "params", "metrics")


@pytest.fixture(scope="module", autouse=True)
def _write_evidence():
    yield
    directory = Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence"))
    directory.mkdir(parents=True, exist_ok=True)
    record_ = {
        "cases": LEDGER["cases"],
        "tracebacks": LEDGER["tracebacks"],
        "commands": sorted(LEDGER["commands"]),
        "entry_points": sorted(LEDGER["entry_points"]),
    }
    (directory / "bad_input.json").write_text(json.dumps(record_, indent=1) + "\n")


class Store:
    """The module's SQLite store and work folder (the current directory while the
    module runs, so that any default output would land in the watched folder)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.db = work / "store" / "mlflow.db"
        self.uri = str(self.db)
        self.client = tracking.connect(self.db)
        self.exp_id = tracking.experiment_id(self.client, "digits")
        self.blocker = work / "blocker"
        self.blocker.write_text("a file, not a directory\n")

    def snapshot(self) -> tuple[dict[str, bytes | None], dict[str, list]]:
        files = {
            p.relative_to(self.work).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(self.work.rglob("*"))
            if not p.name.startswith("mlflow.db")  # The SQLite files: compared by rows.
        }
        with sqlite3.connect(self.db) as conn:
            rows = {t: sorted(map(repr, conn.execute(f"SELECT * FROM {t}"))) for t in STORE_TABLES}
        return files, rows


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    work = tmp_path_factory.mktemp("bad-input")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield Store(work)


def check_cli(store: Store, args: list[str], token: str) -> None:
    """`reproducible-experiments ARGS` must refuse with exit 2 and one line naming
    `token`, and write nothing."""
    before = store.snapshot()
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
        if line.strip()
        and not line.startswith(("Usage:", "Try "))
        and "Downloading artifacts" not in line  # MLflow's progress bar, on stderr.
    ]
    assert len(lines) == 1, (args, result.output)
    assert token in lines[0], (args, token, result.output)
    assert store.snapshot() == before, (args, "the command wrote something")


def check_api(name: str, call, token: str) -> None:
    """`call()` must raise a ValueError whose message names `token`."""
    LEDGER["cases"] += 1
    LEDGER["entry_points"].add(name)
    with pytest.raises(ValueError, match=re.escape(token)):
        call()


# --- file damage shared by configs and specs ------------------------------------------

FILE_KINDS = ["missing", "directory", "empty", "truncated", "non_utf8", "not_parsable"]


def write_damaged(path: Path, kind: str, good_text: str, cut: int) -> None:
    """Writes `path` damaged as `kind` (`missing` writes nothing)."""
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_text(good_text[: 1 + cut % (len(good_text) - 2)])
    elif kind == "non_utf8":
        path.write_bytes(b"\xff\xfe" + good_text.encode("utf-16-le"))
    elif kind == "not_parsable":
        path.write_text("{unclosed: [\n")


# --- configs: `train --config`, `bench --config`, `load_config` ---------------------------

BAD_CONFIG_VALUES: dict[str, list[Any]] = {
    "train_seed": [-1, 2**31, 1.5, "0", True, None],
    "eval_seed": [-1, 2**40, "x"],
    "val_fraction": [0.0, 1.0, -0.1, NAN, INF, "0.1"],
    "test_fraction": [0.0, 1.0, NAN, -INF],
    "hidden_size": [0, -3, 1.5, 5000, [32]],
    "dropout_rate": [1.0, -0.1, NAN, INF],
    "label_smoothing": [1.0, -0.5, NAN],
    "learning_rate": [0.0, -1e-3, NAN, INF, 11.0],
    "batch_size": [0, -1, 5000, 1.0, NAN],
    "num_epochs": [0, -5, 10**6, NAN],
}
TINY = json.loads(Config.tiny().to_json())


@st.composite
def damaged_config(draw) -> tuple[str, bytes | None, str]:
    """(kind, bytes to write or None, the token the message must name)."""
    kinds = [k for k in FILE_KINDS if k != "truncated"] + ["wrong_type", "unknown", "bad_value"]
    kind = draw(st.sampled_from([*kinds, "truncated"]))
    text = json.dumps(TINY)
    if kind in ("missing", "directory"):
        return kind, None, "config.json"
    if kind == "empty":
        return kind, b"", "config.json"
    if kind == "truncated":
        return kind, text[: draw(st.integers(1, len(text) - 2))].encode(), "config.json"
    if kind == "non_utf8":
        return kind, b"\xff\xfe" + text.encode("utf-16-le"), "config.json"
    if kind == "not_parsable":
        return kind, b"hidden_size = 32\n", "config.json"
    if kind == "wrong_type":
        value = draw(st.sampled_from([[1], "tiny", 3, None]))
        return kind, json.dumps(value).encode(), "config.json"
    if kind == "unknown":
        name = draw(st.sampled_from(["lr", "seed", "hidden", "epochs"]))
        return kind, json.dumps({**TINY, name: 1}).encode(), name
    field = draw(st.sampled_from(sorted(BAD_CONFIG_VALUES)))
    value = draw(st.sampled_from(BAD_CONFIG_VALUES[field]))
    return kind, json.dumps({**TINY, field: value}).encode(), field


@SOME
@given(damage=damaged_config())
def test_damaged_config_is_refused_by_every_reader(store, damage):
    kind, content, token = damage
    with tempfile.TemporaryDirectory(dir=store.work) as tmp:
        path = Path(tmp) / "config.json"
        if kind == "directory":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        check_api("load_config", lambda: load_config(path), token)
        if content is not None:
            text = content.decode("utf-8", errors="replace")
            check_api("Config.from_json", lambda: Config.from_json(text, str(path)), token)
        train = ["train", "--config", str(path), "--tracking-uri", store.uri]
        check_cli(store, train, token)
        check_cli(store, ["bench", "--config", str(path), "--out", f"{tmp}/b.json"], token)


@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["--train-seed", "-1"], "-1"),
        (["--train-seed", str(2**31)], str(2**31)),
        (["--eval-seed", "x"], "x"),
        (["--experiment", ""], "experiment"),
        (["--experiment", "   "], "experiment"),
    ],
)
def test_bad_train_options_are_refused(store, args, token):
    config = PROJECT_ROOT / "configs" / "tiny.json"
    check_cli(store, ["train", "--config", str(config), "--tracking-uri", store.uri, *args], token)


# --- tracking stores: `--tracking-uri` of every command, `tracking.connect` ---------------

STORE_KINDS = ["missing", "empty_file", "directory", "parent_file", "not_sqlite", "scheme", "blank"]


def damaged_uri(store: Store, tmp: Path, kind: str, junk: bytes) -> tuple[str, str]:
    """(the `--tracking-uri` value, the token its refusal must name)."""
    if kind == "missing":
        return str(tmp / "typo.db"), "typo.db"
    if kind == "empty_file":
        (tmp / "empty.db").write_bytes(b"")
        return str(tmp / "empty.db"), "empty.db"
    if kind == "directory":
        return str(tmp), tmp.name
    if kind == "parent_file":
        return str(store.blocker / "mlflow.db"), "blocker"
    if kind == "not_sqlite":
        (tmp / "notes.db").write_bytes(junk)
        return str(tmp / "notes.db"), "notes.db"
    if kind == "scheme":
        return "foo://store", "foo://store"
    return "", "tracking URI"


@pytest.fixture(scope="module")
def small_spec_file(store) -> Path:
    path = store.work / "small-spec.yaml"
    path.write_text(yaml.safe_dump(SMALL_SPEC))
    return path


@pytest.mark.parametrize("kind", STORE_KINDS)
@settings(max_examples=2, derandomize=True, deadline=None, database=None)
@given(junk=st.sampled_from([b"not a database\n", b"\x00" * 100, b"SQLite format 2\x00" * 8]))
def test_damaged_tracking_store_is_refused_by_every_command(store, small_spec_file, kind, junk):
    with tempfile.TemporaryDirectory(dir=store.work) as tmp:
        uri, token = damaged_uri(store, Path(tmp), kind, junk)
        if kind not in ("missing", "empty_file", "scheme", "blank"):
            check_api("tracking.connect", lambda: tracking.connect(uri), token)
        reading = {
            "show": ["show", "0" * 32],
            "inventory": ["inventory"],
            "analyze": ["analyze", "0" * 32, "--out", f"{tmp}/report"],
            "reproduce": ["reproduce", "0" * 32],
        }
        writing = {
            "train": ["train", "--config", str(PROJECT_ROOT / "configs" / "tiny.json")],
            "compare": ["compare", str(small_spec_file), "--out", f"{tmp}/report"],
        }
        for args in reading.values():
            check_cli(store, [*args, "--tracking-uri", uri], token)
        if kind not in ("missing", "empty_file"):  # A new store is what these two make.
            for args in writing.values():
                check_cli(store, [*args, "--tracking-uri", uri], token)


@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["--experiment", "no-such-experiment"], "no-such-experiment"),
        (["--experiment", ""], "experiment"),
        (["--page-size", "0"], "0"),
        (["--page-size", "-1"], "-1"),
        (["--page-size", "x"], "x"),
    ],
)
def test_bad_inventory_options_are_refused(store, args, token):
    check_cli(store, ["inventory", "--tracking-uri", store.uri, *args], token)


# --- run records: `show`, `reproduce`, `record.load_record` -------------------------------

GOOD_SPLIT = {"train": list(range(0, 1200)), "validation": list(range(1200, 1500))}
GOOD_SPLIT["test"] = list(range(1500, 1797))


def make_run(store: Store, *, files=None, tags=None, params=None, status="FINISHED") -> str:
    """A run written with the MLflow client alone: by default a consistent record of
    `Config.tiny()` (config.json, its hash tag, its params, split_ids.json)."""
    config = Config.tiny()
    good_files = {"config.json": config.to_json().encode(), "split_ids.json": GOOD_SPLIT}
    good_tags = {"config.sha256": config.sha256()}
    good_params = {k: json.dumps(v) for k, v in config.model_dump(mode="json").items()}
    files = good_files if files is None else files
    run_id = store.client.create_run(
        store.exp_id, tags=good_tags if tags is None else tags
    ).info.run_id
    for name, value in (good_params if params is None else params).items():
        store.client.log_param(run_id, name, value)
    with tempfile.TemporaryDirectory() as tmp:
        for name, content in files.items():
            if content is None:
                continue
            path = Path(tmp) / name
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(json.dumps(content))
            store.client.log_artifact(run_id, str(path))
    if status != "RUNNING":
        store.client.set_terminated(run_id, status)
    return run_id


def test_undamaged_record_is_accepted(store):
    """Positive control: the default `make_run` record loads and `show` prints it."""
    run_id = make_run(store)
    rec = record.load_record(store.client, run_id)
    assert rec.config == Config.tiny() and rec.split_ids == GOOD_SPLIT
    result = CliRunner().invoke(main, ["show", run_id, "--tracking-uri", store.uri])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["seeds"] == {"train_seed": 0, "eval_seed": 0}


RECORD_PARTS = ["config.json", "config.sha256", "params", "split_ids.json", "status"]


@st.composite
def damaged_record(draw) -> tuple[dict[str, Any], str]:
    """(keyword arguments of `make_run`, the token the refusal must name)."""
    config = Config.tiny()
    files = {"config.json": config.to_json().encode(), "split_ids.json": GOOD_SPLIT}
    params = {k: json.dumps(v) for k, v in config.model_dump(mode="json").items()}
    part = draw(st.sampled_from(RECORD_PARTS))
    if part == "config.json":
        kinds = ["missing", "empty", "truncated", "non_utf8", "not_json", "wrong_type", "bad_value"]
        kind = draw(st.sampled_from(kinds))
        text = config.to_json()
        token = "config.json"
        if kind == "missing":
            content = None
        elif kind == "empty":
            content = b""
        elif kind == "truncated":
            content = text[: draw(st.integers(1, len(text) - 3))].encode()
        elif kind == "non_utf8":
            content = b"\xff\xfe" + text.encode("utf-16-le")
        elif kind == "not_json":
            content = b"{nope"
        elif kind == "wrong_type":
            content = json.dumps(draw(st.sampled_from([[1], "x", None]))).encode()
        else:
            token = draw(st.sampled_from(sorted(BAD_CONFIG_VALUES)))
            value = draw(st.sampled_from(BAD_CONFIG_VALUES[token]))
            content = json.dumps({**TINY, token: value}).encode()
        return {"files": {**files, "config.json": content}}, token
    if part == "config.sha256":
        value = draw(st.sampled_from([None, "0" * 64, "", "not a hash"]))
        return {"tags": {} if value is None else {"config.sha256": value}}, "config.sha256"
    if part == "params":
        name = draw(st.sampled_from(sorted(params)))
        if draw(st.booleans()):
            return {"params": {k: v for k, v in params.items() if k != name}}, name
        value = draw(st.sampled_from(["7", "x", '"0"', "null"]))
        value = value if value != params[name] else "8"
        return {"params": {**params, name: value}}, name
    if part == "split_ids.json":
        split: Any
        kind = draw(st.sampled_from(["not_json", "non_utf8", "wrong_type", "missing", "bad"]))
        if kind == "not_json":
            split = b"{nope"
        elif kind == "non_utf8":
            split = b"\xff\xfe\x00{"
        elif kind == "wrong_type":
            split = draw(st.sampled_from([[1, 2], "ids", 5]))
        elif kind == "missing":
            name = draw(st.sampled_from(data.SPLITS))
            split = {k: v for k, v in GOOD_SPLIT.items() if k != name}
        else:
            name = draw(st.sampled_from(data.SPLITS))
            bad = draw(st.sampled_from([[-1], [1797], [0.5], "0-9", None, [True], [1500]]))
            split = {**GOOD_SPLIT, name: bad}
        return {"files": {**files, "split_ids.json": split}}, "split_ids.json"
    status = draw(st.sampled_from(["RUNNING", "FAILED", "KILLED"]))
    return {"status": status}, status


@FEW
@given(damage=damaged_record(), track=st.booleans())
def test_damaged_record_is_refused(store, damage, track):
    kwargs, token = damage
    run_id = make_run(store, **kwargs)
    if "status" not in kwargs:  # A run that did not finish still has a readable record.
        check_api("record.load_record", lambda: record.load_record(store.client, run_id), token)
        check_cli(store, ["show", run_id, "--tracking-uri", store.uri], token)
    args = ["reproduce", run_id, "--tracking-uri", store.uri]
    check_cli(store, args if track else [*args, "--no-track"], token)


@pytest.mark.parametrize("run_id", ["0" * 32, "not-a-run", "no such run/id", ""])
def test_unknown_run_is_refused(store, run_id):
    token = f"`{run_id}`"
    check_api("record.load_record", lambda: record.load_record(store.client, run_id), token)
    check_cli(store, ["show", run_id, "--tracking-uri", store.uri], token)
    check_cli(store, ["reproduce", run_id, "--tracking-uri", store.uri, "--no-track"], token)
    check_cli(store, ["analyze", run_id, "--tracking-uri", store.uri], token)


def test_missing_arguments_are_refused(store):
    for command, token in [("show", "RUN_IDS"), ("reproduce", "RUN_ID"), ("analyze", "PARENT")]:
        check_cli(store, [command, "--tracking-uri", store.uri], token)
    check_cli(store, ["compare", "--tracking-uri", store.uri], "SPEC_PATH")


# --- comparison specs: `compare SPEC`, `comparison.load_spec`, `comparison.parse_spec` ----

SMALL_SPEC: dict[str, Any] = {
    "name": "bad-input-small",
    "question": "Does dropout 0.3 change the tiny MLP's test accuracy?",
    "baseline": {"hidden_size": 8, "num_epochs": 1, "batch_size": 64},
    "mechanism": {"field": "dropout_rate", "value": 0.3},
    "train_seeds": [0],
    "eval_seeds": [0],
}
BAD_SPEC_VALUES: dict[str, list[Any]] = {
    "name": ["Bad Name", "", 5, "x" * 81],
    "question": ["short", None],
    "baseline": [{"train_seed": 1}, {"colour": 1}, {"hidden_size": 0}, "x"],
    "mechanism": [
        {"field": "train_seed", "value": 1},
        {"field": "colour", "value": 1},
        {"field": "dropout_rate", "value": 0.0},
        {"field": "dropout_rate", "value": 1.5},
        {"field": "dropout_rate", "value": NAN},
        {"field": "dropout_rate"},
    ],
    "train_seeds": [[], [0, 0], [-1], [2**31], [0.5], "0"],
    "eval_seeds": [[], [-3], [None]],
    "metric": [{"name": "val_loss"}, {"higher_is_better": "yes"}],
    "decision": [
        {"confidence": 0.3},
        {"confidence": NAN},
        {"min_difference": INF},
        {"min_difference": NAN},
        {"min_difference": -1.0},
        {"resamples": 10},
        {"bootstrap_seed": -1},
        {"colour": 1},
    ],
}


def test_undamaged_spec_is_accepted():
    """Positive control: the spec every damage below starts from parses."""
    spec = comparison.parse_spec(yaml.safe_dump(SMALL_SPEC))
    assert spec.pairs() == [(0, 0)] and spec.candidate_config().dropout_rate == 0.3


@st.composite
def damaged_spec(draw) -> tuple[str, str | bytes | None, str]:
    kind = draw(st.sampled_from([*FILE_KINDS, "wrong_type", "unknown", "missing_field", "bad"]))
    text = yaml.safe_dump(SMALL_SPEC)
    if kind in FILE_KINDS:
        return kind, text, "spec.yaml"
    if kind == "wrong_type":
        return kind, yaml.safe_dump(draw(st.sampled_from([[1, 2], "spec", 3]))), "spec.yaml"
    if kind == "unknown":
        name = draw(st.sampled_from(["seeds", "metrics", "Name"]))
        return kind, yaml.safe_dump({**SMALL_SPEC, name: 1}), name
    if kind == "missing_field":
        name = draw(st.sampled_from(sorted(SMALL_SPEC)))
        return kind, yaml.safe_dump({k: v for k, v in SMALL_SPEC.items() if k != name}), name
    name = draw(st.sampled_from(sorted(BAD_SPEC_VALUES)))
    value = draw(st.sampled_from(BAD_SPEC_VALUES[name]))
    return kind, yaml.safe_dump({**SMALL_SPEC, name: value}), name


@SOME
@given(damage=damaged_spec(), cut=st.integers(0, 10**6))
def test_damaged_spec_is_refused(store, damage, cut):
    kind, text, token = damage
    with tempfile.TemporaryDirectory(dir=store.work) as tmp:
        path = Path(tmp) / "spec.yaml"
        if kind in FILE_KINDS:
            write_damaged(path, kind, text, cut)
        else:
            path.write_text(text)
        check_api("comparison.load_spec", lambda: comparison.load_spec(path), token)
        args = ["compare", str(path), "--tracking-uri", store.uri, "--out", f"{tmp}/report"]
        check_cli(store, args, token)


def test_frozen_spec_name_is_refused(store):
    """A name registered with other content: refused before any run starts."""
    name = "bad-input-frozen"
    tags = {"comparison.name": name, "comparison.role": "parent", "comparison.spec_sha256": "0"}
    store.client.create_run(store.exp_id, tags=tags)
    path = store.work / "frozen.yaml"
    path.write_text(yaml.safe_dump({**SMALL_SPEC, "name": name}))
    check_cli(store, ["compare", str(path), "--tracking-uri", store.uri], name)


@pytest.mark.parametrize("command", ["compare", "analyze"])
def test_report_folder_that_cannot_be_made_is_refused_first(store, small_spec_file, command):
    target = str(small_spec_file) if command == "compare" else good_parent(store)
    args = [command, target, "--tracking-uri", store.uri, "--out", str(store.blocker / "r")]
    check_cli(store, args, "blocker")


# --- comparison records: `analyze PARENT`, `comparison.analyze` ---------------------------


def good_parent(store: Store, spec_json: bytes | None = None, sha: str | None = None) -> str:
    spec = comparison.parse_spec(yaml.safe_dump(SMALL_SPEC))
    tags = {
        "comparison.name": "registered-elsewhere",
        "comparison.role": "parent",
        "comparison.spec_sha256": spec.sha256() if sha is None else sha,
    }
    run_id = store.client.create_run(store.exp_id, tags=tags).info.run_id
    content = spec.canonical_json().encode() if spec_json is None else spec_json
    if content != b"-":
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "spec.json").write_bytes(content)
            store.client.log_artifact(run_id, str(Path(tmp) / "spec.json"))
    store.client.set_terminated(run_id, "FINISHED")
    return run_id


def child(store: Store, parent: str, *, arm="baseline", params=None) -> str:
    spec = comparison.parse_spec(yaml.safe_dump(SMALL_SPEC))
    tags = {
        "mlflow.parentRunId": parent,
        "comparison.spec_sha256": spec.sha256(),
        "comparison.role": "child",
    }
    if arm is not None:
        tags["comparison.arm"] = arm
    run_id = store.client.create_run(store.exp_id, tags=tags).info.run_id
    for name, value in (
        {"train_seed": "0", "eval_seed": "0"} if params is None else params
    ).items():
        store.client.log_param(run_id, name, value)
    store.client.log_metric(run_id, "test_accuracy", 0.5)
    store.client.set_terminated(run_id, "FINISHED")
    return run_id


def test_undamaged_comparison_record_is_accepted(store):
    """Positive control: an undamaged parent with one complete pair analyzes."""
    parent = good_parent(store)
    child(store, parent, arm="baseline")
    child(store, parent, arm="candidate")
    analysis = comparison.analyze(store.client, parent)
    assert [p.status for p in analysis.pairs] == ["complete"] and analysis.mean == 0.0


@st.composite
def damaged_comparison(draw) -> tuple[str, dict[str, Any], str]:
    """(what is damaged, details, the token the refusal must name)."""
    part = draw(st.sampled_from(["spec.json", "hash", "not_parent", "child"]))
    if part == "spec.json":
        content = draw(
            st.sampled_from([b"-", b"", b"\xff\xfe{", b"{nope", b"[1, 2]", b'{"name": "x"}'])
        )
        return part, {"spec_json": content}, "spec.json"
    if part == "hash":
        return part, {"sha": draw(st.sampled_from(["0" * 64, ""]))}, "comparison.spec_sha256"
    if part == "not_parent":
        return part, {}, "parent"
    damage = draw(st.sampled_from(["no_arm", "bad_arm", "no_seed", "bad_seed"]))
    if damage == "no_arm":
        return part, {"arm": None}, "comparison.arm"
    if damage == "bad_arm":
        return part, {"arm": draw(st.sampled_from(["other", ""]))}, "comparison.arm"
    seed = draw(st.sampled_from(["train_seed", "eval_seed"]))
    if damage == "no_seed":
        return part, {"params": {"train_seed": "0", "eval_seed": "0", seed: None}}, seed
    value = draw(st.sampled_from(["x", "1.5", '"0"', "-1"]))
    return part, {"params": {"train_seed": "0", "eval_seed": "0", seed: value}}, seed


@FEW
@given(damage=damaged_comparison())
def test_damaged_comparison_record_is_refused(store, damage):
    part, details, token = damage
    if part in ("spec.json", "hash"):
        parent = good_parent(store, **details)
    elif part == "not_parent":
        parent = make_run(store)
    else:
        parent = good_parent(store)
        if "params" in details:
            details["params"] = {k: v for k, v in details["params"].items() if v is not None}
        child(store, parent, **details)
    check_api("comparison.analyze", lambda: comparison.analyze(store.client, parent), token)
    with tempfile.TemporaryDirectory(dir=store.work) as tmp:
        args = ["analyze", parent, "--tracking-uri", store.uri, "--out", f"{tmp}/report"]
        check_cli(store, args, token)


# --- bench's options ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["--out", "{blocker}/bench.json"], "blocker"),
        (["--out", "{work}/bench.png"], "bench.png"),
        (["--out", "{work}"], "--out"),
        (["--reps", "0"], "0"),
        (["--values", "-1"], "-1"),
        (["--values", "many"], "many"),
    ],
)
def test_bad_bench_options_are_refused(store, args, token):
    args = [a.format(blocker=store.blocker, work=store.work) for a in args]
    config = str(PROJECT_ROOT / "configs" / "tiny.json")
    check_cli(store, ["bench", "--config", config, "--reps", "1", "--values", "1", *args], token)


# --- arrays: `data.split_ids` -------------------------------------------------------


@st.composite
def damaged_split_args(draw) -> tuple[dict[str, Any], str]:
    labels = np.repeat(np.arange(10, dtype=np.int32), 20)
    args: dict[str, Any] = {"labels": labels, "val_fraction": 0.15, "test_fraction": 0.2}
    kind = draw(st.sampled_from(["labels", "val_fraction", "test_fraction", "sum"]))
    if kind == "labels":
        bad = draw(
            st.sampled_from(
                [np.zeros(0, np.int32), labels.reshape(20, 10), labels + 0.5, np.array(["a"])]
            )
        )
        return {**args, "labels": bad}, "labels"
    if kind == "sum":
        val = draw(st.floats(0.3, 0.7))
        return {**args, "val_fraction": val, "test_fraction": 1.05 - val}, "val_fraction"
    return {**args, kind: draw(st.sampled_from([NAN, INF, -INF, 0.0, -0.2, 1.0, 1.5]))}, kind


@SOME
@given(damage=damaged_split_args())
def test_split_ids_refuses_bad_arguments(damage):
    args, token = damage
    check_api(
        "data.split_ids",
        lambda: data.split_ids(
            args["labels"], jax.random.key(0), args["val_fraction"], args["test_fraction"]
        ),
        token,
    )


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
