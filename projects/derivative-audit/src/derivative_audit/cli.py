"""The `derivative-audit` command line.

    derivative-audit audit FUNCTION [--dtype float64|float32] [--config FILE] [--workdir DIR]
    derivative-audit inspect MODULE:FUNCTION [--shape 8] [--dtype float32]
                             [--modes jvp,vjp] [--float-policy float32] [--random-ok]
    derivative-audit report [--config FILE] [--workdir DIR]
    derivative-audit bench [--out FILE.json] [--size default|tiny]

`audit` runs the stage-1 checks on one suite function (or on `MODULE:FUNCTION`,
a function of one array); `inspect` audits a program's jaxpr (stage 3);
`report` runs all three stages over the whole suite. Output goes under `runs/`.
"""

import datetime
import importlib
import json
import re
from pathlib import Path

import click

from derivative_audit.config import Config, ConfigError, load_config


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


def _stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")


def _progress(line: str) -> None:
    click.echo(line, err=True)


def _float_dtype(name: str) -> str:
    """Validates a dtype name for a derivative check: `float64` or `float32`."""
    import numpy as np

    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        raise BadInput(f"Unknown dtype `{name}`; use `float64` or `float32`.") from None
    if dtype.name not in ("float64", "float32"):
        raise BadInput(
            f"`--dtype {name}`: derivative checks need a floating-point dtype, `float64` or "
            f"`float32`, not `{dtype.name}`."
        )
    return dtype.name


def _jax_dtype(name: str):
    """Validates a dtype name for a traced input: one JAX has arrays of."""
    import jax.numpy as jnp
    import numpy as np

    try:
        dtype = jnp.dtype(name)
    except (TypeError, ValueError):
        raise BadInput(f"Unknown dtype `{name}`; use e.g. `float32`, `int32` or `bool`.") from None
    numeric = jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)
    # NumPy's extended precision (float128, complex256 on x86) has no JAX counterpart.
    extended = dtype.name not in ("float64", "complex128") and dtype in (
        np.dtype(np.longdouble),
        np.dtype(np.clongdouble),
    )
    if not numeric or extended or dtype.kind in "mMOSU":  # timedelta64 counts as a number
        raise BadInput(
            f"`--dtype {name}`: JAX has no arrays of dtype `{dtype.name}`; use a number or "
            f"bool dtype such as `float32`, `int32` or `bool`."
        )
    return dtype


def _output(path: str | Path, option: str, is_dir: bool) -> Path:
    """An output path that can be written, checked before any work is done."""
    from derivative_audit import checkpoint

    try:
        return checkpoint.check_output_path(path, is_dir=is_dir)
    except checkpoint.OutputPathError as err:
        raise BadInput(f"`{option}`: {err}") from None


def _load_callable(spec: str):
    """`package.module:function` -> the function; a clear error otherwise."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadInput(f"Expected `MODULE:FUNCTION`, got `{spec}`.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise BadInput(f"Cannot import module `{module_name}`: {err}.") from None
    except (TypeError, ValueError) as err:  # a relative name (`.mod`), a NUL byte
        raise BadInput(f"`{module_name}` is not a module name: {err}.") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise BadInput(f"Module `{module_name}` has no function `{attr}`.")
    return fn


MAX_SIZE = 2**31 - 1  # the largest dimension XLA indexes with int32


def _shape(text: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(,\d+)*", text.replace(" ", "")):
        raise BadInput(
            f"`--shape` must be comma-separated positive sizes like `8` or `3,4`, got `{text}`."
        )
    shape = tuple(int(s) for s in text.replace(" ", "").split(","))
    if any(s < 1 for s in shape):
        raise BadInput(f"`--shape` sizes must be positive, got `{text}`.")
    if any(s > MAX_SIZE for s in shape):
        raise BadInput(f"`--shape` sizes must be at most {MAX_SIZE}, got `{text}`.")
    return shape


# `audit MODULE:FUNCTION` builds n x m Jacobians both ways: keep n where that is cheap
# (the suite's own bound, `Config.n`, is 256).
MAX_AUDIT_WIDTH = 4096


@click.group()
@click.version_option(package_name="derivative-audit")
def main() -> None:
    """JVPs, VJPs and custom derivative rules checked by independent means, and
    programs audited through their jaxprs."""


@main.command()
@click.argument("function")
@click.option(
    "--dtype",
    default="float64",
    show_default=True,
    help="float64, or float32 (finite differences then judged against float64).",
)
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option(
    "--shape",
    default="8",
    show_default=True,
    help="Input shape for a `MODULE:FUNCTION` (a vector: one size).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Output directory (default: runs/audit-<function>-<dtype>-<UTC time>).",
)
def audit(
    function: str, dtype: str, config_path: str | None, shape: str, workdir: str | None
) -> None:
    """Stage-1 checks of one function: linearity, transpose, Jacobians, finite differences."""
    from derivative_audit import audit as audit_mod
    from derivative_audit import checkpoint, checks, data, functions, plots

    config = _config(config_path)
    dtype = _float_dtype(dtype)
    try:
        if ":" in function:
            dims = _shape(shape)
            if len(dims) != 1 or dims[0] > MAX_AUDIT_WIDTH:
                raise BadInput(
                    f"`audit` takes a vector input of at most {MAX_AUDIT_WIDTH} values "
                    f"(one size), got `--shape {shape}`."
                )
            problem = data.problem_from_callable(
                function, _load_callable(function), dims, dtype, config.seed
            )
            reference = None
        else:
            problem = data.make_problem(function, config, dtype)
            reference = data.make_problem(function, config, "float64").fn
    except (functions.UnknownFunction, data.ProblemError) as err:
        raise BadInput(str(err)) from None
    label = problem.name.replace(":", ".")
    out = _output(workdir or Path("runs") / f"audit-{label}-{dtype}-{_stamp()}", "--workdir", True)
    try:
        report = audit_mod.audit_problem(problem, config, reference, progress=_progress)
    except checks.DerivativeInputError as err:
        raise BadInput(str(err)) from None
    checkpoint.save_record(out / "report.json", report)
    plots.sweep_plot([report], out / "sweep.png", f"{problem.name} ({dtype})")
    for check in report["checks"]:
        mark = "ok  " if check["passed"] else "FAIL"
        click.echo(
            f"{mark} {check['check']:<22} rel error {check['rel_error']:.2e} "
            f"(tolerance {check['tolerance']:.1e})"
        )
    click.echo(report["verdict"])
    click.echo(f"report: {out / 'report.json'}; sweep plot: {out / 'sweep.png'}")
    if not audit_mod.passed(report):
        raise SystemExit(1)


@main.command()
@click.argument("target")
@click.option("--shape", default="8", show_default=True, help="Input shape, e.g. `8` or `3,4`.")
@click.option("--dtype", default="float32", show_default=True, help="Input dtype.")
@click.option(
    "--modes",
    default="jvp,vjp",
    show_default=True,
    help="Differentiation modes the program must support.",
)
@click.option(
    "--float-policy",
    type=click.Choice(["float32", "float64", "none"]),
    default="float32",
    show_default=True,
    help="float32: no float64 value may appear.",
)
@click.option("--random-ok", is_flag=True, help="Allow random bits (default: deterministic).")
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    help="Write the audit JSON here (default: runs/inspect-<target>.json).",
)
def inspect(
    target: str,
    shape: str,
    dtype: str,
    modes: str,
    float_policy: str,
    random_ok: bool,
    out_path: str | None,
) -> None:
    """Audit the jaxpr of MODULE:FUNCTION (one array argument): primitives, shapes,
    dtypes, the documented table, and the reasons for any rejection."""
    import jax

    from derivative_audit import checkpoint, jaxpr_audit

    fn = _load_callable(target)
    dims = _shape(shape)
    np_dtype = _jax_dtype(dtype)
    wanted = tuple(m.strip() for m in modes.split(",") if m.strip())
    if not wanted:
        raise BadInput(f"`--modes` must name `jvp`, `vjp` or both, got `{modes}`.")
    try:
        policy = jaxpr_audit.Policy(
            modes=wanted,
            float_dtype=None if float_policy == "none" else float_policy,
            deterministic=not random_ok,
        )
    except ValueError as err:
        raise BadInput(str(err)) from None
    out = _output(
        out_path or Path("runs") / f"inspect-{target.replace(':', '.')}.json", "--out", False
    )
    # Tracing needs only the shape and dtype: no array is made, whatever its size.
    x = jax.ShapeDtypeStruct(dims, np_dtype)
    try:
        result = jaxpr_audit.audit(fn, (x,), policy)
    except jaxpr_audit.AuditInputError as err:
        raise BadInput(str(err)) from None
    click.echo(f"{target}: inputs {list(result.inputs)} -> outputs {list(result.outputs)}")
    for heading, counts in (("", result.counts), ("in custom rules: ", result.rule_counts)):
        for name, count in counts.items():
            doc = jaxpr_audit.primitives.TABLE.get(name)
            modes_text = ",".join(sorted(doc.modes)) if doc else "?"
            summary = doc.summary if doc else "not in the documented table"
            click.echo(f"  {heading}{count:>4} x {name:<20} [{modes_text or 'none'}] {summary}")
    for finding in result.findings:
        click.echo(
            f"REJECT {finding.rule}: {finding.reason} at {finding.source or '?'}"
            f"{' in ' + finding.path if finding.path else ''}"
        )
    click.echo(
        f"verdict: {'accepted' if result.accepted else 'rejected'} "
        f"({len(result.findings)} findings, {len(result.equations)} equations)"
    )
    checkpoint.save_record(out, result.to_json())
    click.echo(f"audit: {out}")
    if not result.accepted:
        raise SystemExit(1)


@main.command()
@click.option("--config", "config_path", type=click.Path(), help="JSON config file.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Output directory (default: runs/report-<UTC time>).",
)
def report(config_path: str | None, workdir: str | None) -> None:
    """All three stages over the suite: report.json, report.md and PNG plots."""
    from derivative_audit import report as report_mod

    config = _config(config_path)
    out = _output(workdir or Path("runs") / f"report-{_stamp()}", "--workdir", True)
    summary = report_mod.build(config, out, progress=_progress)
    for line in summary["verdicts"]:
        click.echo(line)
    click.echo(f"report: {out / 'report.md'} (figures in {out / 'report.json'})")
    if not summary["passed"]:
        raise SystemExit(1)


@main.command()
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    default="runs/bench.json",
    show_default=True,
    help="Where to write the JSON report (a PNG goes beside it).",
)
@click.option(
    "--size",
    type=click.Choice(["default", "tiny"]),
    default="default",
    show_default=True,
    help="`tiny` runs in seconds (smoke test), no claims.",
)
@click.option(
    "--rounds",
    type=click.IntRange(3, 200),
    default=None,
    help="Timed rounds per path (default: 20, tiny: 3).",
)
def bench(out_path: str, size: str, rounds: int | None) -> None:
    """Implicit vs unrolled gradients of a fixed-point solve; HVP vs the full Hessian."""
    from derivative_audit import bench as bench_mod

    if not Path(out_path).name:
        raise BadInput(f"`--out` must name a JSON file, got `{out_path}`.")
    _output(out_path, "--out", False)
    _output(Path(out_path).with_suffix(".png"), "--out (its PNG)", False)
    result = bench_mod.run(size, rounds, progress=_progress)
    path = bench_mod.write(result, out_path)
    click.echo(bench_mod.table(result))
    click.echo(json.dumps(result["ratios"], indent=1))
    click.echo(f"bench: {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
