"""The `bayesian-regression` command line.

    bayesian-regression fit      [--config FILE] [--workdir DIR]   exact posterior + VI
    bayesian-regression sample   [--config FILE] [--workdir DIR] [--target T] [--sampler S]
                                 [--step-size-factor F]            draws to a checkpoint
    bayesian-regression diagnose RUN_DIR                           R-hat, ESS, rank plot
    bayesian-regression report   [--config FILE] [--workdir DIR]   everything, one report
    bayesian-regression bench    [--out FILE.json]                 vmapped chains, HMC vs NUTS

With no `--config` the commands use `Config.default()`; outputs go under `runs/`.

Exit codes: 0 done; 1 `diagnose` found the draws NOT trustworthy (R-hat, ESS or
divergences); 2 bad input (a usage error, a config, checkpoint or output path
that cannot be used), with a one-line message naming it and nothing written.
"""

import os
import sys
from pathlib import Path

import click

from bayesian_regression.checkpoint import SAMPLERS, TARGETS, CheckpointError
from bayesian_regression.config import Config, ConfigError, load_config
from bayesian_regression.data import DataError
from bayesian_regression.diagnostics import DiagnosticError
from bayesian_regression.hmc import check_step_size_factor


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


def _output_dir(path: str | Path, option: str) -> Path:
    """Checks, without creating anything, that the directory `path` exists or can be
    made: it is a directory, or its nearest existing ancestor is a writable one."""
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        where = "it is" if probe == path else f"`{probe}` is"
        raise BadInput(f"`{option}` `{path}` cannot be a directory: {where} a file.")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise BadInput(f"`{option}` `{path}` cannot be written: `{probe}` is not writable.")
    return path


def _drop_closed_loop_noise() -> None:
    """Orbax restores the arrays of a checkpoint concurrently through tensorstore. When
    one read fails (a damaged checkpoint), Orbax closes its asyncio loop while other
    reads are still pending; their callbacks then raise `RuntimeError('Event loop is
    closed')` as "unraisable" exceptions, which Python prints as tracebacks after
    `diagnose` has already reported the damage in one line. The command line drops
    exactly those; every other unraisable exception goes on to the previous hook."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_loop", False):
        return

    def hook(unraisable) -> None:
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        previous(unraisable)

    hook.drops_closed_loop = True
    sys.unraisablehook = hook


def _say(message: str) -> None:
    click.echo(message, err=True)


config_option = click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default="runs/default",
    show_default=True,
    help="Output directory.",
)


@click.group()
@click.version_option(package_name="bayesian-regression")
def main() -> None:
    """Bayesian linear regression with an exact posterior that judges hand-built HMC
    and VI, and sampler diagnostics checked against ArviZ and NumPyro."""


@main.command()
@config_option
@workdir_option
def fit(config_path: str | None, workdir: str) -> None:
    """Exact posterior and mean-field / full-rank VI; writes fit.json."""
    from bayesian_regression import train

    config = _config(config_path)
    _output_dir(workdir, "--workdir")
    _say("fitting mean-field and full-rank VI (compiles first, ~10 s) ...")
    result = train.fit_and_evaluate(config, Path(workdir))
    for family, s in result["vi"].items():
        click.echo(
            f"{family:9s}  ELBO {s['elbo']:.3f}  KL(q||p) {s['kl']:.4f}  "
            f"variance ratio {' '.join(f'{r:.3f}' for r in s['var_ratio'])}"
        )
    click.echo(f"wrote {Path(workdir) / 'fit.json'}")


@main.command()
@config_option
@workdir_option
@click.option("--target", type=click.Choice(TARGETS), default="regression", show_default=True)
@click.option("--sampler", type=click.Choice(SAMPLERS), default="hmc", show_default=True)
@click.option(
    "--step-size-factor",
    type=float,
    default=1.0,
    show_default=True,
    help="Multiplies the adapted HMC step size, in [0.001, 1000] (above ~2 provokes divergences).",
)
def sample(config_path, workdir, target, sampler, step_size_factor) -> None:
    """Draw posterior samples; writes a checkpoint and a trace plot under WORKDIR/TARGET-SAMPLER."""
    from bayesian_regression import reports

    config = _config(config_path)
    try:
        check_step_size_factor(step_size_factor, "--step-size-factor")
    except DataError as err:
        raise BadInput(str(err)) from None
    if sampler == "nuts" and target != "regression":
        raise BadInput(f"`--sampler nuts` runs the regression only, not `{target}`.")
    run_dir = _output_dir(workdir, "--workdir") / f"{target}-{sampler}"
    if run_dir.exists() and not run_dir.is_dir():
        raise BadInput(f"The run directory `{run_dir}` is a file; remove it or pick another.")
    _say(
        f"sampling {target} with {sampler}: {config.num_chains} chains x "
        f"({config.num_warmup} warm-up + {config.num_samples}) ..."
    )
    out = reports.sample_to_checkpoint(config, Path(workdir), target, sampler, step_size_factor)
    click.echo(f"wrote {out}")


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
def diagnose(run_dir: str) -> None:
    """R-hat, bulk/tail ESS (by hand and by ArviZ), divergences and a rank plot.

    Exit code 0 when the verdict is trustworthy, 1 when it is not, 2 for a
    checkpoint that cannot be read."""
    from bayesian_regression import reports

    _drop_closed_loop_noise()
    try:
        result = reports.diagnose_checkpoint(Path(run_dir))
    except (CheckpointError, DiagnosticError) as err:
        raise BadInput(str(err)) from None
    click.echo(reports.format_diagnostics(result))
    if result["verdict"] != "trustworthy":
        sys.exit(1)


@main.command()
@config_option
@workdir_option
def report(config_path: str | None, workdir: str) -> None:
    """Everything: exact vs HMC vs NUTS vs VI, diagnostics, the funnel; report.md + plots."""
    from bayesian_regression import reports

    config = _config(config_path)
    _output_dir(workdir, "--workdir")
    path = reports.full_report(config, Path(workdir), progress=_say)
    click.echo(path.read_text(encoding="utf-8"))


@main.command()
@click.option(
    "--out", type=click.Path(dir_okay=False), default="runs/bench.json", show_default=True
)
@click.option("--repeats", type=click.IntRange(3, 1000), default=20, show_default=True)
def bench(out: str, repeats: int) -> None:
    """8 vmapped chains vs 8 sequential ones; HMC vs NUTS effective samples per second."""
    from bayesian_regression import bench as bench_module

    out_path = Path(out)
    _output_dir(out_path.parent, "--out")
    _output_dir(out_path.parent / "jax-cache", "--out")
    result = bench_module.run(Path(out), repeats=repeats, progress=_say)
    click.echo(bench_module.format_table(result))


if __name__ == "__main__":
    sys.exit(main())
