"""`python progress.py hint [STAGE]` and `python progress.py watch`.

The hint ladder is for one region: the one the stage's last failing check
points at (the unwritten region its error names, or one inside a function
the failing test calls), else the stage's first region still to write (or
its first region, when every one is written). Each time it is asked for the
same region, while the failing check stays the same, it climbs one level and
stays at the last; a new failing check starts the region's ladder at level 1
again:

1. the region's hint, where it sits (file:line) and the function it belongs to;
2. the explanation: the check that failed (its assertion, its observed figures
   against its limit, what it proves) and the stage's known mistakes
   (`seeded_bugs.toml`), then the function's docstring (its contract and
   cases), what each of the stage's checks proves (their docstrings), and the
   strict modes the tests set (`tests/conftest.py`) with what they mean;
3. the reference for that one region, as a diff against your file.

`hints.json` holds each region's reference, compressed so that reading the
file does not show it by accident; nothing else in the starter holds it. The
levels shown are kept in `evidence/progress.json` (`hints`), so the dossier
and you can tell which regions you wrote after seeing the reference.

`watch` runs the current stage, then again each time a file under `src/` or
`tests/` is saved (watchfiles), until Ctrl-C (or ``--runs N`` runs).
"""

from __future__ import annotations

import ast
import base64
import difflib
import re
import sys
import zlib
from pathlib import Path

import failed_check
import progress

HINTS = "hints.json"
# The fields `progress.py` stamps for a stage's failing check.
FAILURE_KEYS = ("test", "assertion")
# Level 2 lists at most this many of a stage's known mistakes.
MAX_MISTAKES = 6
LEVELS = ("hint", "explanation", "reference")
# What each strict setting a conftest may make means for the learner's code.
STRICT = {
    "jax_numpy_dtype_promotion": "dtypes never promote implicitly: `x / count` with an int "
    "`count` and a float `x` fails; cast one side (`count.astype(x.dtype)`)",
    "jax_numpy_rank_promotion": "arrays of different ranks never broadcast implicitly: add "
    "the axis yourself (`x[:, None]`)",
    "jax_debug_nans": "a NaN in any jitted result raises at once, naming the operation",
    "jax_debug_infs": "an infinity in any jitted result raises at once",
    "jax_enable_x64": "float64 and int64 are available: a literal or `jnp.array` of Python "
    "floats is float64 unless you give a dtype",
    "jax_default_matmul_precision": "matrix products run at the precision named here",
    "jax_threefry_partitionable": "random bits do not depend on how an array is sharded",
    "jax_debug_key_reuse": "a PRNG key used twice raises: split it (`jax.random.split`) and "
    "use each part once",
}
CONFIG_UPDATE = re.compile(
    r"""config\.update\(\s*["'](?P<name>jax_\w+)["']\s*,\s*(?P<value>[^)]+)\)"""
)


# Each region of `hints.json` and the type of each of its fields.
REGION_FIELDS = {"stage": str, "path": str, "hint": str, "index": int, "reference": str}


def load_regions(folder: Path = progress.HERE) -> list[dict]:
    """The regions of `hints.json`: none when it is absent or not JSON; those of
    another shape are left out. :class:`progress.Unreadable` when the file is
    unusable (a link, a folder, a FIFO, too large, unreadable)."""
    try:
        data = progress.read_json(folder / HINTS, progress.RESTORE)
    except ValueError:
        return []
    regions = data.get("regions") if isinstance(data, dict) else None
    return [
        r
        for r in (regions if isinstance(regions, list) else [])
        if isinstance(r, dict) and all(isinstance(r.get(k), t) for k, t in REGION_FIELDS.items())
    ]


def reference_lines(region: dict) -> list[str]:
    try:
        text = zlib.decompress(base64.b64decode(region["reference"])).decode("utf-8")
    except (ValueError, zlib.error):
        raise progress.Unreadable(
            f"{HINTS} holds a reference for {region['path']} that does not decode: "
            f"{progress.RESTORE}."
        ) from None
    return text.splitlines()


def current_stage(folder: Path = progress.HERE) -> str | None:
    """The first stage whose stamp is not a current pass (None when all pass)."""
    state = progress.load_state(folder)
    for stage in progress.manifest(folder)["stages"]:
        record = state["stages"].get(stage["id"])
        passed = record and record.get("result") == "passed"
        if not (passed and progress.is_current(folder, stage, record)):
            return stage["id"]
    return None


def region_lines(text: list[str], start: int) -> tuple[int, list[str]]:
    """(marker line, body lines) of the region whose opening marker is line ``start``
    (1-based) of ``text``: the lines up to its closing marker."""
    body = []
    for line in text[start:]:
        if progress.CLOSE.match(line):
            break
        body.append(line)
    return start, body


def marker_line(text: list[str], region: dict) -> int:
    """Where the region's opening marker is now in the learner's file (1-based): the
    ``index``-th marker of the file, however much the learner wrote above it."""
    seen = 0
    for number, line in enumerate(text, start=1):
        if progress.OPEN.match(line):
            if seen == region["index"]:
                return number
            seen += 1
    raise LookupError(f"{region['path']}: exercise marker {region['index'] + 1} is gone")


def enclosing_function(tree: ast.Module, line: int) -> ast.FunctionDef | None:
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                if best is None or node.lineno >= best.lineno:
                    best = node
    return best


def checks_of(stage: dict, folder: Path) -> list[tuple[str, str]]:
    """(test name, first docstring sentence) of every test function of ``stage``."""
    found = []
    for test in stage["tests"]:
        try:
            tree = ast.parse(progress.read_text(folder / test) or "")
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "test"
            ):
                sentence = progress.docstring_sentence(folder / test, "", node.name)
                if not sentence:  # A method: look it up in its class.
                    owner = next(
                        (
                            c.name
                            for c in ast.walk(tree)
                            if isinstance(c, ast.ClassDef) and node in c.body
                        ),
                        "",
                    )
                    sentence = progress.docstring_sentence(folder / test, owner, node.name)
                found.append((node.name, sentence))
    return found


def strict_modes(folder: Path) -> list[str]:
    """The strict JAX settings `tests/conftest.py` makes (those :data:`STRICT`
    explains; caches and the like are left out), each with what it means."""
    try:
        text = progress.read_text(folder / "tests" / "conftest.py") or ""
    except OSError:
        return []
    modes = []
    for match in CONFIG_UPDATE.finditer(text):
        name, value = match["name"], match["value"].strip()
        if name in STRICT:
            modes.append(f"{name} = {value}: {STRICT[name]}")
    return modes


def explanation(region: dict, stage: dict, text: list[str], line: int, folder: Path) -> list[str]:
    out = []
    try:
        function = enclosing_function(ast.parse("\n".join(text)), line)
    except SyntaxError:
        function = None
    if function is not None and ast.get_docstring(function):
        out += [f"What `{function.name}` must do (its docstring):", ""]
        out += ["    " + ln for ln in ast.get_docstring(function).splitlines()] + [""]
    checks = checks_of(stage, folder)
    if checks:
        out.append(f"What stage {stage['id']}'s checks prove:")
        out += [f"  - {name}: {sentence or '(no docstring)'}" for name, sentence in checks]
        out.append("")
    modes = strict_modes(folder)
    if modes:
        out.append("Strict modes the tests set (tests/conftest.py):")
        out += [f"  - {mode}" for mode in modes]
    return out


def reference_diff(region: dict, text: list[str], line: int) -> list[str]:
    _, mine = region_lines(text, line)
    return list(
        difflib.unified_diff(
            [ln + "\n" for ln in mine],
            [ln + "\n" for ln in reference_lines(region)],
            fromfile=f"{region['path']} (yours, from line {line + 1})",
            tofile=f"{region['path']} (the reference)",
            lineterm="\n",
        )
    )


def last_failure(stage_id: str, folder: Path) -> dict | None:
    """The failing check the stage's last run stamped (`progress.py`), or None."""
    record = progress.load_state(folder)["stages"].get(stage_id) or {}
    failure = record.get("failure")
    ok = isinstance(failure, dict) and all(isinstance(failure.get(k), str) for k in FAILURE_KEYS)
    return failure if ok else None


def called_names(folder: Path, test: str) -> set[str]:
    """Names the failing test ``test`` (`path::name[params]`, or `path::Class::name`)
    calls, directly or as attributes (`module.function(...)`)."""
    path, _, rest = test.partition("::")
    name = rest.split("::")[-1].split("[", 1)[0]
    try:
        tree = ast.parse(progress.read_text(folder / path) or "")
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    func = call.func
                    names.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return names


def region_function(region: dict, folder: Path) -> str:
    """The name of the function holding ``region`` in the learner's file, or ""."""
    try:
        text = (progress.read_text(folder / region["path"]) or "").splitlines()
        function = enclosing_function(ast.parse("\n".join(text)), marker_line(text, region))
    except (OSError, SyntaxError, ValueError, LookupError):
        return ""
    return function.name if function is not None else ""


def region_to_help(regions: list[dict], stage_id: str, folder: Path) -> tuple[dict, dict | None]:
    """The region the ladder is about, and the stage's last failing check (or None).

    In order: the unwritten region the failure's message names (its starter error
    quotes the region's hint); a region inside a function the failing test calls;
    the stage's first region still to write; its first region."""
    failure = last_failure(stage_id, folder)
    todo = progress.unwritten_regions(folder).get(stage_id, [])
    if failure:
        todo = progress.failing_region_first(
            todo, progress.Failure(failure["test"], failure["assertion"], "")
        )
        named = [r for r in regions if f"exercise: {r['hint']}" in failure["assertion"]]
        if named:
            return named[0], failure
        calls = called_names(folder, failure["test"])
        called = [r for r in regions if region_function(r, folder) in calls]
        if called:
            return called[0], failure
    left = [(rel, hint_text) for rel, _, hint_text in todo]
    region = next((r for key in left for r in regions if (r["path"], r["hint"]) == key), regions[0])
    return region, failure


def failed_check_lines(failure: dict, stage_id: str, region: dict, folder: Path) -> list[str]:
    """Level 2's first part: the check that failed, what it proves, its figure, and
    the stage's known mistakes (those in the region's file first)."""
    out = [f"The check that failed on the last run: {failure['test']}", f"  {failure['assertion']}"]
    if failure.get("figure"):
        out.append(f"  failed check: {failure['figure']}")
    path, _, rest = failure["test"].partition("::")
    owner, _, name = rest.rpartition("::")
    proves = progress.docstring_sentence(folder / path, owner, name) if path else ""
    if proves:
        out.append(f"  it proves: {proves}")
    mistakes = failed_check.known_mistakes(folder, stage_id, region["path"])
    if mistakes:
        out += ["", "Mistakes known to fail this stage's checks (seeded_bugs.toml):"]
        out += [f"  - {why}" for why in mistakes[:MAX_MISTAKES]]
    return out


def next_level(state: dict, key: str, failure: dict | None) -> int:
    """The level to show for region ``key`` now, recorded in the stamps' `ladder`:
    one above the last shown while the failing check (its test, parameters aside)
    is the one it was shown for, else level 1 again: a new failure is a new
    question, and must not open with the reference. The highest level ever shown
    stays in `hints` (the dossier reads it)."""
    ladder = state.get("ladder")
    if not isinstance(ladder, dict):
        ladder = state["ladder"] = {}
    check = failure["test"].split("[", 1)[0] if failure else ""
    step = ladder.get(key)
    same = isinstance(step, list) and len(step) == 2 and step[1] == check
    previous = step[0] if same and isinstance(step[0], int) else 0
    level = min(max(previous, 0) + 1, len(LEVELS))
    ladder[key] = [level, check]
    return level


def hint(stage_id: str | None, folder: Path = progress.HERE) -> int:
    """Print the next level of the ladder (module docstring) for ``stage_id``'s region."""
    project = progress.manifest(folder)
    stages = {s["id"]: s for s in project["stages"]}
    stage_id = stage_id or current_stage(folder)
    if stage_id is None:
        print("Every stage passes: there is no hint to give.")
        return 0
    if stage_id not in stages:
        print(
            f"progress.py hint: no stage {stage_id!r}; stages: {', '.join(stages)}", file=sys.stderr
        )
        return 2
    regions = [r for r in load_regions(folder) if r["stage"] == stage_id]
    if not regions:
        print(f"progress.py hint: {HINTS} holds no region of stage {stage_id}", file=sys.stderr)
        return 2
    region, failure = region_to_help(regions, stage_id, folder)
    source = folder / region["path"]
    found = progress.read_text(source)
    if found is None:
        print(f"progress.py hint: {region['path']} is missing: {progress.RESTORE}", file=sys.stderr)
        return 2
    text = found.splitlines()
    try:
        line = marker_line(text, region)
    except LookupError as gone:
        print(f"progress.py hint: {gone}", file=sys.stderr)
        return 2
    state = progress.load_state(folder)
    shown = state.setdefault("hints", {})
    key = f"{region['path']}#{region['index']}"
    level = next_level(state, key, failure)
    shown[key] = max(level, shown.get(key, 0))
    progress.save_state(state, folder)
    where = f"{region['path']}:{line}"
    print(f"Stage {stage_id}, {where}: level {level} of {len(LEVELS)} ({LEVELS[level - 1]})\n")
    if level == 1:
        function = None
        try:
            function = enclosing_function(ast.parse("\n".join(text)), line)
        except SyntaxError:
            pass
        where = f" in `{function.name}`" if function is not None else ""
        print(f"Hint{where}: {region['hint']}")
        print("\nAsk again (`python progress.py hint`) for the explanation.")
    elif level == 2:
        if failure:
            print("\n".join(failed_check_lines(failure, stage_id, region, folder)) + "\n")
        print("\n".join(explanation(region, stages[stage_id], text, line, folder)))
        print("\nAsk again for the reference of this region, as a diff against your file.")
    else:
        print("".join(reference_diff(region, text, line)) or "Your region equals the reference.")
    return 0


def watch(runs: int | None, folder: Path = progress.HERE) -> int:
    """Run the current stage, then again after every save (module docstring)."""
    try:
        from watchfiles import PythonFilter
        from watchfiles import watch as saves
    except ImportError:
        print("progress.py watch needs watchfiles: pip install -e '.[test]'", file=sys.stderr)
        return 2
    status, done = progress.run_stages(folder=folder), 1
    print("\nwatching src/ and tests/: save a file to rerun, Ctrl-C to stop", flush=True)
    try:
        for changes in saves(folder / "src", folder / "tests", watch_filter=PythonFilter()):
            if runs is not None and done >= runs:
                break
            names = sorted({Path(p).relative_to(folder).as_posix() for _, p in changes})
            print(f"\nsaved: {', '.join(names)}: rerunning", flush=True)
            status, done = progress.run_stages(folder=folder), done + 1
            if runs is not None and done >= runs:
                break
            print("\nwatching src/ and tests/: save a file to rerun, Ctrl-C to stop", flush=True)
    except KeyboardInterrupt:
        print("\nstopped watching")
    return status


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    if command == "hint":
        if len(rest) > 1:
            print("usage: python progress.py hint [STAGE]", file=sys.stderr)
            return 2
        return hint(rest[0] if rest else None)
    runs = None
    if rest[:1] == ["--runs"] and len(rest) == 2 and rest[1].isdigit() and int(rest[1]) > 0:
        runs = int(rest[1])
    elif rest:
        print("usage: python progress.py watch [--runs N]", file=sys.stderr)
        return 2
    return watch(runs)
