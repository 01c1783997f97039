"""The compile pipeline: load -> schema pass -> discover -> rules pass -> build.

Contract: :func:`compile_catalog` never raises on bad input; it returns every
diagnostic of the run and, only when none of them is an error, the published
catalog and the site's inputs. Emitting is left to the caller (cli.py), so
the benchmark and tests can time and inspect the compile on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from catalog_compiler.build import published_catalog, site_inputs
from catalog_compiler.checks import Context, run_checks
from catalog_compiler.diagnostics import Diagnostic, Severity
from catalog_compiler.discover import discover_projects
from catalog_compiler.sources import load_catalog


@dataclass
class Compiled:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    catalog: dict | None = None
    inputs: dict[str, list[dict]] | None = None

    @property
    def ok(self) -> bool:
        return self.catalog is not None


def compile_catalog(root: Path, strict: bool = False) -> Compiled:
    """Check the catalog repository at ``root``; build it if there are no errors.

    With ``strict``, warnings are promoted to errors (and so block the build).
    """
    sources = load_catalog(root)
    discovery = discover_projects(root)
    diagnostics = sources.diagnostics + discovery.diagnostics
    diagnostics += run_checks(Context(sources, discovery))
    if strict:
        diagnostics = [d.promoted() for d in diagnostics]
    result = Compiled(diagnostics)
    if not any(d.severity is Severity.ERROR for d in diagnostics):
        result.catalog = published_catalog(sources, discovery)
        result.inputs = site_inputs(sources, discovery)
    return result
