"""The sizes of `kernel-audit bench`: its settings, the block sizes each sweeps,
which of those the kernels refuse, and every kernel configuration a size compiles.

A block size is refused by the kernel's own check (`kernels.check_matmul`,
`kernels.check_layer_norm`: the TPU block rules and the VMEM budget), run on
abstract operands (`jax.eval_shape`), so deciding it builds no array and no
kernel. `tpu_bench_configs()` lists what the `tpu` size compiles (one dict per
kernel: `kernel`, `shape`, `dtype`, `precision`, `blocks`, `activation`), so
that a test on a CPU can lower each for `platforms=["tpu"]` with `jax.export`.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from kernel_audit import kernels


@dataclasses.dataclass(frozen=True)
class BenchSize:
    """Settings and blocks of one bench run.

    matmuls: `(M, K, N, dtype, precision)` per matmul setting; matmul_blocks:
    `(block_m, block_n, block_k)` swept at every matmul setting; layer_norms:
    `(R, C, dtype)` per layer-norm setting; row_blocks: `block_rows` swept there
    (refused blocks are recorded with the kernel's message); repeats: timed rounds;
    gemms: `(n, dtype, precision)` of the ceiling GEMMs (the first is the headline
    FLOP/s ceiling); copy_mib: size of the copy ceiling; dtype_in_names: whether
    setting names carry the dtype (the `cpu` size keeps the names of its committed
    reports: `matmul_256x512x256`, not `matmul_256x512x256_float32_highest`).
    """

    matmuls: tuple[tuple[int, int, int, str, str], ...]
    matmul_blocks: tuple[tuple[int, int, int], ...]
    layer_norms: tuple[tuple[int, int, str], ...]
    row_blocks: tuple[int, ...]
    repeats: int
    gemms: tuple[tuple[int, str, str], ...]
    copy_mib: int
    dtype_in_names: bool


TPU_MATMUL_SIDES = (1024, 2048, 4096, 8192)
# float32 at `highest` is left out at 8192^3: about 40 ms a call there, times 7 paths
# and 21 calls, would take a sixth of the run's two minutes for one setting.
TPU_F32_MAX_SIDE = 4096

SIZES = {
    # Seconds, in interpret mode on a CPU; for tests. Each dtype refuses one block:
    # block_n = 64 is neither a multiple of 128 nor N (the lane rule), and a bfloat16
    # block of 8 rows breaks its 16-row sublane tiling.
    "tiny": BenchSize(
        matmuls=((64, 256, 128, "float32", "highest"), (64, 256, 128, "bfloat16", "default")),
        matmul_blocks=((32, 128, 128), (64, 128, 256), (32, 64, 128)),
        layer_norms=((32, 256, "float32"), (32, 256, "bfloat16")),
        row_blocks=(8, 16),
        repeats=3,
        gemms=((128, "float32", "highest"), (128, "bfloat16", "default")),
        copy_mib=4,
        dtype_in_names=True,
    ),
    # The CPU run: interpret mode, correctness-only timings. The names of its settings
    # and XLA paths are those of the committed reports (`benchmarks/run-*.json`).
    "cpu": BenchSize(
        matmuls=((256, 512, 256, "float32", "highest"), (100, 1000, 40, "float32", "highest")),
        matmul_blocks=((32, 128, 128), (64, 128, 256), (128, 256, 512)),
        layer_norms=((256, 1000, "float32"),),
        row_blocks=(8, 64),
        repeats=20,
        gemms=((1024, "float32", "highest"),),
        copy_mib=64,
        dtype_in_names=False,
    ),
    # The TPU run (Mosaic-compiled kernels): 1024^3 to 8192^3 in bfloat16 and in
    # float32 at `highest`, to find where the kernel stops helping; layer norms of
    # 64 Mi to 32 Mi entries, memory-bound.
    "tpu": BenchSize(
        matmuls=tuple(
            (s, s, s, dtype, precision)
            for dtype, precision in (("bfloat16", "default"), ("float32", "highest"))
            for s in TPU_MATMUL_SIDES
            if dtype == "bfloat16" or s <= TPU_F32_MAX_SIDE
        ),
        matmul_blocks=(
            (256, 256, 512),
            (512, 512, 512),
            (1024, 1024, 512),
            (512, 1024, 1024),
            (1024, 512, 1024),
        ),
        layer_norms=tuple(
            (r, c, dtype)
            for r, c in ((8192, 8192), (16384, 4096), (32768, 1024))
            for dtype in ("bfloat16", "float32")
        ),
        row_blocks=(8, 32, 128, 256, 512),
        repeats=20,
        gemms=((8192, "bfloat16", "default"), (4096, "float32", "highest")),
        copy_mib=1024,
        dtype_in_names=True,
    ),
}


def resolve_size(name: str, interpret: bool | None = None) -> str:
    """`auto` means `tpu` where the kernels compile (a TPU backend, not forced to
    interpret) and `cpu` elsewhere; an unknown name is a `ValueError` naming it."""
    if name == "auto":
        if interpret is None:
            interpret = kernels.default_interpret()
        return "tpu" if jax.default_backend() == "tpu" and not interpret else "cpu"
    if name not in SIZES:
        raise ValueError(f"Unknown bench size `{name}`; use `auto` or one of {sorted(SIZES)}.")
    return name


def kind_of(dtype: str, precision: str | None) -> str:
    """`bfloat16`, or `float32_<precision>`: the arithmetic a setting's products use."""
    return dtype if dtype == "bfloat16" or precision is None else f"{dtype}_{precision}"


def matmul_setting_name(m: int, k: int, n: int, dtype: str, precision: str, size: BenchSize):
    base = f"matmul_{m}x{k}x{n}"
    return f"{base}_{kind_of(dtype, precision)}" if size.dtype_in_names else base


def row_setting_name(rows: int, cols: int, dtype: str, size: BenchSize) -> str:
    base = f"layer_norm_{rows}x{cols}"
    return f"{base}_{dtype}" if size.dtype_in_names else base


def blocks_name(b: kernels.MatmulBlocks) -> str:
    return f"{b.block_m}x{b.block_n}x{b.block_k}"


def _refusal(check: Callable[..., None], *specs: jax.ShapeDtypeStruct) -> str | None:
    """The kernel check's message for abstract operands of `specs`, or None."""
    try:
        jax.eval_shape(check, *specs)
    except kernels.KernelInputError as err:
        return str(err)
    return None


def matmul_specs(m: int, k: int, n: int, dtype: str) -> tuple[jax.ShapeDtypeStruct, ...]:
    d = kernels.DTYPES[dtype]
    return (
        jax.ShapeDtypeStruct((m, k), d),
        jax.ShapeDtypeStruct((k, n), d),
        jax.ShapeDtypeStruct((n,), d),
    )


def row_specs(rows: int, cols: int, dtype: str) -> tuple[jax.ShapeDtypeStruct, ...]:
    d = kernels.DTYPES[dtype]
    return (
        jax.ShapeDtypeStruct((rows, cols), d),
        jax.ShapeDtypeStruct((cols,), d),
        jax.ShapeDtypeStruct((cols,), d),
    )


def matmul_blocks_for(
    m: int, k: int, n: int, dtype: str, precision: str, size: BenchSize
) -> tuple[list[kernels.MatmulBlocks], dict[str, str]]:
    """The size's matmul blocks the kernel accepts for this problem, in sweep order,
    and the refused ones (name -> the kernel's message)."""
    valid, refused = [], {}
    for bm, bn, bk in size.matmul_blocks:
        blocks = kernels.MatmulBlocks(block_m=bm, block_n=bn, block_k=bk)
        check = functools.partial(
            kernels.check_matmul, blocks=blocks, activation="gelu", precision=precision
        )
        message = _refusal(check, *matmul_specs(m, k, n, dtype))
        if message is None:
            valid.append(blocks)
        else:
            refused[blocks_name(blocks)] = message
    return valid, refused


def row_blocks_for(
    rows: int, cols: int, dtype: str, size: BenchSize
) -> tuple[list[kernels.RowBlocks], dict[str, str]]:
    """The size's row blocks the layer norm accepts, and the refused ones
    (`rows<block_rows>` -> the kernel's message)."""
    valid, refused = [], {}
    for br in size.row_blocks:
        blocks = kernels.RowBlocks(block_rows=br)
        check = functools.partial(kernels.check_layer_norm, blocks=blocks)
        message = _refusal(check, *row_specs(rows, cols, dtype))
        if message is None:
            valid.append(blocks)
        else:
            refused[f"rows{br}"] = message
    return valid, refused


def bench_configs(size_name: str) -> list[dict[str, Any]]:
    """Every kernel configuration `size_name` compiles, one dict each: `kernel`
    (`matmul` or `layer_norm`), operand `shape` (`(M, K, N)` or `(R, C)`), `dtype`,
    matmul `precision` (None for the layer norm), `blocks` (`MatmulBlocks` or
    `RowBlocks`) and the matmul's `activation` (`gelu` for the fused kernel at each
    accepted block size, `none` for the unfused variant at the first, whose bias and
    gelu XLA adds; None for the layer norm, at each accepted row block)."""
    size = SIZES[size_name]
    out: list[dict[str, Any]] = []
    for m, k, n, dtype, precision in size.matmuls:
        valid, _ = matmul_blocks_for(m, k, n, dtype, precision, size)
        base = {"kernel": "matmul", "shape": (m, k, n), "dtype": dtype, "precision": precision}
        out += [{**base, "blocks": blocks, "activation": "gelu"} for blocks in valid]
        if valid:
            out.append({**base, "blocks": valid[0], "activation": "none"})
    for rows, cols, dtype in size.layer_norms:
        base = {"kernel": "layer_norm", "shape": (rows, cols), "dtype": dtype, "precision": None}
        for blocks in row_blocks_for(rows, cols, dtype, size)[0]:
            out.append({**base, "blocks": blocks, "activation": None})
    return out


def tpu_bench_configs() -> list[dict[str, Any]]:
    """Every kernel configuration the `tpu` size compiles (see `bench_configs`)."""
    return bench_configs("tpu")
