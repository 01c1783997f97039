"""The `bayesian-regression` command line.

    bayesian-regression fit      [--config FILE] [--workdir DIR]   exact posterior + VI
    bayesian-regression sample   [--config FILE] [--workdir DIR] [--target T] [--sampler S]
                                 [--step-size-factor F]            draws to a checkpoint
    bayesian-regression diagnose RUN_DIR                           R-hat, ESS, rank plot
    bayesian-regression report   [--config FILE] [--workdir DIR]   everything, one report
    bayesian-regression bench    [--out FILE.json]                 vmapped chains, HMC vs NUTS

With no `--config` the commands use `Config.default()`; outputs go under `runs/`.
"""

import sys
from pathlib import Path

import click

from bayesian_regression.checkpoint import CheckpointError
from bayesian_regression.config import Config, ConfigError, load_config
from bayesian_regression.diagnostics import DiagnosticError

TARGETS = ("regression", "funnel-centered", "funnel-noncentered")


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
@click.option("--sampler", type=click.Choice(["hmc", "nuts"]), default="hmc", show_default=True)
@click.option(
    "--step-size-factor",
    type=float,
    default=1.0,
    show_default=True,
    help="Multiplies the adapted HMC step size (above ~2 provokes divergences).",
)
def sample(config_path, workdir, target, sampler, step_size_factor) -> None:
    """Draw posterior samples; writes a checkpoint and a trace plot under WORKDIR/TARGET-SAMPLER."""
    from bayesian_regression import reports

    config = _config(config_path)
    if not step_size_factor > 0.0:
        raise BadInput(f"`--step-size-factor` must be positive, got `{step_size_factor}`.")
    if sampler == "nuts" and target != "regression":
        raise BadInput(f"`--sampler nuts` runs the regression only, not `{target}`.")
    _say(
        f"sampling {target} with {sampler}: {config.num_chains} chains x "
        f"({config.num_warmup} warm-up + {config.num_samples}) ..."
    )
    out = reports.sample_to_checkpoint(config, Path(workdir), target, sampler, step_size_factor)
    click.echo(f"wrote {out}")


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
def diagnose(run_dir: str) -> None:
    """R-hat, bulk/tail ESS (by hand and by ArviZ), divergences and a rank plot."""
    from bayesian_regression import reports

    try:
        result = reports.diagnose_checkpoint(Path(run_dir))
    except (CheckpointError, DiagnosticError) as err:
        raise BadInput(str(err)) from None
    click.echo(reports.format_diagnostics(result))


@main.command()
@config_option
@workdir_option
def report(config_path: str | None, workdir: str) -> None:
    """Everything: exact vs HMC vs NUTS vs VI, diagnostics, the funnel; report.md + plots."""
    from bayesian_regression import reports

    config = _config(config_path)
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

    result = bench_module.run(Path(out), repeats=repeats, progress=_say)
    click.echo(bench_module.format_table(result))


if __name__ == "__main__":
    sys.exit(main())
