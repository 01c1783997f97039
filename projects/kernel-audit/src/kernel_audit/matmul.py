"""`matmul_bias_act(x, w, b)`: `act(x @ w + b)` as one tiled Pallas kernel, in the TPU idiom.

The grid is `(cdiv(M, block_m), cdiv(N, block_n), cdiv(K, block_k))`. The first
two axes are `parallel`: each `(i, j)` owns one `(block_m, block_n)` output tile.
The last axis walks the reduction and is `arbitrary` (sequential, so the
accumulator carries from one step to the next). Per step the pipeline brings an
`x` block `(block_m, block_k)` and a `w` block `(block_k, block_n)` into VMEM;
the kernel adds their product to a float32 VMEM scratch accumulator. Under
`pl.when`, the first step zeroes the accumulator and the last applies the fused
epilogue: bias, activation, one cast to the output dtype.

Edges. When a dimension is not a multiple of its block, the last block runs
past the array. The Pallas interpreter fills those reads with NaN; on a TPU
they hold whatever the buffer held. Out-of-bounds output rows and columns are
dropped on write, so only the reduction axis K must be masked: entries past K
are replaced by zero with `jnp.where` on an index comparison (a select, so even
a NaN there adds nothing). `mask_edges=False` removes that masking, so that a
test can show an unmasked edge fails (NaN in interpret mode).

Precision: `precision` (`highest` or `default`) is the matmul precision of
float32 operands (see `targets`); bfloat16 operands always multiply exactly.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernel_audit import targets
from kernel_audit.validation import (
    KernelInputError,
    MatmulBlocks,
    check_matmul,
    dtype_name,
    fit_matmul_blocks,
)


def activate(z: jax.Array, activation: str) -> jax.Array:
    """The epilogue activation on float32 values. `gelu` is the tanh form
    (Hendrycks & Gimpel 2016, eq. in section 2), as `jax.nn.gelu(approximate=True)`."""
    if activation == "none":
        return z
    if activation == "relu":
        return jnp.maximum(z, jnp.zeros_like(z))
    if activation == "gelu":
        inner = math.sqrt(2.0 / math.pi) * (z + 0.044715 * z * z * z)
        return 0.5 * z * (1.0 + jnp.tanh(inner))
    raise KernelInputError(f"Unknown activation `{activation}`.")


def _zero_past_k(xk, wk, k, k_total):
    """Reduction step `k` with the entries past `K` zeroed: `xk` `(block_m, block_k)`,
    `wk` `(block_k, block_n)`. Those entries lie outside the arrays (NaN in the
    interpreter, stale memory on a TPU); a select makes them exact zeros
    [claim:ragged-k-zeroed-by-select]."""
    block_k = xk.shape[1]
    # --- exercise stage 2: Zero the x columns and w rows whose index is >= k_total. ---
    col = k * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
    xk = jnp.where(col < k_total, xk, jnp.zeros_like(xk))
    row = k * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)
    wk = jnp.where(row < k_total, wk, jnp.zeros_like(wk))
    return xk, wk
    # --- end exercise ---


def _matmul_kernel(
    x_ref, w_ref, b_ref, o_ref, acc_ref, *, k_total, num_k, activation, precision, mask
):
    """One reduction step of one `(block_m, block_n)` output tile.

    `x_ref` `(block_m, block_k)`, `w_ref` `(block_k, block_n)`, `b_ref` `(1, block_n)`,
    `o_ref` `(block_m, block_n)`, `acc_ref` a float32 `(block_m, block_n)` VMEM
    scratch that persists across the `k` axis (`pl.program_id(2)`, `num_k` steps).

    Cases:
        first step (`k == 0`) -> zero the accumulator, under `pl.when`
            [claim:matmul-acc-zeroed-at-first-step]
        every step -> `acc += dot(xk, wk)` with `preferred_element_type=jnp.float32`
            (never accumulated in bfloat16) [claim:matmul-accumulates-in-float32] and
            `precision` named [claim:matmul-precision-named]
        last step (`k == num_k - 1`) -> bias cast to float32 and added (strict dtype
            promotion refuses bfloat16 + float32), `activate`, one cast to `o_ref.dtype`
            [claim:matmul-epilogue-at-last-step]
        K a multiple of `block_k` -> no mask at all: `ragged` is a static Python bool,
            so a whole-block shape traces no `iota` and no `select_n`
            [claim:matmul-no-mask-when-k-divides]
    """
    k = pl.program_id(2)
    ragged = mask and k_total % x_ref.shape[1] != 0  # Static: only a ragged K needs the mask.

    # --- exercise stage 1: Zero acc at k == 0; add dot(x, w) in float32; bias + act at the end. ---
    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    xk, wk = x_ref[...], w_ref[...]
    if ragged:
        xk, wk = _zero_past_k(xk, wk, k, k_total)
    acc_ref[...] += jnp.dot(xk, wk, preferred_element_type=jnp.float32, precision=precision)

    @pl.when(k == num_k - 1)
    def _epilogue():
        z = acc_ref[...] + b_ref[...].astype(jnp.float32)
        o_ref[...] = activate(z, activation).astype(o_ref.dtype)

    # --- end exercise ---


@functools.partial(
    jax.jit, static_argnames=("blocks", "activation", "precision", "interpret", "mask_edges")
)
def _matmul_call(x, w, b, *, blocks, activation, precision, interpret, mask_edges):
    m, k = x.shape
    n = w.shape[1]
    bm, bn, bk = blocks.block_m, blocks.block_n, blocks.block_k
    num_k = pl.cdiv(k, bk)
    kernel = functools.partial(
        _matmul_kernel,
        k_total=k,
        num_k=num_k,
        activation=activation,
        precision=targets.lax_precision(precision, dtype_name(x)),
        mask=mask_edges,
    )
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), num_k),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, s: (i, s)),
            pl.BlockSpec((bk, bn), lambda i, j, s: (s, j)),
            pl.BlockSpec((1, bn), lambda i, j, s: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, s: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=targets.VMEM_LIMIT_BYTES,
        ),
        interpret=interpret,
        name=f"matmul_bias_{activation}",
    )(x, w, b.reshape(1, n))


def matmul_bias_act(
    x: jax.Array,
    w: jax.Array,
    b: jax.Array,
    *,
    blocks: MatmulBlocks | None = None,
    activation: str = "none",
    precision: str = "highest",
    interpret: bool | None = None,
    mask_edges: bool = True,
) -> jax.Array:
    """`act(x @ w + b)` with float32 accumulation, in the operands' dtype.

    `x`: `(M, K)`; `w`: `(K, N)`; `b`: `(N,)`; all float32 or all bfloat16.
    Returns `(M, N)`. `blocks=None` uses `fit_matmul_blocks`. `precision` names
    the matmul precision of float32 operands (`highest`: float32 products on every
    backend; `default`: bfloat16 inputs on a TPU). Differentiable (a `custom_vjp`
    whose backward pass runs this same kernel on the transposed problems).
    `mask_edges=False` is for the out-of-bounds test only; it is not differentiable.
    """
    if blocks is None and getattr(x, "ndim", 0) == 2 and getattr(w, "ndim", 0) == 2:
        blocks = fit_matmul_blocks(x.shape[0], x.shape[1], w.shape[1])
    check_matmul(x, w, b, blocks or MatmulBlocks(), activation, precision)
    if interpret is None:
        interpret = targets.default_interpret()
    call = functools.partial(
        _matmul_call,
        blocks=blocks,
        activation=activation,
        precision=precision,
        interpret=interpret,
    )
    if not mask_edges:
        return call(x, w, b, mask_edges=False)
    return _fused_dense(x, w, b, blocks, activation, precision, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _fused_dense(x, w, b, blocks, activation, precision, interpret):
    return _matmul_call(
        x,
        w,
        b,
        blocks=blocks,
        activation=activation,
        precision=precision,
        interpret=interpret,
        mask_edges=True,
    )


def _fused_dense_fwd(x, w, b, blocks, activation, precision, interpret):
    y = _fused_dense(x, w, b, blocks, activation, precision, interpret)
    return y, (x, w, b)


def _lane_block(block: int, dim: int) -> int:
    """`block` as a reduction (lane) block: rounded up to a multiple of 128, or the
    whole dimension when that is no larger."""
    rounded = -(-block // targets.LANES) * targets.LANES
    return dim if dim <= rounded else rounded


def _fused_dense_bwd(blocks, activation, precision, interpret, residuals, g):
    x, w, b = residuals
    m = x.shape[0]
    k, n = w.shape
    call = functools.partial(
        _matmul_call, precision=precision, interpret=interpret, mask_edges=True
    )
    # The forward pass keeps only its inputs; the kernel recomputes the pre-activation.
    if activation == "none":
        gz = g.astype(jnp.float32)
    else:
        z = call(x, w, b, blocks=blocks, activation="none").astype(jnp.float32)
        _, act_vjp = jax.vjp(lambda v: activate(v, activation), z)
        (gz,) = act_vjp(g.astype(jnp.float32))
    gz = gz.astype(x.dtype)
    # dx = gz @ w.T: (M, N) x (N, K); dw = x.T @ gz: (K, M) x (M, N). Same kernel, blocks
    # permuted so each still tiles the dimension it tiled in the forward pass; a block
    # that becomes a reduction (lane) block is rounded up to the lane rule.
    dx_blocks = MatmulBlocks(blocks.block_m, blocks.block_k, _lane_block(blocks.block_n, n))
    dw_blocks = MatmulBlocks(blocks.block_k, blocks.block_n, _lane_block(blocks.block_m, m))
    dx = call(gz, w.T, jnp.zeros((k,), x.dtype), blocks=dx_blocks, activation="none")
    dw = call(x.T, gz, jnp.zeros((n,), x.dtype), blocks=dw_blocks, activation="none")
    db = jnp.sum(gz.astype(jnp.float32), axis=0).astype(b.dtype)
    return dx, dw, db


_fused_dense.defvjp(_fused_dense_fwd, _fused_dense_bwd)
