"""``catalog-compile``: validate the catalog and build its route documents.

Run from anywhere inside the repository::

    catalog-compile [--root DIR] [--out DIR] [--strict] [--check] [--format text|json]
    catalog-compile coverage --role ID [--format text|html] [--out DIR] EVIDENCE_DIR...

It prints every problem it finds (``file:line:col: severity[CODE] message``
with a hint) and, when there is no error, writes ``<out>/catalog.json``,
``<out>/routes/<role>.txt`` and the site in ``<out>/site/`` (``--check``
compares instead of writing). Exit status: 0 clean (warnings allowed unless
``--strict``), 1 errors, 2 usage, 3 internal error. This module is the one
place that sets it, and the one boundary where an unexpected exception (a bug
of the compiler, never of the catalog) becomes an INT001 diagnostic and exit
status 3 instead of a traceback; ``CATALOG_COMPILE_DEBUG=1`` lets it through.

``coverage`` prints one route's milestone coverage from learners' evidence
folders (:mod:`coverage`), as text or as an HTML page in the site's style;
exit status 1 when an evidence folder cannot be read or names an unknown
project or stage (COV001-COV003), else 0, however much remains to do.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic, Severity
from catalog_compiler.source_text import exists

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
MARKER = Path("catalog") / "catalog.yaml"


def find_root(start: Path) -> Path | None:
    """Return the nearest folder at or above ``start`` that has catalog/catalog.yaml."""
    for folder in (start, *start.parents):
        if exists(folder / MARKER):
            return folder
    return None


def exit_code(diagnostics: list[Diagnostic]) -> int:
    """The exit status of a run (``--strict`` has already promoted warnings)."""
    return EXIT_ERRORS if any(d.severity is Severity.ERROR for d in diagnostics) else EXIT_OK


def _shown(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


ROOT_OPTION = click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    help="The repository (default: the one containing the current folder).",
)


def _guarded(run, fmt: str) -> None:
    """Print what ``run()`` returns and exit with its status; the one boundary where
    an unexpected exception becomes INT001 and exit 3 (see the module docstring)."""
    try:
        code, text = run()
    except click.ClickException:
        raise
    except Exception as error:
        if os.environ.get("CATALOG_COMPILE_DEBUG"):
            raise
        code, text = EXIT_INTERNAL, _internal_error(error, fmt)
    click.echo(text, nl=False)
    sys.exit(code)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@ROOT_OPTION
@click.option(
    "--out", type=click.Path(path_type=Path), help="The build folder (default: <root>/build)."
)
@click.option("--strict", is_flag=True, help="Treat warnings as errors.")
@click.option(
    "--check", is_flag=True, help="Compare the build folder with fresh outputs; write nothing."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="How to print diagnostics.",
)
@click.pass_context
def main(
    ctx: click.Context, root: Path | None, out: Path | None, strict: bool, check: bool, fmt: str
) -> None:
    """Validate the JAX Pathways catalog against the projects on disk and build it."""
    if ctx.invoked_subcommand is not None:
        return
    _guarded(lambda: _run(root, out, strict, check, fmt), fmt)


@main.command()
@click.option("--role", "role_id", required=True, help="The route (role id) to cover.")
@ROOT_OPTION
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "html"]),
    default="text",
    show_default=True,
    help="Text on standard output, or an HTML page written to --out.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the HTML page (default: <root>/build/coverage).",
)
@click.argument(
    "evidence", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path)
)
def coverage(
    role_id: str, root: Path | None, fmt: str, out: Path | None, evidence: tuple[Path, ...]
) -> None:
    """Milestone coverage of one route from EVIDENCE_DIR folders (projects' evidence/)."""
    _guarded(lambda: _coverage(role_id, root, fmt, out, list(evidence)), "text")


def _coverage(
    role_id: str, root: Path | None, fmt: str, out: Path | None, folders: list[Path]
) -> tuple[int, str]:
    from catalog_compiler import coverage_page, report
    from catalog_compiler.coverage import role_coverage, text_report
    from catalog_compiler.pipeline import compile_catalog

    root = _root(root)
    for folder in folders:
        try:
            is_folder = folder.is_dir()
        except OSError as error:  # e.g. a path longer than the system allows
            raise click.BadParameter(
                f"`{folder}` cannot be examined: {error.strerror}.", param_hint="EVIDENCE_DIR"
            ) from None
        if not is_folder:
            raise click.BadParameter(f"`{folder}` is not a folder.", param_hint="EVIDENCE_DIR")
    compiled = compile_catalog(root)
    if not compiled.ok:
        return EXIT_ERRORS, report.text_report(compiled.diagnostics, "Nothing covered.")
    roles = {r["id"]: r for r in compiled.catalog["roles"]}
    if role_id not in roles:
        raise click.BadParameter(
            f"No route `{role_id}`; known: {', '.join(sorted(roles))}.", param_hint="--role"
        )
    projects = {p["id"]: p for p in compiled.inputs["projects"]}
    lessons = {lesson["id"]: lesson for lesson in compiled.inputs["lessons"]}
    result = role_coverage(roles[role_id], lessons, projects, folders)
    text = text_report(result)
    if fmt == "html":
        out = out if out is not None else root / "build" / "coverage"
        page = coverage_page.write(out, result)
        text += f"Wrote `{page}`.\n"
    return (EXIT_ERRORS if result.diagnostics else EXIT_OK), text


def _root(root: Path | None) -> Path:
    if root is None:
        root = find_root(Path.cwd())
        if root is None:
            raise click.UsageError(
                f"No catalog repository contains `{Path.cwd()}` (no `{MARKER}` above it); "
                "run inside the repository or pass --root."
            )
    elif not exists(root / MARKER):
        raise click.BadParameter(
            f"`{root}` is not a catalog repository: it has no `{MARKER}`.", param_hint="--root"
        )
    return root


def _internal_error(error: Exception, fmt: str) -> str:
    from catalog_compiler import report

    detail = (str(error).strip().splitlines() or [""])[0][:200]
    message = (
        f"catalog-compile failed unexpectedly: `{type(error).__name__}"
        + (f": {detail}" if detail else "")
        + "`; this is a bug of the compiler, not a problem of the catalog."
    )
    hint = rules.INTERNAL_ERROR.hint + " Set CATALOG_COMPILE_DEBUG=1 to see the traceback."
    diagnostic = rules.INTERNAL_ERROR.at("catalog-compile", START, "", message, hint)
    outcome = "Nothing written."
    if fmt == "json":
        return report.json_report([diagnostic], outcome, EXIT_INTERNAL)
    return report.text_report([diagnostic], outcome)


def _out_problem(out: Path) -> str | None:
    """Why ``out`` cannot be a build folder, if an existing ancestor is not a folder."""
    for folder in out.absolute().parents:
        if exists(folder):
            if not folder.is_dir():
                return f"`{out}` lies below `{folder}`, which is not a folder."
            return None
    return None


def _run(
    root: Path | None, out: Path | None, strict: bool, check: bool, fmt: str
) -> tuple[int, str]:
    from catalog_compiler import emit, report
    from catalog_compiler.pipeline import compile_catalog

    root = _root(root)
    out = out if out is not None else root / "build"
    if problem := _out_problem(out):
        raise click.BadParameter(problem, param_hint="--out")
    compiled = compile_catalog(root, strict=strict)
    diagnostics = compiled.diagnostics
    outcome = "Nothing written."
    if compiled.ok:
        shown = _shown(out, root)
        if check:
            diagnostics = diagnostics + emit.check_build(
                out, shown, compiled.catalog, compiled.inputs
            )
            outcome = f"`{shown}` is up to date." if exit_code(diagnostics) == 0 else ""
        else:
            try:
                emit.write_build(out, compiled.catalog, compiled.inputs)
            except emit.OutputFolderError as error:
                raise click.BadParameter(str(error), param_hint="--out") from None
            except OSError as error:
                reason = error.strerror or str(error)
                raise click.BadParameter(
                    f"`{out}` cannot be written: {reason}.", param_hint="--out"
                ) from None
            roles = len(compiled.catalog["roles"])
            outcome = f"Wrote `{shown}` ({roles} route{'' if roles == 1 else 's'})."
    code = exit_code(diagnostics)
    if fmt == "json":
        return code, report.json_report(diagnostics, outcome, code)
    return code, report.text_report(diagnostics, outcome)


if __name__ == "__main__":  # python -m catalog_compiler.cli
    main(prog_name="catalog-compile")
