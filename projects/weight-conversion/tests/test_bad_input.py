"""Bad input: every command of the CLI and every loader a learner calls.

The promise, case by case: a damaged input (a run folder's file, an
`--input` file, a PyTorch or Keras source, a converted artifact, an Orbax
checkpoint, the reference logits, the config, an option) is refused
- by the CLI with exit code 2 (the project's `BadInput`, or click's own
  usage error), one `Error:` line naming the file and the tensor or field,
  no traceback, and the folder's file names and bytes unchanged;
- by the library with a `ValueError` subclass (`MappingError`,
  `CheckpointError`, `ConfigError`) whose message names the tensor or field,
  never a model holding a NaN.

The damage is drawn with hypothesis (the kind, the tensor, the value);
enumerations that read better as a table are parametrized. The good files
of the same run are accepted (`test_good_inputs_are_accepted`), so each
refusal is about its damage. The run folder is built from an untrained
source model (no training: the loaders check structure and values, not
accuracy). The Keras source is a file in the Keras layout (`conv1/kernel`,
HWIO, (in, out) Dense kernels) written from the converted arrays through
the inverse of `keras_map`, so this file needs no Keras import.

At module end `evidence/bad_input.json` (or under `$EVIDENCE_DIR`) records
the number of damaged inputs tried, the tracebacks seen (0), and the
commands and entry points covered; the last test checks that every command
of the click group has cases.
"""

import json
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
from click.testing import CliRunner
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from weight_conversion import checkpoint, data, model, pipeline, sources, streaming
from weight_conversion.checkpoint import CheckpointError
from weight_conversion.cli import main
from weight_conversion.config import Arch, Config, ConfigError, load_config
from weight_conversion.weight_map import MappingError, convert, keras_map, torch_map

PROJECT_ROOT = Path(__file__).resolve().parents[1]
OTHER = Arch(channels=8, heads=4, conv2_channels=4, hidden=32)
META = {"arch": json.dumps(Arch().__dict__), "source": "torch"}


def cases(n: int):
    return settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


LEDGER: dict = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}


# --- THE RUN FOLDER AND ITS FILES ------------------------------------------------


def read_tensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def keras_layout(converted: dict[str, np.ndarray], arch: Arch) -> dict[str, np.ndarray]:
    """The Keras source's tensors (by Keras path), from NNX arrays: `keras_map`
    read backwards (its rules copy, except the classifier kernel, transposed)."""
    out = {}
    for rule in keras_map(arch):
        (src,), (dst,) = rule.sources, rule.targets
        out[src] = converted[dst].T.copy() if rule.transform == "keras_head" else converted[dst]
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Good files, built once: a run folder, a Keras-layout source, and Orbax
    checkpoints of the wrong shape, dtype, values and structure."""
    base = tmp_path_factory.mktemp("bad-input")
    arch, config = Arch(), Config.tiny()
    torch.manual_seed(0)
    net = sources.TorchDigitNet(arch).eval()
    run = base / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config.to_dict(), indent=1) + "\n")
    pipeline.save_torch_source(net, run / "source.safetensors")
    split = data.load_split(config.split_seed, config.test_fraction)
    logits = sources.torch_logits(net, data.nchw(split.test_images)).astype(np.float32)
    np.save(run / "source_logits.npy", logits)
    spec = checkpoint.target_spec(model.abstract_model(arch))
    streaming.convert_file(
        run / "source.safetensors", run / "converted.safetensors", torch_map(arch), arch, spec, META
    )
    good = checkpoint.load_safetensors(run / "converted.safetensors", arch)
    checkpoint.save_orbax(good, run / "orbax")
    converted, _ = read_tensors(run / "converted.safetensors")
    source, source_meta = read_tensors(run / "source.safetensors")
    keras = keras_layout(converted, arch)
    save_file(keras, str(base / "keras.safetensors"))

    orbax = {}
    other_spec = checkpoint.target_spec(model.abstract_model(OTHER))
    other = model.abstract_model(OTHER)
    checkpoint.fill(other, {k: np.zeros(s, d) for k, (s, d) in other_spec.items()})
    orbax["other-arch"] = (
        checkpoint.save_orbax(other, base / "orbax-other"),
        {k for k in spec if spec[k][0] != other_spec[k][0]},
    )
    half = model.abstract_model(arch, dtype=jnp.float16)
    checkpoint.fill(half, converted)
    orbax["float16"] = (checkpoint.save_orbax(half, base / "orbax-f16"), set(spec))
    nan = checkpoint.load_safetensors(run / "converted.safetensors", arch)
    nan.fc2.kernel[...] = nan.fc2.kernel[...].at[3, 4].set(jnp.nan)  # In-place update.
    orbax["nan"] = (checkpoint.save_orbax(nan, base / "orbax-nan"), {"fc2.kernel"})
    pure = nnx.to_pure_dict(nnx.state(good, (nnx.Param, nnx.BatchStat)))
    del pure["head_bias"]
    with ocp.StandardCheckpointer() as saver:
        saver.save((base / "orbax-missing").resolve(), pure, force=True)
    checkpoint.record_digests(base / "orbax-missing")  # intact files, one array short
    orbax["missing-param"] = ((base / "orbax-missing").resolve(), {"head_bias"})
    return {
        "base": base,
        "run": run,
        "arch": arch,
        "spec": spec,
        "converted": converted,
        "source": source,
        "source_meta": source_meta,
        "keras": keras,
        "keras_file": base / "keras.safetensors",
        "orbax": orbax,
    }


@pytest.fixture(scope="module", autouse=True)
def ledger():
    yield LEDGER
    directory = Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence"))
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "cases": LEDGER["cases"],
        "tracebacks": LEDGER["tracebacks"],
        "commands": sorted(LEDGER["commands"]),
        "entry_points": sorted(LEDGER["entry_points"]),
    }
    (directory / "bad_input.json").write_text(json.dumps(record, indent=1) + "\n")


def scratch(world) -> Path:
    return Path(tempfile.mkdtemp(dir=world["base"]))


def copy_run(world) -> Path:
    run = scratch(world) / "run"
    shutil.copytree(world["run"], run)
    return run


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }


# --- DAMAGE ----------------------------------------------------------------------

FILE_KINDS = ["truncated", "header-cut", "empty", "garbage", "not-json", "not-object"]
TENSOR_KINDS = ["dropped", "extra", "row-short", "row-extra", "flattened", "int32", "nan", "inf"]


def _header_length(blob: bytes) -> int:
    return struct.unpack("<Q", blob[:8])[0]


def cut_tensors(blob: bytes) -> set[str]:
    """Independently of the loaders: the tensors whose bytes the blob no longer holds."""
    length = _header_length(blob)
    header = json.loads(blob[8 : 8 + length])
    data_size = len(blob) - 8 - length
    return {
        k for k, v in header.items() if k != "__metadata__" and v["data_offsets"][1] > data_size
    }


def write_damaged(
    path: Path,
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str] | None,
    kind: str,
    name: str,
    draw: int,
) -> set[str]:
    """Writes `path` damaged by `kind` (at tensor `name`; `draw` picks the byte
    count or the value's index). Returns the tensor names a refusal may give
    (empty: the file itself is all there is to name)."""
    blob = path.read_bytes() if path.exists() else b""
    if kind in FILE_KINDS:
        data_size = len(blob) - 8 - _header_length(blob)
        if kind == "truncated":  # header intact, data cut short
            cut = blob[: len(blob) - 1 - draw % data_size]
            path.write_bytes(cut)
            return cut_tensors(cut)
        damaged = {
            "header-cut": blob[: 8 + draw % _header_length(blob)],
            "empty": b"",
            "garbage": bytes((draw * 7 + i * 13) % 256 for i in range(3 + draw % 40)),
            "not-json": struct.pack("<Q", 8) + b"{tensor:",
            "not-object": struct.pack("<Q", 8) + b"[1,2,3] ",
        }[kind]
        path.write_bytes(damaged)
        return set()
    tensors = dict(tensors)
    array = tensors[name]
    if kind == "dropped":
        del tensors[name]
    elif kind == "extra":
        tensors["fc3.extra"] = np.zeros(3, np.float32)
        name = "fc3.extra"
    elif kind == "row-short":
        tensors[name] = array[:-1] if array.ndim else array.reshape(1)
    elif kind == "row-extra":
        tensors[name] = np.concatenate([array, array[:1]]) if array.ndim else array.reshape(1, 1)
    elif kind == "flattened":
        tensors[name] = array.reshape(-1) if array.ndim != 1 else array.reshape(1, -1)
    elif kind == "int32":
        tensors[name] = array.astype(np.int32)
    elif kind == "float64":
        tensors[name] = array.astype(np.float64)
    elif kind in ("nan", "inf"):
        bad = array.copy()
        bad.flat[draw % bad.size] = np.nan if kind == "nan" else -np.inf
        tensors[name] = bad
    path.unlink(missing_ok=True)
    # `.copy()` makes a C-ordered copy and keeps a 0-d tensor 0-d (`np.ascontiguousarray` would not)
    tensors = {k: v if v.flags.c_contiguous else v.copy() for k, v in tensors.items()}
    save_file(tensors, str(path), metadata)
    return {name}


def float_names(tensors: dict[str, np.ndarray]) -> list[str]:
    return sorted(k for k, v in tensors.items() if np.issubdtype(v.dtype, np.floating))


def damage_draws(tensors: dict[str, np.ndarray], kinds: list[str]):
    return st.tuples(
        st.sampled_from(kinds), st.sampled_from(float_names(tensors)), st.integers(0, 10**6)
    )


def names_in(message: str, must: list[str], any_of: set[str]) -> bool:
    return all(m in message for m in must) and (not any_of or any(n in message for n in any_of))


# --- CHECKS ------------------------------------------------------------------------


def refused(args: list[str], folder: Path, must: list[str], any_of=frozenset(), usage=False):
    """Runs the CLI in-process; asserts the refusal promise. `usage`: click's own
    usage error (usage lines, then one `Error:` line) instead of `BadInput`'s one line."""
    before = snapshot(folder)
    result = CliRunner().invoke(main, args)
    LEDGER["cases"] += 1
    LEDGER["commands"].add(args[0])
    crashed = "Traceback" in result.output or not (
        result.exception is None or isinstance(result.exception, SystemExit)
    )
    LEDGER["tracebacks"] += int(crashed)
    assert not crashed, (args, result.output, repr(result.exception))
    assert result.exit_code == 2, (args, result.exit_code, result.output)
    lines = result.output.strip().splitlines()
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert usage or len(lines) == 1, result.output
    assert names_in(errors[0], must, set(any_of)), (must, sorted(any_of), errors[0])
    assert snapshot(folder) == before, f"{args}: the folder changed"
    return errors[0]


def raises(entry_point: str, error: type, call, must: list[str], any_of=frozenset()):
    LEDGER["cases"] += 1
    LEDGER["entry_points"].add(entry_point)
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, ValueError)
    assert names_in(str(info.value), must, set(any_of)), (must, sorted(any_of), str(info.value))
    return str(info.value)


# --- CONTROLS: THE GOOD FILES ARE ACCEPTED ------------------------------------------


def test_good_inputs_are_accepted(world, tmp_path):
    run, arch = world["run"], world["arch"]
    a = checkpoint.flat_arrays(checkpoint.load_safetensors(run / "converted.safetensors", arch))
    b = checkpoint.flat_arrays(checkpoint.load_orbax(run / "orbax", arch))
    assert all(a[k].tobytes() == world["converted"][k].tobytes() == b[k].tobytes() for k in a)
    net = pipeline.load_torch_source(run / "source.safetensors", arch)
    assert torch.equal(net.fc2.weight.detach(), torch.from_numpy(world["source"]["fc2.weight"]))
    assert pipeline.read_config(run) == Config.tiny()
    assert checkpoint.read_arch(run / "converted.safetensors") == arch
    keras_arch = sources.keras_arch(arch)
    out = streaming.convert_file(
        world["keras_file"], tmp_path / "k.safetensors", keras_map(keras_arch), keras_arch,
        world["spec"],
    )  # fmt: skip
    back, _ = read_tensors(out)
    assert all(back[k].tobytes() == world["converted"][k].tobytes() for k in back)
    logits = pipeline.read_reference_logits(run / "source_logits.npy", 360, 10)
    assert logits.shape == (360, 10) and np.isfinite(logits).all()
    for source in ("torch", "keras"):
        file = world["keras_file"] if source == "keras" else run / "source.safetensors"
        out = tmp_path / source
        result = CliRunner().invoke(
            main, ["convert", "--input", str(file), "--source", source, "--run-dir", str(out)]
        )
        assert result.exit_code == 0, result.output
        back, _ = read_tensors(out / "converted.safetensors")
        assert all(back[k].tobytes() == world["converted"][k].tobytes() for k in back)


# --- SAFETENSORS FILES: SOURCE (PYTORCH, KERAS) AND CONVERTED ----------------------


@cases(14)
@given(data=st.data())
def test_damaged_source_file_is_refused_by_convert(world, data):
    source = data.draw(st.sampled_from(["torch", "keras"]), label="source")
    tensors, meta = (
        (world["keras"], None) if source == "keras" else (world["source"], world["source_meta"])
    )
    kind, name, draw = data.draw(damage_draws(tensors, FILE_KINDS + TENSOR_KINDS), label="damage")
    folder = scratch(world)
    path = folder / "input.safetensors"
    shutil.copyfile(
        world["keras_file"] if source == "keras" else world["run"] / "source.safetensors", path
    )
    any_of = write_damaged(path, tensors, meta, kind, name, draw)
    refused(
        ["convert", "--input", str(path), "--source", source, "--run-dir", str(folder / "out")],
        folder,
        ["Nothing written", path.name],
        any_of,
    )
    arch = sources.keras_arch(world["arch"]) if source == "keras" else world["arch"]
    rules = keras_map(arch) if source == "keras" else torch_map(arch)
    raises(
        f"streaming.convert_file ({source} source)",
        MappingError,
        lambda: streaming.convert_file(
            path, folder / "lib" / "out.safetensors", rules, arch, world["spec"]
        ),
        [],
        any_of or {path.name},
    )
    assert not (folder / "lib").exists()  # nothing written, not even the folder
    if source == "torch":
        raises(
            "pipeline.load_torch_source",
            CheckpointError,
            lambda: pipeline.load_torch_source(path, world["arch"]),
            [path.name],
            any_of,
        )


@cases(12)
@given(data=st.data())
def test_damaged_source_of_a_run_is_refused_by_compare(world, data):
    tensors = world["source"]
    kind, name, draw = data.draw(damage_draws(tensors, FILE_KINDS + TENSOR_KINDS), label="damage")
    run = copy_run(world)
    any_of = write_damaged(
        run / "source.safetensors", tensors, world["source_meta"], kind, name, draw
    )
    refused(["compare", str(run)], run, ["source.safetensors"], any_of)


@cases(14)
@given(data=st.data())
def test_damaged_converted_file_is_refused_by_reload(world, data):
    tensors = world["converted"]
    kinds = FILE_KINDS + TENSOR_KINDS + ["float64"]
    kind, name, draw = data.draw(damage_draws(tensors, kinds), label="damage")
    run = copy_run(world)
    path = run / "converted.safetensors"
    any_of = write_damaged(path, tensors, META, kind, name, draw)
    refused(["reload", str(run)], run, ["converted.safetensors"], any_of)
    raises(
        "checkpoint.load_safetensors",
        CheckpointError,
        lambda: checkpoint.load_safetensors(path, world["arch"]),
        [path.name],
        any_of,
    )


@pytest.mark.parametrize(
    ("label", "metadata", "must"),
    [
        ("no arch", {"source": "torch"}, ["`arch`"]),
        ("arch not JSON", {"arch": "{channels: 16"}, ["`arch`", "not JSON"]),
        ("arch a list", {"arch": "[16, 2]"}, ["`arch`", "object"]),
        ("arch unknown field", {"arch": json.dumps({"channels": 16, "depth": 3})}, ["depth"]),
        ("arch zero width", {"arch": json.dumps(dict(Arch().__dict__, hidden=0))}, ["hidden"]),
        ("arch of another model", {"arch": json.dumps(OTHER.__dict__)}, ["config.json"]),
    ],
)
def test_converted_metadata_is_checked(world, label, metadata, must):
    run = copy_run(world)
    path = run / "converted.safetensors"
    save_file(world["converted"], str(path), metadata)
    refused(["reload", str(run)], run, ["converted.safetensors", *must])
    if label != "arch of another model":
        raises("checkpoint.read_arch", CheckpointError, lambda: checkpoint.read_arch(path), must)


# --- ORBAX ---------------------------------------------------------------------------


def _orbax_damage(kind: str, directory: Path) -> set[str]:
    """Damages a checkpoint folder in place; returns the files a refusal may name."""
    data_files = sorted((directory / "ocdbt.process_0" / "d").glob("*"))
    named = {str(f.relative_to(directory)) for f in data_files}
    if kind == "digests removed":
        (directory / checkpoint.FILE_DIGESTS).unlink()
        return {checkpoint.FILE_DIGESTS}
    if kind == "removed":
        shutil.rmtree(directory)
        return set()
    if kind == "empty":
        shutil.rmtree(directory)
        directory.mkdir()
        return set()
    if kind == "no _METADATA":
        (directory / "_METADATA").unlink()
        return {"_METADATA"}
    if kind == "_METADATA not UTF-8":
        (directory / "_METADATA").write_bytes(b"\xff\xfe\x00{")
        return {"_METADATA"}
    if kind == "manifest garbage":
        (directory / "manifest.ocdbt").write_bytes(b"xx")
        return {"manifest.ocdbt"}
    if kind == "digests not JSON":
        (directory / checkpoint.FILE_DIGESTS).write_text("{sizes")
        return {checkpoint.FILE_DIGESTS}
    for f in data_files:
        if kind == "data files removed":
            f.unlink()
        else:  # cut in half
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return named


ORBAX_IN_PLACE = [
    "removed",
    "empty",
    "no _METADATA",
    "_METADATA not UTF-8",
    "manifest garbage",
    "digests not JSON",
    "data files removed",
    "data files cut in half",
    "digests removed",
]


@pytest.mark.parametrize("kind", ORBAX_IN_PLACE + ["other-arch", "float16", "nan", "missing-param"])
def test_damaged_orbax_checkpoint_is_refused(world, kind):
    run = copy_run(world)
    if kind in ORBAX_IN_PLACE:
        any_of = _orbax_damage(kind, run / "orbax")
    else:
        source, any_of = world["orbax"][kind]
        shutil.rmtree(run / "orbax")
        shutil.copytree(source, run / "orbax")
    refused(["reload", str(run)], run, ["orbax"], any_of)
    raises(
        "checkpoint.load_orbax",
        CheckpointError,
        lambda: checkpoint.load_orbax(run / "orbax", world["arch"]),
        ["orbax"],
        any_of,
    )


# --- THE REFERENCE LOGITS -----------------------------------------------------------

LOGIT_KINDS = ["missing", "empty", "garbage", "truncated", "rows", "transposed", "flat", "int"]
LOGIT_KINDS += ["nan", "inf", "object"]


@cases(10)
@given(kind=st.sampled_from(LOGIT_KINDS), index=st.integers(0, 3599))
def test_damaged_reference_logits_are_refused(world, kind, index):
    run = copy_run(world)
    path = run / "source_logits.npy"
    good = np.load(path)
    if kind == "missing":
        path.unlink()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(b"\x93NUMPY\x01\x00{'descr': <f4")
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[: 128 + index])
    else:
        bad = {
            "rows": good[:-1],
            "transposed": good.T,
            "flat": good.reshape(-1),
            "int": good.astype(np.int64),
            "object": good.astype(object),
        }.get(kind)
        if kind in ("nan", "inf"):
            bad = good.copy()
            bad.flat[index % bad.size] = np.nan if kind == "nan" else np.inf
        np.save(path, bad, allow_pickle=True)
    refused(["reload", str(run)], run, ["source_logits.npy"])
    raises(
        "pipeline.read_reference_logits",
        CheckpointError,
        lambda: pipeline.read_reference_logits(path, *good.shape),
        ["source_logits.npy"],
    )


# --- THE CONFIG -------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
JUNK = st.one_of(st.none(), st.text(max_size=3), st.lists(st.integers(), max_size=2))
SIZE = st.one_of(
    st.integers(max_value=0), st.integers(min_value=1025, max_value=10**12), st.booleans(),
    st.floats(allow_nan=True), JUNK,
)  # fmt: skip
EPSILON = st.one_of(
    st.floats(max_value=0.0), st.floats(min_value=1.0), st.sampled_from([NAN, INF]),
    st.booleans(), JUNK,
)  # fmt: skip
SEED = st.one_of(
    st.integers(max_value=-1), st.integers(min_value=2**32, max_value=2**40),
    st.floats(allow_nan=True), st.booleans(), JUNK,
)  # fmt: skip
POSITIVE = st.one_of(st.integers(max_value=0), st.floats(allow_nan=True), st.booleans(), JUNK)
BAD_VALUES = {
    "arch.channels": SIZE,
    "arch.heads": SIZE,
    "arch.conv2_channels": SIZE,
    "arch.hidden": SIZE,
    "arch.num_classes": st.one_of(st.integers(1, 1024).filter(lambda v: v != 10), SIZE),
    "arch.image_size": st.one_of(st.integers(1, 1024).filter(lambda v: v != 8), SIZE),
    "arch.bn_epsilon": EPSILON,
    "arch.ln_epsilon": EPSILON,
    "arch.gelu_approximate": st.one_of(st.integers(), st.floats(allow_nan=True), JUNK),
    "source": st.one_of(st.text(max_size=6).filter(lambda v: v not in ("torch", "keras")), JUNK),
    "seed": SEED,
    "split_seed": SEED,
    "test_fraction": st.one_of(
        st.floats(max_value=0.0499), st.floats(min_value=0.5001), st.just(NAN), JUNK
    ),
    "epochs": POSITIVE,
    "batch_size": POSITIVE,
    "learning_rate": st.one_of(st.floats(max_value=0.0), st.sampled_from([NAN, INF]), JUNK),
}
CONFIG_FILE_KINDS = ["empty", "not UTF-8", "not JSON", "a list", "a number", "arch a string"]


@st.composite
def config_damage(draw):
    """(config.json bytes, what the refusal must name)."""
    good = Config.tiny().to_dict()
    kind = draw(st.sampled_from(["value", "value", "missing", "unknown", *CONFIG_FILE_KINDS]))
    if kind == "value":
        field = draw(st.sampled_from(sorted(BAD_VALUES)))
        value = draw(BAD_VALUES[field])
        raw = json.loads(json.dumps(good))
        *parents, leaf = field.split(".")
        (raw[parents[0]] if parents else raw)[leaf] = value
        return json.dumps(raw).encode(), leaf
    if kind in ("missing", "unknown"):
        raw = json.loads(json.dumps(good))
        field = draw(st.sampled_from(sorted(BAD_VALUES)))
        *parents, leaf = field.split(".")
        holder = raw[parents[0]] if parents else raw
        if kind == "missing":
            del holder[leaf]
        else:
            holder[leaf + "_x"] = 1
            leaf += "_x"
        return json.dumps(raw).encode(), leaf
    blob = {
        "empty": b"",
        "not UTF-8": b'{"seed": "\xff\xfe"}',
        "not JSON": b'{"seed": 0,',
        "a list": b"[1, 2]",
        "a number": b"3",
        "arch a string": json.dumps(dict(good, arch="default")).encode(),
    }[kind]
    return blob, "arch" if kind == "arch a string" else "config.json"


@cases(24)
@given(damage=config_damage(), command=st.sampled_from(["compare", "reload"]))
def test_damaged_config_is_refused(world, damage, command):
    blob, field = damage
    run = copy_run(world)
    (run / "config.json").write_bytes(blob)
    refused([command, str(run)], run, ["config.json", field])
    raises("config.load_config", ConfigError, lambda: load_config(run / "config.json"), [field])


@pytest.mark.parametrize("command", ["compare", "reload"])
def test_keras_config_for_a_torch_run_is_refused(world, command):
    run = copy_run(world)
    raw = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps(dict(raw, source="keras")))
    # compare: PyTorch runs only; reload: the artifact's arch (1e-5) is not a Keras run's (1e-3)
    refused([command, str(run)], run, ["keras"] if command == "compare" else ["config.json"])


# --- IN-MEMORY SOURCES AND `fill` ---------------------------------------------------


@pytest.mark.parametrize(
    ("label", "source", "tensor", "change", "pattern"),
    [
        ("torch NaN", "torch", "attn.in_proj_weight", "nan", r"non-finite"),
        ("torch bfloat16", "torch", "fc2.weight", "bf16", r"dtype `torch.bfloat16`"),
        ("torch bias reshaped (3, C)", "torch", "attn.in_proj_bias", "rows3", r"wrong shape"),
        ("torch empty tensor", "torch", "fc1.bias", "empty", r"wrong shape"),
        ("keras inf", "keras", "fc1/kernel", "inf", r"non-finite"),
        ("keras kernel flattened", "keras", "conv2/kernel", "flat", r"wrong shape"),
        ("keras missing", "keras", "head/bias", "drop", r"missing source tensor"),
    ],
)
def test_damaged_in_memory_source_is_refused(world, label, source, tensor, change, pattern):
    arch = sources.keras_arch(world["arch"]) if source == "keras" else world["arch"]
    if source == "torch":
        state = {k: torch.from_numpy(v.copy()) for k, v in world["source"].items()}
        state["head.weight"] = state["class_embed.weight"]
        rules = torch_map(arch)
    else:
        state = {k: v.copy() for k, v in world["keras"].items()}
        rules = keras_map(arch)
    value = state[tensor]
    if change == "nan":
        value[0, 0] = float("nan")
    elif change == "inf":
        value[1, 2] = np.inf
    elif change == "bf16":
        state[tensor] = value.to(torch.bfloat16)
    elif change == "rows3":
        state[tensor] = value.reshape(3, -1)
    elif change == "empty":
        state[tensor] = value[:0]
    elif change == "flat":
        state[tensor] = value.reshape(-1)
    elif change == "drop":
        del state[tensor]
    message = raises(
        f"weight_map.convert ({source} source)",
        MappingError,
        lambda: convert(rules, state, arch, world["spec"]),
        [f"`{tensor}`"],
    )
    assert re.search(pattern, message), message


@pytest.mark.parametrize("change", ["row short", "nan", "missing", "strings"])
def test_fill_checks_every_array(world, change):
    arrays = dict(world["converted"])
    if change == "row short":
        arrays["fc1.kernel"] = arrays["fc1.kernel"][:-1]
    elif change == "nan":
        arrays["fc1.kernel"] = arrays["fc1.kernel"].copy()
        arrays["fc1.kernel"][5, 6] = np.nan
    elif change == "missing":
        del arrays["fc1.kernel"]
    else:
        arrays["fc1.kernel"] = np.full(arrays["fc1.kernel"].shape, "x")
    target = model.abstract_model(world["arch"])
    raises(
        "checkpoint.fill", CheckpointError, lambda: checkpoint.fill(target, arrays), ["fc1.kernel"]
    )


# --- OPTIONS AND PATHS ---------------------------------------------------------------


def _file_in(folder: Path) -> Path:
    (folder / "a-file").write_text("not a folder\n")
    return folder / "a-file"


OPTION_CASES = [
    ("convert", ["--source", "jax"], ["--source", "jax"], True),
    ("convert", ["--epochs", "0"], ["--epochs", "0"], True),
    ("convert", ["--epochs", "201"], ["--epochs", "201"], True),
    ("convert", ["--epochs", "three"], ["--epochs", "three"], True),
    ("convert", ["--seed", "-1"], ["--seed", "-1"], True),
    ("convert", ["--run-dir", "{file}/run"], ["--run-dir", "a-file"], False),
    ("convert", ["--run-dir", "{file}"], ["a-file"], True),
    ("convert", ["--input", "{folder}/nowhere.safetensors"], ["nowhere.safetensors"], False),
    ("convert", ["--input", "{folder}"], ["--input"], True),
    ("convert", ["--input", "{source}", "--epochs", "2"], ["--epochs", "--input"], False),
    ("convert", ["--input", "{source}", "--run-dir", "{file}/x"], ["a-file"], False),
    ("convert", ["--input", "{source}", "--source", "keras"], ["conv1/kernel"], False),
    ("compare", ["{folder}/nowhere"], ["nowhere"], False),
    ("compare", ["{file}"], ["a-file"], False),
    ("compare", ["{run}", "--fault", "no-such-fault"], ["no-such-fault"], True),
    ("compare", ["{run}", "--dtype", "float16"], ["float16"], True),
    ("compare", [], ["RUN_DIR"], True),
    ("reload", ["{folder}/nowhere"], ["nowhere"], False),
    ("reload", [], ["RUN_DIR"], True),
    ("bench", ["--layers", "0"], ["--layers", "0"], True),
    ("bench", ["--width", "-3"], ["--width", "-3"], True),
    ("bench", ["--rounds", "0"], ["--rounds", "0"], True),
    ("bench", ["--layers", "many"], ["--layers", "many"], True),
    ("bench", ["--out", "{folder}"], ["--out"], True),
    ("bench", ["--out", "{file}/bench.json"], ["--out", "a-file"], False),
]


@pytest.mark.parametrize(("command", "args", "must", "usage"), OPTION_CASES)
def test_bad_options_and_paths_are_refused(world, command, args, must, usage):
    folder = scratch(world)
    run = copy_run(world) if any("{run}" in a for a in args) else folder
    file = _file_in(folder)
    source = world["run"] / "source.safetensors"
    filled = [
        a.format(folder=folder, file=file, run=run, source=source).replace("//", "/") for a in args
    ]
    if command == "convert" and "--run-dir" not in args:
        filled += ["--run-dir", str(folder / "out")]
    refused([command, *filled], folder if run == folder else run.parent, must, usage=usage)


# --- COVERAGE ----------------------------------------------------------------------


def test_every_cli_command_has_bad_input_cases():
    """Last in the module. The commands come from the click group itself, so a
    new command without a row in `OPTION_CASES` fails here; when the module's
    cases ran before this test, each command was refused at least once, and
    no case crashed."""
    commands = set(main.commands)
    assert {"convert", "compare", "reload", "bench"} <= commands  # the group is read
    missing = sorted(commands - {row[0] for row in OPTION_CASES})
    assert not missing, f"CLI commands without bad-input cases: {missing}"
    if LEDGER["cases"]:
        assert LEDGER["tracebacks"] == 0
        assert LEDGER["commands"] == commands, sorted(commands - LEDGER["commands"])
