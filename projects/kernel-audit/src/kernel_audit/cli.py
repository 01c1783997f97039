"""The `kernel-audit` command line.

    kernel-audit audit [--config FILE] [--workdir DIR]   every kernel x shape x dtype x block
    kernel-audit check M K N [--dtype D] [--blocks BM BN BK] [--activation A]
    kernel-audit train [--config FILE] [--workdir DIR]   kernels vs references, trained
    kernel-audit bench [--out FILE.json] [--size ...]     timings, each with its mode

With no `--config`, `audit` runs `Config.default()` and writes
`runs/audit-<UTC time>/report.json` and `audit.png`. On a TPU the kernels are
compiled (Mosaic); on any other machine they run in the Pallas interpreter, and
every record says which.
"""

import datetime
import sys
from pathlib import Path

import click

from kernel_audit.bench import bench
from kernel_audit.checkpoint import RecordError, check_writable
from kernel_audit.config import Config, ConfigError, load_config

# Largest operand or output `check` builds: 2**24 entries (64 MiB in float32, twice
# that for the float64 reference).
MAX_CHECK_ENTRIES = 2**24


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


def _workdir(workdir: str | None, prefix: str) -> Path:
    """The output folder, checked for writing before any work starts."""
    if workdir is None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
        workdir = str(Path("runs") / f"{prefix}-{stamp}")
    try:
        return check_writable(workdir, directory=True, what="Output folder `--workdir`")
    except RecordError as err:
        raise BadInput(str(err)) from None


def _progress(message: str) -> None:
    click.echo(message, err=True)
    sys.stderr.flush()


@click.group()
@click.version_option(package_name="kernel-audit")
def main() -> None:
    """Pallas kernels (a fused matmul, a layer norm) checked against independent
    references, with interpreted and compiled execution declared apart."""


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Output directory (default: runs/audit-<UTC time>).",
)
def audit(config_path: str | None, workdir: str | None) -> None:
    """Run the audit table; exit 1 if any executed cell breaks its error bound."""
    from kernel_audit import audit as audit_module
    from kernel_audit import checkpoint

    config = _config(config_path)
    out = _workdir(workdir, "audit")
    report = audit_module.run_audit(config, progress=_progress)
    checkpoint.save_record(out / "report.json", report)
    audit_module.plot(report, out / "audit.png")
    s = report["summary"]
    click.echo(
        f"{s['passed']}/{s['ran']} cells within their error bound ({s['refused']} block sizes "
        f"refused for their shape); largest fraction of the bound used: "
        f"{s['max_bound_used_vs_f64']:.3f}; execution mode: {', '.join(s['execution_modes'])}; "
        f"unmasked ragged edges gave NaN: {s['unmasked_edges_all_nan']}; report: {out}"
    )
    if s["failed"]:
        sys.exit(1)


@main.command()
@click.argument("m", type=int)
@click.argument("k", type=int)
@click.argument("n", type=int)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32")
@click.option("--activation", type=click.Choice(["none", "relu", "gelu"]), default="gelu")
@click.option(
    "--blocks",
    type=(int, int, int),
    default=None,
    help="BM BN BK, used as given (refused when a TPU block rule forbids them); default: "
    "256 256 512, each replaced by the whole dimension where that is smaller.",
)
@click.option(
    "--precision",
    type=click.Choice(["highest", "default"]),
    default="highest",
    show_default=True,
    help="Matmul precision of float32 operands (`default`: bfloat16 inputs on a TPU).",
)
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
def check(
    m: int,
    k: int,
    n: int,
    dtype: str,
    activation: str,
    blocks: tuple[int, int, int] | None,
    precision: str,
    seed: int,
) -> None:
    """Run the fused matmul once on an (M, K) x (K, N) problem and compare it with
    both references; block sizes invalid for the shape or dtype are refused."""
    from kernel_audit import audit as audit_module
    from kernel_audit import data, kernels

    for name, value in (("M", m), ("K", k), ("N", n)):
        if value < 1:
            raise BadInput(f"`{name}` must be at least 1, but got `{value}`.")
    for name, entries in (("x (M, K)", m * k), ("w (K, N)", k * n), ("the output (M, N)", m * n)):
        if entries > MAX_CHECK_ENTRIES:
            raise BadInput(
                f"{name} would hold {entries} entries for (M, K, N) = `{(m, k, n)}`, more "
                f"than the {MAX_CHECK_ENTRIES} `check` builds; use smaller dimensions."
            )
    if blocks is None:
        fitted = kernels.fit_matmul_blocks(m, k, n)
    else:
        fitted = kernels.MatmulBlocks(*blocks)
    record = audit_module.audit_matmul(
        data.MatmulCase("cli", m, k, n), dtype, activation, fitted, seed, precision=precision
    )
    if record.get("refused"):
        raise BadInput(record["refused"])
    click.echo(
        f"({m}, {k}) x ({k}, {n}) {dtype} {activation} at precision {precision}, blocks "
        f"{(fitted.block_m, fitted.block_n, fitted.block_k)} "
        f"[{record['execution_mode']}]: max |kernel - f64| = "
        f"{record['max_abs_error_vs_f64']:.3g}, {record['bound_used_vs_f64']:.3f} of the "
        f"bound; {'PASS' if record['passed'] else 'FAIL'}"
    )
    if not record["passed"]:
        sys.exit(1)


@main.command(name="train")
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Output directory (default: runs/train-<UTC time>).",
)
def train_command(config_path: str | None, workdir: str | None) -> None:
    """Train the small network through the kernels and through the references."""
    from kernel_audit import train

    config = _config(config_path)
    out = _workdir(workdir, "train")
    metrics = train.train_and_evaluate(config, out, progress=_progress)
    click.echo(
        f"{metrics['steps']} steps [{metrics['execution_mode']}]: loss "
        f"{metrics['losses']['kernels'][0]:.5f} -> {metrics['losses']['kernels'][-1]:.5f}; "
        f"largest relative loss gap kernels vs references {metrics['max_rel_loss_gap']:.2e}, "
        f"largest parameter gap {metrics['max_param_gap']:.2e}; metrics: {out / 'metrics.json'}"
    )


main.add_command(bench)

if __name__ == "__main__":
    main()
