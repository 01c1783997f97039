"""Independent references for the kernels, and the error bounds they are held to.

Two references per kernel, written apart from `kernels.py`:
- `*_jnp`: plain `jax.numpy`, same dtype rules as the kernel (float32
  accumulation, one cast at the end), compiled by XLA;
- `*_f64`: NumPy in float64 on the kernel's (already rounded) inputs, the
  "true" value up to float64 rounding.

Tolerances are not picked: `matmul_error_bound` and `layer_norm_error_bound`
give a per-element bound from the standard floating-point error analysis
(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section
3.1: a sum or inner product of n terms in precision u has error at most
gamma_n * sum |terms|, gamma_n = n u / (1 - n u)), plus one rounding of the
result to the output dtype. A kernel result must lie within the bound of the
float64 value; two float32 computations (kernel and `jnp`) within twice it.

Each bound takes the arithmetic of what runs (`backend`, default the JAX
backend, and the declared matmul `precision`):
- products: exact in float32 for bfloat16 operands and for float32 at `highest`
  (any backend) or on a CPU; float32 at `default` on a TPU rounds both inputs
  to bfloat16 first, a relative error of at most 2 u_bf16 + u_bf16^2 per product
  (`product_roundoff`), added to gamma_n of the float32 accumulation;
- `tanh` and `rsqrt`, which neither backend rounds correctly: their accuracy on
  each backend (`TANH_ABS_ERROR`, `RSQRT_ERROR_U`) was measured over 2^20
  points (tanh on [-12, 12], rsqrt of v^2 + 1e-5 for the same v), in XLA and
  inside a Pallas kernel alike (`benchmarks/tpu-primitive-accuracy.json`), and
  rounded up to the next power of two (tanh) or whole unit roundoff (rsqrt).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernel_audit.layer_norm import LAYER_NORM_EPS
from kernel_audit.targets import lax_precision

# Unit roundoff (half the machine epsilon) of each dtype.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8}
# Largest |gelu'(z)| of the tanh form (about 1.13 near z = 2.4): its Lipschitz constant.
GELU_LIPSCHITZ = 1.13
# Roundings in evaluating the tanh-form gelu in float32 (cube, two mul-adds,
# tanh, add, two products): each contributes at most u relative to |z| or |y|.
GELU_ROUNDINGS = 8
# Largest |tanh(v) - tanh64(v)| measured per backend (CPU 2.7e-7, TPU v5e 4.4e-5).
TANH_ABS_ERROR = {"cpu": 2.0**-21, "tpu": 2.0**-14}
# Largest relative error of rsqrt, in float32 unit roundoffs (CPU 1.50, TPU v5e 2.92).
RSQRT_ERROR_U = {"cpu": 2, "tpu": 4}


def _backend(backend: str | None) -> str:
    """The backend whose arithmetic a bound describes: `backend`, or the JAX default.
    A backend without measured figures gets the loosest measured ones (the TPU's)."""
    name = backend or jax.default_backend()
    return name if name in TANH_ABS_ERROR else "tpu"


def product_roundoff(dtype: str, precision: str, backend: str | None = None) -> float:
    """Relative error of one product before accumulation: 0 where float32 multiplies
    exactly enough (bfloat16 operands; float32 at `highest`; a CPU, whose one rounding
    per product gamma_n already counts), 2 u_bf16 + u_bf16^2 for float32 at `default`
    on a TPU, whose MXU rounds both inputs to bfloat16."""
    if dtype == "float32" and precision == "default" and _backend(backend) == "tpu":
        u = UNIT_ROUNDOFF["bfloat16"]
        return 2.0 * u + u * u
    return 0.0


def dot_relative_error(n: int, e_p: float) -> float:
    """Relative bound of an n-term float32 accumulation of products each off by
    `e_p`: e_p + gamma_n (1 + e_p), which is gamma_n when the products are exact."""
    return e_p + gamma(n, UNIT_ROUNDOFF["float32"]) * (1.0 + e_p)


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of an n-term sum."""
    if n * u >= 1.0:
        return math.inf
    return n * u / (1.0 - n * u)


def to_f64(array: jax.Array | np.ndarray) -> np.ndarray:
    """Exact float64 copy (float32 and bfloat16 embed exactly in float64); a
    float64 NumPy array is returned as it is."""
    if isinstance(array, np.ndarray) and array.dtype == np.float64:
        return array
    return np.asarray(jnp.asarray(array).astype(jnp.float32), dtype=np.float64)


# --- MATMUL + BIAS + ACTIVATION --------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("activation", "precision"))
def matmul_bias_act_jnp(
    x: jax.Array, w: jax.Array, b: jax.Array, activation: str, precision: str = "highest"
) -> jax.Array:
    """`act(x @ w + b)` in plain `jax.numpy`: float32 accumulation at the named
    matmul `precision` (as the kernel: `highest` or `default`), one cast."""
    p = lax_precision(precision, jnp.dtype(x.dtype).name)
    z = jnp.dot(x, w, preferred_element_type=jnp.float32, precision=p)
    z = z + b.astype(jnp.float32)[None, :]
    if activation == "gelu":
        y = jax.nn.gelu(z, approximate=True)
    elif activation == "relu":
        y = jax.nn.relu(z)
    else:
        y = z
    return y.astype(x.dtype)


def gelu_f64(z: np.ndarray) -> np.ndarray:
    """The tanh-form gelu in float64."""
    return 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z**3)))


def matmul_bias_act_f64(x: np.ndarray, w: np.ndarray, b: np.ndarray, activation: str) -> np.ndarray:
    """`act(x @ w + b)` in float64 NumPy on the given (rounded) values."""
    z = to_f64(x) @ to_f64(w) + to_f64(b)
    if activation == "gelu":
        return gelu_f64(z)
    if activation == "relu":
        return np.maximum(z, 0.0)
    return z


def matmul_error_bound(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    activation: str,
    dtype: str,
    precision: str = "highest",
    backend: str | None = None,
) -> np.ndarray:
    """Per-element bound on |kernel - float64| for `act(x @ w + b)`.

    Pre-activation: K products (each off by e_p = `product_roundoff`) and the bias
    summed in float32, so (e_p + gamma_{K+1}(u32)(1 + e_p)) * (|x| @ |w| + |b|).
    Activation: relu is exact and 1-Lipschitz; gelu is 1.13-Lipschitz, adds its own
    float32 roundings and the backend's tanh error, 0.5 |z| TANH_ABS_ERROR.
    Output: one rounding to `dtype`, u_out * |y|.
    """
    x64, w64, b64 = to_f64(x), to_f64(w), to_f64(b)
    u32, u_out = UNIT_ROUNDOFF["float32"], UNIT_ROUNDOFF[dtype]
    k = x64.shape[1]
    magnitude = np.abs(x64) @ np.abs(w64) + np.abs(b64)
    pre = dot_relative_error(k + 1, product_roundoff(dtype, precision, backend)) * magnitude
    y = matmul_bias_act_f64(x, w, b, activation)
    if activation == "gelu":
        z = x64 @ w64 + b64
        tanh_err = 0.5 * TANH_ABS_ERROR[_backend(backend)] * np.abs(z)
        act_err = GELU_LIPSCHITZ * pre + GELU_ROUNDINGS * u32 * (np.abs(z) + np.abs(y)) + tanh_err
    else:
        act_err = pre
    # The rounding to `dtype` applies to a value already off by act_err.
    return act_err + u_out * (np.abs(y) + act_err)


# --- LAYER NORM ----------------------------------------------------------------------------


@jax.jit
def layer_norm_jnp(x: jax.Array, gamma_: jax.Array, beta: jax.Array) -> jax.Array:
    """Layer norm over the last axis in plain `jax.numpy`, statistics in float32."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + LAYER_NORM_EPS)
    return (y * gamma_.astype(jnp.float32)[None, :] + beta.astype(jnp.float32)[None, :]).astype(
        x.dtype
    )


def layer_norm_f64(x: np.ndarray, gamma_: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Layer norm over the last axis in float64 NumPy (two-pass variance)."""
    x64 = to_f64(x)
    mean = x64.mean(axis=-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x64 - mean) / np.sqrt(var + LAYER_NORM_EPS) * to_f64(gamma_) + to_f64(beta)


def _normalization_errors(
    x64: np.ndarray, u: float, rsqrt_u: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The centring and scaling of a float32 layer norm, with their error terms.

    For rows `x64` (float64 copies, shape `(rows, c)`) and unit roundoff `u`:
    `d = x - mean` (shape `(rows, c)`) and `r = 1 / sqrt(var + eps)` in exact
    arithmetic, `e_d` the absolute error of the computed `d` (mean error plus
    one rounding) and `rel_r` the relative error of the computed `r` (these
    three of shape `(rows, 1)`): the variance's, halved by the square root, one
    rounding for adding eps and `rsqrt_u` roundings for the backend's rsqrt.
    Shared by the forward and backward bounds.
    """
    c = x64.shape[-1]
    mean = x64.mean(axis=-1, keepdims=True)
    d = x64 - mean
    var = (d**2).mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(var + LAYER_NORM_EPS)
    e_mu = gamma(c + 1, u) * np.abs(x64).mean(axis=-1, keepdims=True)
    e_d = e_mu + u * np.abs(d).max(axis=-1, keepdims=True)
    e_var = 2.0 * np.abs(d).mean(axis=-1, keepdims=True) * e_d + e_d**2 + gamma(c + 2, u) * var
    rel_r = e_var / (2.0 * (var + LAYER_NORM_EPS)) + (1.0 + rsqrt_u) * u
    return d, r, e_d, rel_r


def layer_norm_error_bound(
    x: np.ndarray, gamma_: np.ndarray, beta: np.ndarray, dtype: str, backend: str | None = None
) -> np.ndarray:
    """Per-element bound on |kernel - float64| for the layer norm (float32 statistics).

    First-order propagation, row by row, with C the row length and u = u32:
      mean:      e_mu  = gamma_{C+1} * mean|x|              (sum, then divide)
      centred:   e_d   = e_mu + u * max|d|                   (d = x - mean)
      variance:  e_var = 2 mean|d| e_d + e_d^2 + gamma_{C+2} * var
      1/std:     rel_r = e_var / (2 (var + eps)) + (1 + r_u) u  (add eps, the backend's
                                                              rsqrt: r_u = RSQRT_ERROR_U)
      output:    |g| (e_d r + |d| r rel_r) + 3u (|d| r |g| + |b|) + u_out |y|
    doubled to cover the second-order terms dropped above.
    """
    x64, g64, b64 = to_f64(x), to_f64(gamma_), to_f64(beta)
    u, u_out = UNIT_ROUNDOFF["float32"], UNIT_ROUNDOFF[dtype]
    d, r, e_d, rel_r = _normalization_errors(x64, u, RSQRT_ERROR_U[_backend(backend)])
    y = d * r * g64 + b64
    first_order = np.abs(g64) * (e_d * r + np.abs(d) * r * rel_r) + 3.0 * u * (
        np.abs(d) * r * np.abs(g64) + np.abs(b64)
    )
    return 2.0 * first_order + u_out * (np.abs(y) + 2.0 * first_order)


# --- GRADIENTS (float32 kernels) -------------------------------------------------------------

# Largest |gelu''(z)| of the tanh form (at z = 0, sqrt(2/pi) ~ 0.80).
GELU_CURVATURE = 0.8


def dense_grads_f64(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, g: np.ndarray, activation: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of `sum(g * act(x @ w + b))` w.r.t. `x`, `w`, `b`, in float64,
    written out by hand (chain rule), not by autodiff."""
    x64, w64, g64 = to_f64(x), to_f64(w), to_f64(g)
    z = x64 @ w64 + to_f64(b)
    gz = g64 * _act_prime_f64(z, activation)
    return gz @ w64.T, x64.T @ gz, gz.sum(axis=0)


def _act_prime_f64(z: np.ndarray, activation: str) -> np.ndarray:
    if activation == "none":
        return np.ones_like(z)
    if activation == "relu":
        return (z > 0).astype(np.float64)
    c = np.sqrt(2.0 / np.pi)
    t = np.tanh(c * (z + 0.044715 * z**3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t**2) * c * (1.0 + 3 * 0.044715 * z**2)


def dense_grad_error_bound(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    g: np.ndarray,
    activation: str,
    precision: str = "highest",
    backend: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-element bounds on |kernel gradient - float64 gradient| (float32 operands).

    The backward pass recomputes z (error e_z as in `matmul_error_bound`), forms
    gz = g * act'(z) (error e_gz: relu's act' is exact unless |z| <= e_z, where it
    may flip and the error is |g|; gelu's moves by its curvature times e_z plus
    16 roundings, and by the backend's tanh error times |d act'/d tanh| <=
    0.5 + 0.8 |z| (1 + 0.134 z^2)), then dx = gz @ w.T and dw = x.T @ gz are
    (N+1)- and (M+1)-term inner products of products off by e_p
    (`product_roundoff`) and db an M-term sum.
    """
    x64, w64, b64, g64 = to_f64(x), to_f64(w), to_f64(b), to_f64(g)
    u = UNIT_ROUNDOFF["float32"]
    e_p = product_roundoff("float32", precision, backend)
    m, k = x64.shape
    n = w64.shape[1]
    z = x64 @ w64 + b64
    e_z = dot_relative_error(k + 1, e_p) * (np.abs(x64) @ np.abs(w64) + np.abs(b64))
    gz = g64 * _act_prime_f64(z, activation)
    if activation == "none":
        e_gz = np.zeros_like(gz)
    elif activation == "relu":
        e_gz = np.where(np.abs(z) <= e_z, np.abs(g64), 0.0)
    else:
        tanh_slope = 0.5 + GELU_CURVATURE * np.abs(z) * (1.0 + 3 * 0.044715 * z**2)
        e_gz = np.abs(g64) * (
            GELU_CURVATURE * e_z
            + 16 * u * (1.0 + np.abs(z))
            + TANH_ABS_ERROR[_backend(backend)] * tanh_slope
        )
    a_gz = np.abs(gz) + e_gz
    bx = dot_relative_error(n + 1, e_p) * (a_gz @ np.abs(w64).T) + e_gz @ np.abs(w64).T
    bw = dot_relative_error(m + 1, e_p) * (np.abs(x64).T @ a_gz) + np.abs(x64).T @ e_gz
    bb = gamma(m, u) * a_gz.sum(axis=0) + e_gz.sum(axis=0)
    return bx, bw, bb


def layer_norm_grads_f64(
    x: np.ndarray, gamma_: np.ndarray, beta: np.ndarray, g: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of `sum(g * layer_norm(x))` w.r.t. `x`, `gamma`, `beta` in float64,
    by the closed form dx = r (gy - mean(gy) - xhat mean(gy xhat)), gy = g gamma."""
    del beta
    x64, g64, gam = to_f64(x), to_f64(g), to_f64(gamma_)
    mean = x64.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(((x64 - mean) ** 2).mean(axis=-1, keepdims=True) + LAYER_NORM_EPS)
    xhat = (x64 - mean) * r
    gy = g64 * gam
    dx = r * (
        gy - gy.mean(axis=-1, keepdims=True) - xhat * (gy * xhat).mean(axis=-1, keepdims=True)
    )
    return dx, (g64 * xhat).sum(axis=0), g64.sum(axis=0)


def layer_norm_grad_error_bound(
    x: np.ndarray,
    gamma_: np.ndarray,
    beta: np.ndarray,
    g: np.ndarray,
    backend: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-element bounds on |kernel gradient - float64 gradient| (float32 operands).

    From the forward analysis (`layer_norm_error_bound`): e_d, rel_r. Then
      xhat:        e_xh = e_d r + |xhat| (rel_r + 2u)
      mean(gy):    e_m1 = gamma_{C+1} mean|gy|                 (gy = g gamma, + u|gy|)
      mean(gy xh): e_m2 = gamma_{C+2} mean|gy xhat| + mean(|gy| e_xh)
      dx:          |dx| (rel_r + 3u) + r (u|gy| + e_m1 + |xhat| e_m2 + e_xh |m2|)
      dgamma:      gamma_R sum|g xhat| + sum |g| e_xh;  dbeta: gamma_R sum|g|
    doubled to cover the second-order terms.
    """
    del beta
    x64, g64, gam = to_f64(x), to_f64(g), to_f64(gamma_)
    u = UNIT_ROUNDOFF["float32"]
    rows, c = x64.shape
    d, r, e_d, rel_r = _normalization_errors(x64, u, RSQRT_ERROR_U[_backend(backend)])
    xhat = d * r
    e_xh = e_d * r + np.abs(xhat) * (rel_r + 2.0 * u)
    gy = g64 * gam
    m2 = (gy * xhat).mean(axis=-1, keepdims=True)
    e_m1 = gamma(c + 1, u) * np.abs(gy).mean(axis=-1, keepdims=True)
    e_m2 = gamma(c + 2, u) * np.abs(gy * xhat).mean(axis=-1, keepdims=True) + (
        np.abs(gy) * e_xh
    ).mean(axis=-1, keepdims=True)
    dx = r * (gy - gy.mean(axis=-1, keepdims=True) - xhat * m2)
    bx = np.abs(dx) * (rel_r + 3.0 * u) + r * (
        u * np.abs(gy) + e_m1 + np.abs(xhat) * e_m2 + e_xh * np.abs(m2)
    )
    bg = gamma(rows, u) * np.abs(g64 * xhat).sum(axis=0) + (np.abs(g64) * e_xh).sum(axis=0)
    bb = gamma(rows, u) * np.abs(g64).sum(axis=0)
    return 2.0 * bx, 2.0 * bg, 2.0 * bb
