"""The sweep's rounding premise (`rounding_model`) tells rounding-like float32 errors
from smooth ones: simulated on the CPU with NumPy, so the verdict does not depend
on the backend that runs."""

import numpy as np
import pytest
import rounding_model


def _faithful(x: np.ndarray) -> np.ndarray:
    return np.tanh(x.astype(np.float32))


def _ulps(x: np.ndarray) -> np.ndarray:
    return np.spacing(np.abs(np.tanh(x.astype(np.float64))).astype(np.float32))


def _smooth_error(ulps: float, period: float):
    """tanh plus a smooth error of `ulps` units at `period` (a coarse approximation)."""

    def fn(x):
        err = ulps * _ulps(x) * np.sin(2 * np.pi * x.astype(np.float64) / period)
        return (np.tanh(x.astype(np.float64)) + err).astype(np.float32)

    return fn


def _noise(ulps: float, seed: int):
    """tanh plus independent noise of up to `ulps` units per argument."""

    def fn(x):
        rng = np.random.default_rng(seed)
        err = rng.uniform(-ulps, ulps, x.shape) * _ulps(x)
        return (np.tanh(x.astype(np.float64)) + err).astype(np.float32)

    return fn


def test_a_faithful_tanh_is_rounding_like():
    profile = rounding_model.error_profile(_faithful, np.tanh)
    assert profile["total_ulps"] <= 0.5, profile
    assert rounding_model.roundoff_slope_judged(profile)


@pytest.mark.parametrize("ulps", [4.0, 300.0])
def test_independent_errors_are_rounding_like_however_large(ulps):
    profile = rounding_model.error_profile(_noise(ulps, seed=1), np.tanh)
    assert rounding_model.roundoff_slope_judged(profile), profile


@pytest.mark.parametrize(
    ("ulps", "period"), [(5.0, 0.5), (30.0, 0.5), (1000.0, 0.01), (300.0, 2.0)]
)
def test_a_smooth_error_is_not(ulps, period):
    profile = rounding_model.error_profile(_smooth_error(ulps, period), np.tanh)
    assert not rounding_model.roundoff_slope_judged(profile), profile


def test_an_error_free_function_is_rounding_like():
    # The identity is exact on float32 arguments: every error is 0.
    profile = rounding_model.error_profile(lambda x: x, lambda x: x.astype(np.float64))
    assert profile == {"smooth_ulps": 0.0, "total_ulps": 0.0}
    assert rounding_model.roundoff_slope_judged(profile)
