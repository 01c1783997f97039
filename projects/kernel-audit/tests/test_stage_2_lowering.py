"""Stage 2: every kernel configuration the project runs lowers for a TPU, checked on a CPU.

Independent check: the Pallas interpreter enforces none of the TPU's rules, so a
kernel that interprets correctly can still be refused by the chip. `jax.export`
with `platforms=["tpu"]` runs the Pallas TPU lowering (Mosaic) on any machine,
and refuses a bad block shape with the same error as the chip. Every
configuration the stages, the `check` command, the audit's default table and
the TPU bench use is exported that way, forward and (for the stage tests'
shapes) backward; the negative control exports a block shape the TPU refuses,
past the project's own checks, and the lowering must refuse it.
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import pytest
from jax import export

from kernel_audit import bench, data, kernels
from kernel_audit.config import Config
from kernel_audit.matmul import _matmul_call


def _lower_matmul(m, k, n, dtype, blocks, activation="gelu", precision="highest", grad=False):
    """Exports `matmul_bias_act` (or its gradient) for a TPU from abstract operands."""

    def f(x, w, b):
        y = kernels.matmul_bias_act(
            x, w, b, blocks=blocks, activation=activation, precision=precision, interpret=False
        )
        return jnp.sum(y.astype(jnp.float32))

    fn = jax.grad(f, argnums=(0, 1, 2)) if grad else f
    dt = kernels.DTYPES[dtype]
    args = (
        jax.ShapeDtypeStruct((m, k), dt),
        jax.ShapeDtypeStruct((k, n), dt),
        jax.ShapeDtypeStruct((n,), dt),
    )
    return export.export(jax.jit(fn), platforms=["tpu"])(*args)


def _lower_layer_norm(rows, cols, dtype, blocks, grad=False):
    def f(x, g, b):
        return jnp.sum(kernels.layer_norm(x, g, b, blocks=blocks, interpret=False))

    fn = jax.grad(f, argnums=(0, 1, 2)) if grad else f
    dt = kernels.DTYPES[dtype]
    args = (
        jax.ShapeDtypeStruct((rows, cols), dt),
        jax.ShapeDtypeStruct((cols,), dt),
        jax.ShapeDtypeStruct((cols,), dt),
    )
    return export.export(jax.jit(fn), platforms=["tpu"])(*args)


def _mosaic_calls(exported) -> int:
    return exported.mlir_module().count("tpu_custom_call")


def _audit_configs():
    """Every (case, dtype, blocks) cell of the default audit the kernels accept."""
    config = Config.default()
    matmul, rows = set(), set()
    for case, dtype, triple in itertools.product(
        data.MATMUL_CASES, config.dtypes, config.matmul_blocks
    ):
        blocks = kernels.fit_matmul_blocks(case.m, case.k, case.n, kernels.MatmulBlocks(*triple))
        if _accepted_matmul(case.m, case.k, case.n, dtype, blocks):
            matmul.add((case.m, case.k, case.n, dtype, blocks))
    for case, dtype, target in itertools.product(data.ROW_CASES, config.dtypes, config.row_blocks):
        blocks = kernels.fit_row_blocks(case.rows, dtype, target)
        if _accepted_rows(case.rows, case.cols, dtype, blocks):
            rows.add((case.rows, case.cols, dtype, blocks))
    return sorted(matmul, key=str), sorted(rows, key=str)


def _accepted_matmul(m, k, n, dtype, blocks) -> bool:
    try:
        kernels.check_matmul(
            *(jax.ShapeDtypeStruct(s, kernels.DTYPES[dtype]) for s in ((m, k), (k, n), (n,))),
            blocks,
            "gelu",
        )
    except kernels.KernelInputError:
        return False
    return True


def _accepted_rows(rows, cols, dtype, blocks) -> bool:
    try:
        kernels.check_layer_norm(
            *(jax.ShapeDtypeStruct(s, kernels.DTYPES[dtype]) for s in ((rows, cols), (cols,))),
            jax.ShapeDtypeStruct((cols,), kernels.DTYPES[dtype]),
            blocks,
        )
    except kernels.KernelInputError:
        return False
    return True


@pytest.mark.claims("every-configuration-lowers-for-a-tpu")
def test_every_audit_cell_lowers_for_a_tpu(evidence):
    """Every cell of the default audit table the kernels accept exports for a TPU with one Mosaic
    kernel, in both dtypes and at every fitted block size."""
    matmul, rows = _audit_configs()
    lowered = {}
    for m, k, n, dtype, blocks in matmul:
        exported = _lower_matmul(m, k, n, dtype, blocks)
        name = f"matmul {(m, k, n)} {dtype} {dataclasses.astuple(blocks)}"
        lowered[name] = _mosaic_calls(exported)
    for r, c, dtype, blocks in rows:
        exported = _lower_layer_norm(r, c, dtype, blocks)
        lowered[f"layer norm {(r, c)} {dtype} rows {blocks.block_rows}"] = _mosaic_calls(exported)
    assert evidence.record(
        "the default audit's kernel configurations lower for a TPU (jax.export, platforms=tpu)",
        f"{len(matmul)} matmul and {len(rows)} layer-norm cells, gelu, precision highest",
        lowered,
        {"mosaic_kernels_per_export": 1},
        len(matmul) > 20 and len(rows) > 10 and all(v == 1 for v in lowered.values()),
    )


@pytest.mark.claims("every-configuration-lowers-for-a-tpu", "matmul-backward-reuses-the-kernel")
@pytest.mark.parametrize("precision", ["highest", "default"])
def test_stage_shapes_and_their_gradients_lower_for_a_tpu(evidence, precision):
    """The stage tests' ragged matmul and its gradient (three Mosaic kernels: the recomputed
    pre-activation, dx, dw) and the layer norm with its gradient lower for a TPU, at both
    precisions."""
    cases = {
        "matmul ragged (50, 300, 200) f32": (50, 300, 200, "float32", (16, 128, 128)),
        "matmul gradient shape (33, 300, 17) f32": (33, 300, 17, "float32", (16, 128, 128)),
        "matmul (64, 256, 200) bf16": (64, 256, 200, "bfloat16", (32, 128, 128)),
    }
    lowered = {}
    for name, (m, k, n, dtype, target) in cases.items():
        blocks = kernels.fit_matmul_blocks(m, k, n, kernels.MatmulBlocks(*target))
        forward = _lower_matmul(m, k, n, dtype, blocks, precision=precision)
        backward = _lower_matmul(m, k, n, dtype, blocks, precision=precision, grad=True)
        lowered[name] = {"forward": _mosaic_calls(forward), "gradient": _mosaic_calls(backward)}
    for rows, cols, dtype in ((37, 70, "float32"), (4, 300, "float32"), (24, 128, "bfloat16")):
        blocks = kernels.fit_row_blocks(rows, dtype)
        lowered[f"layer norm ({rows}, {cols}) {dtype}"] = {
            "forward": _mosaic_calls(_lower_layer_norm(rows, cols, dtype, blocks)),
            "gradient": _mosaic_calls(_lower_layer_norm(rows, cols, dtype, blocks, grad=True)),
        }
    expected = {
        name: {"forward": 1, "gradient": 3 if name.startswith("matmul") else 1} for name in lowered
    }
    assert evidence.record(
        "stage shapes and their gradients lower for a TPU",
        f"precision {precision}",
        lowered,
        expected,
        lowered == expected,
    )


@pytest.mark.claims("every-configuration-lowers-for-a-tpu")
def test_every_tpu_bench_configuration_lowers(evidence):
    """Every kernel configuration the TPU bench compiles exports for a TPU with one Mosaic
    kernel."""
    configs = bench.tpu_bench_configs()
    lowered = {}
    for cfg in configs:
        if cfg["kernel"] == "matmul":
            m, k, n = cfg["shape"]
            exported = _lower_matmul(
                m, k, n, cfg["dtype"], cfg["blocks"], cfg["activation"], cfg["precision"]
            )
        else:
            r, c = cfg["shape"]
            exported = _lower_layer_norm(r, c, cfg["dtype"], cfg["blocks"])
        lowered[str(sorted((k, str(v)) for k, v in cfg.items()))] = _mosaic_calls(exported)
    assert evidence.record(
        "the TPU bench's kernel configurations lower for a TPU",
        f"{len(configs)} configurations",
        {"configurations": len(configs), "one_kernel_each": all(v == 1 for v in lowered.values())},
        {"mosaic_kernels_per_export": 1},
        len(configs) > 10 and all(v == 1 for v in lowered.values()),
    )


@pytest.mark.claims("every-configuration-lowers-for-a-tpu")
@pytest.mark.parametrize(
    ("blocks", "why"),
    [
        ((16, 64, 128), "block_n 64: not a multiple of 128"),
        ((12, 128, 128), "block_m 12: not a multiple of 8"),
    ],
)
def test_a_block_the_tpu_refuses_fails_the_export(evidence, blocks, why):
    """A block shape the TPU lowering refuses, passed straight to the kernel past the project's own
    checks, fails the export with the lowering's block-shape error: the export test can fail."""
    dt = jnp.float32
    args = (
        jax.ShapeDtypeStruct((64, 256), dt),
        jax.ShapeDtypeStruct((256, 256), dt),
        jax.ShapeDtypeStruct((256,), dt),
    )

    def f(x, w, b):
        return _matmul_call(
            x,
            w,
            b,
            blocks=kernels.MatmulBlocks(*blocks),
            activation="none",
            precision="highest",
            interpret=False,
            mask_edges=True,
        )

    with pytest.raises(ValueError, match="divisible by 8 and 128") as refused:
        export.export(jax.jit(f), platforms=["tpu"])(*args)
    # The project's own rule refuses the same blocks before any kernel is built.
    with pytest.raises(kernels.KernelInputError, match="breaks the TPU block rule"):
        kernels.check_matmul(*args, kernels.MatmulBlocks(*blocks), "none")
    assert evidence.record(
        "negative control: a block the TPU refuses fails the export",
        f"(64, 256) x (256, 256) float32, blocks {blocks} ({why})",
        {"lowering_error": str(refused.value).splitlines()[0][:160]},
        {"expected": "ValueError: ... divisible by 8 and 128 ..."},
        True,
    )
