"""Two Pallas kernels and their `custom_vjp` wrappers.

- `matmul_bias_act(x, w, b)`: `act(x @ w + b)` as one tiled kernel. The grid
  is `(cdiv(M, block_m), cdiv(N, block_n))`; each program owns one
  `(block_m, block_n)` output tile and walks the reduction in `block_k`
  chunks with a `fori_loop`, accumulating in float32, then adds the bias,
  applies the activation and casts once (the fused epilogue).
- `layer_norm(x, gamma, beta)`: one program per `block_rows` rows; the whole
  row sits in one block of `block_cols >= C` columns, so mean, variance and the
  affine output are computed without a second pass over memory.

Edges. When a dimension is not a multiple of its block, the last block runs
past the array. Pallas's interpreter fills those out-of-bounds reads with NaN
(`jax/_src/pallas/hlo_interpreter.py`, "We pad with NaN, to make it easier to
catch OOB accesses"); on a GPU they are undefined. Out-of-bounds output rows
and columns are dropped on write, so only the reduction axis (K of the matmul,
the columns of the layer norm) must be masked: both kernels replace the
out-of-range entries by zero with `jnp.where` on an index comparison.
`mask_edges=False` removes that masking; it exists so that a test can show an
unmasked edge fails (NaN in interpret mode).

Execution mode. `interpret=None` picks the mode from the backend: compiled
(Triton) on a GPU, the interpreter anywhere else. `execution_mode(...)` names
it; every audit record carries that name.

Every public function validates its operands and block sizes before any
kernel is traced (`KernelInputError`, a full sentence naming the value);
concrete operands must also be finite (traced ones, inside `jit` or `grad`,
have no values to check, and NaN propagates there as in `jnp.dot`).
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ACTIVATIONS = ("none", "relu", "gelu")
# Triton's `tl.dot` needs every tile dimension >= 16; Triton blocks are powers of two.
MIN_DOT_BLOCK = 16
MAX_BLOCK = 256
# Shared memory one block may use on an H100/H200 (227 KiB); the matmul's
# staged input tiles, `num_stages * (bm*bk + bk*bn) * itemsize`, must fit.
SHARED_MEMORY_BYTES = 227 * 1024
LAYER_NORM_EPS = 1e-5


class KernelInputError(ValueError):
    """Operands or block sizes a kernel cannot run with; the message says why."""


def default_interpret() -> bool:
    """Interpret everywhere except on a GPU, where the kernel is compiled."""
    return jax.default_backend() != "gpu"


def execution_mode(interpret: bool | None) -> str:
    """`interpret` (Pallas interpreter, any backend) or `compiled` (GPU target)."""
    if interpret is None:
        interpret = default_interpret()
    return "interpret" if interpret else "compiled"


@dataclasses.dataclass(frozen=True)
class MatmulBlocks:
    """Tile sizes of `matmul_bias_act`: output tile `(block_m, block_n)`,
    reduction chunk `block_k`; `num_stages` is the pipeline depth assumed by the
    shared-memory rule (Triton's software pipelining)."""

    block_m: int = 32
    block_n: int = 32
    block_k: int = 32
    num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class RowBlocks:
    """Tiling of `layer_norm`: `block_rows` rows per program; `block_cols`
    (None: the next power of two >= C) columns, which must cover the row."""

    block_rows: int = 8
    block_cols: int | None = None


def fit_matmul_blocks(m: int, k: int, n: int, target: int = 32) -> MatmulBlocks:
    """Blocks of `target` (a power of two), shrunk to the padded size of small
    dimensions (never below 16): what `matmul_bias_act` uses when `blocks=None`."""

    def fit(dim: int) -> int:
        return min(target, max(MIN_DOT_BLOCK, pl.next_power_of_2(dim)))

    return MatmulBlocks(block_m=fit(m), block_n=fit(n), block_k=fit(k))


def fit_row_blocks(rows: int, target: int = 8) -> RowBlocks:
    """`target` rows per program, fewer for a shorter input: the `blocks=None` default."""
    return RowBlocks(block_rows=min(target, pl.next_power_of_2(rows)))


# --- VALIDATION ------------------------------------------------------------------


def _dtype_name(array: jax.Array) -> str:
    return jnp.dtype(array.dtype).name


def _check_dtypes(**arrays: jax.Array) -> None:
    for name, a in arrays.items():
        if not hasattr(a, "dtype") or not hasattr(a, "ndim"):
            raise KernelInputError(
                f"`{name}` must be an array (`jax.Array` or NumPy), not a `{type(a).__name__}`."
            )
    names = {name: _dtype_name(a) for name, a in arrays.items()}
    for name, dtype in names.items():
        if dtype not in DTYPES:
            raise KernelInputError(
                f"`{name}` has dtype `{dtype}`, which the kernels do not support; "
                f"use one of {', '.join(f'`{d}`' for d in DTYPES)}."
            )
    if len(set(names.values())) > 1:
        listed = ", ".join(f"`{n}`: `{d}`" for n, d in names.items())
        raise KernelInputError(f"All operands must share one dtype, but got {listed}.")


def _check_finite(**arrays: jax.Array) -> None:
    """Refuses NaN or infinite entries in concrete operands (a traced operand, inside
    `jit` or `grad`, has no values yet: there NaN propagates as in `jnp.dot`)."""
    for name, a in arrays.items():
        if isinstance(a, jax.core.Tracer) or a.size == 0:
            continue
        host = np.asarray(a)  # On the host: no program compiled per operand shape.
        finite = np.isfinite(host)
        if not finite.all():
            index = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise KernelInputError(
                f"`{name}` has a non-finite entry at {index} (`{float(host[index])}`); the "
                f"kernels take finite operands."
            )


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def _check_block(name: str, block: int, dim_name: str, dim: int, minimum: int) -> None:
    if not isinstance(block, int) or isinstance(block, bool) or not _is_power_of_two(block):
        raise KernelInputError(
            f"`{name}` must be a power of two (Triton blocks are), but got `{block}`."
        )
    if not minimum <= block <= MAX_BLOCK:
        raise KernelInputError(f"`{name}` must lie in [{minimum}, {MAX_BLOCK}], but got `{block}`.")
    largest = max(minimum, pl.next_power_of_2(dim))
    if block > largest:
        raise KernelInputError(
            f"`{name}` = `{block}` exceeds the padded {dim_name} = {dim} (at most `{largest}` "
            f"is useful): the block would be mostly padding; use `{name}` <= {largest}."
        )


def check_matmul(
    x: jax.Array, w: jax.Array, b: jax.Array, blocks: MatmulBlocks, activation: str
) -> None:
    """Raises `KernelInputError` unless `act(x @ w + b)` can run with `blocks`:
    `x` `(M, K)`, `w` `(K, N)`, `b` `(N,)`, one supported dtype, power-of-two
    blocks in [16, 256] no larger than the padded dimension, and staged tiles
    that fit in shared memory for that dtype."""
    if activation not in ACTIVATIONS:
        raise KernelInputError(
            f"Unknown activation `{activation}`; use one of "
            f"{', '.join(f'`{a}`' for a in ACTIVATIONS)}."
        )
    _check_dtypes(x=x, w=w, b=b)
    if x.ndim != 2 or w.ndim != 2 or b.ndim != 1:
        raise KernelInputError(
            f"Expected `x` (M, K), `w` (K, N) and `b` (N,), but got shapes "
            f"`{tuple(x.shape)}`, `{tuple(w.shape)}` and `{tuple(b.shape)}`."
        )
    (m, k), (k2, n) = x.shape, w.shape
    if k != k2:
        raise KernelInputError(
            f"`x` has {k} columns but `w` has {k2} rows (shapes `{tuple(x.shape)}` and "
            f"`{tuple(w.shape)}`); they must be equal."
        )
    if b.shape[0] != n:
        raise KernelInputError(
            f"`b` has {b.shape[0]} entries but `w` has {n} columns; they must be equal."
        )
    if min(m, k, n) < 1:
        raise KernelInputError(
            f"Every dimension must be at least 1, but (M, K, N) = `{(m, k, n)}`."
        )
    _check_block("block_m", blocks.block_m, "M", m, MIN_DOT_BLOCK)
    _check_block("block_n", blocks.block_n, "N", n, MIN_DOT_BLOCK)
    _check_block("block_k", blocks.block_k, "K", k, MIN_DOT_BLOCK)
    if blocks.num_stages < 1:
        raise KernelInputError(f"`num_stages` must be at least 1, got `{blocks.num_stages}`.")
    staged = matmul_staged_bytes(blocks, jnp.dtype(x.dtype).itemsize)
    if staged > SHARED_MEMORY_BYTES:
        raise KernelInputError(
            f"Blocks (block_m, block_n, block_k) = "
            f"`{(blocks.block_m, blocks.block_n, blocks.block_k)}` with `{_dtype_name(x)}` "
            f"operands and {blocks.num_stages} stages need {staged} bytes of shared memory, "
            f"more than the {SHARED_MEMORY_BYTES} a block may use; use smaller blocks."
        )
    _check_finite(x=x, w=w, b=b)


def matmul_staged_bytes(blocks: MatmulBlocks, itemsize: int) -> int:
    """Shared memory for the pipelined input tiles of one program."""
    per_stage = blocks.block_m * blocks.block_k + blocks.block_k * blocks.block_n
    return blocks.num_stages * per_stage * itemsize


def row_block_cols(blocks: RowBlocks, cols: int) -> int:
    """The column block actually used: `block_cols`, or the next power of two >= C."""
    return blocks.block_cols if blocks.block_cols is not None else pl.next_power_of_2(cols)


def check_layer_norm(x: jax.Array, gamma: jax.Array, beta: jax.Array, blocks: RowBlocks) -> None:
    """Raises `KernelInputError` unless the layer norm can run: `x` `(R, C)`,
    `gamma` and `beta` `(C,)`, one supported dtype, power-of-two blocks, and a
    column block that covers the whole row."""
    _check_dtypes(x=x, gamma=gamma, beta=beta)
    if x.ndim != 2 or gamma.shape != (x.shape[-1],) or beta.shape != (x.shape[-1],):
        raise KernelInputError(
            f"Expected `x` (R, C) with `gamma` and `beta` of shape (C,), but got "
            f"`{tuple(x.shape)}`, `{tuple(gamma.shape)}` and `{tuple(beta.shape)}`."
        )
    rows, cols = x.shape
    if min(rows, cols) < 1:
        raise KernelInputError(
            f"Every dimension must be at least 1, but (R, C) = `{(rows, cols)}`."
        )
    _check_block("block_rows", blocks.block_rows, "R", rows, 1)
    block_cols = row_block_cols(blocks, cols)
    if not _is_power_of_two(block_cols):
        raise KernelInputError(
            f"`block_cols` must be a power of two (Triton blocks are), but got `{block_cols}`."
        )
    if block_cols < cols:
        raise KernelInputError(
            f"`block_cols` = `{block_cols}` is smaller than the row length C = {cols}: the "
            f"kernel keeps a whole row in one block; use `block_cols` >= {cols} "
            f"(e.g. {pl.next_power_of_2(cols)}) or leave it unset."
        )
    if block_cols > pl.next_power_of_2(cols):
        raise KernelInputError(
            f"`block_cols` = `{block_cols}` is wider than the padded row length "
            f"{pl.next_power_of_2(cols)} (C = {cols}): the block would be mostly padding; "
            f"use {pl.next_power_of_2(cols)} or leave it unset."
        )
    tile = blocks.block_rows * block_cols * jnp.dtype(x.dtype).itemsize
    if tile > SHARED_MEMORY_BYTES:
        raise KernelInputError(
            f"A `{blocks.block_rows}` x `{block_cols}` tile of `{_dtype_name(x)}` is {tile} "
            f"bytes, more than the {SHARED_MEMORY_BYTES} a block may use; lower `block_rows`."
        )
    _check_finite(x=x, gamma=gamma, beta=beta)


# --- MATMUL + BIAS + ACTIVATION ----------------------------------------------------


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


def _zero_past_k(xk, wk, k, block_k, k_total):
    """Chunk `k` of the reduction with the entries past `K` zeroed: `xk` `(block_m,
    block_k)`, `wk` `(block_k, block_n)`. Those entries lie outside the arrays (NaN
    in the interpreter, undefined on a GPU); zero times anything adds nothing."""
    # --- exercise stage 2: Zero the x columns and w rows whose index is >= k_total. ---
    col = k * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
    xk = jnp.where(col < k_total, xk, jnp.zeros_like(xk))
    row = k * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)
    wk = jnp.where(row < k_total, wk, jnp.zeros_like(wk))
    return xk, wk
    # --- end exercise ---


def _matmul_kernel(x_ref, w_ref, b_ref, o_ref, *, k_total, block_k, num_k, activation, mask):
    """One `(block_m, block_n)` output tile. `x_ref` is a `(block_m, >= num_k*block_k)`
    strip, `w_ref` a `(>= num_k*block_k, block_n)` strip, `b_ref` `(1, block_n)`.
    With `mask`, a ragged reduction edge (K not a multiple of `block_k`) is zeroed.

    Cases:
        accumulator -> float32 `(block_m, block_n)`, each chunk's `jnp.dot` with
            `preferred_element_type=jnp.float32` (never accumulated in bfloat16)
        bias -> cast to float32 before it is added (strict dtype promotion refuses
            bfloat16 + float32), then `activate`, then cast to `o_ref.dtype`
        K a multiple of `block_k` -> no mask at all: `ragged` is a static Python bool,
            so a whole-block shape traces no `iota` and no `select_n`
    """
    block_m, block_n = o_ref.shape
    ragged = mask and k_total % block_k != 0  # Static: only a ragged K needs the mask.

    # --- exercise stage 1: Accumulate x @ w chunk by chunk in float32; add b; activate. ---
    def body(k, acc):
        xk = x_ref[:, pl.ds(k * block_k, block_k)]
        wk = w_ref[pl.ds(k * block_k, block_k), :]
        if ragged:
            xk, wk = _zero_past_k(xk, wk, k, block_k, k_total)
        return acc + jnp.dot(xk, wk, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, num_k, body, jnp.zeros((block_m, block_n), jnp.float32))
    z = acc + b_ref[...].astype(jnp.float32)
    o_ref[...] = activate(z, activation).astype(o_ref.dtype)
    # --- end exercise ---


@functools.partial(jax.jit, static_argnames=("blocks", "activation", "interpret", "mask_edges"))
def _matmul_call(x, w, b, *, blocks, activation, interpret, mask_edges):
    m, k = x.shape
    n = w.shape[1]
    bm, bn, bk = blocks.block_m, blocks.block_n, blocks.block_k
    num_k = pl.cdiv(k, bk)
    # Triton blocks must be powers of two: the strip along K is padded up to one
    # (a multiple of block_k, as block_k is a power of two); only num_k chunks are read.
    k_block = pl.next_power_of_2(num_k * bk)
    kernel = functools.partial(
        _matmul_kernel,
        k_total=k,
        block_k=bk,
        num_k=num_k,
        activation=activation,
        mask=mask_edges,
    )
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[
            pl.BlockSpec((bm, k_block), lambda i, j: (i, 0)),
            pl.BlockSpec((k_block, bn), lambda i, j: (0, j)),
            pl.BlockSpec((1, bn), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
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
    interpret: bool | None = None,
    mask_edges: bool = True,
) -> jax.Array:
    """`act(x @ w + b)` with float32 accumulation, in the operands' dtype.

    `x`: `(M, K)`; `w`: `(K, N)`; `b`: `(N,)`; all float32 or all bfloat16.
    Returns `(M, N)`. `blocks=None` uses `fit_matmul_blocks`. Differentiable
    (a `custom_vjp` whose backward pass runs this same kernel on the transposed
    problems). `mask_edges=False` is for the out-of-bounds test only; it is not
    differentiable.
    """
    if blocks is None and getattr(x, "ndim", 0) == 2 and getattr(w, "ndim", 0) == 2:
        blocks = fit_matmul_blocks(x.shape[0], x.shape[1], w.shape[1])
    check_matmul(x, w, b, blocks or MatmulBlocks(), activation)
    if interpret is None:
        interpret = default_interpret()
    if not mask_edges:
        return _matmul_call(
            x, w, b, blocks=blocks, activation=activation, interpret=interpret, mask_edges=False
        )
    return _fused_dense(x, w, b, blocks, activation, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _fused_dense(x, w, b, blocks, activation, interpret):
    return _matmul_call(
        x, w, b, blocks=blocks, activation=activation, interpret=interpret, mask_edges=True
    )


def _fused_dense_fwd(x, w, b, blocks, activation, interpret):
    y = _fused_dense(x, w, b, blocks, activation, interpret)
    return y, (x, w, b)


def _fused_dense_bwd(blocks, activation, interpret, residuals, g):
    x, w, b = residuals
    call = functools.partial(_matmul_call, interpret=interpret, mask_edges=True)
    # The forward pass keeps only its inputs; the kernel recomputes the pre-activation.
    if activation == "none":
        gz = g.astype(jnp.float32)
    else:
        z = call(x, w, b, blocks=blocks, activation="none").astype(jnp.float32)
        _, act_vjp = jax.vjp(lambda v: activate(v, activation), z)
        (gz,) = act_vjp(g.astype(jnp.float32))
    gz = gz.astype(x.dtype)
    k, n = w.shape
    # dx = gz @ w.T: (M, N) x (N, K); dw = x.T @ gz: (K, M) x (M, N). Same kernel,
    # blocks permuted so each still tiles the dimension it tiled in the forward pass.
    dx_blocks = dataclasses.replace(blocks, block_n=blocks.block_k, block_k=blocks.block_n)
    dw_blocks = dataclasses.replace(blocks, block_m=blocks.block_k, block_k=blocks.block_m)
    dx = call(gz, w.T, jnp.zeros((k,), x.dtype), blocks=dx_blocks, activation="none")
    dw = call(x.T, gz, jnp.zeros((n,), x.dtype), blocks=dw_blocks, activation="none")
    db = jnp.sum(gz.astype(jnp.float32), axis=0).astype(b.dtype)
    return dx, dw, db


_fused_dense.defvjp(_fused_dense_fwd, _fused_dense_bwd)


# --- LAYER NORM ----------------------------------------------------------------------


def _layer_norm_kernel(x_ref, g_ref, b_ref, o_ref, mean_ref, rstd_ref, *, cols, eps, mask):
    """`block_rows` rows. `x_ref` `(block_rows, block_cols)`, `g_ref`/`b_ref`
    `(1, block_cols)`; writes `o_ref` like `x_ref`, `mean_ref`/`rstd_ref` `(block_rows,)`.

    The region leaves `y` (float32, like `x_ref`), `mean` and `rstd` (float32
    `(block_rows, 1)`, kept dims) for the writes after it. Cases:
        statistics -> float32; the mean and the (population) variance divide by
            `cols`, the true row length, not `block_cols`
        eps -> inside the square root, `rsqrt(var + eps)`: it decides rows whose
            variance is near or below 1e-5
        `cols == block_cols` -> no mask at all (`ragged` is a static Python bool)
        `gamma`, `beta` -> cast to float32 (strict dtype promotion refuses mixing)
    """
    block_cols = x_ref.shape[1]
    ragged = mask and cols != block_cols  # Static: only a padded row needs the mask.
    # --- exercise stage 1: Row mean and variance in float32; normalize with rsqrt(var + eps). ---
    x = x_ref[...].astype(jnp.float32)
    if ragged:
        x = _zero_past_cols(x, cols)
    mean = jnp.sum(x, axis=1, keepdims=True) / cols
    d = x - mean
    if ragged:
        d = _zero_past_cols(d, cols)
    var = jnp.sum(d * d, axis=1, keepdims=True) / cols
    rstd = jax.lax.rsqrt(var + eps)
    y = d * rstd * g_ref[...].astype(jnp.float32) + b_ref[...].astype(jnp.float32)
    # --- end exercise ---
    o_ref[...] = y.astype(o_ref.dtype)
    mean_ref[...] = mean[:, 0]
    rstd_ref[...] = rstd[:, 0]


def _zero_past_cols(v, cols):
    """`v` `(block_rows, block_cols)` with the columns `>= cols` zeroed: they lie outside
    the array (NaN in the interpreter), and must count neither in the mean nor the variance."""
    # --- exercise stage 2: Zero every column whose index is >= cols. ---
    valid = jax.lax.broadcasted_iota(jnp.int32, (1, v.shape[1]), 1) < cols
    return jnp.where(valid, v, jnp.zeros_like(v))
    # --- end exercise ---


@functools.partial(jax.jit, static_argnames=("blocks", "interpret", "mask_edges"))
def _layer_norm_call(x, gamma, beta, *, blocks, interpret, mask_edges):
    rows, cols = x.shape
    br = blocks.block_rows
    bc = row_block_cols(blocks, cols)
    kernel = functools.partial(_layer_norm_kernel, cols=cols, eps=LAYER_NORM_EPS, mask=mask_edges)
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[
            pl.BlockSpec((br, bc), lambda i: (i, 0)),
            pl.BlockSpec((1, bc), lambda i: (0, 0)),
            pl.BlockSpec((1, bc), lambda i: (0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((br, bc), lambda i: (i, 0)),
            pl.BlockSpec((br,), lambda i: (i,)),
            pl.BlockSpec((br,), lambda i: (i,)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((rows, cols), x.dtype),
            jax.ShapeDtypeStruct((rows,), jnp.float32),
            jax.ShapeDtypeStruct((rows,), jnp.float32),
        ],
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
    mask_edges: bool = True,
) -> jax.Array:
    """Layer norm over the last axis, `(x - mean) / sqrt(var + 1e-5) * gamma + beta`,
    statistics in float32, output in the operands' dtype.

    `x`: `(R, C)`; `gamma`, `beta`: `(C,)`. `blocks=None` uses `fit_row_blocks`.
    Differentiable (a `custom_vjp`
    whose backward pass is the closed-form layer-norm gradient in `jax.numpy`,
    from the mean and 1/std the kernel saved).
    """
    if blocks is None and getattr(x, "ndim", 0) == 2:
        blocks = fit_row_blocks(x.shape[0])
    check_layer_norm(x, gamma, beta, blocks or RowBlocks())
    if interpret is None:
        interpret = default_interpret()
    if not mask_edges:
        return _layer_norm_call(
            x, gamma, beta, blocks=blocks, interpret=interpret, mask_edges=False
        )[0]
    return _layer_norm(x, gamma, beta, blocks, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x, gamma, beta, blocks, interpret):
    return _layer_norm_call(x, gamma, beta, blocks=blocks, interpret=interpret, mask_edges=True)[0]


def _layer_norm_fwd(x, gamma, beta, blocks, interpret):
    y, mean, rstd = _layer_norm_call(
        x, gamma, beta, blocks=blocks, interpret=interpret, mask_edges=True
    )
    return y, (x, gamma, mean, rstd)


def _layer_norm_bwd(blocks, interpret, residuals, g):
    """The cotangents `(dx, dgamma, dbeta)` of `_layer_norm` for the output cotangent `g`.

    In float32, from the saved `mean` and `rstd` (float32 `(R,)`), with
    `xhat = (x - mean) * rstd` and `gy = g * gamma` (row means over the C columns):
        dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat))   per row
        dgamma = sum over rows of g * xhat;   dbeta = sum over rows of g
    Under the tests' strict rank promotion, broadcast `(R,)` and `(C,)` explicitly
    (`mean[:, None]`, `gamma[None, :]`). The casts back to the operands' dtypes follow.
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
