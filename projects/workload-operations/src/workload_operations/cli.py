"""`workload-operations`: run, supervise, drill and read a supervised training job.

    workload-operations run                 # the job alone, in the foreground
    workload-operations supervise           # the job under a supervisor, restarts, verifier
    workload-operations drill               # every fault, 5 times each, diagnosed
    workload-operations incidents           # the incident records kept under runs/
    workload-operations report runs/drill-...   # a drill's report (Markdown + PNG)
    workload-operations verify --workdir W  # judge W's recovery points
    workload-operations bench               # observation cost and detection times

Everything is written under `runs/`. Bad input (an unknown fault, a config
whose heartbeat interval is not shorter than its timeouts, a missing or
damaged checkpoint folder) exits with status 2 and one message.
"""

import json
import sys
import time
from pathlib import Path

import click

from workload_operations import faults
from workload_operations.config import Config, ConfigError, check_output_path, load


def _config(path: str | None) -> Config:
    try:
        return load(path)
    except ConfigError as err:
        raise click.BadParameter(str(err), param_hint="--config") from None


def _fault(ctx, param, value: str | None) -> str:
    if not value:
        return ""
    try:
        return str(faults.parse(value))
    except faults.FaultError as err:
        raise click.BadParameter(str(err)) from None


def _stamp(prefix: str) -> Path:
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def _output(path: str | Path, option: str, *, directory: bool = True) -> Path:
    """`path` checked for writing before anything starts (a usage error if it cannot be)."""
    try:
        return check_output_path(path, directory=directory, what="The output path")
    except ConfigError as err:
        raise click.BadParameter(str(err), param_hint=option) from None


def _read_error(err: Exception, hint: str) -> click.BadParameter:
    return click.BadParameter(str(err), param_hint=hint)


@click.group()
def main() -> None:
    """A supervised JAX training job: observed, failed on purpose, continued only
    from an accepted recovery point."""


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="Config JSON (default: built in).")
@click.option("--workdir", type=click.Path(), help="Output folder (default: runs/run-<time>).")
@click.option("--fault", callback=_fault, help="Inject KIND@STEP, e.g. `kill@50`.")
@click.option("--resume", is_flag=True, help="Continue from the latest accepted step.")
def run(config_path, workdir, fault, resume) -> None:
    """Run the job in the foreground; heartbeats are printed as JSON lines."""
    config = _config(config_path)
    if fault:
        try:
            faults.check(faults.parse(fault), config)
        except faults.FaultError as err:
            raise click.BadParameter(str(err), param_hint="--fault") from None
    workdir = _output(workdir or _stamp("run"), "--workdir")
    if resume:
        _check_checkpoints(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "config.json"
    config_file.write_text(config.to_json(), encoding="utf-8")
    from workload_operations import job

    argv = ["--config", str(config_file), "--workdir", str(workdir)]
    argv += ["--fault", fault] if fault else []
    argv += ["--resume"] if resume else []
    code = job.main(argv)
    if code:
        sys.exit(code)
    click.echo(f"done; metrics and checkpoints in {workdir}", err=True)


def _check_checkpoints(workdir: Path) -> None:
    if not (workdir / "checkpoints").is_dir() or not (workdir / "ledger").is_dir():
        raise click.BadParameter(
            f"`{workdir}` holds no checkpoint folder and ledger to resume from; give the "
            f"workdir of a run that saved checkpoints.",
            param_hint="--workdir",
        )


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="Config JSON (default: built in).")
@click.option(
    "--workdir", type=click.Path(), help="Output folder (default: runs/supervise-<time>)."
)
@click.option("--fault", callback=_fault, help="Inject KIND@STEP into the first attempt.")
@click.option("--restarts", type=click.IntRange(0, 100), default=1, show_default=True)
def supervise(config_path, workdir, fault, restarts) -> None:
    """Run the job under the supervisor; after an incident, verify and continue."""
    from workload_operations.supervisor import supervise as run_supervised

    config = _config(config_path)
    if fault:
        try:
            faults.check(faults.parse(fault), config)
        except faults.FaultError as err:
            raise click.BadParameter(str(err), param_hint="--fault") from None
    workdir = _output(workdir or _stamp("supervise"), "--workdir")
    result = run_supervised(
        config, workdir, fault=fault, restarts=restarts, say=lambda m: click.echo(m, err=True)
    )
    last = result["outcomes"][-1]
    click.echo(
        json.dumps(
            {
                "workdir": str(workdir.absolute()),
                "attempts": [o.status for o in result["outcomes"]],
                "incidents": [o.incident_path for o in result["outcomes"] if o.incident_path],
                "finished": last.finished,
            },
            indent=1,
        )
    )
    if last.status != "completed":
        sys.exit(1)


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="Config JSON (default: tiny).")
@click.option("--out", type=click.Path(), help="Output folder (default: runs/drill-<time>).")
@click.option("--faults", "kinds", default=",".join(faults.DRILL_FAULTS), show_default=True)
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--parallel", type=click.IntRange(1, 64), default=6, show_default=True)
@click.option("--at-step", type=click.IntRange(1), default=24, show_default=True)
def drill(config_path, out, kinds, repeats, parallel, at_step) -> None:
    """Inject every fault REPEATS times and check each diagnosis."""
    from workload_operations.drill import run_drills
    from workload_operations.report import drill_report

    config = _config(config_path) if config_path else Config.tiny()
    names = [k.strip() for k in kinds.split(",") if k.strip()]
    if not names:
        raise click.BadParameter(
            f"`{kinds}` names no fault; choose from {', '.join(faults.DRILL_FAULTS)}.",
            param_hint="--faults",
        )
    for name in names:
        if name not in faults.DRILL_FAULTS:
            raise click.BadParameter(
                f"Unknown drill fault `{name}`; choose from {', '.join(faults.DRILL_FAULTS)}.",
                param_hint="--faults",
            )
    out = _output(out or _stamp("drill"), "--out")
    try:
        summary = run_drills(
            config,
            out,
            kinds=names,
            repeats=repeats,
            parallel=parallel,
            at_step=at_step,
            say=lambda m: click.echo(m, err=True),
        )
    except faults.FaultError as err:
        raise click.BadParameter(str(err), param_hint="--at-step") from None
    text = drill_report(out)
    (out / "report.md").write_text(text, encoding="utf-8")
    click.echo(text)
    if summary["correct"] != summary["runs"]:
        sys.exit(1)


@main.command()
@click.argument("root", type=click.Path(), default="runs")
def incidents(root) -> None:
    """List the incident records kept under ROOT."""
    from workload_operations.report import ReportError, find_incidents, incident_rows, table

    if not Path(root).is_dir():
        raise click.BadParameter(f"`{root}` is not a folder.", param_hint="ROOT")
    try:
        records = find_incidents(root)
    except ReportError as err:
        raise _read_error(err, "ROOT") from None
    header = ["incident", "class", "detection/bound (intervals)", "diagnosis"]
    click.echo(table(header, incident_rows(records)))
    click.echo(f"{len(records)} incident(s) under {root}", err=True)


@main.command()
@click.argument("drill_dir", type=click.Path())
def report(drill_dir) -> None:
    """Write and print the report of the drill in DRILL_DIR."""
    from workload_operations.report import ReportError, drill_report

    if not (Path(drill_dir) / "summary.json").is_file():
        raise click.BadParameter(
            f"`{drill_dir}` holds no `summary.json`; give a folder written by "
            f"`workload-operations drill`.",
            param_hint="DRILL_DIR",
        )
    _output(Path(drill_dir) / "report.md", "DRILL_DIR", directory=False)
    try:
        text = drill_report(drill_dir)
    except ReportError as err:
        raise _read_error(err, "DRILL_DIR") from None
    (Path(drill_dir) / "report.md").write_text(text, encoding="utf-8")
    click.echo(text)


@main.command()
@click.option("--workdir", type=click.Path(), required=True)
def verify(workdir) -> None:
    """Judge WORKDIR's requested checkpoints in this process: accept or reject each."""
    from workload_operations import checkpoint, verifier

    workdir = Path(workdir)
    _check_checkpoints(workdir)
    try:
        verdicts = verifier.verify(workdir)
    except (checkpoint.CheckpointError, ConfigError) as err:
        raise click.BadParameter(str(err), param_hint="--workdir") from None
    for v in verdicts:
        click.echo(
            f"step {v['step']:>6}: {'accepted' if v['accepted'] else 'REJECTED'} "
            + "; ".join(v["reasons"])
        )
    click.echo(f"latest accepted step: {checkpoint.latest_accepted(workdir)}")


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="Config JSON (default: tiny).")
@click.option("--out", type=click.Path(), default="runs/bench.json", show_default=True)
@click.option("--reps", type=click.IntRange(3), default=20, show_default=True)
@click.option("--chunk", type=click.IntRange(10), default=200, show_default=True)
@click.option("--detection-repeats", type=click.IntRange(0), default=3, show_default=True)
def bench(config_path, out, reps, chunk, detection_repeats) -> None:
    """Step time unobserved vs observed; detection of a hang and a death."""
    from workload_operations.bench import bench as run_bench

    config = _config(config_path) if config_path else Config.tiny()
    _output(out, "--out", directory=False)
    _output(Path(out).parent / (Path(out).stem + "-drills"), "--out")
    result = run_bench(
        config,
        Path(out),
        reps=reps,
        chunk=chunk,
        detection_repeats=detection_repeats,
        say=lambda m: click.echo(m, err=True),
    )
    for name, m in result["measurements"].items():
        click.echo(
            f"{name:<32} median {m['median_s'] * 1e3:8.2f} ms  p90 {m['p90_s'] * 1e3:8.2f} ms"
            f"  (compile {m['compile_s']:.2f} s, n={m['n']})"
        )
    for name, value in result["ratios"].items():
        click.echo(f"{name:<36} {value:.4f}")
    for kind, d in result["detection_intervals"].items():
        click.echo(
            f"detection {kind:<6} {d['intervals_min']:.1f}..{d['intervals_max']:.1f} "
            f"intervals (bound {d['bound_intervals']:.1f}, {d['correct']} correct)"
        )
    click.echo(result["verdict"])
    click.echo(f"written to {out}", err=True)


if __name__ == "__main__":
    main()
