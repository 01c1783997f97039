"""Bad input: every `kernel-audit` command and the entry points a learner calls
with a file, an array or a config refuse a damaged input cleanly.

- CLI (in-process `CliRunner`): exit code 2, one `Error:` line naming the file,
  field or value, no traceback, and nothing written (the workspace's file
  names and bytes are equal before and after). The audit table, the training
  demo, the bench run and every Pallas kernel build are replaced by tripwires,
  so an input that is silently accepted fails the case instead of starting work.
- Library: a `ValueError` subclass of the project (`ConfigError`,
  `KernelInputError`, `RecordError`) whose message names the input; never a
  NaN result.

Cases are drawn by hypothesis (the damage, the field, the value) with a fixed
derandomized seed, plus enumerations where a list is clearer. The count goes to
`evidence/bad_input.json` when the module ends.
"""

import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl

from kernel_audit import audit, checkpoint, data, kernels, train
from kernel_audit import bench as bench_module
from kernel_audit.checkpoint import RecordError
from kernel_audit.cli import main
from kernel_audit.config import Config, ConfigError, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
FEW = settings(max_examples=30, derandomize=True, deadline=None, database=None)
TALLY: dict[str, Any] = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}
REAL = {
    "run_audit": audit.run_audit,
    "train_and_evaluate": train.train_and_evaluate,
    "run_bench": bench_module.run_bench,
}
FIELDS = sorted(Config.model_fields)
# Invalid for every field of `Config` (strict: no string or null for a number, no
# number for a tuple, every numeric field bounded well inside +-1e9).
GENERIC_BAD = [float("nan"), float("inf"), float("-inf"), "0.1", None, [], {}, -1e9, 1e9]


class Tripwire(AssertionError):
    """Raised when the work behind a command starts although its input was damaged."""


def _tripwire(name: str):
    def fire(*args: object, **kwargs: object) -> None:
        raise Tripwire(f"{name} started on a damaged input")

    return fire


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The workspace every case runs in (cwd too, so default outputs land here)."""
    root = tmp_path_factory.mktemp("bad_input")
    (root / "a_file").write_text("not a folder\n")
    (root / "a_folder").mkdir()
    previous = os.getcwd()
    os.chdir(root)
    patch = pytest.MonkeyPatch()
    patch.setattr(audit, "run_audit", _tripwire("the audit table"))
    patch.setattr(train, "train_and_evaluate", _tripwire("the training demo"))
    patch.setattr(bench_module, "run_bench", _tripwire("the bench"))
    # Both kernels call `pl.pallas_call` through the module, so this catches either.
    patch.setattr(pl, "pallas_call", _tripwire("a Pallas kernel build"))
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


def cli(ws: Path, args: list[str], *needles: str) -> str:
    """Runs one damaged command; checks the refusal; returns its error line."""
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


# --- damaged config files (audit, train) ------------------------------------------------

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
        "not-json": b"seed = 0\nhidden = 16\n",
        "json-list": b"[1, 2, 3]",
        "json-string": b'"configs/tiny.json"',
        "json-null": b"null",
    }[kind]
    path.write_bytes(content)
    return path


config_damage = st.one_of(
    st.tuples(st.just("file"), st.sampled_from(FILE_DAMAGE), st.none()),
    st.tuples(st.just("field"), st.sampled_from(FIELDS), st.sampled_from(GENERIC_BAD)),
    st.tuples(st.just("unknown"), st.sampled_from(["colour", "Seed", "blocks", ""]), st.none()),
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
    return path, f"`{what}"


@FEW
@given(command=st.sampled_from(["audit", "train"]), damage=config_damage)
def test_audit_and_train_refuse_a_damaged_config(ws, command, damage):
    path, needle = config_file(ws, damage)
    cli(ws, [command, "--config", str(path), "--workdir", str(ws / "run")], needle)


@FEW
@given(damage=config_damage)
def test_load_config_refuses_a_damaged_config(ws, damage):
    path, needle = config_file(ws, damage)
    refused("load_config", ConfigError, needle, load_config, path)


OUT_OF_RANGE = [
    ({"seed": -1}, "`seed`"),
    ({"seed": 2**31}, "`seed`"),
    ({"hidden": 0}, "`hidden`"),
    ({"hidden": 1.5}, "`hidden`"),
    ({"batch_size": 0}, "`batch_size`"),
    ({"train_steps": 0}, "`train_steps`"),
    ({"learning_rate": 0.0}, "`learning_rate`"),
    ({"learning_rate": 11.0}, "`learning_rate`"),
    ({"dtypes": ["float16"]}, "`dtypes"),
    ({"dtypes": "float32"}, "`dtypes`"),
    ({"activations": ["swish"]}, "`activations"),
    ({"matmul_cases": ["huge"]}, "`matmul_cases`"),
    ({"row_cases": ["nope"]}, "`row_cases`"),
    ({"matmul_blocks": [[16, 0, 16]]}, "`matmul_blocks`"),
    ({"matmul_blocks": [[16, 16]]}, "`matmul_blocks"),
    ({"matmul_blocks": [[16, 16, 16, 16]]}, "`matmul_blocks"),
    ({"row_blocks": [0]}, "`row_blocks`"),
    ({"row_blocks": [-8]}, "`row_blocks`"),
]


@pytest.mark.parametrize(("change", "needle"), OUT_OF_RANGE)
def test_audit_refuses_out_of_range_fields(ws, change, needle):
    (ws / "range.json").write_text(json.dumps({**Config.tiny().model_dump(mode="json"), **change}))
    cli(ws, ["audit", "--config", "range.json", "--workdir", "run"], needle)
    refused("Config.from_json", ConfigError, needle, Config.from_json, json.dumps(change))


@pytest.mark.parametrize("command", ["audit", "train"])
@pytest.mark.parametrize(
    ("workdir", "needle"), [("a_file/run", "`a_file` is a file"), ("a_file/x/y", "a_file")]
)
def test_audit_and_train_refuse_an_output_folder_they_cannot_create(ws, command, workdir, needle):
    tiny = str(PROJECT_ROOT / "configs/tiny.json")
    cli(ws, [command, "--config", tiny, "--workdir", workdir], needle)
    cli(ws, [command, "--workdir", workdir], needle)


def test_entry_points_refuse_a_config_that_is_not_one(ws):
    tiny = Config.tiny().model_dump()
    refused("run_audit", ConfigError, "`Config`", REAL["run_audit"], tiny)
    refused("train_and_evaluate", ConfigError, "`Config`", REAL["train_and_evaluate"], tiny)
    refused("train_and_evaluate", RecordError, "a_file", REAL["train_and_evaluate"],
            Config.tiny(), ws / "a_file/run")  # fmt: skip


# --- check ------------------------------------------------------------------------------

CHECK_DAMAGE = [
    (["0", "4", "4"], "`M`"),
    (["4", "0", "4"], "`K`"),
    (["--", "4", "4", "-3"], "`N`"),
    (["4", "-1", "4"], "'-1'"),
    (["4", "4", "x"], "'N'"),
    (["4", "4"], "'N'"),
    (["4", "4", "4", "4"], "extra argument (4)"),
    (["4.5", "4", "4"], "'M'"),
    # Block sizes: each breaks one TPU rule (`targets.block_rule_violation`), the
    # others being whole dimensions, or the VMEM budget.
    (["4", "4", "4", "--blocks", "3", "4", "4"], "`block_m`"),
    (["4", "4", "4", "--blocks", "4", "4", "0"], "`block_k`"),
    (["4", "4", "4", "--blocks", "4", "-16", "4"], "`block_n`"),
    (["4", "4", "4", "--blocks", "512", "4", "4"], "`block_m`"),
    (["5", "64", "7", "--blocks", "64", "7", "64"], "`block_m` = `64` exceeds M = 5"),
    (["16", "256", "256", "--blocks", "16", "64", "256"], "multiple of 128"),
    (["16", "256", "256", "--blocks", "16", "256", "96"], "`block_k`"),
    (["32", "256", "256", "--dtype", "bfloat16", "--blocks", "8", "256", "256"], "multiple of 16"),
    (["1024", "1024", "1024", "--blocks", "1024", "1024", "1024"], "VMEM"),
    (["4", "4", "4", "--blocks", "16", "16"], "'--blocks'"),
    (["4", "4", "4", "--blocks", "a", "16", "16"], "'--blocks'"),
    (["4", "4", "4", "--dtype", "float16"], "'--dtype'"),
    (["4", "4", "4", "--precision", "fast"], "'--precision'"),
    (["4", "4", "4", "--precision", "HIGHEST"], "'--precision'"),
    (["4", "4", "4", "--activation", "swish"], "'--activation'"),
    (["4", "4", "4", "--seed", "-1"], "'--seed'"),
    (["4", "4", "4", "--seed", str(2**31)], "'--seed'"),
]


@pytest.mark.parametrize(("args", "needle"), CHECK_DAMAGE)
def test_check_refuses_damaged_arguments(ws, args, needle):
    cli(ws, ["check", *args], needle)


@pytest.mark.parametrize("dims", [("100000", "100000", "100000"), ("1", "5000", "5000")])
def test_check_refuses_operands_too_large_to_build(ws, monkeypatch, dims):
    monkeypatch.setattr(data, "matmul_operands", _tripwire("building the operands"))
    cli(ws, ["check", *dims], "entries")


# --- bench ------------------------------------------------------------------------------

BENCH_DAMAGE = [
    (["--size", "huge"], "'--size'"),
    (["--size", "gpu"], "'--size'"),
    # The `tpu` size needs compiled kernels, refused in interpret mode on any machine.
    (["--size", "tpu", "--mode", "interpret"], "`--size tpu`"),
    (["--repeats", "0"], "'--repeats'"),
    (["--repeats", "-2"], "'--repeats'"),
    (["--repeats", "x"], "'--repeats'"),
    (["--mode", "fast"], "'--mode'"),
    (["--out", "a_folder"], "a_folder"),
    (["--out", "a_file/bench.json"], "`a_file` is a file"),
]
if jax.default_backend() != "tpu":
    # Compiled kernels need a TPU (Mosaic); elsewhere `--mode compiled` is refused, and
    # `--size tpu` with the automatic mode (interpret there) too.
    BENCH_DAMAGE.append((["--mode", "compiled", "--size", "tiny"], "needs a TPU"))
    BENCH_DAMAGE.append((["--size", "tpu"], "`--size tpu`"))


@pytest.mark.parametrize(("args", "needle"), BENCH_DAMAGE)
def test_bench_refuses_damaged_options_before_running(ws, args, needle):
    cli(ws, ["bench", *args], needle)


@pytest.mark.parametrize("taken", ["report.png", "report.json.sha256"])
def test_bench_refuses_output_siblings_taken_by_a_folder(ws, taken):
    (ws / taken).mkdir()
    try:
        cli(ws, ["bench", "--out", "report.json", "--size", "tiny"], taken)
    finally:
        (ws / taken).rmdir()


def test_bench_refuses_an_unknown_size():
    refused("run_bench", ValueError, "`huge`", REAL["run_bench"], "huge")
    refused("resolve_size", ValueError, "`huge`", bench_module.resolve_size, "huge")


# --- kernels: arrays --------------------------------------------------------------------


def _f32(*shape: int, value: float = 0.5) -> jax.Array:
    return jnp.full(shape, value, jnp.float32)


MATMUL_OPERANDS = {"x": (8, 16), "w": (16, 8), "b": (8,)}
ROW_OPERANDS = {"x": (8, 16), "gamma": (16,), "beta": (16,)}
OPERAND_DAMAGE = ["nan", "inf", "-inf", "list", "float64", "int32", "float16", "rank", "empty"]


def _damage(array: jax.Array, kind: str, at: int) -> Any:
    """`array` with the damage `kind`; `at` picks the poisoned entry."""
    if kind in ("nan", "inf", "-inf"):
        flat = np.asarray(array).ravel().copy()
        flat[at % flat.size] = float(kind)
        return jnp.asarray(flat.reshape(array.shape))
    if kind == "list":
        return np.asarray(array).tolist()
    if kind in ("float64", "int32", "float16"):
        return np.asarray(array).astype(kind)
    if kind == "rank":
        return array[None]
    return array[:0]


EXPECTED = {
    "nan": "non-finite entry",
    "inf": "non-finite entry",
    "-inf": "non-finite entry",
    "list": "must be an array",
    "float64": "dtype `float64`",
    "int32": "dtype `int32`",
    "float16": "dtype `float16`",
    "rank": "shape",
    "empty": "",
}


@FEW
@given(
    kernel=st.sampled_from(["matmul_bias_act", "layer_norm"]),
    operand=st.sampled_from([0, 1, 2]),
    kind=st.sampled_from(OPERAND_DAMAGE),
    at=st.integers(0, 127),
)
def test_kernels_refuse_damaged_operands_before_building(ws, kernel, operand, kind, at):
    shapes = MATMUL_OPERANDS if kernel == "matmul_bias_act" else ROW_OPERANDS
    names = list(shapes)
    arrays = {name: _f32(*shape) for name, shape in shapes.items()}
    arrays[names[operand]] = _damage(arrays[names[operand]], kind, at)
    # The float64 and int32 operands are refused by dtype, a single rank-3 `x` by shape;
    # the name of the damaged operand is in every message except a dimension of 0.
    needle = EXPECTED[kind] or "at least 1"
    if kind == "empty" and names[operand] != "x":
        needle = "shape"
    message = refused(kernel, kernels.KernelInputError, needle, getattr(kernels, kernel),
                      *arrays.values())  # fmt: skip
    if kind not in ("empty", "rank"):
        assert f"`{names[operand]}`" in message, message


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"activation": "swish"}, "`swish`"),
        ({"precision": "fast"}, "Unknown precision `fast`"),
        ({"precision": "HIGH"}, "Unknown precision `HIGH`"),
        ({"precision": None}, "Unknown precision `None`"),
        ({"blocks": kernels.MatmulBlocks(24, 8, 16)}, "`block_m` = `24` exceeds M = 8"),
        ({"blocks": kernels.MatmulBlocks(4, 8, 16)}, "`block_m` = `4` breaks"),
        ({"blocks": kernels.MatmulBlocks(8, 64, 16)}, "`block_n` = `64` breaks"),
        ({"blocks": kernels.MatmulBlocks(8, 8, 0)}, "`block_k` must be a positive integer"),
        ({"blocks": kernels.MatmulBlocks("16", 8, 16)}, "`block_m`"),
        ({"blocks": kernels.MatmulBlocks(True, 8, 16)}, "`block_m`"),
    ],
)
def test_matmul_refuses_bad_options(ws, kwargs, needle):
    x, w, b = (_f32(*shape) for shape in MATMUL_OPERANDS.values())
    refused("matmul_bias_act", kernels.KernelInputError, needle, kernels.matmul_bias_act, x, w,
            b, **kwargs)  # fmt: skip


def test_matmul_refuses_blocks_over_the_vmem_budget(ws):
    """Blocks that obey the shape rules but overflow the VMEM budget are refused before a
    kernel is built; abstract operands suffice (nothing of 1024^2 is allocated)."""
    x, w = (jax.ShapeDtypeStruct((1024, 1024), jnp.float32) for _ in range(2))
    b = jax.ShapeDtypeStruct((1024,), jnp.float32)
    blocks = kernels.MatmulBlocks(1024, 1024, 1024)
    refused("matmul_bias_act", kernels.KernelInputError, "VMEM", kernels.matmul_bias_act, x, w,
            b, blocks=blocks)  # fmt: skip


@pytest.mark.parametrize(
    ("blocks", "dtype", "needle"),
    [
        (kernels.RowBlocks(12), "float32", "`block_rows` = `12` breaks"),
        (kernels.RowBlocks(0), "float32", "`block_rows` must be a positive integer"),
        (kernels.RowBlocks(16), "float32", "`block_rows` = `16` exceeds R = 8"),
        (kernels.RowBlocks(8), "bfloat16", "multiple of 16"),
    ],
)
def test_layer_norm_refuses_bad_row_blocks(ws, blocks, dtype, needle):
    x, g, b = (_f32(*shape) for shape in ROW_OPERANDS.values())
    if dtype == "bfloat16":
        x, g, b = (a.astype(jnp.bfloat16) for a in (x, g, b))
        x = jnp.concatenate([x, x, x])  # 24 rows: 8 is neither 16-aligned nor all of them.
    refused("layer_norm", kernels.KernelInputError, needle, kernels.layer_norm, x, g, b,
            blocks=blocks)  # fmt: skip


def test_audit_cells_refuse_an_unknown_dtype(ws):
    case = data.MATMUL_CASES[0]
    refused("audit_matmul", kernels.KernelInputError, "`float16`", audit.audit_matmul, case,
            "float16", "gelu", kernels.MatmulBlocks(16, 16, 16), 0)  # fmt: skip
    refused("audit_layer_norm", kernels.KernelInputError, "`int8`", audit.audit_layer_norm,
            data.ROW_CASES[0], "int8", kernels.RowBlocks(8), 0)  # fmt: skip


# --- records ----------------------------------------------------------------------------


def _record(ws: Path, name: str, text: bytes, digest: bytes | None) -> Path:
    path = ws / name
    path.write_bytes(text)
    sidecar = path.with_name(path.name + ".sha256")
    if digest is None:
        sidecar.unlink(missing_ok=True)
    else:
        sidecar.write_bytes(digest)
    return path


def _sha(text: bytes) -> bytes:
    import hashlib

    return hashlib.sha256(text).hexdigest().encode() + b"\n"


RECORD_DAMAGE = {
    "missing": (None, None, "missing.json"),
    "no digest": (b'{"a": 1}\n', None, "no digest.json"),
    "edited": (b'{"a": 2}\n', _sha(b'{"a": 1}\n'), "does not match"),
    "empty digest": (b'{"a": 1}\n', b"", "does not match"),
    "non-utf8": (b"\xff\xfe{\x00", b"00", "not UTF-8"),
    "not json": (b"seed = 0\n", _sha(b"seed = 0\n"), "not valid JSON"),
    "truncated": (b'{"a": [1, 2', _sha(b'{"a": [1, 2'), "not valid JSON"),
    "json list": (b"[1, 2]\n", _sha(b"[1, 2]\n"), "JSON list"),
    "json number": (b"3.5\n", _sha(b"3.5\n"), "JSON float"),
}


@pytest.mark.parametrize("kind", sorted(RECORD_DAMAGE))
def test_load_record_refuses_a_damaged_record(ws, kind):
    text, digest, needle = RECORD_DAMAGE[kind]
    path = ws / f"{kind}.json" if text is None else _record(ws, f"{kind}.json", text, digest)
    refused("load_record", RecordError, needle, checkpoint.load_record, path)


# --- every command has its cases ----------------------------------------------------------

CASES_OF_COMMAND = {
    "audit": (test_audit_and_train_refuse_a_damaged_config, test_audit_refuses_out_of_range_fields),
    "train": (test_audit_and_train_refuse_an_output_folder_they_cannot_create,),
    "check": (test_check_refuses_damaged_arguments, test_check_refuses_operands_too_large_to_build),
    "bench": (test_bench_refuses_damaged_options_before_running,),
}


def test_every_command_of_the_group_has_bad_input_cases():
    assert set(main.commands) == set(CASES_OF_COMMAND), (
        f"commands without bad-input cases: {set(main.commands) - set(CASES_OF_COMMAND)}"
    )
    assert all(CASES_OF_COMMAND.values())
