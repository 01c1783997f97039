"""The error bounds of `kernel_audit.reference`, written out again from their documented
formulas in plain Python (loops over float64 values), for the stage tests to compare against.

Nothing here reads the library's constants: the unit roundoff comes from each dtype's own
description (eps / 2) and the layer norm's epsilon is the documented 1e-5.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np

TINY = np.finfo(np.float64).tiny

# Unit roundoff u = eps / 2 (Higham, section 2.1: round to nearest is off by at most half an ulp
# of 1), from each dtype's own description: float32 keeps 24 significand bits (u = 2^-24),
# bfloat16 keeps 8 (u = 2^-8).
U32 = float(np.finfo(np.float32).eps) / 2
U_BF16 = float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) / 2
U_OUT = {"float32": U32, "bfloat16": U_BF16}
LN_EPS = 1e-5  # the layer norm's epsilon, as documented
# The documented accuracy of each backend's tanh (absolute) and rsqrt (in u32), and
# which products round their inputs to bfloat16 (float32 at `default` on a TPU).
TANH_ABS = {"cpu": 2.0**-21, "tpu": 2.0**-14}
RSQRT_U = {"cpu": 2, "tpu": 4}


def product_error(dtype: str, precision: str, backend: str) -> float:
    """Per-product relative error: both inputs rounded to bfloat16, or none."""
    if backend == "tpu" and dtype == "float32" and precision == "default":
        return (1 + U_BF16) ** 2 - 1
    return 0.0


def dot_error(n: int, e_p: float) -> float:
    """(1 + e_p)(1 + gamma_n) - 1: products off by e_p, then an n-term float32 sum."""
    return (1 + e_p) * (1 + gamma(n, U32)) - 1


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u), infinite from n u = 1 on."""
    return math.inf if n * u >= 1 else n * u / (1 - n * u)


def _rows(a) -> list:
    """Nested lists of Python floats (float32 and bfloat16 values are exact in float64)."""
    return np.asarray(jnp.asarray(a).astype(jnp.float32), dtype=np.float64).tolist()


def _gelu(z: float) -> float:
    return 0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))


def _gelu_prime(z: float) -> float:
    c = math.sqrt(2 / math.pi)
    t = math.tanh(c * (z + 0.044715 * z**3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z)


def act(z: float, activation: str) -> float:
    """none, relu and the tanh form of gelu, in float64."""
    return {"none": z, "relu": max(z, 0.0), "gelu": _gelu(z)}[activation]


def _act_prime(z: float, activation: str) -> float:
    return {"none": 1.0, "relu": float(z > 0), "gelu": _gelu_prime(z)}[activation]


def _pre_activation(x, w, b, e_p=0.0):
    """z = x @ w + b and its float32 error dot_error(K+1, e_p) (|x| @ |w| + |b|), element by
    element."""
    k = len(w)
    z = [[sum(xi[t] * w[t][j] for t in range(k)) + b[j] for j in range(len(b))] for xi in x]
    e_z = [
        [
            dot_error(k + 1, e_p) * (sum(abs(xi[t] * w[t][j]) for t in range(k)) + abs(b[j]))
            for j in range(len(b))
        ]
        for xi in x
    ]
    return z, e_z


def matmul_bound_loop(
    x, w, b, activation: str, dtype: str, precision: str = "highest", backend: str = "cpu"
) -> np.ndarray:
    """The documented bound of `act(x @ w + b)`: dot_error(K+1, e_p) (|x| @ |w| + |b|) before
    the activation; gelu multiplies it by 1.13 and adds 8 u32 (|z| + |y|) and half the tanh
    error times |z|; the cast to `dtype` adds u_out (|y| + that error)."""
    x, w, b = _rows(x), _rows(w), _rows(b)
    z, e_z = _pre_activation(x, w, b, product_error(dtype, precision, backend))
    out = np.zeros((len(x), len(b)))
    for i in range(len(x)):
        for j in range(len(b)):
            y = act(z[i][j], activation)
            err = e_z[i][j]
            if activation == "gelu":
                err = 1.13 * err + 8 * U32 * (abs(z[i][j]) + abs(y))
                err += 0.5 * TANH_ABS[backend] * abs(z[i][j])
            out[i, j] = err + U_OUT[dtype] * (abs(y) + err)
    return out


def _row_statistics(row: list, backend: str) -> tuple[list, float, float, float]:
    """d = x - mean, r = 1 / sqrt(var + eps), e_d and rel_r of one row (the documented
    propagation: mean, centring, variance, 1/std), all with u = u32."""
    c = len(row)
    mean = sum(row) / c
    d = [v - mean for v in row]
    var = sum(v * v for v in d) / c
    r = 1 / math.sqrt(var + LN_EPS)
    e_mu = gamma(c + 1, U32) * sum(abs(v) for v in row) / c
    e_d = e_mu + U32 * max(abs(v) for v in d)
    e_var = 2 * (sum(abs(v) for v in d) / c) * e_d + e_d**2 + gamma(c + 2, U32) * var
    rel_r = e_var / (2 * (var + LN_EPS)) + U32 + RSQRT_U[backend] * U32
    return d, r, e_d, rel_r


def layer_norm_bound_loop(x, g, b, dtype: str, backend: str = "cpu") -> np.ndarray:
    """The documented layer-norm bound: |g| (e_d r + |d| r rel_r) + 3u (|d| r |g| + |b|), doubled,
    plus u_out (|y| + the doubled error)."""
    x, g, b = _rows(x), _rows(g), _rows(b)
    out = np.zeros((len(x), len(g)))
    for i, row in enumerate(x):
        d, r, e_d, rel_r = _row_statistics(row, backend)
        for j in range(len(row)):
            first = abs(g[j]) * (e_d * r + abs(d[j]) * r * rel_r) + 3 * U32 * (
                abs(d[j]) * r * abs(g[j]) + abs(b[j])
            )
            y = d[j] * r * g[j] + b[j]
            out[i, j] = 2 * first + U_OUT[dtype] * (abs(y) + 2 * first)
    return out


def dense_grad_bound_loop(
    x, w, b, g, activation: str, precision: str = "highest", backend: str = "cpu"
) -> tuple[np.ndarray, ...]:
    """The documented gradient bounds of `sum(g * act(x @ w + b))`: gz = g act'(z) off by e_gz
    (0 for none; |g| where relu's act' may flip, |z| <= e_z; |g| (0.8 e_z + 16 u (1 + |z|)) for
    gelu), then dx = gz @ w.T an (N+1)-term, dw = x.T @ gz an (M+1)-term inner product and db an
    M-term sum of |gz| + e_gz; gelu's e_gz also takes the tanh error times
    0.5 + 0.8 |z| (1 + 0.134 z^2), and every product may be off by e_p."""
    x, w, b, g = _rows(x), _rows(w), _rows(b), _rows(g)
    m, k, n = len(x), len(w), len(b)
    e_p = product_error("float32", precision, backend)
    z, e_z = _pre_activation(x, w, b, e_p)
    gz = [[g[i][j] * _act_prime(z[i][j], activation) for j in range(n)] for i in range(m)]
    e_gz = [[0.0] * n for _ in range(m)]
    for i in range(m):
        for j in range(n):
            if activation == "relu" and abs(z[i][j]) <= e_z[i][j]:
                e_gz[i][j] = abs(g[i][j])
            elif activation == "gelu":
                zz = abs(z[i][j])
                slope = 0.5 + 0.8 * zz * (1 + 3 * 0.044715 * zz * zz)
                e_gz[i][j] = abs(g[i][j]) * (
                    0.8 * e_z[i][j] + 16 * U32 * (1 + zz) + TANH_ABS[backend] * slope
                )
    a_gz = [[abs(gz[i][j]) + e_gz[i][j] for j in range(n)] for i in range(m)]
    bx, bw, bb = np.zeros((m, k)), np.zeros((k, n)), np.zeros(n)
    for i in range(m):
        for t in range(k):
            carried = sum(a_gz[i][j] * abs(w[t][j]) for j in range(n))
            bx[i, t] = dot_error(n + 1, e_p) * carried + sum(
                e_gz[i][j] * abs(w[t][j]) for j in range(n)
            )
    for t in range(k):
        for j in range(n):
            carried = sum(abs(x[i][t]) * a_gz[i][j] for i in range(m))
            bw[t, j] = dot_error(m + 1, e_p) * carried + sum(
                abs(x[i][t]) * e_gz[i][j] for i in range(m)
            )
    for j in range(n):
        bb[j] = gamma(m, U32) * sum(a_gz[i][j] for i in range(m)) + sum(
            e_gz[i][j] for i in range(m)
        )
    return bx, bw, bb


def layer_norm_grad_bound_loop(x, gam, g, backend: str = "cpu") -> tuple[np.ndarray, ...]:
    """The documented gradient bounds of `sum(g * layer_norm(x))`, row by row from the forward
    propagation: e_xh = e_d r + |xhat| (rel_r + 2u); e_m1 = gamma_{C+1} mean|gy|; e_m2 =
    gamma_{C+2} mean|gy xhat| + mean(|gy| e_xh); dx: |dx| (rel_r + 3u) + r (u|gy| + e_m1 +
    |xhat| e_m2 + e_xh |m2|); dgamma: gamma_R sum|g xhat| + sum|g| e_xh; dbeta: gamma_R sum|g|;
    each doubled."""
    x, gam, g = _rows(x), _rows(gam), _rows(g)
    rows, c = len(x), len(gam)
    bx = np.zeros((rows, c))
    sum_g_xhat, sum_g_e_xh, sum_g = np.zeros(c), np.zeros(c), np.zeros(c)
    for i, row in enumerate(x):
        d, r, e_d, rel_r = _row_statistics(row, backend)
        xhat = [v * r for v in d]
        e_xh = [e_d * r + abs(v) * (rel_r + 2 * U32) for v in xhat]
        gy = [g[i][j] * gam[j] for j in range(c)]
        m1 = sum(gy) / c
        m2 = sum(gy[j] * xhat[j] for j in range(c)) / c
        e_m1 = gamma(c + 1, U32) * sum(abs(v) for v in gy) / c
        e_m2 = (
            gamma(c + 2, U32) * sum(abs(gy[j] * xhat[j]) for j in range(c)) / c
            + sum(abs(gy[j]) * e_xh[j] for j in range(c)) / c
        )
        for j in range(c):
            dx = r * (gy[j] - m1 - xhat[j] * m2)
            bx[i, j] = abs(dx) * (rel_r + 3 * U32) + r * (
                U32 * abs(gy[j]) + e_m1 + abs(xhat[j]) * e_m2 + e_xh[j] * abs(m2)
            )
            sum_g_xhat[j] += abs(g[i][j] * xhat[j])
            sum_g_e_xh[j] += abs(g[i][j]) * e_xh[j]
            sum_g[j] += abs(g[i][j])
    bg = gamma(rows, U32) * sum_g_xhat + sum_g_e_xh
    bb = gamma(rows, U32) * sum_g
    return 2 * bx, 2 * bg, 2 * bb


def same_bound(evidence, check: str, condition: str, got, expected) -> bool:
    """Records how far a bound of `kernel_audit.reference` is from its formula computed here;
    passes when they agree to float64 rounding (relative 1e-9) everywhere."""
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    same_shape = got.shape == expected.shape
    rel = (
        np.abs(got - expected) / np.maximum(np.abs(expected), TINY)
        if same_shape
        else np.array([math.inf])
    )
    ratio = got / np.maximum(expected, TINY) if same_shape else np.array([math.nan])
    return evidence.record(
        check,
        condition,
        {
            "max_rel_diff": float(rel.max(initial=0.0)),
            "min_ratio_to_formula": float(ratio.min(initial=1.0)),
            "max_ratio_to_formula": float(ratio.max(initial=1.0)),
            "num_values": int(expected.size),
        },
        {"rtol": 1e-9, "unit_roundoff": {"float32": U32, "bfloat16": U_BF16}},
        same_shape and bool(np.all(rel <= 1e-9)),
    )
