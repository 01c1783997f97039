"""The `reproducible-experiments` command line.

    reproducible-experiments train [--config FILE]        a tracked run of the digits MLP
    reproducible-experiments show RUN_ID                  the run's record, as JSON
    reproducible-experiments inventory                    every run, its status, counts
    reproducible-experiments compare SPEC.yaml            a frozen, paired comparison
    reproducible-experiments analyze PARENT_RUN_ID        re-analyze one from the store
    reproducible-experiments reproduce RUN_ID             re-run from the record, bitwise
    reproducible-experiments bench [--out FILE.json]      what tracking costs

Every command takes `--tracking-uri` (default: the SQLite file `runs/mlflow.db`
under the current directory; a plain path means a SQLite file there, or give
`http://127.0.0.1:5000` for an `mlflow server`) and `--experiment` (default
`digits`). The store is always named explicitly, never MLflow's fallback.
Look at the runs with `mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`.

A tracking server that cannot be reached ends `train` and `compare` with one
line (exit code 1) within the retry bound of `outage`; what the store did not
receive is kept under `runs/unsent/` and written by the next `train` or
`compare` on that store.
"""

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from reproducible_experiments.config import Config, ConfigError, load_config
from reproducible_experiments.tracking import DEFAULT_EXPERIMENT, TrackingError


class BadInput(click.ClickException):
    """A user-facing error: printed as one message, exit code 2, no traceback."""

    exit_code = 2


class StoreDown(click.ClickException):
    """The tracking server went away: one message, exit code 1, no traceback."""

    exit_code = 1


def _config(path: str | None) -> Config:
    if path is None:
        return Config.default()
    try:
        return load_config(path)
    except ConfigError as err:
        raise BadInput(str(err)) from None


def _store(uri: str | None, experiment: str, *, create: bool = True) -> tuple[Any, str]:
    """The client and experiment id; `create=False` (for reading) needs both to exist.
    `create=True` (for writing) first settles the runs kept in `runs/unsent/`."""
    from reproducible_experiments import outage, tracking

    try:
        client = tracking.connect(uri, create=create)
        if create:
            # What a run kept while this store was unreachable is written first, so
            # that the run ends FAILED with its error rather than reconciled as KILLED.
            outage.settle_unsent(client)
            return client, tracking.experiment_id(client, experiment)
        return client, tracking.existing_experiment_id(client, experiment)
    except TrackingError as err:
        raise BadInput(str(err)) from None


def _client(uri: str | None) -> Any:
    """A client of an existing store: for the commands that read a run."""
    from reproducible_experiments import tracking

    try:
        return tracking.connect(uri, create=False)
    except TrackingError as err:
        raise BadInput(str(err)) from None


def _check_out_dir(out: str | None) -> None:
    """A report folder must be creatable; checked before any work, not after."""
    if out is None:
        return
    parent = Path(out).absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"`--out {out}` cannot be created: `{parent}` is not a directory.")


def _check_out_file(out: str) -> None:
    """A JSON report path whose folder can be made and which is not the plot's path."""
    path = Path(out)
    if path.with_suffix(".png") == path:
        raise BadInput(f"`--out {out}` is where the plot goes; give the JSON report another name.")
    _check_out_dir(str(path.parent))


def _experiment_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.strip():
        raise click.BadParameter(f"the experiment name `{value}` is blank.")
    return value


_uri = click.option(
    "--tracking-uri",
    "tracking_uri",
    default=None,
    help="Tracking store: a SQLite path, `sqlite:///...` or `http://...` (default: "
    "runs/mlflow.db).",
)
_experiment = click.option(
    "--experiment",
    default=DEFAULT_EXPERIMENT,
    show_default=True,
    callback=_experiment_name,
    help="Experiment name.",
)


def _epoch_line(record: dict[str, float]) -> None:
    if record["epoch"] == 1 or record["epoch"] % 20 == 0:
        click.echo(
            f"epoch {int(record['epoch']):>4}  train loss {record['train_loss']:.4f}  "
            f"val loss {record['val_loss']:.4f}  val acc {record['val_accuracy']:.4f}",
            err=True,
        )


@click.group()
@click.version_option(package_name="reproducible-experiments")
def main() -> None:
    """MLflow provenance that survives failure, on a JAX classifier of scikit-learn's
    digits: run identities, complete inventories, frozen comparisons, reproduction."""
    # Keep stdout for our own output (`--json` must be parseable): MLflow otherwise
    # prints a "View run at" line to stdout whenever a run on a server ends.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    from reproducible_experiments import outage

    outage.bound_http_retries()
    # A server that went away is reported once, by `StoreDown`; urllib3's
    # "Retrying ..." warnings and MLflow's background-writer errors would repeat it.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    logging.getLogger("mlflow.utils.async_logging").setLevel(logging.CRITICAL)


@main.command(name="train")
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option("--train-seed", type=click.IntRange(0, 2**31 - 1), help="Override `train_seed`.")
@click.option("--eval-seed", type=click.IntRange(0, 2**31 - 1), help="Override `eval_seed`.")
@click.option(
    "--checkpoint/--no-checkpoint",
    default=True,
    show_default=True,
    help="Attach an Orbax checkpoint of the trained parameters to the run.",
)
@_uri
@_experiment
def train_command(
    config_path: str | None,
    train_seed: int | None,
    eval_seed: int | None,
    checkpoint: bool,
    tracking_uri: str | None,
    experiment: str,
) -> None:
    """Train and evaluate as a tracked run (identities, metrics, artifacts)."""
    from reproducible_experiments import record, train

    config = _config(config_path)
    changes = {
        k: v for k, v in (("train_seed", train_seed), ("eval_seed", eval_seed)) if v is not None
    }
    if changes:
        config = config.replace(**changes)
    from reproducible_experiments.outage import StoreUnavailable

    client, exp_id = _store(tracking_uri, experiment)
    try:
        run_id, result, status = record.run_tracked(
            client, exp_id, config, progress=_epoch_line, save_checkpoint=checkpoint
        )
    except StoreUnavailable as err:
        raise StoreDown(str(err)) from None
    assert result is not None
    summary = train.summary(result)
    click.echo(
        f"run {run_id} {status}: test accuracy {summary['test_accuracy']:.4f}, "
        f"test loss {summary['test_loss']:.4f}, training {summary['train_s']:.2f} s "
        f"(store {client.tracking_uri}, experiment `{experiment}`)"
    )


@main.command()
@click.argument("run_ids", nargs=-1, required=True)
@_uri
def show(run_ids: tuple[str, ...], tracking_uri: str | None) -> None:
    """Print each run's record as a JSON list: status, config, seeds, code, data and
    runtime identities, split IDs and every metric value, read from the store alone."""
    from reproducible_experiments import record

    client = _client(tracking_uri)
    payload = []
    for run_id in run_ids:
        try:
            rec = record.load_record(client, run_id)
        except TrackingError as err:
            raise BadInput(str(err)) from None
        payload.append(
            {
                "run_id": rec.run_id,
                "status": rec.status,
                **rec.identities(),
                "metrics": {
                    name: [list(v) for v in series] for name, series in rec.metrics.items()
                },
                "params_sha256": rec.tags.get("result.params_sha256"),
                "split_ids": rec.split_ids,
            }
        )
    click.echo(json.dumps(payload, indent=1, sort_keys=True))


@main.command()
@_uri
@_experiment
@click.option("--json", "as_json", is_flag=True, help="Print the inventory as JSON.")
@click.option(
    "--page-size",
    default=1000,
    show_default=True,
    type=click.IntRange(1, 50_000),
    help="Runs per search call (every page is read).",
)
def inventory(tracking_uri: str | None, experiment: str, as_json: bool, page_size: int) -> None:
    """List every run of the experiment (deleted ones too) with its status, and
    count the runs by status. Read-only: nothing is marked or deleted."""
    from reproducible_experiments import inventory as inv

    client, exp_id = _store(tracking_uri, experiment, create=False)
    result = inv.inventory(client, experiment, exp_id, page_size=page_size)
    click.echo(json.dumps(result.to_json(), indent=1) if as_json else inv.render(result))


@main.command()
@click.argument("spec_path", type=click.Path())
@_uri
@_experiment
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Report directory (default: runs/comparisons/<spec name>).",
)
def compare(spec_path: str, tracking_uri: str | None, experiment: str, out: str | None) -> None:
    """Register SPEC (a frozen question), run every pair as child runs, and
    report the paired analysis read back from the store (markdown + PNG)."""
    from reproducible_experiments import comparison

    try:
        spec = comparison.load_spec(spec_path)
    except comparison.SpecError as err:
        raise BadInput(str(err)) from None
    _check_out_dir(out)
    from reproducible_experiments.outage import StoreUnavailable

    client, exp_id = _store(tracking_uri, experiment)
    try:
        ran = comparison.run_comparison(
            client, exp_id, spec, progress=lambda line: click.echo(line, err=True)
        )
    except comparison.FrozenSpecError as err:
        raise BadInput(str(err)) from None
    except StoreUnavailable as err:
        raise StoreDown(str(err)) from None
    _report(client, ran.parent_run_id, out)


@main.command()
@click.argument("parent_run_id")
@_uri
@click.option("--out", type=click.Path(file_okay=False), help="Report directory.")
def analyze(parent_run_id: str, tracking_uri: str | None, out: str | None) -> None:
    """Analyze a registered comparison again, from the store alone."""
    _check_out_dir(out)
    client = _client(tracking_uri)
    _report(client, parent_run_id, out)


def _report(client: Any, parent_run_id: str, out: str | None) -> None:
    from reproducible_experiments import comparison

    try:
        analysis = comparison.analyze(client, parent_run_id)
    except (TrackingError, comparison.SpecError) as err:
        raise BadInput(str(err)) from None
    out_dir = Path(out) if out else Path("runs") / "comparisons" / analysis.spec.name
    paths = comparison.write_report(client, analysis, out_dir)
    click.echo(comparison.report_markdown(analysis))
    click.echo(f"report: {', '.join(str(p) for p in paths)}")


@main.command()
@click.argument("run_id")
@_uri
@click.option("--no-track", is_flag=True, help="Do not record the re-run as a new run.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def reproduce(run_id: str, tracking_uri: str | None, no_track: bool, as_json: bool) -> None:
    """Recover RUN_ID's config, code commit, data identity and seeds from the
    record, re-run it, and compare every metric value bit for bit. Exits 0 only
    for a reproduction; 1 when an identity differs or the numbers do."""
    from reproducible_experiments import reproduce as rep

    client = _client(tracking_uri)
    try:
        result = rep.reproduce(client, run_id, track=not no_track, progress=_epoch_line)
    except TrackingError as err:
        raise BadInput(str(err)) from None
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=1))
    else:
        for kind, diffs in result.identity_differences.items():
            if not diffs:
                click.echo(f"{kind} identity: matches")
            for key, (old, new) in diffs.items():
                click.echo(f"{kind} identity differs: {key}: recorded `{old}`, now `{new}`")
        click.echo(
            f"metrics: {result.values_compared} values compared, "
            f"{len(result.metric_mismatches)} series differ"
        )
        for name, what in result.metric_mismatches.items():
            click.echo(f"  {name}: {what}")
        checks = {
            "params digest": result.params_sha256_equal,
            "checkpoint": result.checkpoint_equal,
        }
        for name, equal in checks.items():
            if equal is not None:
                click.echo(f"{name}: {'bitwise equal' if equal else 'DIFFERS'}")
        click.echo(f"verdict: {result.verdict}")
    sys.exit(0 if result.reproduced else 1)


@main.command()
@click.option(
    "--out",
    default="runs/bench.json",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="JSON report (a PNG is written beside it).",
)
@click.option("--config", "config_path", type=click.Path(), help="Workload config (JSON).")
@click.option("--reps", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--values", default=200, show_default=True, type=click.IntRange(1, 100_000))
def bench(out: str, config_path: str | None, reps: int, values: int) -> None:
    """Time batched vs per-value metric logging, and training untracked vs tracked."""
    from reproducible_experiments.bench import bench as run_bench

    config = _config(config_path)
    _check_out_file(out)
    report = run_bench(
        out,
        config=config,
        reps=reps,
        values=values,
        progress=lambda line: click.echo(line, err=True),
    )
    click.echo(f"{'path':<22} {'median s':>10} {'p90 s':>10} {'n':>4}")
    for name, m in report["measurements"].items():
        click.echo(f"{name:<22} {m['median_s']:>10.4f} {m['p90_s']:>10.4f} {m['n']:>4}")
    for name, value in report["ratios"].items():
        click.echo(f"{name:<22} {value:>10.3f}")
    click.echo(f"report: {out} and {Path(out).with_suffix('.png')}")
