"""`layer_norm(x, gamma, beta)`: a row-wise fused layer norm as one Pallas kernel.

One program per `block_rows` rows (a `parallel` grid axis). A block is
`(block_rows, C)`: its last dimension equals the array's, which the TPU block
rule always allows whatever C is, and each row sits whole in VMEM, so mean,
variance and the affine output come from one read of the row and one write.
The saved statistics are `(R, 1)` float32 arrays written in `(block_rows, 1)`
blocks (last dimension equal to the array's again); the backward pass uses them.

Edges. When R is not a multiple of `block_rows`, the last block's extra rows
lie outside the array: NaN in the interpreter, stale memory on a TPU. Rows
are independent and out-of-bounds rows are dropped on write, so they need no
mask; within a row every column is real.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernel_audit import targets
from kernel_audit.validation import RowBlocks, check_layer_norm, dtype_name, fit_row_blocks

LAYER_NORM_EPS = 1e-5


def _layer_norm_kernel(x_ref, g_ref, b_ref, o_ref, mean_ref, rstd_ref, *, eps):
    """`block_rows` whole rows. `x_ref` `(block_rows, C)`, `g_ref`/`b_ref` `(1, C)`;
    writes `o_ref` like `x_ref`, `mean_ref`/`rstd_ref` `(block_rows, 1)` float32.

    The region leaves `y` (float32, like `x_ref`), `mean` and `rstd` (float32
    `(block_rows, 1)`, kept dims) for the writes after it. Cases:
        statistics -> float32; the mean and the (population) variance divide by C
            [claim:layer-norm-float32-population-statistics]
        eps -> inside the square root, `rsqrt(var + eps)`: it decides rows whose
            variance is near or below 1e-5 [claim:layer-norm-eps-inside-rsqrt]
        `gamma`, `beta` -> cast to float32 (strict dtype promotion refuses mixing)
            [claim:layer-norm-affine-in-float32]
    """
    cols = x_ref.shape[1]
    # --- exercise stage 1: Row mean and variance in float32; normalize with rsqrt(var + eps). ---
    x = x_ref[...].astype(jnp.float32)
    mean = jnp.sum(x, axis=1, keepdims=True) / cols
    d = x - mean
    var = jnp.sum(d * d, axis=1, keepdims=True) / cols
    rstd = jax.lax.rsqrt(var + eps)
    y = d * rstd * g_ref[...].astype(jnp.float32) + b_ref[...].astype(jnp.float32)
    # --- end exercise ---
    o_ref[...] = y.astype(o_ref.dtype)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


@functools.partial(jax.jit, static_argnames=("blocks", "interpret"))
def _layer_norm_call(x, gamma, beta, *, blocks, interpret):
    rows, cols = x.shape
    br = blocks.block_rows
    kernel = functools.partial(_layer_norm_kernel, eps=LAYER_NORM_EPS)
    stats = jax.ShapeDtypeStruct((rows, 1), jnp.float32)
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[
            pl.BlockSpec((br, cols), lambda i: (i, 0)),
            pl.BlockSpec((1, cols), lambda i: (0, 0)),
            pl.BlockSpec((1, cols), lambda i: (0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((br, cols), lambda i: (i, 0)),
            pl.BlockSpec((br, 1), lambda i: (i, 0)),
            pl.BlockSpec((br, 1), lambda i: (i, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct((rows, cols), x.dtype), stats, stats],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",), vmem_limit_bytes=targets.VMEM_LIMIT_BYTES
        ),
        interpret=interpret,
        name="layer_norm",
    )(x, gamma.reshape(1, cols), beta.reshape(1, cols))


def layer_norm(
    x: jax.Array,
    gamma: jax.Array,
    beta: jax.Array,
    *,
    blocks: RowBlocks | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Layer norm over the last axis, `(x - mean) / sqrt(var + 1e-5) * gamma + beta`,
    statistics in float32, output in the operands' dtype.

    `x`: `(R, C)`; `gamma`, `beta`: `(C,)`. `blocks=None` uses `fit_row_blocks`.
    Differentiable (a `custom_vjp` whose backward pass is the closed-form layer-norm
    gradient in `jax.numpy`, from the mean and 1/std the kernel saved).
    """
    if blocks is None and getattr(x, "ndim", 0) == 2 and hasattr(x, "dtype"):
        blocks = fit_row_blocks(x.shape[0], dtype_name(x))
    check_layer_norm(x, gamma, beta, blocks or RowBlocks())
    if interpret is None:
        interpret = targets.default_interpret()
    return _layer_norm(x, gamma, beta, blocks, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x, gamma, beta, blocks, interpret):
    return _layer_norm_call(x, gamma, beta, blocks=blocks, interpret=interpret)[0]


def _layer_norm_fwd(x, gamma, beta, blocks, interpret):
    y, mean, rstd = _layer_norm_call(x, gamma, beta, blocks=blocks, interpret=interpret)
    return y, (x, gamma, mean[:, 0], rstd[:, 0])


def _layer_norm_bwd(blocks, interpret, residuals, g):
    """The cotangents `(dx, dgamma, dbeta)` of `_layer_norm` for the output cotangent `g`.

    In float32, from the saved `mean` and `rstd` (float32 `(R,)`), with
    `xhat = (x - mean) * rstd` and `gy = g * gamma` (row means over the C columns):
        dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat))   per row
            [claim:layer-norm-grad-dx]
        dgamma = sum over rows of g * xhat;   dbeta = sum over rows of g
            [claim:layer-norm-grad-dgamma-dbeta]
    Under the tests' strict rank promotion, broadcast `(R,)` and `(C,)` explicitly
    (`mean[:, None]`, `gamma[None, :]`) [claim:layer-norm-grad-explicit-broadcast]. The
    casts back to the operands' dtypes follow.
    """
    del blocks, interpret
    x, gamma, mean, rstd = residuals
    cols = x.shape[1]
    g32 = g.astype(jnp.float32)
    # --- exercise stage 2: The closed-form layer-norm gradients from the saved mean and rstd. ---
    xhat = (x.astype(jnp.float32) - mean[:, None]) * rstd[:, None]
    gy = g32 * gamma.astype(jnp.float32)[None, :]
    # d/dx of (x - mean) * rstd, contracted with gy (the standard closed form).
    mean_gy = jnp.sum(gy, axis=1, keepdims=True) / cols
    mean_gy_xhat = jnp.sum(gy * xhat, axis=1, keepdims=True) / cols
    dx = rstd[:, None] * (gy - mean_gy - xhat * mean_gy_xhat)
    dgamma = jnp.sum(g32 * xhat, axis=0)
    dbeta = jnp.sum(g32, axis=0)
    # --- end exercise ---
    return dx.astype(x.dtype), dgamma.astype(gamma.dtype), dbeta.astype(gamma.dtype)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
