"""Bad input: every `deployment-audit` command and the entry points a learner
calls with a file, an array or a config refuse a damaged input cleanly.

- CLI (in-process `CliRunner`): exit code 2, one `Error:` line naming the file,
  field or value, no traceback, and nothing written (the workspace's file
  names and bytes are equal before and after). Training, the precision
  comparison, the server, the load run and the bench are replaced by
  tripwires, so an input that is silently accepted fails its case instead of
  starting work; `serve` and `load` never start a server here.
- Library: a `ValueError` subclass of the project (`ConfigError`,
  `ArtifactError`, `InputError`, `CheckpointError`, `WorkdirError`) whose
  message names the input; never a NaN result.

Cases are drawn by hypothesis (the damage, the field, the value) with a fixed
derandomized seed, plus enumerations where a list is clearer. The count goes to
`evidence/bad_input.json` when the module ends. The session's trained model and
artifact (tests/conftest.py) are read, never changed: damaged copies are made.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from deployment_audit import bench as bench_module
from deployment_audit import checkpoint, export, loadgen, precision, report, serve, train
from deployment_audit.cli import main
from deployment_audit.config import Config, ConfigError, LoadConfig, ServeConfig, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
FEW = settings(max_examples=25, derandomize=True, deadline=None, database=None)
TALLY: dict[str, Any] = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}
REAL = {"train_and_evaluate": train.train_and_evaluate, "run_bench": bench_module.run_bench}
KINDS = {"train": Config, "serve": ServeConfig, "load": LoadConfig}
# Invalid for every field of the three configs (strict: no string or null for a
# number, no number for a tuple; every numeric field bounded inside +-1e9).
GENERIC_BAD = [float("nan"), float("inf"), float("-inf"), "0.1", None, [], {}, -1e9, 1e9]
# Invalid for every manifest field the loader reads (a wrong type, or a value of the
# right type that names nothing: `x` is no file, hash, version or date).
MANIFEST_BAD = [5, None, "x", [], {}, True, -1, 1.5]
GOOD_PIXELS = np.full((2, 64), 3.0, np.float32)


class Tripwire(AssertionError):
    """Raised when the work behind a command starts although its input was damaged."""


def _tripwire(name: str):
    def fire(*args: object, **kwargs: object) -> None:
        raise Tripwire(f"{name} started on a damaged input")

    return fire


@pytest.fixture(scope="module")
def ws(tmp_path_factory, artifact, trained):
    """The workspace every case runs in (cwd too, so default outputs land here).
    The session's model and artifact are built first, then the work is tripwired."""
    root = tmp_path_factory.mktemp("bad_input")
    (root / "a_file").write_text("not a folder\n")
    (root / "a_folder").mkdir()
    previous = os.getcwd()
    os.chdir(root)
    patch = pytest.MonkeyPatch()
    patch.setattr(train, "create_model", _tripwire("training"))
    patch.setattr(export, "write_artifact", _tripwire("writing an artifact"))
    patch.setattr(precision, "compare", _tripwire("the precision comparison"))
    patch.setattr(serve, "run_server", _tripwire("a server"))
    patch.setattr(loadgen, "run_load_test", _tripwire("the load run"))
    patch.setattr(bench_module, "run_bench", _tripwire("the bench"))
    yield root
    patch.undo()
    os.chdir(previous)


@pytest.fixture(scope="module")
def spare(tmp_path_factory):
    """A folder outside the workspace for damaged copies of the artifact and workdir."""
    return tmp_path_factory.mktemp("damaged")


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


def cli(ws: Path, args: list[str], *needles: str, also: Path | None = None) -> str:
    """Runs one damaged command; checks the refusal; returns its error line.
    `also`: a second folder the command reads (a damaged copy) that must not change."""
    before = snapshot(ws), snapshot(also) if also else None
    result = CliRunner().invoke(main, [str(a) for a in args])
    after = snapshot(ws), snapshot(also) if also else None
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
    assert after == before, f"{args} wrote into the workspace or the input it read"
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


# --- damaged config files (train, serve, load) --------------------------------------------

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
        "not-json": b"seed = 0\nrates = 40\n",
        "json-list": b"[1, 2, 3]",
        "json-string": b'"configs/tiny.json"',
        "json-null": b"null",
    }[kind]
    path.write_bytes(content)
    return path


def config_damage(kind: type) -> st.SearchStrategy:
    return st.one_of(
        st.tuples(st.just("file"), st.sampled_from(FILE_DAMAGE), st.none()),
        st.tuples(
            st.just("field"),
            st.sampled_from(sorted(kind.model_fields)),
            st.sampled_from(GENERIC_BAD),
        ),
        st.tuples(st.just("unknown"), st.sampled_from(["colour", "Seed", "port", ""]), st.none()),
    )


def config_file(ws: Path, kind: type, damage: tuple[str, str, Any]) -> tuple[Path, str]:
    """The damaged config file of `kind` and what its error message must name."""
    what, name, value = damage
    good = kind().model_dump(mode="json")
    if what == "file":
        return damaged_file(ws, name, f"{kind.__name__}.json", json.dumps(good)), kind.__name__
    good[name] = value if what == "field" else 1
    path = ws / f"{kind.__name__}.json"
    path.write_text(json.dumps(good))
    return path, f"`{name}"


CONFIG_OPTION = {"train": ["--workdir", "new_run"], "serve": [], "load": []}


@FEW
@given(command=st.sampled_from(sorted(KINDS)), data=st.data())
def test_train_serve_and_load_refuse_a_damaged_config(ws, artifact, command, data):
    path, needle = config_file(ws, KINDS[command], data.draw(config_damage(KINDS[command])))
    target = [] if command == "train" else [artifact]
    cli(ws, [command, *target, "--config", path, *CONFIG_OPTION[command]], needle)


@FEW
@given(command=st.sampled_from(sorted(KINDS)), data=st.data())
def test_load_config_refuses_a_damaged_config(ws, command, data):
    kind = KINDS[command]
    path, needle = config_file(ws, kind, data.draw(config_damage(kind)))
    refused("load_config", ConfigError, needle, load_config, path, kind)


OUT_OF_RANGE = [
    (Config, {"seed": -1}, "`seed`"),
    (Config, {"test_fraction": 0.0}, "`test_fraction`"),
    (Config, {"hidden_sizes": []}, "`hidden_sizes`"),
    (Config, {"hidden_sizes": [0]}, "`hidden_sizes`"),
    (Config, {"hidden_sizes": [8, 8, 8, 8, 8]}, "`hidden_sizes`"),
    (Config, {"learning_rate": 0.0}, "`learning_rate`"),
    (Config, {"batch_size": 0}, "`batch_size`"),
    (Config, {"num_epochs": 0}, "`num_epochs`"),
    (Config, {"num_golden": 257}, "`num_golden`"),
    (ServeConfig, {"max_batch_size": 0}, "`max_batch_size`"),
    (ServeConfig, {"batch_timeout_ms": -1.0}, "`batch_timeout_ms`"),
    (ServeConfig, {"max_rows_per_request": 128}, "`max_rows_per_request`"),
    (ServeConfig, {"max_queue_rows": 8, "max_rows_per_request": 16}, "`max_queue_rows`"),
    (LoadConfig, {"rates": []}, "`rates`"),
    (LoadConfig, {"rates": [0.0]}, "`rates`"),
    (LoadConfig, {"rates": [-50.0]}, "`rates`"),
    (LoadConfig, {"rates": [40.0, float("nan")]}, "`rates.1`"),
    (LoadConfig, {"rates": [float("inf")]}, "`rates.0`"),
    (LoadConfig, {"requests_per_rate": 9}, "`requests_per_rate`"),
    (LoadConfig, {"request_sizes": [0]}, "`request_sizes`"),
    (LoadConfig, {"max_seconds_per_rate": 0.0}, "`max_seconds_per_rate`"),
    (LoadConfig, {"request_timeout_s": 61.0}, "`request_timeout_s`"),
]
COMMAND_OF = {Config: "train", ServeConfig: "serve", LoadConfig: "load"}


@pytest.mark.parametrize(("kind", "change", "needle"), OUT_OF_RANGE)
def test_out_of_range_fields_are_refused(ws, artifact, kind, change, needle):
    (ws / "range.json").write_text(json.dumps({**kind().model_dump(mode="json"), **change}))
    command = COMMAND_OF[kind]
    target = [] if command == "train" else [artifact]
    cli(ws, [command, *target, "--config", "range.json", *CONFIG_OPTION[command]], needle)
    refused(f"{kind.__name__}.from_json", ConfigError, needle, kind.from_json, json.dumps(change))


def test_load_refuses_a_damaged_serve_config(ws, artifact):
    (ws / "serve.json").write_text(json.dumps({"max_batch_size": "64"}))
    cli(ws, ["load", artifact, "--serve-config", "serve.json"], "`max_batch_size`")


# --- train and its workdir ------------------------------------------------------------


@pytest.mark.parametrize(
    ("workdir", "needle"),
    [("a_file/run", "`a_file` is a file"), ("a_file", "a_file"), ("a_file/x/y", "a_file")],
)
def test_train_refuses_a_workdir_it_cannot_create(ws, workdir, needle):
    cli(ws, ["train", "--config", PROJECT_ROOT / "configs/tiny.json", "--workdir", workdir], needle)
    cli(ws, ["train", "--workdir", workdir, "--overwrite"], needle)


def test_train_and_evaluate_refuses_a_bad_config_or_workdir(ws):
    fit = REAL["train_and_evaluate"]
    refused("train_and_evaluate", ConfigError, "`Config`", fit, Config.tiny().model_dump())
    refused("train_and_evaluate", train.WorkdirError, "a_file", fit, Config.tiny(), "a_file/run")


# --- the trained workdir: export and precision -------------------------------------------


def _workdir_copy(spare: Path, trained: dict[str, Any], name: str) -> Path:
    target = spare / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(trained["workdir"], target, ignore=shutil.ignore_patterns("artifact"))
    return target


WORKDIR_DAMAGE = {
    "missing": ("missing workdir", None, "incomplete"),
    "no golden": ("golden.json", None, "golden.json"),
    "golden not json": ("golden.json", b"{not json", "golden.json"),
    "golden a list": ("golden.json", b"[1, 2]", "golden.json"),
    "no hashes": ("checkpoint/sha256.json", None, "incomplete"),
    "hashes not json": ("checkpoint/sha256.json", b"\xff\xfe", "incomplete"),
}


@pytest.mark.parametrize("damage", sorted(WORKDIR_DAMAGE))
def test_export_refuses_a_damaged_workdir(ws, spare, trained, damage):
    relative, content, needle = WORKDIR_DAMAGE[damage]
    workdir = _workdir_copy(spare, trained, "export-" + damage.replace(" ", "-"))
    if damage == "missing":
        shutil.rmtree(workdir)
    elif content is None:
        (workdir / relative).unlink()
    else:
        (workdir / relative).write_bytes(content)
    cli(ws, ["export", workdir, "--out", "exported"], needle, also=workdir.parent)
    if damage != "missing":
        refused("load_trained", checkpoint.CheckpointError, needle, train.load_trained, workdir)


@pytest.mark.parametrize(
    ("out", "needle"), [("a_file", "a_file"), ("a_file/artifact", "`a_file` is a file")]
)
def test_export_refuses_an_artifact_folder_it_cannot_create(ws, trained, out, needle):
    cli(ws, ["export", trained["workdir"], "--out", out], needle)


METRICS_DAMAGE = {
    "missing": (None, "metrics.json"),
    "not json": (b"{", "not valid JSON"),
    "a list": (b"[]", "not a JSON object"),
    "no split": (b'{"epochs": []}', "lack the `split`"),
    "split a list": (b'{"split": [1, 2]}', "lack the `split`"),
    "empty test split": (b'{"split": {"train": [1, 2], "test": []}}', "`test` split"),
    "ids out of range": (b'{"split": {"train": [1, 2], "test": [3, 5000]}}', "outside 0..1796"),
    "negative ids": (b'{"split": {"train": [-1], "test": [3]}}', "`train` split"),
    "ids not integers": (b'{"split": {"train": [1.5], "test": [3]}}', "`train` split"),
    "ids ragged": (b'{"split": {"train": [[1], 2], "test": [3]}}', "`train` split"),
}


@pytest.mark.parametrize("damage", sorted(METRICS_DAMAGE))
def test_precision_refuses_damaged_training_metrics(ws, spare, trained, damage):
    content, needle = METRICS_DAMAGE[damage]
    workdir = _workdir_copy(spare, trained, "precision-" + damage.replace(" ", "-"))
    if content is None:
        (workdir / "metrics.json").unlink()
    else:
        (workdir / "metrics.json").write_bytes(content)
    cli(ws, ["precision", workdir, "--out", "precision.json"], needle, also=workdir.parent)
    refused("precision_report", checkpoint.CheckpointError, needle, report.precision_report,
            workdir)  # fmt: skip


@pytest.mark.parametrize(
    ("out", "needle"),
    [("a_file/p.json", "`a_file` is a file"), ("a_folder", "a_folder"), ("report", "report.png")],
)
def test_precision_refuses_a_report_path_it_cannot_write(ws, trained, out, needle):
    (ws / "report.png").mkdir(exist_ok=True)
    try:
        cli(ws, ["precision", trained["workdir"], "--out", out], needle)
    finally:
        (ws / "report.png").rmdir()


# --- the artifact: verify, predict, load_artifact -----------------------------------------


def _artifact_copy(spare: Path, artifact: Path, name: str) -> Path:
    target = spare / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(artifact, target)
    return target


def _rewrite(target: Path, edit) -> None:
    manifest = json.loads((target / export.MANIFEST_FILE).read_text())
    edit(manifest)
    (target / export.MANIFEST_FILE).write_text(json.dumps(manifest))


def _set_golden(target: Path, text: bytes) -> None:
    (target / export.GOLDEN_FILE).write_bytes(text)
    _rewrite(target, lambda m: m.update(golden_sha256=hashlib.sha256(text).hexdigest()))


def damaged_artifact(spare: Path, artifact: Path, damage: tuple[str, str, Any]) -> tuple[Path, str]:
    """A damaged copy of the artifact and what its error message must name."""
    what, name, value = damage
    target = _artifact_copy(spare, artifact, "artifact")
    if what == "field":
        _rewrite(target, lambda m: m.update({name: value}))
        kind = export._REQUIRED[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            return target, f"`{name}`"  # The wrong JSON type.
        if value == "x":
            return target, "x`"  # A string that names no file, hash, version or date.
        if name == "calling_convention_version":
            return target, f"calling convention {value}"
        return target, f"`{name}`"
    if what == "missing field":
        _rewrite(target, lambda m: m.pop(name))
        return target, f"'{name}'"
    if what == "manifest":
        path = target / export.MANIFEST_FILE
        if name == "missing":
            path.unlink()
        else:
            good = path.read_text()
            path.write_bytes(
                {
                    "empty": b"",
                    "truncated": good.encode()[: len(good) // 2],
                    "non-utf8": b"\xff\xfe{",
                    "json-list": b"[1]",
                }[name]
            )
        return target, "manifest.json"
    if what == "golden":
        golden = json.loads((target / export.GOLDEN_FILE).read_text())
        changed = {
            "a list": [golden],
            "no logits": {k: v for k, v in golden.items() if k != "logits"},
            "inputs of 63 pixels": {**golden, "inputs": [row[:63] for row in golden["inputs"]]},
            "a NaN input": {**golden, "inputs": [[float("nan")] * 64] + golden["inputs"][1:]},
            "short predictions": {**golden, "predictions": golden["predictions"][:-1]},
            "logits of 9 classes": {**golden, "logits": [row[:9] for row in golden["logits"]]},
        }[name]
        _set_golden(target, json.dumps(changed).encode())
        return target, "golden.json"
    blob = (target / export.ARTIFACT_FILE).read_bytes()
    cut = {"half": blob[: len(blob) // 2], "empty": b"", "flipped": bytes([blob[0] ^ 1]) + blob[1:]}
    (target / export.ARTIFACT_FILE).write_bytes(cut[name])
    return target, "model.jaxexport"


artifact_damage = st.one_of(
    st.tuples(
        st.just("field"), st.sampled_from(sorted(export._REQUIRED)), st.sampled_from(MANIFEST_BAD)
    ),
    st.tuples(st.just("missing field"), st.sampled_from(sorted(export._REQUIRED)), st.none()),
    st.tuples(
        st.just("manifest"),
        st.sampled_from(["missing", "empty", "truncated", "non-utf8", "json-list"]),
        st.none(),
    ),
    st.tuples(
        st.just("golden"),
        st.sampled_from(
            [
                "a list",
                "no logits",
                "inputs of 63 pixels",
                "a NaN input",
                "short predictions",
                "logits of 9 classes",
            ]
        ),
        st.none(),
    ),
    st.tuples(st.just("bytes"), st.sampled_from(["half", "empty", "flipped"]), st.none()),
)


@FEW
@given(damage=artifact_damage)
def test_verify_refuses_a_damaged_artifact(ws, spare, artifact, damage):
    target, needle = damaged_artifact(spare, artifact, damage)
    cli(ws, ["verify", target], needle, also=target)


@FEW
@given(damage=artifact_damage)
def test_load_artifact_refuses_a_damaged_artifact(spare, artifact, damage):
    target, needle = damaged_artifact(spare, artifact, damage)
    refused("load_artifact", export.ArtifactError, needle, export.load_artifact, target)


@pytest.mark.parametrize("command", ["verify", "serve"])
@pytest.mark.parametrize("pin", ["xyz", "A" * 64, "0" * 63, "g" * 64])
def test_verify_and_serve_refuse_a_malformed_pinned_hash(ws, artifact, command, pin):
    cli(ws, [command, artifact, "--expect-sha256", pin], "'--expect-sha256'")
    refused("load_artifact", export.ArtifactError, "64 lowercase hexadecimal", export.load_artifact,
            artifact, expected_sha256=pin)  # fmt: skip


def _npy(ws: Path, name: str, kind: str) -> Path:
    """An input file for `predict`; every kind but `ok` is damaged."""
    path = ws / name
    arrays = {
        "ok": GOOD_PIXELS,
        "float64": GOOD_PIXELS.astype(np.float64),
        "int32": GOOD_PIXELS.astype(np.int32),
        "bool": GOOD_PIXELS > 1,
        "complex": GOOD_PIXELS.astype(np.complex64),
        "strings": np.array([["3"] * 64]),
        "rank 1": GOOD_PIXELS[0],
        "rank 3": GOOD_PIXELS.reshape(2, 8, 8),
        "63 features": GOOD_PIXELS[:, :63],
        "empty": GOOD_PIXELS[:0],
        "nan": np.where(np.eye(2, 64, dtype=bool), np.nan, GOOD_PIXELS).astype(np.float32),
        "inf": np.where(np.eye(2, 64, dtype=bool), np.inf, GOOD_PIXELS).astype(np.float32),
        "negative": GOOD_PIXELS - 5,
        "above 16": GOOD_PIXELS * 6,
        "huge": GOOD_PIXELS * 1e30,
    }
    if kind in arrays:
        with path.open("wb") as f:
            np.save(f, arrays[kind])
        return path
    good = path.with_suffix(".good.npy")
    with good.open("wb") as f:
        np.save(f, GOOD_PIXELS)
    blob = good.read_bytes()
    good.unlink()
    damaged = {
        "empty file": b"",
        "truncated": blob[: len(blob) // 2],
        "text": b"3,3,3\n",
        "pickle": b"\x80\x04\x95\x00",
    }
    if kind == "object array":
        with path.open("wb") as f:
            np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == "npz":
        with path.open("wb") as f:
            np.savez(f, x=GOOD_PIXELS)
    else:
        path.write_bytes(damaged[kind])
    return path


PREDICT_DAMAGE = {
    "float64": "float32",
    "int32": "float32",
    "bool": "float32",
    "complex": "float32",
    "strings": "float32",
    "rank 1": "rank 2",
    "rank 3": "rank 2",
    "63 features": "64 features",
    "empty": "at least one row",
    "nan": "NaN or infinite",
    "inf": "NaN or infinite",
    "negative": "[0, 16]",
    "above 16": "[0, 16]",
    "huge": "[0, 16]",
    "empty file": "not a NumPy .npy file",
    "truncated": "not a NumPy .npy file",
    "text": "not a NumPy .npy file",
    "pickle": "not a NumPy .npy file",
    "object array": "not a NumPy .npy file",
    "npz": ".npz archive",
}


@pytest.mark.parametrize("kind", sorted(PREDICT_DAMAGE))
def test_predict_refuses_a_damaged_input_before_loading_the_artifact(ws, monkeypatch, kind):
    monkeypatch.setattr(export, "load_artifact", _tripwire("loading the artifact"))
    path = _npy(ws, f"input-{kind.replace(' ', '-')}.npy", kind)
    message = cli(ws, ["predict", "no_artifact", path, "logits.npy"], PREDICT_DAMAGE[kind])
    assert path.name in message, message


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["missing.npy", "logits.npy"], "'INPUTS'"),
        (["a_folder", "logits.npy"], "'INPUTS'"),
        (["ok.npy", "a_file/logits.npy"], "`a_file` is a file"),
        (["ok.npy", "a_folder"], "'OUTPUT'"),
    ],
)
def test_predict_refuses_input_and_output_paths(ws, monkeypatch, args, needle):
    monkeypatch.setattr(export, "load_artifact", _tripwire("loading the artifact"))
    _npy(ws, "ok.npy", "ok")
    cli(ws, ["predict", "no_artifact", *args], needle)


@pytest.mark.parametrize("damage", [("field", "size_bytes", 5), ("golden", "a NaN input", None)])
def test_predict_refuses_a_damaged_artifact(ws, spare, artifact, damage):
    _npy(ws, "ok.npy", "ok")
    target, needle = damaged_artifact(spare, artifact, damage)
    cli(ws, ["predict", target, "ok.npy", "logits.npy"], needle, also=target)


@pytest.fixture(scope="module")
def loaded(artifact):
    return export.load_artifact(artifact)


ARRAY_DAMAGE = {
    "nan": lambda x: np.where(np.eye(*x.shape, dtype=bool), np.nan, x).astype(np.float32),
    "inf": lambda x: np.where(np.eye(*x.shape, dtype=bool), -np.inf, x).astype(np.float32),
    "negative": lambda x: x - 4,
    "above 16": lambda x: x + 14,
    "float64": lambda x: x.astype(np.float64),
    "float16": lambda x: x.astype(np.float16),
    "int8": lambda x: x.astype(np.int8),
    "rank 1": lambda x: x.ravel(),
    "rank 3": lambda x: x[None],
    "features": lambda x: x[:, :-1],
    "empty": lambda x: x[:0],
    "a list": lambda x: x.tolist(),
}
ARRAY_NEEDLE = {
    "nan": "NaN or infinite",
    "inf": "NaN or infinite",
    "negative": "[0, 16]",
    "above 16": "[0, 16]",
    "float64": "`float64`",
    "float16": "`float16`",
    "int8": "`int8`",
    "rank 1": "rank 2",
    "rank 3": "rank 2",
    "features": "64 features",
    "empty": "at least one row",
    "a list": "NumPy or JAX array",
}


@FEW
@given(kind=st.sampled_from(sorted(ARRAY_DAMAGE)), rows=st.integers(1, 5))
def test_predict_and_check_input_refuse_damaged_arrays(loaded, kind, rows):
    x = ARRAY_DAMAGE[kind](np.full((rows, 64), 2.0, np.float32))
    refused("LoadedArtifact.predict", export.InputError, ARRAY_NEEDLE[kind], loaded.predict, x)
    refused("check_input", export.InputError, ARRAY_NEEDLE[kind], export.check_input, x)


@pytest.mark.parametrize(
    ("payload", "error", "needle"),
    [
        ([], ValueError, "JSON object"),
        ({"inputs": [[3.0] * 64], "extra": 1}, ValueError, "Unknown fields"),
        ({"inputs": [[3.0] * 64], "dtype": "float64"}, export.InputError, "`dtype`"),
        ({"inputs": "3"}, ValueError, "list of rows"),
        ({"inputs": [[3.0] * 63]}, export.InputError, "64 features"),
        ({"inputs": [[3.0] * 64, [3.0] * 63]}, export.InputError, "rectangular"),
        ({"inputs": [[True] * 64]}, export.InputError, "JSON number"),
        ({"inputs": [[-1.0] * 64]}, export.InputError, "[0, 16]"),
        ({"inputs": [[10**400] * 64]}, export.InputError, "[0, 16]"),
        ({"inputs": []}, export.InputError, "rank 2"),
        ({"inputs": [[3.0] * 64] * 65}, ValueError, "at most 64"),
    ],
)
def test_parse_inputs_refuses_damaged_requests(payload, error, needle):
    refused("serve.parse_inputs", error, needle, serve.parse_inputs, payload, 64)


# --- serve, load and bench: validated without a server ------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["no_artifact"], "'ARTIFACT'"),
        (["a_file"], "'ARTIFACT'"),
        (["ARTIFACT", "--port", "-1"], "'--port'"),
        (["ARTIFACT", "--port", "65536"], "'--port'"),
        (["ARTIFACT", "--port", "http"], "'--port'"),
        (["ARTIFACT", "--port-file", "a_file/port"], "`a_file` is a file"),
        (["ARTIFACT", "--port-file", "a_folder"], "'--port-file'"),
    ],
)
def test_serve_refuses_damaged_options_without_starting(ws, artifact, args, needle):
    cli(ws, ["serve", *[artifact if a == "ARTIFACT" else a for a in args]], needle)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["no_artifact"], "'ARTIFACT'"),
        (["a_file"], "'ARTIFACT'"),
        (["ARTIFACT", "--out", "a_file/load.json"], "`a_file` is a file"),
        (["ARTIFACT", "--out", "a_folder"], "a_folder"),
        (["ARTIFACT", "--serve-config", "missing.json"], "missing.json"),
    ],
)
def test_load_refuses_damaged_options_without_starting(ws, artifact, args, needle):
    cli(ws, ["load", *[artifact if a == "ARTIFACT" else a for a in args]], needle)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--size", "huge"], "'--size'"),
        (["--out", "a_file/bench.json"], "`a_file` is a file"),
        (["--out", "a_folder"], "a_folder"),
        (["--out", "report.json"], "report.png"),
    ],
)
def test_bench_refuses_damaged_options_before_running(ws, args, needle):
    (ws / "report.png").mkdir(exist_ok=True)
    try:
        cli(ws, ["bench", "--no-load", *args], needle)
    finally:
        (ws / "report.png").rmdir()


def test_run_bench_refuses_an_unknown_size():
    refused("run_bench", ValueError, "`huge`", REAL["run_bench"], "huge", False, print)


# --- every command has its cases -------------------------------------------------------------

CASES_OF_COMMAND = {
    "train": (
        test_train_serve_and_load_refuse_a_damaged_config,
        test_train_refuses_a_workdir_it_cannot_create,
    ),
    "export": (
        test_export_refuses_a_damaged_workdir,
        test_export_refuses_an_artifact_folder_it_cannot_create,
    ),
    "verify": (
        test_verify_refuses_a_damaged_artifact,
        test_verify_and_serve_refuse_a_malformed_pinned_hash,
    ),
    "predict": (test_predict_refuses_a_damaged_input_before_loading_the_artifact,),
    "precision": (test_precision_refuses_damaged_training_metrics,),
    "serve": (test_serve_refuses_damaged_options_without_starting,),
    "load": (test_load_refuses_damaged_options_without_starting,),
    "bench": (test_bench_refuses_damaged_options_before_running,),
}


def test_every_command_of_the_group_has_bad_input_cases():
    assert set(main.commands) == set(CASES_OF_COMMAND), (
        f"commands without bad-input cases: {set(main.commands) ^ set(CASES_OF_COMMAND)}"
    )
    assert all(CASES_OF_COMMAND.values())
