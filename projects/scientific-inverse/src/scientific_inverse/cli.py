"""The `scientific-inverse` command line.

    scientific-inverse fit [--config FILE] [--workdir DIR] [--overwrite]
    scientific-inverse simulate [--system oscillator|pendulum] [--dt DT] [--t-end T] ...
    scientific-inverse bench [--size tiny|default] [--out FILE.json]

With no `--config`, `fit` runs `Config.default()`: (c, k) recovered within a
few standard errors, the error budget, grid convergence, profiles, Fisher
designs, coverage over 400 seeds and the sensitivity study; the report
(`report.md`, `fits.png`, `profiles.png`, `convergence.png`, `result.json`)
goes to `runs/fit-<UTC time>/`.
"""

import datetime
import sys
from pathlib import Path

import click
import numpy as np

from scientific_inverse.bench import bench
from scientific_inverse.config import Config, ConfigError, check_output_path, load_config
from scientific_inverse.data import DataError
from scientific_inverse.model import SYSTEMS, ParameterError
from scientific_inverse.train import FitError


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


def _output(path: str, *, directory: bool, what: str) -> Path:
    """`path` checked for writing before any work starts (`BadInput` if it cannot be)."""
    try:
        return check_output_path(path, directory=directory, what=what)
    except ConfigError as err:
        raise BadInput(str(err)) from None


def _numbers(text: str, option: str) -> list[float]:
    """`"1,0.3,4"` -> `[1.0, 0.3, 4.0]`; `BadInput` naming the option and the text."""
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise BadInput(
            f"`{option} {text}` must be comma-separated numbers, e.g. `1,0.3,4`."
        ) from None


@click.group()
@click.version_option(package_name="scientific-inverse")
def main() -> None:
    """Batched ODE simulation with scan, checked sensitivities, and a damped
    oscillator's parameters recovered with their error budget."""


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Report directory (default: runs/fit-<UTC time>).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing report at --workdir.")
def fit(config_path: str | None, workdir: str | None, overwrite: bool) -> None:
    """Recover (c, k) from synthetic observations and write the report."""
    from scientific_inverse.train import fit_and_evaluate

    config = _config(config_path)
    if workdir is None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
        workdir = str(Path("runs") / f"fit-{stamp}")
    if (Path(workdir) / "report.md").exists() and not overwrite:
        raise BadInput(f"`{workdir}` already holds a report; pass --overwrite to replace it.")
    _output(workdir, directory=True, what="Report folder `--workdir`")
    try:
        result = fit_and_evaluate(
            config, workdir, progress=lambda message: click.echo(message, err=True)
        )
    except (DataError, FitError, ParameterError) as err:
        raise BadInput(str(err)) from None
    ref = result["fit"]["refined"]
    cov = result["coverage"]
    click.echo(
        f"c = {ref['theta'][0]:.4f} +- {ref['se'][0]:.4f}, k = {ref['theta'][1]:.4f} +- "
        f"{ref['se'][1]:.4f} (truth {config.damping:g}, {config.stiffness:g}); "
        f"coverage {cov['rate'][0]:.3f}/{cov['rate'][1]:.3f} at {cov['nominal']:g}; "
        f"report: {Path(workdir) / 'report.md'}"
    )


@main.command()
@click.option(
    "--system",
    "system_name",
    type=click.Choice(sorted(SYSTEMS)),
    default="oscillator",
    show_default=True,
)
@click.option(
    "--param",
    "params",
    multiple=True,
    required=False,
    help="One parameter set as comma-separated values (m,c,k or L,c); repeatable "
    "(one trajectory each). Default: one preset set.",
)
@click.option("--y0", default="1.0,0.0", show_default=True, help="Initial state, shared.")
@click.option("--dt", default=0.01, show_default=True, type=float, help="RK4 step.")
@click.option("--t-end", default=10.0, show_default=True, type=float, help="End time.")
@click.option(
    "--plot",
    "plot_path",
    default="runs/simulate.png",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="PNG of the trajectories and their phase portraits.",
)
def simulate(
    system_name: str, params: tuple[str, ...], y0: str, dt: float, t_end: float, plot_path: str
) -> None:
    """Integrate a batch of trajectories with RK4 in `lax.scan`; print the final states
    and plot every trajectory (state against time and the phase portrait)."""
    from scientific_inverse import plots, solver

    system = SYSTEMS[system_name]
    defaults = {"oscillator": "1.0,0.3,4.0", "pendulum": "1.0,0.2"}
    rows = [_numbers(p, "--param") for p in (params or (defaults[system_name],))]
    width = len(system.param_names)
    for text, row in zip(params, rows, strict=False):
        if len(row) != width:
            raise BadInput(
                f"`--param {text}` has {len(row)} values, but the {system_name} takes "
                f"{width}: {','.join(system.param_names)}."
            )
    theta = np.array(rows)
    start = np.array(_numbers(y0, "--y0"))
    if start.shape != (2,):
        raise BadInput(
            f"`--y0 {y0}` has {start.shape[0]} values, but the state has 2: "
            f"{','.join(system.state_names)}."
        )
    _output(plot_path, directory=False, what="Plot file `--plot`")
    try:
        run = solver.simulate(
            system, theta, np.broadcast_to(start, (theta.shape[0], start.shape[0])), t_end, dt
        )
    except ParameterError as err:
        raise BadInput(str(err)) from None
    click.echo(f"ys shape (batch, time, state) = {run.ys.shape}")
    for row, final in zip(theta, run.ys[:, -1], strict=True):
        click.echo(f"{system.param_names} = {row.tolist()}: y({t_end:g}) = {final.tolist()}")
    labels = [
        ", ".join(f"{n}={v:g}" for n, v in zip(system.param_names, row, strict=True))
        for row in theta
    ]
    path = plots.trajectories(
        Path(plot_path), run.ts, np.asarray(run.ys), labels, system.state_names
    )
    click.echo(f"trajectories plotted to {path}")


main.add_command(bench)

if __name__ == "__main__":
    sys.exit(main())
