"""The `weight-conversion` command line.

    weight-conversion convert [--source torch|keras] [--epochs N] [--seed S] [--run-dir DIR]
    weight-conversion convert --input FILE.safetensors [--source torch|keras] [--run-dir DIR]
    weight-conversion compare RUN_DIR [--fault NAME] [--dtype float32|float64]
    weight-conversion reload RUN_DIR
    weight-conversion bench [--out runs/bench.json]

`convert` trains the source model briefly on scikit-learn's digits (seconds),
streams its safetensors file through the weight map and writes the NNX
artifact (safetensors + Orbax) under `runs/<source>-seed<S>/`. `compare`
locates the first layer that disagrees; `reload` checks the artifact in a
fresh process (exit 1 if it fails).

A damaged input (a run folder's file, an `--input` file, an output path
that cannot be a folder) is refused with exit code 2 and one line naming
the file and the tensor or field; nothing is written.
"""

import json
import sys
from pathlib import Path

import click

from weight_conversion.parity import FAULTS


class BadInput(click.ClickException):
    """A user-facing error: one message on one line, exit code 2, no traceback."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def _say(message: str) -> None:
    click.echo(message, err=True)


def _writable_folder(path: Path, option: str) -> None:
    """Refuses an output folder that cannot be made: a file in its place or above it."""
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                raise BadInput(f"{option} `{path}`: `{folder}` is a file, not a folder.")
            return


def _run_dir(path: str) -> Path:
    run_dir = Path(path)
    if not (run_dir / "config.json").is_file() or not (run_dir / "source.safetensors").is_file():
        raise BadInput(
            f"`{path}` is not a run folder of `weight-conversion convert` "
            "(it needs config.json and source.safetensors)."
        )
    return run_dir


@click.group()
@click.version_option(package_name="weight-conversion")
def main() -> None:
    """PyTorch and Keras weights mapped into Flax NNX: the map, the first
    disagreement, the reloaded artifact."""


@main.command()
@click.option(
    "--source",
    type=click.Choice(["torch", "keras"]),
    default="torch",
    show_default=True,
    help="Framework of the source model to train.",
)
@click.option(
    "--epochs",
    type=click.IntRange(1, 200),
    default=None,
    help="Training epochs (default: the default config's 8).",
)
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option(
    "--input",
    "input_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Convert this safetensors file (PyTorch names, or Keras paths with --source keras) "
    "instead of training a model.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Output folder (default: runs/<source>-seed<S>).",
)
def convert(
    source: str, epochs: int | None, seed: int, input_path: str | None, run_dir: str | None
) -> None:
    """Train a source model briefly, convert it by streaming, save the artifact."""
    from weight_conversion import checkpoint, model, pipeline, streaming
    from weight_conversion.config import Config
    from weight_conversion.weight_map import MappingError

    changes = {"source": source, "seed": seed}
    if epochs is not None:
        changes["epochs"] = epochs
    config = Config.default(**changes)
    if input_path is not None:
        if epochs is not None:
            raise BadInput("--epochs trains a source model; --input converts a file: give one.")
        if not Path(input_path).is_file():
            raise BadInput(f"No such file: `{input_path}`.")
        out = Path(run_dir or "runs/input") / "converted.safetensors"
        _writable_folder(out.parent, "--run-dir")
        if out.is_dir():
            raise BadInput(f"`{out}` is a folder; the converted file cannot be written there.")
        arch = pipeline.target_arch(config)
        spec = checkpoint.target_spec(model.abstract_model(arch))
        try:
            streaming.convert_file(
                input_path,
                out,
                pipeline.rules_for(config),
                arch,
                spec,
                {"arch": json.dumps(arch.__dict__), "source": source},
            )
        except MappingError as err:
            raise BadInput(f"Nothing written. `{input_path}`: {err.one_line()}") from None
        click.echo(f"converted {input_path} -> {out}")
        return
    run_dir = run_dir or f"runs/{source}-seed{seed}"
    _writable_folder(Path(run_dir), "--run-dir")
    summary = pipeline.convert_run(config, run_dir, progress=_say)
    click.echo(
        f"{source} source: held-out accuracy {summary['source_test_accuracy']:.4f}; "
        f"{summary['parameters']} values converted "
        f"({summary['converted_bytes'] / 1e3:.0f} kB); artifact in {run_dir}"
    )


@main.command()
@click.argument("run_dir", type=click.Path())
@click.option(
    "--fault",
    type=click.Choice(sorted(FAULTS)),
    default=None,
    help="Inject one known conversion mistake and locate it.",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float64"]),
    default="float32",
    show_default=True,
    help="Precision of both sides.",
)
def compare(run_dir: str, fault: str | None, dtype: str) -> None:
    """Layer-by-layer parity of a PyTorch run: the first layer beyond tolerance."""
    import numpy as np

    from weight_conversion import data, pipeline, plots
    from weight_conversion.checkpoint import CheckpointError
    from weight_conversion.config import ConfigError
    from weight_conversion.parity import torch_parity

    path = _run_dir(run_dir)
    try:
        config = pipeline.read_config(path)
        if config.source != "torch":
            raise BadInput(
                f"`compare` runs on PyTorch runs; `{run_dir}` holds a {config.source} run."
            )
        net = pipeline.load_torch_source(path / "source.safetensors", config.arch)
    except (ConfigError, CheckpointError) as err:
        raise BadInput(str(err)) from None
    split = data.load_split(config.split_seed, config.test_fraction)
    report = torch_parity(net, config.arch, split.test_images, np.dtype(dtype), fault)
    click.echo(f"{'layer':>8} {'max |err|':>11} {'tolerance':>11} {'ratio':>9}")
    for row in report.layers:
        mark = "  <-- first disagreement" if row.name == report.first_disagreement else ""
        click.echo(
            f"{row.name:>8} {row.max_abs_error:>11.3e} {row.tolerance:>11.3e} "
            f"{row.ratio:>9.3g}{mark}"
        )
    stem = f"parity-{fault or 'clean'}-{dtype}"
    (path / f"{stem}.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    plots.parity_plot(report.to_dict(), path / f"{stem}.png", f"{fault or 'clean'} ({dtype})")
    expected = FAULTS[fault].layer if fault else None
    verdict = "as expected" if report.first_disagreement == expected else "UNEXPECTED"
    click.echo(
        f"first disagreement: {report.first_disagreement or 'none'} ({verdict}); "
        f"report {path / (stem + '.json')}"
    )


@main.command()
@click.argument("run_dir", type=click.Path())
def reload(run_dir: str) -> None:
    """Reload the artifact (safetensors and Orbax) and check it against the source."""
    from weight_conversion import pipeline
    from weight_conversion.checkpoint import CheckpointError
    from weight_conversion.config import ConfigError

    path = _run_dir(run_dir)
    try:
        result = pipeline.reload_check(path)
    except (ConfigError, CheckpointError) as err:
        raise BadInput(str(err)) from None
    for name in ("safetensors", "orbax"):
        r = result[name]
        click.echo(
            f"{name:>12}: max |logit error| {r['max_abs_logit_error']:.3e} "
            f"(tolerance {result['tolerance']:.3e}), identical predictions "
            f"{r['identical_predictions']}/{result['held_out_examples']}, "
            f"accuracy {r['accuracy']:.4f}"
        )
    click.echo(f"reload: {'PASS' if result['passed'] else 'FAIL'}")
    if not result["passed"]:
        sys.exit(1)


@main.command(name="bench")
@click.option(
    "--out", type=click.Path(dir_okay=False), default="runs/bench.json", show_default=True
)
@click.option("--layers", type=click.IntRange(1, 1000), default=48, show_default=True)
@click.option("--width", type=click.IntRange(1, 8192), default=1024, show_default=True)
@click.option("--rounds", type=click.IntRange(1, 50), default=3, show_default=True)
def bench_command(out: str, layers: int, width: int, rounds: int) -> None:
    """Peak memory and MB/s: eager vs streaming conversion vs a file copy."""
    from weight_conversion.bench import bench, table

    _writable_folder(Path(out).parent, "--out")
    report = bench(out, layers, width, rounds, progress=_say)
    click.echo(table(report))
    click.echo(f"report: {out}")
