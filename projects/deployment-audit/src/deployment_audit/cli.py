"""The `deployment-audit` command line.

    deployment-audit train [--config FILE] [--workdir DIR] [--overwrite]
    deployment-audit export WORKDIR [--out DIR]           jax.export bytes + manifest
    deployment-audit verify ARTIFACT [--expect-sha256 H]  hash, window, self-test
    deployment-audit predict ARTIFACT INPUT.npy OUT.npy   run the artifact on an array
    deployment-audit precision WORKDIR [--out FILE.json]  the precision policy table
    deployment-audit serve ARTIFACT [--port N] [--port-file F] [--config FILE]
    deployment-audit load ARTIFACT [--config FILE] [--out FILE.json]
    deployment-audit bench [--out FILE.json] [--size default|tiny]

`deployment-audit train` with no options trains `Config.default()` into
`runs/train` (test accuracy >= 0.96, about 10 s on a 2-core CPU); `export runs/train`
then writes `runs/train/artifact`, which `serve` and `load` use.
"""

import json
import re
import sys
from pathlib import Path
from typing import Any

import click

from deployment_audit.config import (
    Config,
    ConfigError,
    LoadConfig,
    ServeConfig,
    check_output_path,
    load_config,
)


class BadInput(click.ClickException):
    """A user-facing error: printed as one message, exit code 2, no traceback."""

    exit_code = 2


def _load(path: str | None, kind: Any, default: Any) -> Any:
    if path is None:
        return default
    try:
        return load_config(path, kind)
    except ConfigError as err:
        raise BadInput(str(err)) from None


def _output(path: str | Path, *, directory: bool, what: str) -> Path:
    """`path` checked for writing before any work starts (`BadInput` if it cannot be)."""
    try:
        return check_output_path(path, directory=directory, what=what)
    except ConfigError as err:
        raise BadInput(str(err)) from None


def _report_paths(path: str | Path, what: str) -> Path:
    """A JSON report and the PNG plot next to it, both checked for writing."""
    out = Path(path)
    for target in (out, out.with_suffix(".png")):
        _output(target, directory=False, what=what)
    return out


def _sha256(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[0-9a-f]{64}", value):
        raise click.BadParameter(
            f"`{value}` is not a sha256 (64 lowercase hexadecimal digits), so no artifact "
            "could ever match it."
        )
    return value


@click.group()
@click.version_option(package_name="deployment-audit")
def main() -> None:
    """A trained digits classifier taken to deployment: an Orbax artifact with golden
    predictions, a jax.export artifact that refuses the wrong input, precision
    policies, and an HTTP server measured under a stated load."""


@main.command(name="train")
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option("--workdir", default="runs/train", show_default=True, type=click.Path())
@click.option("--overwrite", is_flag=True, help="Replace an existing workdir.")
def train_command(config_path: str | None, workdir: str, overwrite: bool) -> None:
    """Train, evaluate on the held-out split, save the Orbax artifact and golden sample."""
    from deployment_audit import train

    config = _load(config_path, Config, Config.default())

    def progress(record: dict[str, Any]) -> None:
        if record["epoch"] % 10 == 0 or record["epoch"] == config.num_epochs:
            click.echo(
                f"epoch {record['epoch']:>4}  train loss {record['train_loss']:.4f}", err=True
            )

    try:
        metrics = train.train_and_evaluate(config, workdir, overwrite=overwrite, progress=progress)
    except train.WorkdirError as err:
        raise BadInput(str(err)) from None
    click.echo(
        f"test accuracy {metrics['test_accuracy']:.4f} ({metrics['test_count']} examples); "
        f"golden sample of {len(metrics['_golden']['ids'])}; artifact: {workdir}/checkpoint"
    )


@main.command(name="export")
@click.argument("workdir", type=click.Path())
@click.option("--out", type=click.Path(), help="Artifact directory (default: WORKDIR/artifact).")
def export_command(workdir: str, out: str | None) -> None:
    """Export the trained model with jax.export (symbolic batch) and write its manifest."""
    from deployment_audit import checkpoint, export, train

    out = str(_output(out or Path(workdir) / "artifact", directory=True, what="Artifact `--out`"))
    try:
        params, spec, golden = train.load_trained(workdir)
    except (checkpoint.CheckpointError, OSError) as err:
        raise BadInput(f"Cannot read the trained model in `{workdir}`: {err}") from None
    manifest = export.write_artifact(
        out, export.export_model(params, spec["preprocessing"]), spec, golden
    )
    loaded = export.load_artifact(out)
    self_test = loaded.self_test()
    click.echo(
        f"exported {manifest['size_bytes']} bytes, sha256 {manifest['sha256'][:16]}..., "
        f"platforms {manifest['platforms']}; self-test "
        f"{'passed' if self_test['passed'] else 'FAILED'} (bitwise {self_test['bitwise_equal']}); "
        f"artifact: {out}"
    )


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--expect-sha256", callback=_sha256, help="Refuse any other model version.")
@click.option("--accept-outside-window", is_flag=True, help="Load a stale artifact anyway.")
def verify(artifact: str, expect_sha256: str | None, accept_outside_window: bool) -> None:
    """Verify an artifact: hash, manifest, compatibility window, golden self-test."""
    from deployment_audit import export

    try:
        loaded = export.load_artifact(
            artifact, expected_sha256=expect_sha256, accept_outside_window=accept_outside_window
        )
    except export.ArtifactError as err:
        raise BadInput(str(err)) from None
    self_test = loaded.self_test()
    report = {**loaded.checks, "self_test": self_test}
    click.echo(json.dumps(report, indent=1))
    if not self_test["passed"]:
        sys.exit(1)


@main.command()
@click.argument("artifact", type=click.Path())
@click.argument("inputs", type=click.Path(exists=True, dir_okay=False))
@click.argument("output", type=click.Path(dir_okay=False))
def predict(artifact: str, inputs: str, output: str) -> None:
    """Run the verified artifact on INPUTS (.npy, float32 (n, 64)); write logits to OUTPUT."""
    import numpy as np

    from deployment_audit import export

    _output(output, directory=False, what="Logits file OUTPUT")
    try:
        # No pickles: an object array (or a pickle posing as .npy) is refused, not run.
        x = np.load(inputs, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise BadInput(
            f"`{inputs}` is not a NumPy .npy file of numbers ({type(err).__name__}: {err}); "
            f"save a float32 array of shape (n, 64) with `numpy.save`."
        ) from None
    if not isinstance(x, np.ndarray):
        x.close()
        raise BadInput(
            f"`{inputs}` is a .npz archive, not one .npy array; save a float32 array of "
            f"shape (n, 64) with `numpy.save`."
        )
    try:
        export.check_input(x)  # Before the artifact is loaded: the input alone is wrong.
    except export.InputError as err:
        raise BadInput(f"`{inputs}`: {err}") from None
    try:
        loaded = export.load_artifact(artifact)
        logits = loaded.predict(x)
    except (export.ArtifactError, export.InputError) as err:
        raise BadInput(str(err)) from None
    np.save(output, logits)
    click.echo(f"wrote logits {logits.shape} {logits.dtype} to {output}")


@main.command()
@click.argument("workdir", type=click.Path())
@click.option("--out", type=click.Path(), help="Report JSON (default: WORKDIR/precision.json).")
def precision(workdir: str, out: str | None) -> None:
    """Compare the precision policies on the held-out split against f32."""
    from deployment_audit import checkpoint, report

    out_path = _report_paths(out or Path(workdir) / "precision.json", "Precision report `--out`")
    try:
        result = report.precision_report(workdir)
    except (checkpoint.CheckpointError, OSError) as err:
        raise BadInput(f"Cannot read the trained model in `{workdir}`: {err}") from None
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    report.plot_precision(result, out_path.with_suffix(".png"))
    click.echo(report.precision_table(result))
    click.echo(f"report: {out_path} (plot {out_path.with_suffix('.png')})")


@main.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535))
@click.option("--port-file", type=click.Path(dir_okay=False), help="Write the bound port here.")
@click.option("--config", "config_path", type=click.Path(), help="ServeConfig JSON file.")
@click.option(
    "--expect-sha256", callback=_sha256, help="Never become ready with any other model version."
)
def serve(
    artifact: str,
    port: int,
    port_file: str | None,
    config_path: str | None,
    expect_sha256: str | None,
) -> None:
    """Serve ARTIFACT over HTTP on 127.0.0.1 (Ctrl-C stops it)."""
    from deployment_audit.serve import run_server

    config = _load(config_path, ServeConfig, ServeConfig())
    if port_file is not None:
        _output(port_file, directory=False, what="Port file `--port-file`")
        _output(f"{port_file}.tmp", directory=False, what="Port file `--port-file`")
    run_server(artifact, config, port=port, port_file=port_file, expected_sha256=expect_sha256)


@main.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--config", "config_path", type=click.Path(), help="LoadConfig JSON file.")
@click.option("--serve-config", "serve_path", type=click.Path(), help="ServeConfig JSON file.")
@click.option("--out", default="runs/load.json", show_default=True, type=click.Path())
def load(artifact: str, config_path: str | None, serve_path: str | None, out: str) -> None:
    """Start a server on ARTIFACT, drive it with the stated workload, fit the queue
    model, and write the capacity report (observed, simulated, unmeasured apart)."""
    from deployment_audit import loadgen, report

    load_config_ = _load(config_path, LoadConfig, LoadConfig.default())
    serve_config = _load(serve_path, ServeConfig, ServeConfig())
    out_path = _report_paths(out, "Load report `--out`")
    try:
        result = loadgen.run_load_test(
            artifact, load_config_, serve_config, log=lambda m: click.echo(m, err=True)
        )
    except loadgen.ServerStartError as err:
        raise BadInput(str(err)) from None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    report.plot_load(result, out_path.with_suffix(".png"))
    click.echo(report.load_table(result))
    click.echo(f"report: {out_path} (plot {out_path.with_suffix('.png')})")


def _bench_command() -> click.Command:
    from deployment_audit.bench import bench

    return bench


main.add_command(_bench_command())

if __name__ == "__main__":
    main()
