"""The `sharded-training` command line.

    sharded-training train   [--config FILE] [--workdir DIR] [--devices N]
    sharded-training launch  [--config FILE] [--workdir DIR] --processes N --devices-per-process K
    sharded-training worker  --coordinator HOST:PORT --process-id I --num-processes N ...
    sharded-training profile [--config FILE] [--out DIR]
    sharded-training bench   [--out FILE.json]      (the optimization at batch 96 and 16, A/A)

With no `--config`, `train` and `launch` run `Config.default()` (300 steps of a
32-256-8 MLP on a (4, 2) mesh of 8 simulated CPU devices), output under `runs/`.
"""

import datetime
import json
import math
from pathlib import Path

import click

from sharded_training.config import Config, ConfigError, check_output_dir, load_config


class BadInput(click.ClickException):
    """A user-facing error: printed as one message, exit code 2, no traceback."""

    exit_code = 2


def _config(path: str | None) -> Config:
    if path is None:
        return Config.default()
    try:
        return load_config(path)
    except ConfigError as err:
        raise BadInput(str(err)) from None


def _output_dir(path: str | Path, what: str) -> None:
    try:
        check_output_dir(path, what)
    except ConfigError as err:
        raise BadInput(str(err)) from None


def _mesh_fits(config: Config, devices: int, where: str) -> None:
    """The mesh against the device count, before JAX starts with that many devices."""
    data, model = config.mesh_shape
    if data * model != devices:
        raise BadInput(
            f"The mesh shape `({data}, {model})` needs {data * model} devices, but there are "
            f"`{devices}` ({where}); choose (data, model) sizes whose product is {devices}."
        )


def _positive_seconds(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value} is not a positive, finite number of seconds.")
    return value


def _workdir(workdir: str | None, kind: str) -> Path:
    if workdir is not None:
        return Path(workdir)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{kind}-{stamp}"


def _echo(line: str) -> None:
    click.echo(line, err=True)


@click.group()
@click.version_option(package_name="sharded-training")
def main() -> None:
    """Meshes, several real processes, full-state recovery in fresh processes and a
    trace-backed performance report, on simulated CPU devices."""


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option("--workdir", type=click.Path(file_okay=False), help="Output (default runs/).")
@click.option(
    "--devices",
    default=8,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Simulated CPU devices in this one process.",
)
def train(config_path: str | None, workdir: str | None, devices: int) -> None:
    """Train in this process on a mesh of simulated devices, with checkpoints."""
    import jax

    config = _config(config_path)
    _mesh_fits(config, devices, "`--devices`")
    if workdir is not None:
        _output_dir(workdir, "`--workdir`")
    jax.config.update("jax_num_cpu_devices", devices)
    from sharded_training import plots
    from sharded_training import train as train_mod
    from sharded_training.checkpoint import CheckpointError
    from sharded_training.sharding import MeshError

    out = _workdir(workdir, "train")
    try:
        result = train_mod.run(config, out, progress=_echo)
    except (MeshError, CheckpointError) as err:
        raise BadInput(str(err)) from None
    result.pop("state")
    (out / "final_p0.json").write_text(json.dumps(result, indent=1) + "\n")
    if result["losses"]:
        plots.loss_curve(result["losses"], out / "loss.png", "single process")
    last = max(result["losses"], default=None)
    summary = f"final loss {result['losses'][last]:.4f}" if last else "nothing left to train"
    click.echo(f"{summary}; state digest {result['digest'][:16]}; output: {out}")


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option("--workdir", type=click.Path(file_okay=False), help="Output (default runs/).")
@click.option("--processes", default=2, show_default=True, type=int)
@click.option("--devices-per-process", default=4, show_default=True, type=int)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    help="Coordinator port on 127.0.0.1 (default: a free one).",
)
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=float,
    callback=_positive_seconds,
    help="Seconds before giving up.",
)
def launch(config_path, workdir, processes, devices_per_process, port, timeout) -> None:
    """Run the same training as several real processes on this machine."""
    from sharded_training import launch as launch_mod
    from sharded_training import plots

    config = _config(config_path)
    out = _workdir(workdir, "launch")
    try:
        result = launch_mod.launch(
            config,
            out,
            processes=processes,
            devices_per_process=devices_per_process,
            port=port,
            timeout_s=timeout,
            echo=_echo,
        )
    except launch_mod.LaunchError as err:
        raise BadInput(str(err)) from None
    if any(result.returncodes):
        for index in range(processes):
            tail = launch_mod.read_output(out, 0, index).strip().splitlines()[-3:]
            _echo(f"process {index} (exit {result.returncodes[index]}): " + " | ".join(tail))
        raise click.ClickException(f"The job failed; logs in `{out / 'logs'}`.")
    summary = launch_mod.summarize(out, processes)
    plots.loss_curve(
        {int(k): v for k, v in summary["losses"].items()},
        out / "loss.png",
        f"{processes} processes x {devices_per_process} devices",
    )
    click.echo(
        f"{processes} processes x {devices_per_process} devices: final loss "
        f"{summary['final_loss']:.4f}; every global batch covered once by the processes' "
        f"sample IDs: {summary['ids_cover_each_batch_once']}; gradient all-reduce "
        f"{summary['gradient_all_reduce_bytes']} bytes per device; {result.wall_s:.1f} s; "
        f"output: {out}"
    )


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def worker(args: tuple[str, ...]) -> None:
    """One process of a job (for real hosts): the options of `python -m sharded_training.worker`:
    --config FILE --workdir DIR --process-id I --num-processes N
    --devices-per-process K --coordinator HOST:PORT."""
    from sharded_training import worker as worker_mod

    raise SystemExit(worker_mod.main(list(args)))


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Report directory.")
@click.option(
    "--steps",
    default=40,
    show_default=True,
    type=click.IntRange(8, 10_000),
    help="Timed training steps per variant.",
)
def profile(config_path: str | None, out_dir: str | None, steps: int) -> None:
    """Train under jax.profiler.trace, read the trace, optimize, report before/after."""
    import jax

    config = _config(config_path) if config_path else None
    if config is not None:
        _mesh_fits(config, 8, "`profile` runs on 8 simulated devices")
    out = Path(out_dir) if out_dir else _workdir(None, "profile")
    _output_dir(out, "`--out`")
    jax.config.update("jax_num_cpu_devices", 8)
    from sharded_training import profile as profile_mod

    config = config or profile_mod.profile_config()
    report = profile_mod.run_profile(config, out, steps=steps, progress=_echo)
    click.echo(profile_mod.summary_text(report))
    click.echo(f"report: {out / 'report.md'}, {out / 'report.json'}, {out / 'step_breakdown.png'}")


@main.command()
@click.option(
    "--out",
    "out_path",
    default="runs/bench.json",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="JSON report; a PNG is written next to it.",
)
@click.option("--steps", default=40, show_default=True, type=click.IntRange(8, 10_000))
@click.option(
    "--rounds",
    default=20,
    show_default=True,
    type=click.IntRange(2, 10_000),
    help="Interleaved timing rounds per path.",
)
def bench(out_path: str, steps: int, rounds: int) -> None:
    """The optimization at the default batch and at 16, and checkpoint blocking, with A/A."""
    import jax

    out = Path(out_path)
    if out.with_suffix(".png") == out:
        raise BadInput(f"`--out {out}` is where the plot goes; give the JSON report another name.")
    _output_dir(out.parent, "The folder of `--out`")
    jax.config.update("jax_num_cpu_devices", 8)
    from sharded_training import bench as bench_mod

    report = bench_mod.run_bench(out, steps=steps, rounds=rounds, progress=_echo)
    click.echo(bench_mod.summary_text(report))
    click.echo(f"report: {out}, {out.with_suffix('.png')}")
