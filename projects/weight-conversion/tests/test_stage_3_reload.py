"""Stage 3: reload the mapped artifact.

Independent checks: the streamed conversion, read back with the safetensors
library, is bitwise the in-memory conversion; a fresh process (the
`weight-conversion reload` command) rebuilds the model from the safetensors
file and from the Orbax checkpoint, and its held-out logits agree with the
source model's within the float32 tolerance of the whole network, with
identical predictions. Streaming is shown to hold one tensor at a time: its
peak resident memory, measured in a subprocess, is a fraction of the eager
conversion's. Changed conditions: another architecture and float64 targets
for the streamed file; both artifact formats. Bad files are refused with
the tensor named and nothing written (an `--input` file; a run folder's
truncated or mis-shaped artifact or source, for `reload` and `compare`); a
transposed square kernel, which shapes cannot see, fails `reload`.
"""

import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.numpy import save_file as numpy_save_file
from safetensors.torch import save_file as torch_save_file

from weight_conversion import checkpoint, model, pipeline, sources, streaming, synthetic
from weight_conversion.cli import main
from weight_conversion.config import Arch, Config
from weight_conversion.weight_map import MappingError, convert, torch_map

OTHER = Arch(channels=8, heads=4, conv2_channels=4, hidden=32)


def read_all(path: Path) -> dict[str, np.ndarray]:
    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize(
    ("arch", "dtype"),
    [(Arch(), np.float32), (OTHER, np.float64)],
    ids=["default-float32", "other-arch-float64"],
)
def test_streamed_file_equals_in_memory_conversion(evidence, tmp_path, arch, dtype):
    torch.manual_seed(3)
    net = sources.TorchDigitNet(arch).eval()
    src = pipeline.save_torch_source(net, tmp_path / "src.safetensors")
    spec = {
        k: (s, np.dtype(dtype))
        for k, (s, _) in checkpoint.target_spec(model.abstract_model(arch)).items()
    }
    out = streaming.convert_file(
        src, tmp_path / "out.safetensors", torch_map(arch), arch, spec, {"note": "test"}
    )
    streamed = read_all(out)
    reference = convert(torch_map(arch), net.state_dict(), arch, spec)
    same = sorted(streamed) == sorted(reference) and all(
        streamed[k].dtype == reference[k].dtype and streamed[k].tobytes() == reference[k].tobytes()
        for k in reference
    )
    assert checkpoint.read_metadata(out) == {"note": "test"}
    assert evidence.record(
        "streamed file == in-memory conversion, bitwise",
        f"{arch}, {dtype}",
        {"tensors": len(streamed)},
        None,
        same,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, torch_source):
    """A run folder written by `pipeline.convert_run` (tiny config: 3 epochs)."""
    del torch_source  # trained with the same config; this also sets one torch thread
    path = tmp_path_factory.mktemp("run")
    pipeline.convert_run(Config.tiny(), path)
    return path


def test_reload_in_a_fresh_process(evidence, run_dir):
    cmd = [
        sys.executable,
        "-c",
        "from weight_conversion.cli import main; main()",
        "reload",
        str(run_dir),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((run_dir / "reload.json").read_text())
    for name in ("safetensors", "orbax"):
        r = result[name]
        assert evidence.record(
            "fresh-process reload: logits within tolerance, identical predictions",
            name,
            {
                "max_abs_logit_error": r["max_abs_logit_error"],
                "identical_predictions": r["identical_predictions"],
                "accuracy": r["accuracy"],
            },
            {"tolerance": result["tolerance"], "examples": result["held_out_examples"]},
            r["passed"] and r["identical_predictions"] == result["held_out_examples"],
        )


def test_safetensors_and_orbax_reload_the_same_bits(evidence, run_dir):
    arch = Arch()
    a = checkpoint.flat_arrays(checkpoint.load_safetensors(run_dir / "converted.safetensors", arch))
    b = checkpoint.flat_arrays(checkpoint.load_orbax(run_dir / "orbax", arch))
    same = sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert evidence.record(
        "safetensors reload == Orbax reload, bitwise",
        "two formats",
        {"tensors": len(a)},
        None,
        same,
    )


def _peak(mode: str, src: Path, dst: Path, layers: int, width: int) -> int:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "weight_conversion.bench_child",
            mode,
            str(src),
            str(dst),
            str(layers),
            str(width),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["added_bytes"]


def test_streaming_holds_one_tensor_not_the_whole_source(evidence, tmp_path):
    layers, width = 24, 512  # 24 MB of float32 in 1 MB tensors
    src = tmp_path / "src.safetensors"
    size = synthetic.write_source(src, layers, width)
    eager = _peak("eager", src, tmp_path / "eager.safetensors", layers, width)
    stream = _peak("streaming", src, tmp_path / "stream.safetensors", layers, width)
    same = (
        read_all(tmp_path / "eager.safetensors").keys()
        == read_all(tmp_path / "stream.safetensors").keys()
    )
    assert evidence.record(
        "peak RSS added: streaming well under eager and under the source size",
        f"{layers} x {width}x{width} float32",
        {"source_bytes": size, "eager_added": eager, "streaming_added": stream},
        {"streaming_below": size / 2},
        same and stream < size / 2 and stream * 2 < eager,
    )


def _bad_sources(tmp_path: Path, good: Path) -> dict[str, tuple[Path, str]]:
    blob = good.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(blob[: len(blob) - 5000])
    other = tmp_path / "other.safetensors"
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 10))
    torch_save_file(mlp.state_dict(), str(other))
    ints = tmp_path / "int.safetensors"
    state = read_all(good)
    state["fc2.weight"] = state["fc2.weight"].astype(np.int32)
    from safetensors.numpy import save_file

    save_file(state, str(ints))
    return {
        "truncated": (truncated, r"tensor `[\w.]+` needs bytes .* \(truncated\)"),
        "other-architecture": (other, r"unexpected source tensor `0.weight`"),
        "unsupported-dtype": (ints, r"`fc2.weight` has dtype `int32`"),
    }


def test_bad_files_are_refused_by_name_and_nothing_is_written(evidence, tmp_path):
    arch = Arch()
    torch.manual_seed(0)
    good = pipeline.save_torch_source(sources.TorchDigitNet(arch), tmp_path / "good.safetensors")
    spec = checkpoint.target_spec(model.abstract_model(arch))
    runner = CliRunner()
    for label, (path, pattern) in _bad_sources(tmp_path, good).items():
        dst = tmp_path / f"out-{label}.safetensors"
        with pytest.raises(MappingError, match=pattern):
            streaming.convert_file(path, dst, torch_map(arch), arch, spec)
        left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f"out-{label}"))
        result = runner.invoke(
            main, ["convert", "--input", str(path), "--run-dir", str(tmp_path / f"cli-{label}")]
        )
        cli_written = (tmp_path / f"cli-{label}" / "converted.safetensors").exists()
        assert evidence.record(
            "bad file refused, tensor named, nothing written",
            label,
            {
                "left_behind": left,
                "cli_exit": result.exit_code,
                "cli_message": result.output.strip()[-300:],
            },
            None,
            not left
            and result.exit_code == 2
            and not cli_written
            and "Nothing written" in result.output,
        )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _cut_tensors(blob: bytes) -> set[str]:
    """The tensors whose byte range a truncated safetensors file no longer holds,
    read from its header (8-byte little-endian length, then JSON)."""
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    data_size = len(blob) - 8 - length
    return {
        k for k, v in header.items() if k != "__metadata__" and v["data_offsets"][1] > data_size
    }


def _truncate(path: Path) -> set[str]:
    blob = path.read_bytes()
    path.write_bytes(blob[:-1000])
    return _cut_tensors(blob[:-1000])


def _rewrite(path: Path, name: str, change) -> None:
    with safe_open(str(path), framework="numpy") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors[name] = change(tensors[name])
    numpy_save_file(tensors, str(path), metadata=metadata)


@pytest.mark.parametrize(
    ("command", "file", "damage"),
    [
        ("reload", "converted.safetensors", "truncated"),
        ("reload", "converted.safetensors", "fc1.kernel one row short"),
        ("compare", "source.safetensors", "truncated"),
        ("compare", "source.safetensors", "fc1.weight one column short"),
    ],
)
def test_damaged_run_files_are_refused_by_name(evidence, run_dir, tmp_path, command, file, damage):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    if damage == "truncated":
        cut = _truncate(run / file)
        assert cut  # the last 1000 bytes hold at least one tensor
    elif damage == "fc1.kernel one row short":
        _rewrite(run / file, "fc1.kernel", lambda a: a[:-1])
        cut = {"fc1.kernel"}
    else:
        _rewrite(run / file, "fc1.weight", lambda a: np.ascontiguousarray(a[:, :-1]))
        cut = {"fc1.weight"}
    before = _snapshot(run)
    result = CliRunner().invoke(main, [command, str(run)])
    lines = result.output.strip().splitlines()
    named = re.findall(r"`([\w.]+)`", result.output)
    ok = (
        result.exit_code == 2
        and (result.exception is None or isinstance(result.exception, SystemExit))
        and "Traceback" not in result.output
        and len(lines) == 1
        and file in result.output
        and any(n in cut for n in named)
        and _snapshot(run) == before
    )
    if "short" in damage:  # the shape found and the shape the model needs, both named
        ok = ok and "(255, 64)" in result.output and "(256, 64)" in result.output
        ok = ok or ("(64, 255)" in result.output and "(64, 256)" in result.output)
    assert evidence.record(
        "damaged run file refused: exit 2, one line naming file and tensor, nothing written",
        f"{command}: {file} {damage}",
        {"exit": result.exit_code, "message": result.output.strip()[-300:]},
        {"tensors": sorted(cut)},
        ok,
    ), result.output


def test_reload_fails_a_transposed_square_kernel(evidence, run_dir, tmp_path):
    """Shapes cannot see fc2.kernel transposed (64 x 64); the reload check's logits can."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    _rewrite(run / "converted.safetensors", "fc2.kernel", lambda a: np.ascontiguousarray(a.T))
    result = CliRunner().invoke(main, ["reload", str(run)])
    report = json.loads((run / "reload.json").read_text())
    error = report["safetensors"]["max_abs_logit_error"]
    assert evidence.record(
        "reload: a transposed square kernel fails the check (exit 1); the intact Orbax passes",
        "converted.safetensors fc2.kernel transposed",
        {"exit": result.exit_code, "max_abs_logit_error": error},
        {"tolerance": report["tolerance"]},
        result.exit_code == 1
        and "reload: FAIL" in result.output
        and not report["safetensors"]["passed"]
        and report["orbax"]["passed"]
        and error > 100 * report["tolerance"],
    ), result.output
