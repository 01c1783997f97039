"""How much less exact the running backend's float32 `log_softmax` and `log_sigmoid`
are than NumPy's float32 evaluation of the same formulas.

Checks of a loss or log-probability against a float64 NumPy reference set their
relative tolerance for float32 arithmetic whose `exp`, `log` and `log1p` are
faithful, as a CPU's are (1 to 2 units of roundoff). A TPU v5e's float32 `log`
errs by up to about 4,000 units of roundoff, its `exp` by about 60, so a figure
made through them is proportionally less exact there. Such a check multiplies its
relative tolerance by the factor measured here, on the machine that runs: about 1
on a CPU (clamped to at least 1), larger on a TPU. Absolute tolerances, and checks
of matrix products or of two results computed on the same backend, do not change.
"""

from collections.abc import Callable

import jax
import numpy as np

# This project's vocabulary: 5 special tokens and 16 symbols.
VOCAB = 21


def numpy_log_softmax(z: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis, written as `jax.nn.log_softmax` computes it."""
    shifted = z - z.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def numpy_log_sigmoid(x: np.ndarray) -> np.ndarray:
    """log sigmoid(x) = min(x, 0) - log1p(exp(-|x|)), the stable form."""
    return np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))


def excess(backend: Callable, numpy_formula: Callable, sample: np.ndarray) -> float:
    """Max |error| of the backend's float32 `backend(sample)` over that of NumPy's float32
    `numpy_formula(sample)`, both against `numpy_formula` in float64; at least 1."""
    exact = numpy_formula(sample.astype(np.float64))
    ours = np.asarray(jax.jit(backend)(sample), np.float64)
    faithful = numpy_formula(sample).astype(np.float64)
    return max(1.0, float(np.abs(ours - exact).max() / np.abs(faithful - exact).max()))


def log_softmax_excess() -> float:
    """The excess of `jax.nn.log_softmax` on 4,096 rows of 21 unit-normal logits: the
    vocabulary of this project and the logit scale of its cross-entropy, SFT and
    sequence log-probability checks (their logits are unit normal or zero)."""
    z = np.random.default_rng(0).standard_normal((4096, VOCAB)).astype(np.float32)
    return excess(jax.nn.log_softmax, numpy_log_softmax, z)


def log_sigmoid_excess() -> float:
    """The excess of `jax.nn.log_sigmoid` on 65,536 normal values of scale 4: the
    reward margins of the DPO checks (from 0.2 to a few units; +-500 saturates)."""
    x = (np.random.default_rng(1).standard_normal(65536) * 4).astype(np.float32)
    return excess(jax.nn.log_sigmoid, numpy_log_sigmoid, x)
