"""Emit the outputs: catalog.json, route texts and the static site.

Contract: :func:`render` writes the full set of outputs into an empty
folder. :func:`write_build` renders into a temporary sibling of ``out`` and
swaps it into place, so a failed run never leaves a half-written build.
:func:`check_build` renders into a temporary folder and returns one CHK
diagnostic per missing, extra or different file in ``out``; it writes nothing
to ``out``. The renderer modules (route text, Jinja2 site) are imported
lazily: checking a catalog does not pay for them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from catalog_compiler import rules
from catalog_compiler.diagnostics import START, Diagnostic, Position

CATALOG_JSON = "catalog.json"
# What the compiler writes at the top of a build folder; anything else there
# means the folder is not a build and must not be replaced.
OWNED = {CATALOG_JSON, "routes", "site"}


class OutputFolderError(Exception):
    """``--out`` names a folder that the compiler must not replace."""


def catalog_json(catalog: dict) -> str:
    """The text of catalog.json: indent 2, UTF-8 as is, trailing newline."""
    return json.dumps(catalog, indent=2, ensure_ascii=False) + "\n"


def render(dest: Path, catalog: dict, inputs: dict[str, list[dict]]) -> None:
    """Write every output into the empty folder ``dest``."""
    from catalog_compiler.route_text import route_text
    from catalog_compiler.site import write_site

    (dest / CATALOG_JSON).write_text(catalog_json(catalog), encoding="utf-8")
    routes = dest / "routes"
    routes.mkdir()
    for role in catalog["roles"]:
        # newline="" keeps the text byte for byte (no platform newline translation).
        with open(routes / f"{role['id']}.txt", "w", encoding="utf-8", newline="") as f:
            f.write(route_text(role))
    site = dest / "site"
    site.mkdir()
    write_site(site, catalog, **inputs)


def _guard(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise OutputFolderError(f"The output path `{out}` exists and is not a folder.")
    if out.is_dir():
        entries = {p.name for p in out.iterdir()}
        if entries and (not entries <= OWNED or CATALOG_JSON not in entries):
            raise OutputFolderError(
                f"The output folder `{out}` holds files that catalog-compile did not write; "
                "choose an empty folder or an earlier build folder for --out."
            )


def write_build(out: Path, catalog: dict, inputs: dict[str, list[dict]]) -> None:
    """Render into a temporary sibling of ``out``, then swap it into place."""
    _guard(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-new-", dir=out.parent))
    try:
        render(staging, catalog, inputs)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
        out.rename(old / "build")
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _files(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}


def first_difference(a: Any, b: Any, ptr: str = "") -> str | None:
    """Return the JSON pointer of the first place where ``a`` and ``b`` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{ptr}/{key}"
            found = first_difference(a[key], b[key], f"{ptr}/{key}")
            if found is not None:
                return found
        return None if list(a) == list(b) else ptr  # Same keys, other order.
    if isinstance(a, list) and isinstance(b, list):
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{ptr}/{index}")
            if found is not None:
                return found
        return None if len(a) == len(b) else f"{ptr}/{min(len(a), len(b))}"
    return None if a == b and type(a) is type(b) else ptr


def check_build(
    out: Path, shown: str, catalog: dict, inputs: dict[str, list[dict]]
) -> list[Diagnostic]:
    """Compare ``out`` (shown in messages as ``shown``) with a fresh render."""
    with tempfile.TemporaryDirectory(prefix="catalog-check-") as tmp:
        expected_dir = Path(tmp)
        render(expected_dir, catalog, inputs)
        expected = _files(expected_dir)
        actual = _files(out) if out.is_dir() else {}
        found = []
        for name in sorted(expected.keys() - actual.keys()):
            message = f"The output file `{name}` is missing from `{shown}`."
            found.append(rules.BUILD_MISSING.at(f"{shown}/{name}", START, "", message))
        for name in sorted(actual.keys() - expected.keys()):
            message = f"The file `{name}` in `{shown}` is not an output of this catalog."
            found.append(rules.BUILD_EXTRA.at(f"{shown}/{name}", START, "", message))
        for name in sorted(expected.keys() & actual.keys()):
            new, old = expected[name].read_bytes(), actual[name].read_bytes()
            if new != old:
                found.append(_difference(name, shown, new, old))
        return found


def _difference(name: str, shown: str, new: bytes, old: bytes) -> Diagnostic:
    ptr, where = "", ""
    if name == CATALOG_JSON:
        try:
            ptr = first_difference(json.loads(new), json.loads(old)) or ""
            where = f" first at `{ptr or '/'}`"
        except ValueError:
            where = " (the file there is not valid JSON)"
    line = next(
        (
            i
            for i, (a, b) in enumerate(zip(new.splitlines(), old.splitlines(), strict=False), 1)
            if a != b
        ),
        min(new.count(b"\n"), old.count(b"\n")) + 1,
    )
    message = f"The output file `{name}` differs from what the catalog compiles to{where}."
    return rules.BUILD_DIFFERS.at(f"{shown}/{name}", Position(line, 1), ptr, message)
