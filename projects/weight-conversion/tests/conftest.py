"""Shared test set-up: JAX strict mode, the `gpu` and stage markers, the
`evidence` fixture, and the source models every stage converts (trained once
per session, a few seconds each).

Evidence: every stage test records what it compared (check, condition,
observed error, tolerance, passed) through the module-scoped `evidence`
fixture; the records go to `evidence/stage_<n>.json` (directory overridable
with the `EVIDENCE_DIR` environment variable) when the module finishes, so a
person can read the observed figures after the run, passed or failed.
"""

import datetime
import json
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")

# Strict mode: implicit rank broadcasting is an error in our code and in Flax's.
# (Implicit dtype promotion stays at JAX's default: Keras's own layers rely on it.)
jax.config.update("jax_numpy_rank_promotion", "raise")
# Determinism comes from explicit keys, split before use: a reused key is an error.
jax.config.update("jax_debug_key_reuse", True)
# The stage claims are about float32 arithmetic. A TPU rounds a float32 matrix
# product's (and convolution's) inputs to bfloat16 unless asked for `highest`; a CPU
# computes the same bits either way, so the session asks for float32 products on
# every backend. The environment variable carries the same request to the fresh
# processes the tests start (the `reload` command of stage 3).
jax.config.update("jax_default_matmul_precision", "highest")
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _stage_of_file() -> dict[str, str]:
    """Test file name -> stage id, as `project.toml` declares them."""
    with (PROJECT_ROOT / "project.toml").open("rb") as f:
        stages = tomllib.load(f)["stages"]
    return {Path(t).name: s["id"] for s in stages for t in s.get("tests", [])}


# A claim about IEEE float64 arithmetic (both frameworks at float64, agreeing to about
# 1e-12) is made on a CPU. A TPU emulates float64 in software, not IEEE-rounded (its
# normalisation layers differ from PyTorch's beyond float64's rounding), so such a claim
# means nothing there; the float32 claims are what a TPU is checked on.
IEEE_FLOAT64_REASON = (
    "the claim is about IEEE float64 arithmetic on both sides; JAX's "
    f"`{jax.default_backend()}` backend emulates float64 in software (not IEEE-rounded)"
)


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
    if jax.default_backend() != "cpu":
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


# --- SOURCE MODELS (trained once per session) -----------------------------------


@pytest.fixture(scope="session")
def split():
    from weight_conversion import data

    return data.load_split()


@pytest.fixture(scope="session")
def torch_source(split):
    """The PyTorch source, `Config.tiny()` (3 epochs), in eval mode."""
    import torch

    from weight_conversion import train
    from weight_conversion.config import Config

    torch.set_num_threads(1)  # tiny ops: one thread is faster and deterministic
    return train.train_torch(Config.tiny(), split)


@pytest.fixture(scope="session")
def keras_source(split):
    """The Keras source (JAX backend), 2 epochs."""
    from weight_conversion import train
    from weight_conversion.config import Config

    return train.train_keras(Config.tiny(epochs=2, source="keras"), split)


# --- ELEMENTWISE FUNCTIONS OF THE RUNNING BACKEND ---------------------------------
#
# The float32 tolerances against an independent reference (PyTorch, Keras) are
# set for float32 arithmetic whose elementwise functions are faithful: a CPU's
# `exp`, `erfc` and `rsqrt` err 1 to 2 units of roundoff. A TPU v5e's err up to
# about 130 (`exp`) and more (functions built from it), so every output computed
# through the network's nonlinearities is proportionally less exact there. Each
# figure below is measured on the machine that runs, as the network composes the
# function, against NumPy's float32 evaluation of the same formula (both against
# float64); floored at 1, so a CPU keeps its tolerances.


def _numpy_softmax(z: np.ndarray) -> np.ndarray:
    shifted = z - z.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


_ERFC = np.vectorize(math.erfc, otypes=[np.float64])


def _numpy_gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU as `jax.nn.gelu(approximate=False)` writes it, x/2 * erfc(-x/sqrt(2)),
    in the dtype of `x`, with `erfc` correctly rounded to that dtype."""
    erfc = _ERFC(-(x * x.dtype.type(math.sqrt(0.5))).astype(np.float64)).astype(x.dtype)
    return x.dtype.type(0.5) * x * erfc


def _numpy_layer_norm(x: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + x.dtype.type(1e-5))


def _jax_layer_norm(x: jax.Array) -> jax.Array:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred * jax.lax.rsqrt(var + 1e-5)  # as flax's LayerNorm and BatchNorm


def _excess(backend_fn, numpy_fn, sample: np.ndarray) -> float:
    """max |backend float32 - float64| / max |NumPy float32 - float64| of one formula
    on a float32 `sample`: how many times the backend errs more than a faithful float32
    evaluation (the backend's function jitted, as the model runs it)."""
    exact = numpy_fn(sample.astype(np.float64))
    backend = np.asarray(jax.jit(backend_fn)(sample), np.float64)
    faithful = numpy_fn(sample).astype(np.float64)
    return float(np.abs(backend - exact).max() / np.abs(faithful - exact).max())


def measure_elementwise_excess() -> dict[str, float]:
    """Per nonlinearity of the network, the running backend's float32 error over NumPy's
    float32 error on a fixed sample in this network's regime (see `_excess`):

    softmax: attention weights, 2,048 rows of 64 keys (the 8x8 tokens), logits of scale 3;
    gelu: exact GELU (erfc) of 65,536 values of scale 3 (normalised activations);
    layer_norm: 4,096 rows of 16 channels of scale 2 around 1 (rsqrt of the variance).
    """
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((2048, 64)) * 3).astype(np.float32)
    x = (rng.standard_normal(1 << 16) * 3).astype(np.float32)
    t = (rng.standard_normal((4096, 16)) * 2 + 1).astype(np.float32)
    return {
        "softmax": _excess(lambda a: jax.nn.softmax(a, axis=-1), _numpy_softmax, z),
        "gelu": _excess(lambda a: jax.nn.gelu(a, approximate=False), _numpy_gelu, x),
        "layer_norm": _excess(_jax_layer_norm, _numpy_layer_norm, t),
    }


@pytest.fixture(scope="session")
def elementwise_excess() -> float:
    """How many times the running backend's float32 nonlinearities (softmax, exact GELU,
    normalisation) err more than a faithful float32 evaluation: the largest of
    `measure_elementwise_excess()`, at least 1. About 1 on a CPU.

    A check whose path runs through these functions (logits against another
    framework's, per-layer parity from the first GELU on) multiplies its float32
    tolerance by it, so a backend with less exact functions gets a proportionally
    wider bound and a CPU keeps its own."""
    return max(1.0, *measure_elementwise_excess().values())
