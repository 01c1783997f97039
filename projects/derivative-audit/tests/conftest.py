"""Shared test set-up: JAX strict mode, the `gpu` marker, one `stage<id>` marker
per stage of `project.toml`, and the `evidence` fixture.

Evidence: every stage test records what it compared (check, condition,
observed error, tolerance, passed) through the module-scoped `evidence`
fixture; the records go to `evidence/stage_<n>.json` (directory overridable
with the `EVIDENCE_DIR` environment variable) when the module finishes, so a
person can read the observed figures after the run, passed or failed.
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

import derivative_audit  # noqa: F401  (switches float64 on, as the package does on import)

# Strict mode: implicit rank broadcasting and implicit dtype promotion are errors.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Determinism comes from explicit keys, split before use: a reused key is an error.
jax.config.update("jax_debug_key_reuse", True)
# The float32 claims are about float32 arithmetic. A TPU rounds a float32 matrix
# product's inputs to bfloat16 unless asked for `highest`; a CPU computes the same
# bits either way, so the session asks for float32 products on every backend.
jax.config.update("jax_default_matmul_precision", "highest")

BACKEND = jax.default_backend()
# Claims at a few multiples of float64's eps (1.1e-16) are claims about IEEE double
# arithmetic. A CPU computes it; a TPU emulates float64 in software, accurate to about
# 1e-13 relative and not rounded as IEEE, so such a claim means nothing there.
IEEE_FLOAT64 = BACKEND == "cpu"
IEEE_FLOAT64_REASON = (
    f"the claim is at float64's rounding (multiples of its eps); JAX's `{BACKEND}` "
    f"backend emulates float64 in software (about 1e-13 relative, not IEEE-rounded)"
)

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
    config.addinivalue_line(
        "markers", "ieee_float64: a claim at float64 eps; skipped, with the reason, off a CPU"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stage_of = _stage_of_file()
    for item in items:
        stage = stage_of.get(item.path.name)
        if stage is not None:
            item.add_marker(getattr(pytest.mark, f"stage{stage}"))
    if not IEEE_FLOAT64:
        ieee = pytest.mark.skip(reason=IEEE_FLOAT64_REASON)
        for item in items:
            if "ieee_float64" in item.keywords:
                item.add_marker(ieee)
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
        path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
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


@pytest.fixture(scope="session")
def float_dtypes() -> tuple[str, ...]:
    """The dtypes whose claims at a multiple of their eps mean something on the running
    backend: float64 and float32 on a CPU, float32 alone where float64 is emulated."""
    return ("float64", "float32") if IEEE_FLOAT64 else ("float32",)


def _excess(backend_fn, numpy_fn, sample: np.ndarray) -> float:
    """max |backend float32 - float64| / max |NumPy float32 - float64| of one formula on a
    float32 `sample`, relative to the float64 value: how many times the backend errs more
    than a faithful float32 evaluation (the backend's function jitted)."""
    exact = numpy_fn(sample.astype(np.float64))
    scale = np.maximum(np.abs(exact), np.finfo(np.float64).tiny)
    backend = np.asarray(jax.jit(backend_fn)(jax.numpy.asarray(sample)), np.float64)
    faithful = numpy_fn(sample).astype(np.float64)
    return float((np.abs(backend - exact) / scale).max() / (np.abs(faithful - exact) / scale).max())


def _numpy_sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    one = np.ones_like(x)
    return np.where(x >= 0, one / (one + e), e / (one + e))


def measure_float32_excess() -> dict[str, float]:
    """Per elementwise function of the suite and the rules, the running backend's float32
    relative error over NumPy's float32 one (see `_excess`), on fixed samples in this
    project's regimes: sin, exp(-x^2/4) and tanh of 65,536 standard-normal points of scale
    2 (the suite's points and pre-activations); log1p(exp(-|x|)) and sigmoid on 65,536
    points from -85 to 85 (softplus' grid; e^-85 is still a normal float32)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1 << 16) * 2).astype(np.float32)
    wide = rng.uniform(-85.0, 85.0, 1 << 16).astype(np.float32)
    jnp = jax.numpy
    return {
        "sin": _excess(jnp.sin, np.sin, x),
        "exp": _excess(lambda a: jnp.exp(-jnp.square(a) / 4), lambda a: np.exp(-(a**2) / 4), x),
        "tanh": _excess(jnp.tanh, np.tanh, x),
        "log1p_exp": _excess(
            lambda a: jnp.log1p(jnp.exp(-jnp.abs(a))), lambda a: np.log1p(np.exp(-np.abs(a))), wide
        ),
        "sigmoid": _excess(jax.nn.sigmoid, _numpy_sigmoid, wide),
    }


@pytest.fixture(scope="session")
def float32_excess() -> dict[str, float]:
    """Per float32 elementwise function (sin, exp, tanh, log1p_exp, sigmoid), how many
    times the running backend errs more than a faithful float32 evaluation:
    `measure_float32_excess()`, each at least 1. About 1 on a CPU (XLA's tanh about 2).

    A float32 check of a result made through some of these functions against a float64
    or decimal reference multiplies its eps-based tolerance by the largest of theirs, so
    a backend with less exact functions gets a proportionally wider bound."""
    return {k: max(1.0, v) for k, v in measure_float32_excess().items()}


@pytest.fixture(scope="session")
def float32_product_ulps() -> float:
    """The most units in the last place by which the running backend's float32 matrix
    product (at the session's declared precision) misses the correctly rounded one, on
    products of one term (a_ij * t_j, as a Jacobian of diag(t) A is made): 0 on a CPU.
    A figure computed from such products is exact to that many ulps, not bitwise."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    t = rng.uniform(0.5, 2.0, 64).astype(np.float32)
    got = np.asarray(jax.jit(lambda m, d: m @ jax.numpy.diag(d))(a, t), np.float64)
    exact = (a.astype(np.float64) * t.astype(np.float64)).astype(np.float32)
    ulp = np.spacing(np.abs(exact)).astype(np.float64)
    return float((np.abs(got - exact.astype(np.float64)) / ulp).max())
