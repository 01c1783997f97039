"""The arithmetic a backend actually does, measured against float64 NumPy.

    python scripts/accelerator_probe.py OUT.json

Stage tests compare float32 JAX results with NumPy float64 at tolerances derived
from the unit roundoff of what runs. On a CPU that is IEEE float32 throughout; on
a TPU a float32 matrix product at the default precision rounds its inputs to
bfloat16, and transcendentals and reductions are computed by other algorithms.
This probe measures, on the default backend, the quantities such a derivation
needs, each as a multiple of float32's unit roundoff u = 2^-24:

- matrix products at each `jax.lax.Precision`, for several inner sizes K: the
  largest componentwise error over |A| |B| (the bound's natural scale);
- elementwise functions (exp, log, log1p, expm1, tanh, logistic, erf, sqrt,
  reciprocal, division, log_softmax): the largest error over |f(x)| in units of u,
  over inputs spanning the range a model feeds them;
- sums of n float32 values: the error over sum |x|.

Nothing here decides a test; the JSON is kept beside the lane's reports so a
tolerance can cite what the chip was measured to do.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

U32 = 2.0**-24


def _matmul(rng: np.random.Generator) -> list[dict]:
    rows = []
    for k in (16, 128, 1024, 4096):
        a = rng.standard_normal((128, k)).astype(np.float32)
        b = rng.standard_normal((k, 128)).astype(np.float32)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        for precision in ("default", "high", "highest"):
            got = jax.jit(lambda x, y, p=precision: jnp.matmul(x, y, precision=p))(a, b)
            err = np.abs(np.asarray(got, np.float64) - exact)
            rows.append(
                {
                    "k": k,
                    "precision": precision,
                    "max_err_over_abs_product_in_u": float((err / scale).max() / U32),
                    "max_rel_err": float((err / np.maximum(np.abs(exact), 1e-30)).max()),
                    "median_rel_err": float(np.median(err / np.maximum(np.abs(exact), 1e-30))),
                }
            )
    return rows


def _elementwise(rng: np.random.Generator) -> dict[str, float]:
    wide = rng.uniform(-30, 30, 100_000).astype(np.float32)
    positive = np.exp(rng.uniform(-20, 20, 100_000)).astype(np.float32)
    small = rng.uniform(-1, 1, 100_000).astype(np.float32)
    cases = {
        "exp": (jnp.exp, np.exp, rng.uniform(-80, 80, 100_000).astype(np.float32)),
        "log": (jnp.log, np.log, positive),
        "log1p": (jnp.log1p, np.log1p, np.abs(small)),
        "expm1": (jnp.expm1, np.expm1, small),
        "tanh": (jnp.tanh, np.tanh, wide),
        "logistic": (jax.nn.sigmoid, lambda x: 1 / (1 + np.exp(-x)), wide),
        "erf": (jax.lax.erf, None, small * 3),
        "sqrt": (jnp.sqrt, np.sqrt, positive),
        "reciprocal": (lambda x: 1 / x, lambda x: 1 / x, positive),
    }
    out = {}
    for name, (jfn, nfn, x) in cases.items():
        got = np.asarray(jax.jit(jfn)(x), np.float64)
        if nfn is None:
            from scipy.special import erf

            nfn = erf
        want = nfn(x.astype(np.float64))
        keep = np.abs(want) > 1e-30
        out[name] = float((np.abs(got - want)[keep] / np.abs(want)[keep]).max() / U32)
    logits = rng.standard_normal((4096, 50)).astype(np.float32) * 4
    got = np.asarray(jax.jit(jax.nn.log_softmax)(logits), np.float64)
    x = logits.astype(np.float64)
    want = x - x.max(1, keepdims=True)
    want = want - np.log(np.exp(want).sum(1, keepdims=True))
    out["log_softmax_abs_err_in_u"] = float(np.abs(got - want).max() / U32)
    return out


def _sums(rng: np.random.Generator) -> list[dict]:
    rows = []
    for n in (1_000, 100_000, 1_000_000):
        x = rng.standard_normal(n).astype(np.float32)
        got = float(jax.jit(jnp.sum)(x))
        exact = float(x.astype(np.float64).sum())
        rows.append(
            {"n": n, "err_over_abs_sum_in_u": abs(got - exact) / float(np.abs(x).sum()) / U32}
        )
    return rows


def main() -> None:
    rng = np.random.default_rng(0)
    device = jax.devices()[0]
    began = time.perf_counter()
    report = {
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "jax": jax.__version__,
        "unit": "u = 2^-24 (float32 unit roundoff) unless a key says otherwise",
        "matmul": _matmul(rng),
        "elementwise_rel_err_in_u": _elementwise(rng),
        "sum": _sums(rng),
    }
    report["seconds"] = round(time.perf_counter() - began, 1)
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report)[:2000])


if __name__ == "__main__":
    main()
