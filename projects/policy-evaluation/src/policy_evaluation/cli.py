"""`policy-evaluation`: train PPO over seeds and evaluate it on held-out keys, or bench.

  policy-evaluation train [--env cartpole|gridworld] [--config FILE] [--workdir DIR]
  policy-evaluation bench [--size default|tiny] [--out runs/bench.json]
  policy-evaluation inspect [--env ...] [--config FILE]

With no options, `train` runs the embedded default config of the environment
and writes under `runs/<env>/`: `report.md`, `metrics.json`, `config.json`,
`params.npz`, `learning_curves.png`, `eval_per_seed.png`.
"""

import sys
import time
from pathlib import Path

import click
import jax

from policy_evaluation.config import Config, ConfigError
from policy_evaluation.devices import DeviceError, request_cpu_devices


class BadInput(click.ClickException):
    """A user-facing error: printed as one message, exit code 2, no traceback."""

    exit_code = 2


def _output_dir(path: Path, what: str) -> None:
    """An output folder must be creatable: checked before training, not after."""
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise BadInput(f"{what} `{path}` cannot be created: `{existing}` is not a directory.")


def _progress(message: str) -> None:
    click.echo(f"[policy-evaluation] {message}", err=True)


def _config(env: str, path: str | None) -> Config:
    if path is None:
        return Config.default(env)
    config = Config.from_json(path)
    if config.env != env and env != "from-config":
        raise ConfigError(
            f"`--env {env}` disagrees with `env = {config.env}` in `{path}`; "
            f"pass `--env {config.env}` or drop `--env`."
        )
    return config


@click.group()
@click.version_option(package_name="policy-evaluation")
def main() -> None:
    """Functional environments, scan rollouts and PPO judged by an exact evaluator."""


@main.command()
@click.option(
    "--env", type=click.Choice(["cartpole", "gridworld"]), default="cartpole", show_default=True
)
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
def inspect(env: str, config_path: str | None) -> None:
    """Print the validated config as JSON."""
    try:
        click.echo(_config(env, config_path).to_json(), nl=False)
    except ConfigError as err:
        raise BadInput(str(err)) from None


@main.command()
@click.option(
    "--env", type=click.Choice(["cartpole", "gridworld"]), default="cartpole", show_default=True
)
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option(
    "--workdir", type=click.Path(file_okay=False), help="Output folder [default: runs/<env>]."
)
def train(env: str, config_path: str | None, workdir: str | None) -> None:
    """Train all seeds (vmapped), evaluate on held-out keys, write the report."""
    from policy_evaluation.checkpoint import save_params
    from policy_evaluation.report import worst_seed_trajectory, write_report
    from policy_evaluation.train import run_experiment, seed_keys

    try:
        config = _config(env, config_path)
    except ConfigError as err:
        raise BadInput(str(err)) from None
    out = Path(workdir) if workdir else Path("runs") / config.env
    _output_dir(out, "`--workdir`")
    request_cpu_devices(config.seed_shards)
    start = time.perf_counter()
    try:
        result = run_experiment(config, progress=_progress)
    except DeviceError as err:  # More seed shards than CPU devices: found before training.
        raise BadInput(str(err)) from None
    seconds = time.perf_counter() - start
    worst = result["summary"]["worst_seed"]
    _, eval_keys = seed_keys(config)
    traj_key = jax.random.fold_in(eval_keys[worst], 1)
    params_w = jax.tree.map(lambda x: x[worst], result["params"])
    trajectory = worst_seed_trajectory(config, params_w, traj_key)
    write_report(out, config, result, seconds, trajectory)
    (out / "config.json").write_text(config.to_json(), encoding="utf-8")
    save_params(out / "params.npz", result["params"])
    s = result["summary"]
    click.echo(
        f"{s['metric']}: mean {s['mean']:.4f} +- {s['ci95_half_width']:.4f} over "
        f"{config.num_seeds} seeds; per seed {[round(v, 4) for v in s['per_seed']]}"
    )
    if "exact" in result:
        ex = result["exact"]
        click.echo(
            f"exact V(start): trained {[round(v, 4) for v in ex['trained_per_seed']]}, "
            f"uniform {ex['uniform_random']:.4f}, optimal {ex['optimal']:.4f}"
        )
    click.echo(
        f"{seconds:.1f} s (training + evaluation, compilation included); report: "
        f"{out / 'report.md'}"
    )


@main.command()
@click.option(
    "--size", type=click.Choice(["default", "tiny"]), default="default", show_default=True
)
@click.option(
    "--out", type=click.Path(dir_okay=False), default="runs/bench.json", show_default=True
)
def bench(size: str, out: str) -> None:
    """Time the three ratios side by side; JSON + PNG report."""
    if Path(out).with_suffix(".png") == Path(out):
        raise BadInput(f"`--out {out}` is where the plot goes; give the JSON report another name.")
    _output_dir(Path(out).parent, "The folder of `--out`")
    try:
        import gymnasium  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "`bench` compares with gymnasium, which is not installed; "
            "install the test extra: pip install -e '.[test]'."
        ) from None
    from policy_evaluation.bench import ppo_config, run_bench

    request_cpu_devices(ppo_config(size).seed_shards)
    try:
        report = run_bench(size, Path(out), progress=_progress)
    except DeviceError as err:
        raise BadInput(str(err)) from None
    for name, value in report["ratios"].items():
        target = report["targets"].get(name)
        click.echo(f"{name}: {value:.2f}" + (f" (target >= {target:g})" if target else ""))
    click.echo(f"report: {out}")


if __name__ == "__main__":
    sys.exit(main())
