"""Shared test set-up: JAX strict mode, the `gpu` marker, the `evidence` fixture,
and the two tracking back-ends every stage test runs against.

Back-ends (`store` fixture, parametrized):
  - `sqlite`: a SQLite file in a temporary directory, the embedded default;
  - `postgres`: an `mlflow server` on 127.0.0.1 backed by a throwaway
    PostgreSQL cluster (`tests/services.py`), started once per session and
    stopped at the end. Without PostgreSQL binaries these tests skip, saying
    why; with `REQUIRE_POSTGRES=1` (set by the repository's CI) they FAIL.

Evidence: every stage test records what it compared through the module-scoped
`evidence` fixture; the records go to `evidence/stage_<n>.json` (directory
overridable with `EVIDENCE_DIR`) when the module finishes.
"""

import datetime
import itertools
import json
import os
import re
import sqlite3
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import services

# Strict mode: implicit rank broadcasting and implicit dtype promotion are errors
# in our code (optax's own update is exempted where it is called, see train.py).
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Determinism comes from explicit keys, split before use: a reused key is an error.
jax.config.update("jax_debug_key_reuse", True)

# The store is always explicit; an inherited MLFLOW_TRACKING_URI must not leak in.
os.environ.pop("MLFLOW_TRACKING_URI", None)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
_counter = itertools.count()


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
        path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value


@pytest.fixture(scope="module")
def evidence(request: pytest.FixtureRequest):
    """The stage's `Evidence`; the stage number comes from `test_stage_<n>_*.py`."""
    match = re.match(r"test_stage_(\w+?)_", Path(request.module.__file__).name)
    if match is None:
        raise RuntimeError("The `evidence` fixture is for `test_stage_<n>_<topic>.py` files.")
    log = Evidence(match.group(1))
    yield log
    log.write(Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence")))


# TRACKING BACK-ENDS ----------------------------------------------------------


@dataclass
class Store:
    """One tracking back-end: `uri` for clients, and raw SQL access to the
    database behind it (`sql`), used as an independent reference."""

    kind: str  # `sqlite` or `postgres`
    uri: str
    backend_uri: str  # the database the store writes to (SQLite URI or PostgreSQL URI)

    def client(self):
        from reproducible_experiments import tracking

        return tracking.connect(self.uri)

    def new_experiment(self, client, stem: str) -> tuple[str, str]:
        """A fresh experiment per test, so tests sharing a store stay independent."""
        from reproducible_experiments import tracking

        name = f"{stem}-{self.kind}-{os.getpid()}-{next(_counter)}"
        return name, tracking.experiment_id(client, name)

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        """Runs `query` (with `?` placeholders) directly on the database."""
        if self.kind == "sqlite":
            path = self.backend_uri.removeprefix("sqlite:///")
            with sqlite3.connect(path) as conn:
                return conn.execute(query, params).fetchall()
        import psycopg2

        dsn = self.backend_uri.replace("postgresql+psycopg2://", "postgresql://")
        conn = psycopg2.connect(dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(query.replace("?", "%s"), params)
                return cur.fetchall()
        finally:
            conn.close()


def postgres_absent_outcome(environ: dict[str, str]) -> tuple[str, str]:
    """What a missing PostgreSQL means: `("skip", reason)`, or `("fail", reason)`
    when `REQUIRE_POSTGRES=1` (the repository's CI installs it and sets that)."""
    reason = (
        "PostgreSQL is not installed (no `initdb`/`pg_ctl` under /usr/lib/postgresql/*/bin "
        "or on PATH); install Debian's `postgresql` to run the PostgreSQL back-end"
    )
    if environ.get("REQUIRE_POSTGRES") == "1":
        return "fail", f"REQUIRE_POSTGRES=1 but {reason}."
    return "skip", reason


@pytest.fixture(scope="session")
def postgres_server():
    """`(server_uri, backend_uri)` of an `mlflow server` on a throwaway PostgreSQL."""
    bin_dir = services.pg_bin_dir()
    if bin_dir is None:
        outcome, reason = postgres_absent_outcome(dict(os.environ))
        if outcome == "fail":
            pytest.fail(reason)
        pytest.skip(reason)
    with services.postgres_cluster(bin_dir) as backend_uri:
        with services.mlflow_server(backend_uri) as server_uri:
            yield server_uri, backend_uri


@pytest.fixture(scope="session")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """One SQLite store for the session (its schema is created once, before any
    worker starts; every test works in an experiment of its own)."""
    from reproducible_experiments import tracking

    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    tracking.connect(uri)
    return Store("sqlite", uri, uri)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    """Each module's tests run once per back-end."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_store")
    server_uri, backend_uri = request.getfixturevalue("postgres_server")
    return Store("postgres", server_uri, backend_uri)
