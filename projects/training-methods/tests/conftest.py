"""Shared test set-up: JAX strict mode, two CPU devices, stage, `gpu` and `ieee_float64`
markers, the `evidence` fixture, and the shared tiny data and SFT model.

Evidence: every stage test records what it compared (check, condition,
observed error, tolerance, passed) through the module-scoped `evidence`
fixture; the records go to `evidence/stage_<n>.json` (directory overridable
with the `EVIDENCE_DIR` environment variable) when the module finishes, so a
person can read the observed figures after the run, passed or failed.

Tolerances that depend on the backend: checks of a figure made through float32
`log_softmax` (cross-entropy, InfoNCE, sequence log-probabilities) or `log_sigmoid`
(DPO losses) against a float64 reference multiply their relative tolerance by the
`log_softmax_excess` / `log_sigmoid_excess` fixture, measured on the running machine
(`backend_error.py`): about 1 on a CPU, larger on a TPU, whose `exp` and `log` are less
exact. Every other tolerance is the same on every backend: matrix products run at
float32 precision everywhere (below), and claims about IEEE float64 arithmetic
(marker `ieee_float64`) are skipped where JAX's backend is not a CPU.
"""

import datetime
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import jax

# Two CPU devices for stage 6's sharded gradient; set before JAX starts its backend.
jax.config.update("jax_num_cpu_devices", 2)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Strict mode: implicit rank broadcasting and implicit dtype promotion are errors
# in our code (optax's own update is exempted where it is called, see train.py).
# A persistent compilation cache is used when JAX_COMPILATION_CACHE_DIR is set.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Determinism comes from explicit keys, split before use: a reused key is an error.
jax.config.update("jax_debug_key_reuse", True)
# The stage claims are about float32 arithmetic. A TPU rounds a float32 matrix
# product's inputs to bfloat16 unless asked for `highest`; a CPU computes the same
# bits either way, so the session asks for float32 products on every backend.
jax.config.update("jax_default_matmul_precision", "highest")

import backend_error  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# A claim about IEEE float64 arithmetic (Flax and PyTorch at float64, agreeing to about
# 1e-12) is made on a CPU. A TPU emulates float64 in software, not IEEE-rounded (and
# flax's float64 initialisers do not compile there), so such a claim means nothing
# there; the float32 claims are what a TPU is checked on.
IEEE_FLOAT64_REASON = (
    "the claim is about IEEE float64 arithmetic on both sides; JAX's "
    f"`{jax.default_backend()}` backend emulates float64 in software (not IEEE-rounded)"
)


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
        "markers", "ieee_float64: a claim about IEEE float64 arithmetic, checked on a CPU only"
    )


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


@pytest.fixture(scope="session")
def log_softmax_excess() -> float:
    """How many times the backend's float32 `jax.nn.log_softmax` errs more than NumPy's
    float32 evaluation of the same formula (at least 1; `backend_error.py`)."""
    return backend_error.log_softmax_excess()


@pytest.fixture(scope="session")
def log_sigmoid_excess() -> float:
    """The same for `jax.nn.log_sigmoid` at the scale of DPO reward margins."""
    return backend_error.log_sigmoid_excess()


@pytest.fixture(scope="module")
def evidence(request: pytest.FixtureRequest):
    """The stage's `Evidence`; the stage number comes from `test_stage_<n>_*.py`."""
    match = re.match(r"test_stage_(\w+?)_", Path(request.module.__file__).name)
    if match is None:
        raise RuntimeError("The `evidence` fixture is for `test_stage_<n>_<topic>.py` files.")
    log = Evidence(match.group(1))
    yield log
    log.write(Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence")))


# Shared data and model. Fixtures are lazy: a stage's tests build only what
# they ask for, so stages 1 and 2 never run the SFT code of stage 3.


@pytest.fixture(scope="session")
def config():
    from training_methods.config import Config

    return Config.tiny()


@pytest.fixture(scope="session")
def splits(config):
    from training_methods.data import split_ids

    return split_ids(config)


@pytest.fixture(scope="session")
def corpus(config, splits):
    """Train and held-out examples of the `reverse` task, one corpus."""
    from training_methods.data import generate

    return generate(config, np.concatenate([splits["train"], splits["heldout"]]))


@pytest.fixture(scope="session")
def sft_run(config, splits, corpus):
    """The tiny SFT model (stage 3's objective), trained once for the session;
    the base of the LoRA, DPO and held-out tests. Returns (model, history, ledger)."""
    from training_methods import sft
    from training_methods.model import build
    from training_methods.train import Ledger, fit

    ledger = Ledger()
    key_init, key_fit = jax.random.split(jax.random.key(config.seed))
    model = build(config, key=key_init)
    trained, history = fit(
        model,
        sft.loss_fn,
        config,
        corpus,
        splits["train"],
        splits["heldout"],
        steps=config.sft_steps,
        key=key_fit,
        objective="sft",
        ledger=ledger,
    )
    return model, trained, history, ledger
