"""Shared test set-up: JAX strict mode, float32 matrix products, the `gpu` marker,
one `stage<id>` marker per stage of `project.toml`, the `evidence` fixture and the
backend's `elementwise_excess`.

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
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import digamma, gammaln, polygamma
from scipy import special

# Strict mode: implicit rank broadcasting and implicit dtype promotion are errors
# in our code (Optax's update and NumPyro are exempted where they are called).
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Determinism comes from explicit keys, split before use: a reused key is an error.
jax.config.update("jax_debug_key_reuse", True)
# The stage claims are about float32 arithmetic. A TPU rounds a float32 matrix
# product's inputs to bfloat16 unless asked for `highest` (a relative error of about
# 2e-3 where float32's is 6e-8); a CPU computes the same bits either way, so the
# session asks for float32 products on every backend. The tests start no process of
# their own that runs JAX, so no child needs the same declaration.
jax.config.update("jax_default_matmul_precision", "highest")

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


# The float32 functions through which the model's densities, evidence and moments and
# the step-size adaptation pass, each on a fixed sample of the regime the stage tests
# reach: `log sigma^2` and its negation (exp), rates, scales, determinants' factors and
# step sizes (log), the adaptation's `count**-0.75` and `sqrt(count)`, and the shapes
# a0 and a_n (the gamma-function family).
def _elementwise_cases() -> dict[str, tuple[Any, Any, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {
        "exp": (jnp.exp, np.exp, rng.uniform(-10.0, 10.0, 4096)),
        "log": (jnp.log, np.log, np.exp(rng.uniform(np.log(1e-3), np.log(1e3), 4096))),
        "pow": (lambda a: a**-0.75, lambda a: a**-0.75, rng.uniform(1.0, 3000.0, 4096)),
        "sqrt": (jnp.sqrt, np.sqrt, rng.uniform(0.0, 3000.0, 4096)),
        "gammaln": (gammaln, special.gammaln, rng.uniform(0.5, 60.0, 4096)),
        "digamma": (digamma, special.digamma, rng.uniform(0.5, 60.0, 4096)),
        "trigamma": (
            lambda a: polygamma(1, a),
            lambda a: special.polygamma(1, a),
            rng.uniform(0.5, 60.0, 4096),
        ),
    }


def _scaled_error(got: np.ndarray, exact: np.ndarray) -> float:
    """The largest error, relative where `|exact| > 1` and absolute below (a `log` near 1
    or a `gammaln` near its zeros is judged by the absolute error that enters a sum)."""
    return float(np.max(np.abs(got - exact) / np.maximum(np.abs(exact), 1.0)))


def measure_elementwise_excess() -> dict[str, float]:
    """Per function of `_elementwise_cases`, how many times the running backend's float32
    result errs more (against float64) than the same jitted function on the CPU, the
    backend every tolerance of the stage tests was set on. Where this process has no
    CPU device (`JAX_PLATFORMS` names another backend alone), the reference is NumPy's
    and SciPy's float32 evaluation (SciPy's special functions round a float64 result).
    On a CPU the two evaluations are one program on one device: every ratio is 1."""
    try:
        cpu = jax.devices("cpu")[0]
    except RuntimeError:
        cpu = None
    out = {}
    for name, (jax_fn, ref_fn, sample) in _elementwise_cases().items():
        x32 = sample.astype(np.float32)
        exact = ref_fn(x32.astype(np.float64))
        backend = np.asarray(jax.jit(jax_fn)(x32), np.float64)
        if cpu is not None:
            faithful = np.asarray(jax.jit(jax_fn)(jax.device_put(x32, cpu)), np.float64)
        else:
            faithful = np.asarray(ref_fn(x32), np.float32).astype(np.float64)
        backend_err, faithful_err = _scaled_error(backend, exact), _scaled_error(faithful, exact)
        floor = float(np.finfo(np.float32).eps) / 4  # a faithful error of exactly 0
        out[name] = backend_err / max(faithful_err, floor)
    return out


class ElementwiseExcess:
    """`measure_elementwise_excess()`, read per check: `excess("exp", "log")` is the
    largest ratio of the functions a figure passes through, at least 1."""

    def __init__(self, ratios: dict[str, float]) -> None:
        self.ratios = ratios

    def __call__(self, *names: str) -> float:
        return max(1.0, *(self.ratios[name] for name in names))


@pytest.fixture(scope="session")
def elementwise_excess() -> ElementwiseExcess:
    """How many times the running backend's float32 elementwise functions (exp, log, a
    power, a square root, log-gamma, digamma, trigamma) err more than the CPU's, per
    function (`measure_elementwise_excess()`); a check asks for the functions its figure
    passes through. Exactly 1 on a CPU; a TPU v5e's `exp` and `log` err up to about 130
    and 5,800 units of roundoff (measured there), a CPU's 1 to 2.

    A check whose figure passes through these functions (a log density, the log
    evidence, `E[log sigma^2]`, the dual-averaging iterates) multiplies its float32
    tolerance by the largest of their ratios, so a backend with less exact functions
    gets a proportionally wider bound and a CPU keeps its own. Checks of matrix
    products, solves and factorizations alone keep theirs: the session asks for float32
    products (above)."""
    return ElementwiseExcess(measure_elementwise_excess())


@pytest.fixture(scope="module")
def evidence(request: pytest.FixtureRequest):
    """The stage's `Evidence`; the stage number comes from `test_stage_<n>_*.py`."""
    match = re.match(r"test_stage_(\w+?)_", Path(request.module.__file__).name)
    if match is None:
        raise RuntimeError("The `evidence` fixture is for `test_stage_<n>_<topic>.py` files.")
    log = Evidence(match.group(1))
    yield log
    log.write(Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence")))
