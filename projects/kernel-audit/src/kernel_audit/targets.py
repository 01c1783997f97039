"""The compiled target (a TPU, through Mosaic) and the rules a kernel must obey there.

Every rule is checked in plain Python before a kernel is traced, with a message
naming the rule, because the Pallas interpreter enforces none of them: a block
shape that interprets fine on a CPU can still be refused by the TPU lowering.

- **Block shapes** (Pallas TPU lowering, `jax/_src/pallas/mosaic/lowering.py`,
  `_check_block_mappings`): the last dimension of a block is a multiple of 128
  (the lanes of a vector register) or equals the array's; the second-to-last a
  multiple of the dtype's sublane tiling or equals the array's. The lowering
  itself asks for a multiple of 8; this module asks for the native tiling, 8
  rows of 32-bit values and 16 of bfloat16 (two values packed per 32-bit
  sublane), so no tile is relaid out.
- **VMEM** (the chip's on-core memory): the pipeline keeps two buffers of every
  input and output block (one in use, one in flight) plus the kernel's scratch
  and its float32 temporaries; their sum must fit `VMEM_LIMIT_BYTES`, which
  each `pallas_call` passes as `vmem_limit_bytes`. A TPU v5e core has 128 MiB
  of VMEM; 32 MiB leaves room for XLA's own buffers.
- **Matmul precision**: a float32 product at `default` precision rounds its
  inputs to bfloat16 on a TPU (one MXU pass); `highest` keeps float32 inputs
  (several passes). Mosaic accepts only those two for float32 and only
  `default` for bfloat16, whose products are exact in float32 anyway.

Execution mode: `interpret=None` compiles on a TPU backend and interprets
everywhere else; `execution_mode(...)` names the mode, and every record carries it.
"""

import os

import jax

LANES = 128
SUBLANES_32BIT = 8
VMEM_LIMIT_BYTES = 32 * 2**20
PRECISIONS = ("highest", "default")
# Nominal TPU v5e figures (Google's published chip specification): the roofline's
# nominal ceilings, shown beside the ceilings measured in the same run.
TPU_V5E_PEAK_BF16_FLOPS = 197e12
TPU_V5E_HBM_BYTES_PER_S = 819e9


def default_interpret() -> bool:
    """Compile on a TPU, where Mosaic lowers the kernels; interpret everywhere else,
    or everywhere when the environment sets `KERNEL_AUDIT_MODE=interpret` (so the
    same tests run both modes on a TPU)."""
    if os.environ.get("KERNEL_AUDIT_MODE", "auto") == "interpret":
        return True
    return jax.default_backend() != "tpu"


def execution_mode(interpret: bool | None) -> str:
    """`interpret` (Pallas interpreter, any backend) or `compiled` (Mosaic, on a TPU)."""
    if interpret is None:
        interpret = default_interpret()
    return "interpret" if interpret else "compiled"


def sublane_multiple(itemsize: int) -> int:
    """Rows of one native tile: 8 for 32-bit values, 16 for 16-bit (packed in pairs)."""
    return SUBLANES_32BIT * max(1, 4 // itemsize)


def lax_precision(precision: str, dtype_name: str) -> jax.lax.Precision:
    """The `jax.lax.Precision` of a dot on `dtype_name` operands: `precision` for
    float32, `DEFAULT` for bfloat16 (exact products; Mosaic refuses `HIGHEST` there)."""
    if dtype_name == "bfloat16" or precision == "default":
        return jax.lax.Precision.DEFAULT
    return jax.lax.Precision.HIGHEST


def block_rule_violation(
    name: str, block: int, dim_name: str, dim: int, multiple: int, axis: str
) -> str | None:
    """The TPU block-shape rule `block` breaks along one axis, or None.

    `axis` is `lane` (last dimension: a multiple of 128) or `sublane` (second to
    last: a multiple of `multiple`); either way a block equal to the whole
    dimension is allowed, and a block wider than the dimension rounded up to that
    multiple is refused as mostly padding.
    """
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        return f"`{name}` must be a positive integer, but got `{block}`."
    if block == dim:
        return None
    if block % multiple != 0:
        return (
            f"`{name}` = `{block}` breaks the TPU block rule for the {axis} axis: a block's "
            f"{'last' if axis == 'lane' else 'second-to-last'} dimension must be a multiple "
            f"of {multiple} or equal the array's ({dim_name} = {dim}); use a multiple of "
            f"{multiple} or {dim}."
        )
    padded = -(-dim // multiple) * multiple
    if block > padded:
        return (
            f"`{name}` = `{block}` exceeds {dim_name} = {dim} rounded up to the tile "
            f"({padded}): the block would be mostly padding; use `{name}` <= {padded} "
            f"or exactly {dim}."
        )
    return None


def matmul_vmem_bytes(
    block_m: int, block_n: int, block_k: int, itemsize: int, split_float32: bool = False
) -> int:
    """VMEM of one matmul program: double-buffered `x`, `w`, bias and output blocks,
    the float32 accumulator, and the float32 product of one step. A float32 product
    at `highest` (`split_float32`) also holds each input block split into three
    bfloat16 parts and a second float32 partial product: on a TPU v5e, (1024, 1024,
    512) float32 blocks at `highest` took 34.47 MB of scoped VMEM, 9.3 MB more than
    the first three terms. The count is symmetric in `block_m` and `block_n`, and
    Mosaic is not: there (1024, 512, 1024) float32 blocks at `highest` (counted
    32.5 MB) overflowed the 33.5 MB limit while (512, 1024, 1024) compiled, so a
    count just under the limit can still fail to compile, which the bench records
    as a failed path."""
    inputs = (block_m * block_k + block_k * block_n + block_n) * itemsize
    output = block_m * block_n * itemsize
    needed = 2 * (inputs + output) + 2 * block_m * block_n * 4
    if split_float32:
        needed += 3 * 2 * (block_m * block_k + block_k * block_n) + block_m * block_n * 4
    return needed


def layer_norm_vmem_bytes(block_rows: int, cols: int, itemsize: int) -> int:
    """VMEM of one layer-norm program: double-buffered input and output row blocks,
    `gamma`, `beta` and the two statistics, and three float32 temporaries of the
    block (the upcast rows, the centred rows, the output before its cast)."""
    blocks = 2 * block_rows * cols * itemsize + 2 * cols * itemsize + 2 * block_rows * 4
    return 2 * blocks + 3 * block_rows * cols * 4


def vmem_violation(what: str, needed: int) -> str | None:
    """The VMEM rule `needed` bytes break, or None."""
    if needed <= VMEM_LIMIT_BYTES:
        return None
    return (
        f"{what} need {needed} bytes of VMEM (double-buffered blocks plus float32 "
        f"temporaries), more than the {VMEM_LIMIT_BYTES} the kernel is given; use smaller blocks."
    )
