"""Shared test set-up: JAX strict mode, stage markers, the `gpu` marker, the
`evidence` fixture, one JAX compilation cache for every job the tests start, and
`job_log`, a supervised job's own log tail for assertion messages.

Evidence: every stage test records what it compared (check, condition,
observed error, tolerance, passed) through the `evidence` fixture, one per
stage and shared by the stage's test files; as each file finishes, all of
the stage's records so far go to `evidence/stage_<n>.json` (directory
overridable with the `EVIDENCE_DIR` environment variable), so a person can
read the observed figures after the run, passed or failed.
"""

import datetime
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

# Strict mode: implicit rank broadcasting and implicit dtype promotion are errors
# in our code (optax's own update is exempted where it is called, see train.py).
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Determinism comes from explicit keys, split before use: a reused key is an error.
jax.config.update("jax_debug_key_reuse", True)

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _stage_of_file() -> dict[str, str]:
    """Test file name -> stage id, as `project.toml` declares them."""
    with (PROJECT_ROOT / "project.toml").open("rb") as f:
        stages = tomllib.load(f)["stages"]
    return {Path(t).name: s["id"] for s in stages for t in s.get("tests", [])}


def pytest_configure(config: pytest.Config) -> None:
    # One marker per stage, so that `pytest -m stage2` runs one stage's tests.
    for stage in sorted(set(_stage_of_file().values())):
        config.addinivalue_line("markers", f"stage{stage}: tests of stage {stage}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stage_of = _stage_of_file()
    for item in items:
        stage = stage_of.get(item.path.name)
        if stage is not None:
            item.add_marker(getattr(pytest.mark, f"stage{stage}"))
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason=f"needs a GPU; JAX backend is `{jax.default_backend()}`")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class Evidence:
    """Collects the figures a stage test compared; written as JSON at module end."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.records: list[dict[str, Any]] = []

    def record(
        self,
        check: str,
        condition: str,
        observed: dict[str, Any],
        tolerance: dict[str, Any] | None,
        passed: bool,
    ) -> bool:
        """Keeps one comparison; returns `passed` so a test can `assert` on it."""
        self.records.append(
            {
                "check": check,
                "condition": condition,
                "observed": _jsonable(observed),
                "tolerance": _jsonable(tolerance),
                "passed": bool(passed),
            }
        )
        return bool(passed)

    def allclose(
        self,
        check: str,
        condition: str,
        actual: Any,
        reference: Any,
        *,
        rtol: float,
        atol: float,
    ) -> bool:
        """Compares `actual` with an independent `reference` like `np.allclose`,
        recording the max absolute and relative error; returns whether it passed."""
        actual = np.asarray(actual, dtype=np.float64)
        reference = np.asarray(reference, dtype=np.float64)
        if actual.shape != reference.shape:
            return self.record(
                check,
                condition,
                {"actual_shape": actual.shape, "reference_shape": reference.shape},
                None,
                False,
            )
        abs_err = np.abs(actual - reference)
        rel_err = abs_err / np.maximum(np.abs(reference), np.finfo(np.float64).tiny)
        passed = bool(np.all(abs_err <= atol + rtol * np.abs(reference)))
        observed = {
            "max_abs_error": float(abs_err.max(initial=0.0)),
            "max_rel_error": float(rel_err.max(initial=0.0)),
            "num_values": int(actual.size),
        }
        return self.record(check, condition, observed, {"rtol": rtol, "atol": atol}, passed)

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"stage_{self.stage}.json"
        payload = {
            "stage": self.stage,
            "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
            "records": self.records,
        }
        # Written beside and renamed, so an interrupted run never leaves half a file.
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        os.replace(partial, path)
        return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value


@pytest.fixture(scope="session")
def stage_evidence() -> dict[str, Evidence]:
    """Stage id -> the one `Evidence` that every test file of the stage adds to."""
    return {}


@pytest.fixture(scope="module")
def evidence(request: pytest.FixtureRequest, stage_evidence: dict[str, Evidence]):
    """The stage's `Evidence`; the stage number comes from `test_stage_<n>_*.py`.

    A stage with several test files shares one `Evidence`, written whole as each
    file finishes, so a later file never replaces the figures an earlier one kept.
    """
    match = re.match(r"test_stage_(\w+?)_", Path(request.module.__file__).name)
    if match is None:
        raise RuntimeError("The `evidence` fixture is for `test_stage_<n>_<topic>.py` files.")
    log = stage_evidence.setdefault(match.group(1), Evidence(match.group(1)))
    yield log
    log.write(Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence")))


def job_log(
    workdir: str | Path, attempt: int = 0, *, err_lines: int = 30, out_lines: int = 5
) -> str:
    """The end of a supervised job's own logs, for an assertion message.

    Returns the last `err_lines` lines of `<workdir>/logs/attempt_<attempt>.err` and
    the last `out_lines` of `.out` (the files the supervisor points the job's standard
    error and output at), each under a heading naming the file, as one string. A file
    that is missing or empty says so. It only reads: it never raises for a log it
    cannot find, and it decides nothing.

    A job that exits at its start (a bug in the job's code, a machine that refuses the
    metrics server's socket, an accelerator another process holds) says why only
    there; a test that needed the job to get further puts this in its message, so the
    reason is in the test's report. The message must stay a `str`: in a tuple, the
    lines would show by their repr, quotes escaped and newlines folded.
    """
    parts = []
    for suffix, count in ((".err", err_lines), (".out", out_lines)):
        path = Path(workdir) / "logs" / f"attempt_{attempt}{suffix}"
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as err:
            parts.append(f"--- {path}: cannot be read ({err.strerror or err})")
            continue
        if not lines:
            parts.append(f"--- {path}: empty")
            continue
        shown = lines[-count:]
        parts.append(f"--- last {len(shown)} of {len(lines)} lines of {path}:")
        parts.extend(shown)
    return "\n".join(parts)


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JAX's persistent compilation cache for the jobs the tests start: the first
    job compiles, the others load. `WO_JAX_CACHE`, else `JAX_COMPILATION_CACHE_DIR`
    (the folder the repository's matrix shares across its runs), names a folder
    kept across runs."""
    kept = os.environ.get("WO_JAX_CACHE") or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return Path(kept) if kept else tmp_path_factory.mktemp("jax-cache")


@pytest.fixture(scope="session", autouse=True)
def _in_process_cache(jax_cache: Path):
    """The test process compiles into, and loads from, the same cache as its jobs."""
    jax.config.update("jax_compilation_cache_dir", str(jax_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    yield
