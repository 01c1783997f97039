"""Bad input: every `mlp-classifier` command, and every library entry point a learner
calls with a file, an array or a config, refuses damaged input with one precise message.

CLI promise: exit code 2 (the project's `BadInput`, or click's own usage error), one
line naming the file, field or value, no traceback (`result.exception` is None or
`SystemExit`), and nothing written (the watched folder's file names and bytes are equal
before and after). Library promise: a `ValueError` (the project's errors subclass it)
whose message names the field or value.

The damage is drawn by hypothesis (kind, field, value) or enumerated where a table is
clearer. Nothing here trains: a dossier is fabricated from an untrained state, so only
the damage can make `reproduce` refuse it (`test_fabricated_dossier_is_accepted` is the
positive control). The case count goes to `evidence/bad_input.json` at module end.
"""

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import click
import jax
import numpy as np
import pytest
from click.testing import CliRunner
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from mlp_classifier import checkpoint, data, dossier, model, train
from mlp_classifier.cli import main
from mlp_classifier.config import Config, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NAN, INF = math.nan, math.inf
FEW = settings(max_examples=4, derandomize=True, deadline=None, database=None)
SOME = settings(max_examples=30, derandomize=True, deadline=None, database=None)

LEDGER: dict[str, Any] = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}

# Every command of the group, with the tests below that damage its input. The final test
# compares this table (and what ran) with the commands the click group itself holds.
COVERED_COMMANDS = {"inspect", "train", "reproduce", "bench"}


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
    """Every path under `root` with its bytes (None for a directory)."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def check_cli(args: list[str], watch: Path, token: str) -> None:
    """`mlp-classifier ARGS` must refuse with exit 2 and one line naming `token`."""
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


# --- configs: `inspect --config`, `train --config`, `load_config` ------------------------

BAD_FIELD_VALUES: dict[str, list[Any]] = {
    "seed": [-1, 2**32, 1.5, "0", True, None],
    "split_seed": [-1, 2**40, "x"],
    "val_fraction": [0.0, 1.0, -0.1, NAN, INF, "0.1"],
    "test_fraction": [0.0, 1.0, NAN, -INF],
    "hidden_sizes": [[0], [-3], [1.5], "32", [32] * 9, [10**8], 3, None],
    "dropout_rate": [1.0, -0.1, NAN, INF],
    "optimizer": ["rmsprop", 1, None],
    "learning_rate": [0.0, -1e-3, NAN, INF, 11.0],
    "momentum": [NAN, 1.0, -0.5, 0.5],
    "weight_decay": [NAN, -1e-4, 1.0],
    "batch_size": [0, -1, 5000, 1.0, NAN],
    "num_epochs": [0, -5, 10**6, NAN],
}
TINY = json.loads(Config.tiny().to_json())


@st.composite
def damaged_config(draw) -> tuple[str, bytes | None, str]:
    """(kind, file bytes or None for a missing file, the token the message must name)."""
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
        cut = draw(st.integers(1, len(text) - 2))
        return kind, text[:cut].encode(), "config.json"
    if kind == "non_utf8":
        return kind, b"\xff\xfe" + text.encode("utf-16-le"), "config.json"
    if kind == "not_json":
        return kind, b"seed = 0\nbatch_size = 32\n", "config.json"
    if kind == "wrong_type":
        value = draw(st.sampled_from([[1, 2], "tiny", 3, None, True]))
        return kind, json.dumps(value).encode(), "config.json"
    if kind == "unknown_field":
        name = draw(st.sampled_from(["lr", "epochs", "hidden", "Seed"]))
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
        check_cli(["inspect", "--config", str(path)], root, token)
        check_cli(["train", "--config", str(path), "--workdir", str(root / "run")], root, token)


# --- train's workdir ----------------------------------------------------------------


@pytest.mark.parametrize("damage", ["is a file", "parent is a file", "holds files"])
def test_unusable_workdir_is_refused_before_training(tmp_path, damage):
    config = tmp_path / "tiny.json"
    config.write_text(Config.tiny().to_json())
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory\n")
    workdir = {
        "is a file": blocker,
        "parent is a file": blocker / "run",
        "holds files": tmp_path,
    }[damage]
    token = "blocker" if damage != "holds files" else str(tmp_path)
    check_cli(["train", "--config", str(config), "--workdir", str(workdir)], tmp_path, token)
    check_api(
        "train.train_and_evaluate", lambda: train.train_and_evaluate(Config.tiny(), workdir), token
    )


# --- dossiers: `reproduce DIR`, `dossier.load`, `checkpoint.restore` --------------------


def _sign(root: Path) -> None:
    """Re-signs the dossier's manifest with this test's own sha256 of every file, so
    that only the content checks can notice a damaged file."""
    hashes = {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "COMPLETE"
    }
    (root / "COMPLETE").write_text(json.dumps({"sha256": hashes}))


@pytest.fixture(scope="module")
def like_state():
    config = Config.tiny()
    _, state = train.create_train_state(config, train.make_optimizer(config), jax.random.key(0))
    return state


@pytest.fixture(scope="module")
def fabricated(tmp_path_factory, like_state) -> Path:
    """A complete dossier of an untrained tiny-config state (no training run)."""
    root = tmp_path_factory.mktemp("fabricated") / "run"
    root.mkdir()
    (root / "config.json").write_text(Config.tiny().to_json())
    ids = list(range(1797))
    split = {"split_seed": 0, "train": ids[:1200], "validation": ids[1200:1500], "test": ids[1500:]}
    (root / "split.json").write_text(json.dumps(split))
    metrics = {
        "epochs": [
            {
                "epoch": 1,
                "train_loss": 2.3,
                "train_accuracy": 0.1,
                "val_loss": 2.3,
                "val_accuracy": 0.1,
            }
        ],
        "test": {"loss": 2.3, "accuracy": 0.1, "count": 297},
        "confusion_matrix": [[0] * 10 for _ in range(10)],
        "misclassified": [],
        "state_sha256": "0" * 64,
    }
    (root / "metrics.json").write_text(json.dumps(metrics))
    checkpoint.save(root / "checkpoint", like_state)
    _sign(root)
    return root


def test_fabricated_dossier_is_accepted(fabricated, like_state):
    """Positive control: undamaged, the fabricated dossier loads and its checkpoint
    restores, so every refusal below comes from the damage alone."""
    loaded = dossier.load(fabricated)
    assert loaded.config == Config.tiny() and len(loaded.split["test"]) == 297
    restored = checkpoint.restore(fabricated / "checkpoint", like_state)
    assert checkpoint.digest(restored) == checkpoint.digest(like_state)


# file -> (fields a `missing_field` damage may drop, {field: bad values})
DOSSIER_FIELDS: dict[str, tuple[list[str], dict[str, list[Any]]]] = {
    "COMPLETE": (["sha256"], {"sha256": [[], "abc", 5, None]}),
    "config.json": ([], BAD_FIELD_VALUES),
    "split.json": (
        ["train", "validation", "test"],
        {
            "train": [[-1], [1797], [10**6], "x", [1.5], None, {}],
            "validation": [[0], [True], [NAN]],
            "test": [[1200], "0-296", 7],
        },
    ),
    "metrics.json": (
        ["epochs", "test", "confusion_matrix", "misclassified", "state_sha256"],
        {
            "epochs": [{}, "x", None],
            "test": [[], None, {"loss": 2.3, "count": 297}],
            "test.accuracy": [NAN, INF, 1.5, -0.1, "0.1", None],
            "test.loss": [NAN, -INF, "x"],
            "test.count": [-1, 1.5, "297"],
            "state_sha256": [5, "zz", "", None],
            "confusion_matrix": ["x", [[1]], None],
            "misclassified": [{}, "x", 3],
        },
    ),
}


def _set(tree: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    head, _, rest = dotted.partition(".")
    new = dict(tree)
    new[head] = _set(new[head], rest, value) if rest else value
    return new


FILE_KINDS = ["missing", "empty", "truncated", "non_utf8", "not_json", "wrong_type"]


def _damage_file(data_draw, path: Path, kind: str) -> None:
    text = path.read_text()
    if kind == "missing":
        path.unlink()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_text(text[: data_draw.draw(st.integers(1, len(text) - 2), label="cut")])
    elif kind == "non_utf8":
        path.write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))
    elif kind == "not_json":
        path.write_text("sha256 = {}\n")
    elif kind == "wrong_type":
        value = data_draw.draw(st.sampled_from([[1, 2], "x", 3, None]), label="top level")
        path.write_text(json.dumps(value))


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (name, kind)
        for name, (droppable, _) in sorted(DOSSIER_FIELDS.items())
        for kind in [*FILE_KINDS, "missing_field", "bad_value"]
        if kind != "missing_field" or droppable  # config.json: every field has a default.
    ],
)
@FEW
@given(data_draw=st.data())
def test_damaged_dossier_is_refused(fabricated, name, kind, data_draw):
    droppable, bad_values = DOSSIER_FIELDS[name]
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "run"
        shutil.copytree(fabricated, target)
        path = target / name
        token = name
        if kind in FILE_KINDS:
            _damage_file(data_draw, path, kind)
        else:
            content = json.loads(path.read_text())
            if kind == "missing_field":
                field = data_draw.draw(st.sampled_from(droppable), label="field")
                del content[field]
            else:
                field = data_draw.draw(st.sampled_from(sorted(bad_values)), label="field")
                value = data_draw.draw(st.sampled_from(bad_values[field]), label="value")
                content = _set(content, field, value)
            path.write_text(json.dumps(content))
            token = field.split(".")[-1] if name == "config.json" else name
        if name != "COMPLETE":
            _sign(target)  # The manifest vouches for the damaged file.
        check_api("dossier.load", lambda: dossier.load(target), token)
        check_cli(["reproduce", str(target)], target.parent, token)


@pytest.mark.parametrize("kind", [*FILE_KINDS, "missing_entry", "bad_entry"])
@FEW
@given(data_draw=st.data())
def test_damaged_checkpoint_hashes_are_refused(fabricated, like_state, kind, data_draw):
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "run"
        shutil.copytree(fabricated, target)
        path = target / "checkpoint" / "sha256.json"
        if kind in FILE_KINDS:
            _damage_file(data_draw, path, kind)
        else:
            hashes = json.loads(path.read_text())
            entry = data_draw.draw(st.sampled_from(sorted(hashes)), label="entry")
            if kind == "missing_entry":
                del hashes[entry]
            else:
                hashes[entry] = data_draw.draw(st.sampled_from([5, None, "00", []]), label="value")
            path.write_text(json.dumps(hashes))
        _sign(target)
        check_api(
            "checkpoint.restore",
            lambda: checkpoint.restore(target / "checkpoint", like_state),
            "checkpoint",
        )
        check_cli(["reproduce", str(target)], target.parent, "checkpoint")


@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["--tolerance", "nan"], "nan"),
        (["--tolerance", "inf"], "inf"),
        (["--tolerance", "-0.1"], "-0.1"),
        (["--tolerance", "x"], "x"),
        (["--seeds", "-1"], "-1"),
        (["--seeds", "21"], "21"),
        (["--seeds", "1.5"], "1.5"),
    ],
)
def test_bad_reproduce_options_are_refused(fabricated, args, token):
    check_cli(["reproduce", str(fabricated), *args], fabricated.parent, token)


def test_reproduce_without_a_dossier_is_refused(tmp_path):
    check_cli(["reproduce"], tmp_path, "WORKDIR")
    check_cli(["reproduce", str(tmp_path / "nowhere")], tmp_path, "nowhere")
    (tmp_path / "a-file").write_text("x")
    check_cli(["reproduce", str(tmp_path / "a-file")], tmp_path, "a-file")


# --- bench's options ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["--out", "{blocker}/bench.json"], "blocker"),
        (["--out", "{tmp}/bench.png"], "bench.png"),
        (["--out", "{tmp}"], "--out"),
        (["--size", "huge"], "huge"),
        (["--repeats", "0"], "0"),
        (["--repeats", "-3"], "-3"),
        (["--repeats", "many"], "many"),
    ],
)
def test_bad_bench_options_are_refused(tmp_path, args, token):
    (tmp_path / "blocker").write_text("not a directory\n")
    args = [a.format(blocker=tmp_path / "blocker", tmp=tmp_path) for a in args]
    check_cli(["bench", "--size", "tiny", *args], tmp_path, token)


# --- arrays: `data.split_ids`, `data.dataset`, the model's forward pass ----------------


@st.composite
def damaged_split_args(draw) -> tuple[dict[str, Any], str]:
    labels = np.repeat(np.arange(10, dtype=np.int32), 20)
    args: dict[str, Any] = {"labels": labels, "val_fraction": 0.15, "test_fraction": 0.2}
    kind = draw(st.sampled_from(["labels", "val_fraction", "test_fraction", "sum"]))
    if kind == "labels":
        bad = draw(
            st.sampled_from(
                [
                    np.zeros(0, np.int32),
                    labels.reshape(20, 10),
                    labels.astype(np.float32) + 0.5,
                    np.array(["a", "b"]),
                ]
            )
        )
        return {**args, "labels": bad}, "labels"
    if kind == "sum":
        val = draw(st.floats(0.3, 0.7))
        return {**args, "val_fraction": val, "test_fraction": 1.0 - val + 0.05}, "val_fraction"
    value = draw(st.sampled_from([NAN, INF, -INF, 0.0, -0.2, 1.0, 1.5]))
    return {**args, kind: value}, kind


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


@pytest.fixture(scope="module")
def digits() -> data.Digits:
    return data.load()


@st.composite
def damaged_dataset_args(draw) -> tuple[dict[str, Any], str]:
    args: dict[str, Any] = {"ids": np.arange(10, dtype=np.int32), "batch_size": 4, "seed": 0}
    kind = draw(st.sampled_from(["ids", "batch_size", "seed"]))
    if kind == "ids":
        bad = draw(
            st.sampled_from(
                [
                    np.array([0, 1797], np.int32),
                    np.array([-1, 3], np.int32),
                    np.array([0.5, 2.0]),
                    np.array([NAN]),
                    np.zeros((2, 2), np.int32),
                    np.zeros(0, np.int32),
                ]
            )
        )
        return {**args, "ids": bad}, "ids"
    if kind == "batch_size":
        return {**args, "batch_size": draw(st.sampled_from([0, -4, 2.5, True]))}, "batch_size"
    return {**args, "seed": draw(st.sampled_from([-1, 2**64, 1.5]))}, "seed"


@SOME
@given(damage=damaged_dataset_args())
def test_dataset_refuses_bad_arguments(digits, damage):
    args, token = damage
    check_api(
        "data.dataset",
        lambda: data.dataset(digits, args["ids"], args["batch_size"], seed=args["seed"]),
        token,
    )


@pytest.fixture(scope="module")
def mlp() -> model.MLP:
    init_key, dropout_key = jax.random.split(jax.random.key(0))
    return model.MLP(64, (8,), 10, 0.0, rngs=nnx.Rngs(params=init_key, dropout=dropout_key))


@pytest.mark.parametrize(
    ("x", "token"),
    [
        (np.zeros((2, 63), np.float32), "63"),
        (np.zeros((2, 65), np.float32), "65"),
        (np.zeros((), np.float32), "()"),
        (np.full((2, 64), NAN, np.float32), "finite"),
        (np.concatenate([np.zeros((1, 64)), np.full((1, 64), INF)]).astype(np.float32), "finite"),
    ],
)
def test_model_refuses_bad_inputs(mlp, x, token):
    check_api("MLP.__call__", lambda: mlp(jax.numpy.asarray(x)), token)


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
