"""Shared test set-up: JAX strict mode, float32 matrix products, the `gpu` marker,
one `stage<id>` marker per stage of `project.toml`, the `evidence` fixture and the
backend's `elementwise_extra`.

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
from collections.abc import Callable
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


def measure_elementwise_extra(backend: dict[str, Callable] | None = None) -> dict[str, float]:
    """Per function of `_elementwise_cases`, how much more the running backend's float32
    result errs (against float64) than the same jitted function on the CPU, the backend
    every tolerance of the stage tests was set on: `max(0, err_backend - err_cpu)`, each
    `err` the largest `_scaled_error` over the function's sample, so in the function's
    own units (absolute where `|f| <= 1`, relative above). Where this process has no CPU
    device (`JAX_PLATFORMS` names another backend alone), the reference is NumPy's and
    SciPy's float32 evaluation (SciPy's special functions round a float64 result). On a
    CPU the two evaluations are one program on one device: every figure is exactly 0.

    `backend` replaces, by name, the JAX function run on the backend (the CPU reference
    keeps the true one): `tests/test_elementwise_bound.py` simulates a less exact chip
    with it."""
    try:
        cpu = jax.devices("cpu")[0]
    except RuntimeError:
        cpu = None
    backend = backend or {}
    out = {}
    for name, (jax_fn, ref_fn, sample) in _elementwise_cases().items():
        x32 = sample.astype(np.float32)
        exact = ref_fn(x32.astype(np.float64))
        on_backend = np.asarray(jax.jit(backend.get(name, jax_fn))(x32), np.float64)
        if cpu is not None:
            faithful = np.asarray(jax.jit(jax_fn)(jax.device_put(x32, cpu)), np.float64)
        else:
            faithful = np.asarray(ref_fn(x32), np.float32).astype(np.float64)
        extra = _scaled_error(on_backend, exact) - _scaled_error(faithful, exact)
        out[name] = max(0.0, extra)
    return out


# What multiplies a first-order propagation bound (below): the sample's worst error
# (4096 points a function) can sit below the function's worst over the points a
# check visits, and a backend rounds the sums that carry an elementwise error in
# its own order (and may fuse or fold them); the second-order terms, products of two
# errors of order 1e-4, are far below either.
PROPAGATION_SAFETY = 4.0


class ElementwiseExtra:
    """`measure_elementwise_extra()`, propagated to a check's figure.

    `extra(*terms)`: an absolute bound on how much more the figure may err on this
    backend than on a CPU, from the float32 elementwise evaluations it is made of. A
    term `(name, coef, value)` is one evaluation of function `name` (or an array of
    them, all entering the figure) whose output has magnitude `value`, entering the
    figure with weight `coef = |d figure / d f|`: its error there is at most
    `delta_f * max(1, |value|)` (the scaled units of `_scaled_error`), so the bound is
    `PROPAGATION_SAFETY * sum |coef| * delta_f * max(1, |value|)` over the terms and
    their entries. A check adds it to its CPU `atol` (its `rtol` stays the CPU's).
    Exactly 0.0 on a CPU, where every `delta_f` is 0: every CPU tolerance is unchanged.
    The terms of the model's figures are written out in `propagation.py`.
    """

    def __init__(self, deltas: dict[str, float], safety: float = PROPAGATION_SAFETY) -> None:
        self.deltas = deltas
        self.safety = safety

    def __call__(self, *terms: tuple[str, Any, Any]) -> float:
        total = 0.0
        for name, coef, value in terms:
            delta = self.deltas[name]
            if delta == 0.0:
                continue
            coef, value = np.broadcast_arrays(np.abs(coef), np.abs(value))
            total += delta * float(np.sum(coef * np.maximum(value, 1.0)))
        return self.safety * total


@pytest.fixture(scope="session")
def elementwise_extra() -> ElementwiseExtra:
    """How much more the running backend's float32 elementwise functions (exp, log, a
    power, a square root, log-gamma, digamma, trigamma) err than the CPU's, per function
    (`measure_elementwise_extra()`), propagated to a check's figure through the terms
    the check names (`ElementwiseExtra`; the terms of the model's figures are in
    `propagation.py`). Exactly 0 on a CPU. A TPU v5e's `log` erred up to about 1,100
    times the CPU's worst (about 9e-5 against 8e-8) over 1e-3..1e3.

    A check whose figure passes through these functions (a log density, the log
    evidence, `E[log sigma^2]`, `Var[log sigma^2]`, `H[q]`, the dual-averaging iterates)
    adds the propagated bound to its float32 `atol`: the backend's extra error enters
    in proportion to the weight each evaluation has in the figure, not as a factor on
    a tolerance set mostly by the rounding of products and sums. Checks of matrix
    products, solves and factorizations alone keep float32's tolerances: the session
    asks for float32 products (above)."""
    return ElementwiseExtra(measure_elementwise_extra())


@pytest.fixture(scope="module")
def evidence(request: pytest.FixtureRequest):
    """The stage's `Evidence`; the stage number comes from `test_stage_<n>_*.py`."""
    match = re.match(r"test_stage_(\w+?)_", Path(request.module.__file__).name)
    if match is None:
        raise RuntimeError("The `evidence` fixture is for `test_stage_<n>_<topic>.py` files.")
    log = Evidence(match.group(1))
    yield log
    log.write(Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence")))
