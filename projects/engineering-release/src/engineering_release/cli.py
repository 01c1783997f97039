"""The `engineering-release` command line.

    engineering-release register [--config FILE] [--seed N]   train, store, register a model
    engineering-release evaluate MODEL_ID                      store a bound evaluation report
    engineering-release keygen NAME [--valid-days D] [--untrusted]
    engineering-release approve MODEL_ID EVALUATION_ID [--key PEM] [--signer NAME]
    engineering-release release MODEL_ID [--timeout S]         gates, readiness, commit, switch
    engineering-release rollback [--to ENTRY]                  back to an earlier release
    engineering-release status [--json]
    engineering-release verify                                 exit 1 if anything is wrong
    engineering-release serve [--port P] [--candidate-nice N]  the serving host (127.0.0.1)
    engineering-release set-policy FILE
    engineering-release bench [--out FILE.json]

State lives under `--root` (default `runs/release`, made absolute at once).
Every command but `serve` and `bench` first finishes what a killed command
left (see `release.recover`), then holds the state's lock (see `durable`) for
each commit it makes and no longer: training, evaluating, signing and a
candidate's readiness run unlocked, and what they assumed is checked again
under the lock before anything is written (see `release`). Exit codes: 0
done, 1 refused or verification failed (the reason is printed; nothing
changed), 2 bad input (a value that names nothing, a malformed file). Bad
input is refused before anything is written.
"""

import json
import logging
import math
import signal
import sys
import tempfile
import time
from pathlib import Path

import click

from engineering_release.config import (
    ConfigError,
    TrainConfig,
    load_policy,
    load_train_config,
    shown,
)

DEFAULT_KEY = "release-manager"
CANDIDATE_NICE = 0  # `serve --candidate-nice`: see `engineering_release.candidate`.


class BadInput(click.ClickException):
    """Bad input: one message, exit code 2, no traceback."""

    exit_code = 2


class Refused(click.ClickException):
    """A refused command or failed verification: exit code 1, nothing changed."""

    exit_code = 1


def _quiet_mlflow() -> None:
    # MLflow announces schema creation and migrations on INFO; the commands print their own.
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _state(ctx: click.Context):
    """The release state, after recovery; its procedures lock it for each commit,
    saying so on stderr when they must wait. (Call inside `_errors()`: a state
    that cannot be read raises its own error.)"""
    from engineering_release import release

    root = ctx.obj["root"]
    state = release.State(
        root,
        on_wait=lambda: click.echo(
            f"waiting for another command on `{root}` to commit ...", err=True
        ),
    )
    _quiet_mlflow()
    for line in release.recover(state):
        click.echo(f"recovered: {line}", err=True)
    return state


def _finite(ctx: click.Context, param: click.Parameter, value):
    """A click callback: refuses NaN and infinity (click's ranges let NaN through)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number.", ctx=ctx, param=param)
    return value


def _errors():
    """Maps the package's refusals to exit codes (as a context manager)."""
    from contextlib import contextmanager

    from engineering_release import (
        checkpoint,
        evaluation,
        gates,
        ledger,
        registry,
        release,
        signing,
        store,
    )

    @contextmanager
    def mapping():
        try:
            yield
        except (store.StoreError, ConfigError, release.StateError, checkpoint.ArtifactError) as err:
            raise BadInput(str(err)) from None
        except (
            release.ReleaseRefused,
            gates.GateRefused,
            evaluation.EvaluationMismatch,
            signing.SignatureRefused,
            ledger.LedgerError,
            registry.RegistryError,
        ) as err:
            raise Refused(str(err)) from None

    return mapping()


@click.group()
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    default="runs/release",
    show_default=True,
    help="The release state directory.",
)
@click.version_option(package_name="engineering-release")
@click.pass_context
def main(ctx: click.Context, root: str) -> None:
    """Releases bound to immutable model and evaluation identities, with gates that
    keep the previous release serving."""
    ctx.obj = {"root": Path(root).resolve()}


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="TrainConfig JSON file.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), help="Override the config's seed.")
@click.pass_context
def register(ctx: click.Context, config_path: str | None, seed: int | None) -> None:
    """Train the classifier, store it by content id, and register it in MLflow."""
    with _errors():
        config = load_train_config(config_path) if config_path else TrainConfig.default()
        if seed is not None:
            config = config.model_copy(update={"seed": seed})
        state = _state(ctx)
        from engineering_release import release, train

        click.echo(
            f"training: hidden {config.hidden_size}, {config.num_epochs} epochs, "
            f"seed {config.seed} ...",
            err=True,
        )
        start = time.perf_counter()
        trained = train.train(config)
        click.echo(
            f"trained in {time.perf_counter() - start:.1f} s; final epoch loss "
            f"{trained.epoch_losses[-1]:.4f}",
            err=True,
        )
        with tempfile.TemporaryDirectory() as tmp:
            train.write_model(trained, Path(tmp) / "model")
            model_id, version = release.register(state, Path(tmp) / "model")
        click.echo(f"model {model_id}  registry version {version}")


@main.command()
@click.argument("model_id")
@click.pass_context
def evaluate(ctx: click.Context, model_id: str) -> None:
    """Evaluate MODEL_ID on the policy's held-out set; store the bound report."""
    with _errors():
        state = _state(ctx)
        from engineering_release import release

        evaluation_id, report = release.evaluate(state, model_id)
        m = report["metrics"]
        click.echo(
            f"accuracy {m['accuracy']:.4f} ({m['correct']}/{m['count']})  "
            f"min class recall {m['min_class_recall']:.4f}"
        )
        click.echo(f"evaluation {evaluation_id}")


@main.command()
@click.argument("name")
@click.option(
    "--valid-days",
    type=click.FloatRange(min=0.0, max=36_500.0, min_open=True),
    default=365.0,
    show_default=True,
    callback=_finite,
)
@click.option("--untrusted", is_flag=True, help="Do not add the key to the keyring.")
@click.pass_context
def keygen(ctx: click.Context, name: str, valid_days: float, untrusted: bool) -> None:
    """Create an Ed25519 signing key NAME (and trust it, unless --untrusted)."""
    from engineering_release import signing

    if not name.replace("-", "").replace("_", "").isalnum() or not name.isascii():
        raise BadInput(f"Key name `{shown(name)}` must be ASCII letters, digits, `-` and `_` only.")
    with _errors():
        from engineering_release import release

        state = release.State(ctx.obj["root"])
        with state.lock():
            kid, path = signing.generate_key(
                state.keys, name, valid_days=valid_days, trust=not untrusted
            )
    click.echo(f"key {kid} at {path}" + ("" if not untrusted else " (not trusted)"))


@main.command()
@click.argument("model_id")
@click.argument("evaluation_id")
@click.option(
    "--key",
    "key_path",
    type=click.Path(dir_okay=False),
    help=f"Private key PEM (default: keys/{DEFAULT_KEY}.pem, created if missing).",
)
@click.option("--signer", default=None, help="Name recorded in the approval.")
@click.pass_context
def approve(
    ctx: click.Context, model_id: str, evaluation_id: str, key_path: str | None, signer: str | None
) -> None:
    """Verify EVALUATION_ID for MODEL_ID, sign the approval, append it to the log."""
    if key_path is not None and not Path(key_path).is_file():
        raise BadInput(f"No key file at `{shown(key_path)}`.")
    with _errors():
        state = _state(ctx)
        from engineering_release import release, signing

        if key_path is None:
            key_path = state.keys / f"{DEFAULT_KEY}.pem"
            if not Path(key_path).exists():
                # Every check before this first write: the default key is created only
                # for a command that will sign.
                model_id, evaluation_id = release.check_approvable(state, model_id, evaluation_id)
                kid, _ = signing.generate_key(state.keys, DEFAULT_KEY)
                click.echo(
                    f"created signing key {kid} ({DEFAULT_KEY}), trusted for 365 days", err=True
                )
        entry = release.approve(
            state, model_id, evaluation_id, Path(key_path), signer or Path(key_path).stem
        )
        click.echo(f"approved: log entry {entry['seq']} {entry['hash']}")


def _outcome(outcome) -> None:
    click.echo(f"{outcome.kind}: {outcome.model_id} (was {outcome.previous_model_id})")
    click.echo(f"  log entry {outcome.entry['seq']} {outcome.entry['hash']}")
    click.echo(f"  readiness: {outcome.readiness.get('where')}")
    if outcome.switched is not None:
        click.echo(f"  traffic: {outcome.switched.get('message')}")
    click.echo("  " + "  ".join(f"{k} {v:.2f}" for k, v in outcome.timings.items()))


@main.command()
@click.argument("model_id")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=3600.0),
    default=120.0,
    show_default=True,
    callback=_finite,
    help="Seconds a candidate may take to become ready.",
)
@click.pass_context
def release(ctx: click.Context, model_id: str, timeout: float) -> None:
    """Release MODEL_ID: gates, candidate readiness, commit, registry, switch."""
    with _errors():
        state = _state(ctx)
        from engineering_release import release as procedures

        _outcome(procedures.release(state, model_id, readiness_timeout_s=timeout))


@main.command()
@click.option("--to", default=None, help="Hash (prefix >= 8) of the release entry to return to.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=3600.0),
    default=120.0,
    show_default=True,
    callback=_finite,
)
@click.pass_context
def rollback(ctx: click.Context, to: str | None, timeout: float) -> None:
    """Return to an earlier release (default: the previous) with a new log entry."""
    with _errors():
        state = _state(ctx)
        from engineering_release import release as procedures

        _outcome(procedures.rollback(state, to, readiness_timeout_s=timeout))


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show what serves, what served before, and what the registry and host say."""
    with _errors():
        state = _state(ctx)
        from engineering_release import release

        out = release.status(state)
    if as_json:
        click.echo(json.dumps(out, indent=1))
        return
    click.echo(f"log entries {out['log_entries']}  objects {out['objects']}")
    click.echo(f"serving  {out['serving']}")
    click.echo(f"previous {out['previous']}")
    reg = out["registry"]
    click.echo(f"registry champion {reg['champion']}  previous {reg['previous']}")
    click.echo(f"host {out['host']}")


@main.command()
@click.pass_context
def verify(ctx: click.Context) -> None:
    """Check the whole record; exit 1 with every problem if anything is wrong."""
    with _errors():
        state = _state(ctx)
        from engineering_release import release

        start = time.perf_counter()
        problems = release.verify(state)
        elapsed = time.perf_counter() - start
        entries = len(state.entries())
        objects = len(state.store.ids())
    if problems:
        for line in problems:
            click.echo(f"problem: {line}", err=True)
        raise Refused(f"{len(problems)} problem(s) in {entries} log entries.")
    click.echo(
        f"verified: {entries} log entries, {objects} objects, registry agrees ({elapsed:.3f} s)"
    )


@main.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Router port on 127.0.0.1 (0: a free port).",
)
@click.option(
    "--candidate-nice",
    type=click.IntRange(0, 19),
    default=CANDIDATE_NICE,
    show_default=True,
    help="How much lower (nice value) each candidate server's start-up runs: its imports, "
    "load, self-test and compile; serving afterwards keeps normal priority.",
)
@click.pass_context
def serve(ctx: click.Context, port: int, candidate_nice: int) -> None:
    """Run the serving host until SIGINT/SIGTERM; it follows the release log."""
    from engineering_release.serve import Host

    root = Path(ctx.obj["root"])
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"Cannot use `{root}` as the release state: {err.strerror}.") from None
    host = Host(root, port=port, candidate_nice=candidate_nice).start(host_file=root / "host.json")
    click.echo(
        f"serving host on http://127.0.0.1:{host.port} (follows {root / 'ledger.jsonl'})", err=True
    )
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        host.stop()
        (root / "host.json").unlink(missing_ok=True)


@main.command(name="set-policy")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_context
def set_policy(ctx: click.Context, path: str) -> None:
    """Put the policy in FILE in force (approvals signed under another stop passing)."""
    with _errors():
        policy = load_policy(path)
        state = _state(ctx)
        state.set_policy(policy)
    click.echo(f"policy {policy.name} {policy.sha256()[:12]} in force")


@main.command()
@click.option(
    "--out", type=click.Path(dir_okay=False), default="runs/bench.json", show_default=True
)
@click.option("--switches", type=click.IntRange(2, 100), default=10, show_default=True)
@click.option("--clients", type=click.IntRange(1, 32), default=4, show_default=True)
@click.option("--verify-entries", type=click.IntRange(2, 10_000), default=100, show_default=True)
@click.option(
    "--candidate-nice",
    type=click.IntRange(0, 19),
    default=CANDIDATE_NICE,
    show_default=True,
    help="The serving host's `serve --candidate-nice`.",
)
def bench(out: str, switches: int, clients: int, verify_entries: int, candidate_nice: int) -> None:
    """Failed requests and p99 latency during switches vs steady state; verify time."""
    target = Path(out).resolve()
    if target.suffix != ".json":
        raise BadInput(f"`--out {out}` must name a `.json` file (the plot goes beside it).")
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise BadInput(f"`--out {out}`: `{ancestor}` is a file, not a directory.")
    _quiet_mlflow()
    from engineering_release.bench import run_bench

    report = run_bench(
        Path(out),
        switches=switches,
        clients=clients,
        verify_entries=verify_entries,
        candidate_nice=candidate_nice,
        echo=lambda s: click.echo(s, err=True),
    )
    for name, value in report["ratios"].items():
        click.echo(f"{name:28s} {value:8.3f}")
    for name, value in report["verdicts"].items():
        click.echo(f"{name:28s} {value}")
    click.echo(f"report: {out}")


if __name__ == "__main__":
    sys.exit(main())
