"""Stage 2: shapes, edges, gradients.

Independent checks: the shape table of `kernel_audit.data` (shapes that divide
the blocks and shapes that do not, tiny and degenerate shapes, long
reductions), in float32 and bfloat16, against the float64 NumPy references
under the derived bounds (the bounds themselves are checked against their
formulas in `test_stage_2_bounds.py`); then hypothesis-drawn shapes, dtypes, activations
and blocks on top of the table. Out-of-bounds handling: the interpreter fills
out-of-bounds reads with NaN, so the same ragged shape fails with the edge
masking switched off and passes with it on (and a shape that divides the
blocks passes either way); on a TPU those reads are undefined rather than NaN,
so that control runs in interpret mode only. Gradients through the `custom_vjp`s: against a
float64 chain rule written by hand, against autodiff of the `jax.numpy`
reference, and against central finite differences of the float64 reference
along random directions (in float64 the difference quotient is accurate to
about 1e-8, so the kernel's own error dominates); the bias gradient for
bfloat16 operands over long batches against the float64 sum of the cotangent,
within float32 summation plus one bfloat16 rounding (a bfloat16 running sum
breaks that bound); then a short training run through the kernels against the
same run through the references.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from bound_formulas import U32, U_BF16, gamma
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_audit import data, kernels, reference, train
from kernel_audit.cli import main
from kernel_audit.config import Config

MODE = kernels.execution_mode(None)
TINY = np.finfo(np.float64).tiny


def fitted(block: int, dim: int) -> int:
    """`block`, or the whole dimension where that is smaller (which the TPU rules allow)."""
    return dim if dim <= block else block


def table_blocks(case: data.MatmulCase) -> kernels.MatmulBlocks:
    """The table's blocks: 16 rows (the bfloat16 tile), 128 columns and reduction steps."""
    return kernels.MatmulBlocks(fitted(16, case.m), fitted(128, case.n), fitted(128, case.k))


# --- GRADIENTS -----------------------------------------------------------------------------------


def _fraction(actual, ref, bound) -> float:
    err = np.abs(reference.to_f64(actual) - ref)
    return float(np.max(err / np.maximum(bound, TINY), initial=0.0))


def _directional_check(evidence, condition, f64, operands, grads, bounds, key) -> bool:
    """Central differences of the float64 function `f64` along a random direction
    (one normal draw per operand from `key`) against the kernel's gradients.

    Kernel error along the direction is at most sum |d| * bound; the float64
    difference quotient adds O(h^2) truncation and eps64 * |f| / h rounding."""
    dirs64 = [
        reference.to_f64(jax.random.normal(kk, a.shape, jnp.float32))
        for kk, a in zip(jax.random.split(key, len(operands)), operands, strict=True)
    ]
    base = [reference.to_f64(a) for a in operands]
    h = 1e-5
    plus = f64(*[a + h * d for a, d in zip(base, dirs64, strict=True)])
    minus = f64(*[a - h * d for a, d in zip(base, dirs64, strict=True)])
    fd = (plus - minus) / (2 * h)
    directional = sum(
        float(np.sum(reference.to_f64(gk) * d)) for gk, d in zip(grads, dirs64, strict=True)
    )
    fd_tol = sum(float(np.sum(np.abs(d) * bd)) for d, bd in zip(dirs64, bounds, strict=True))
    fd_tol += 1e-6 * abs(fd) + 1e-9
    return evidence.record(
        "directional derivative: custom_vjp vs float64 central differences",
        condition + f", h={h}",
        {"custom_vjp": directional, "finite_difference": fd, "abs_diff": abs(directional - fd)},
        {"atol": fd_tol},
        abs(directional - fd) <= fd_tol,
    )


@pytest.mark.claims(
    "custom-vjp-gradients-checked",
    "layer-norm-grad-dx",
    "layer-norm-grad-dgamma-dbeta",
    "layer-norm-grad-explicit-broadcast",
)
@pytest.mark.parametrize("shape", [(13, 70), (4, 300)])
def test_layer_norm_gradients(evidence, shape):
    """Layer-norm custom_vjp gradients match a float64 closed form, jnp autodiff and central
    differences, for 2 shapes."""
    rows, cols = shape
    k_ops, k_g, k_dir = jax.random.split(data.case_key(2, "grad-ln", *shape), 3)
    x, gam, bet = data.layer_norm_operands(k_ops, rows, cols, jnp.float32)
    g = jax.random.normal(k_g, (rows, cols), jnp.float32)
    blocks = kernels.fit_row_blocks(rows, "float32")

    grads = jax.jit(
        jax.grad(lambda *a: jnp.sum(kernels.layer_norm(*a, blocks=blocks) * g), (0, 1, 2))
    )(x, gam, bet)
    auto = jax.jit(jax.grad(lambda *a: jnp.sum(reference.layer_norm_jnp(*a) * g), (0, 1, 2)))(
        x, gam, bet
    )
    exact = reference.layer_norm_grads_f64(x, gam, bet, g)
    bounds = reference.layer_norm_grad_error_bound(x, gam, bet, g)
    condition = f"(R, C)={shape}, float32, block_rows {blocks.block_rows}, mode={MODE}"
    ok = True
    for name, gk, ga, ge, bd in zip(
        ["dx", "dgamma", "dbeta"], grads, auto, exact, bounds, strict=True
    ):
        ok &= evidence.within_bound(
            f"{name}: custom_vjp vs float64 closed form", condition, gk, ge, bd
        )
        ok &= evidence.within_bound(
            f"{name}: custom_vjp vs autodiff of the jnp reference (twice the bound)",
            condition,
            gk,
            reference.to_f64(ga),
            bd,
            scale=2.0,
        )
    g64 = reference.to_f64(g)

    def f64(*args):
        return float(np.sum(reference.layer_norm_f64(*args) * g64))

    ok &= _directional_check(evidence, condition, f64, (x, gam, bet), grads, bounds, k_dir)
    assert ok


@pytest.mark.claims(
    "custom-vjp-gradients-checked",
    "matmul-backward-reuses-the-kernel",
    "ragged-k-zeroed-by-select",
)
@pytest.mark.parametrize(
    ("shape", "activation"),
    [((33, 300, 17), "gelu"), ((16, 48, 140), "relu")],
)
def test_matmul_gradients(evidence, shape, activation):
    """Matmul custom_vjp gradients match a float64 chain rule, jnp autodiff and central differences,
    gelu and relu.

    Blocks of (16, 128, 128), fitted: the first shape has a ragged M and a ragged
    reduction (K = 300), the second a ragged N, and the backward pass's transposed
    problems take the ragged edges onto other axes."""
    m, k, n = shape
    k_ops, k_g, k_dir = jax.random.split(data.case_key(1, "grad", *shape, activation), 3)
    x, w, b = data.matmul_operands(k_ops, m, k, n, jnp.float32)
    g = jax.random.normal(k_g, (m, n), jnp.float32)
    blocks = kernels.fit_matmul_blocks(m, k, n, kernels.MatmulBlocks(16, 128, 128))

    def f_kernel(x_, w_, b_):
        y = kernels.matmul_bias_act(x_, w_, b_, blocks=blocks, activation=activation)
        return jnp.sum(y * g)

    def f_jnp(x_, w_, b_):
        return jnp.sum(reference.matmul_bias_act_jnp(x_, w_, b_, activation) * g)

    grads = jax.jit(jax.grad(f_kernel, argnums=(0, 1, 2)))(x, w, b)
    auto = jax.jit(jax.grad(f_jnp, argnums=(0, 1, 2)))(x, w, b)
    exact = reference.dense_grads_f64(x, w, b, g, activation)
    bounds = reference.dense_grad_error_bound(x, w, b, g, activation)
    condition = (
        f"(M, K, N)={shape}, {activation}, float32, blocks {blocks.block_m}/{blocks.block_n}/"
        f"{blocks.block_k}, backend={jax.default_backend()}, mode={MODE}"
    )
    ok = True
    for name, gk, ga, ge, bd in zip(["dx", "dw", "db"], grads, auto, exact, bounds, strict=True):
        ok &= evidence.within_bound(
            f"{name}: custom_vjp vs float64 chain rule", condition, gk, ge, bd
        )
        ok &= evidence.within_bound(
            f"{name}: custom_vjp vs autodiff of the jnp reference (twice the bound)",
            condition,
            gk,
            reference.to_f64(ga),
            bd,
            scale=2.0,
        )
    g64 = reference.to_f64(g)

    def f64(xx, ww, bb):
        z = xx @ ww + bb
        act = {
            "gelu": reference.gelu_f64,
            "relu": lambda v: np.maximum(v, 0.0),
            "none": lambda v: v,
        }
        return float(np.sum(act[activation](z) * g64))

    ok &= _directional_check(evidence, condition, f64, (x, w, b), grads, bounds, k_dir)
    assert ok


def _bf16_running_sum(g: np.ndarray) -> np.ndarray:
    """Column sums of `g` `(M, N)` accumulated row by row in bfloat16 (each partial sum rounded
    to bfloat16, in NumPy with ml_dtypes): what a bfloat16 accumulator computes, on any backend."""
    acc = np.zeros(g.shape[1], ml_dtypes.bfloat16)
    for row in g.astype(ml_dtypes.bfloat16):
        acc = (acc.astype(np.float32) + row.astype(np.float32)).astype(ml_dtypes.bfloat16)
    return acc.astype(np.float64)


@pytest.mark.claims("bfloat16-bias-gradient-bound")
@pytest.mark.parametrize("shape", [(700, 24, 40), (2048, 40, 24), (4096, 16, 16)])
def test_matmul_bias_gradient_bfloat16_long_batch(evidence, shape):
    """For bfloat16 operands, db is the cotangent's column sum to float32 summation plus one
    bfloat16 rounding, over batches of 700, 2048 and 4096 rows; a bfloat16 running sum is not.

    Activation `none`, so db = sum over the M rows of the bfloat16 cotangent g, whose float64
    sum is exact. The backward pass sums in float32 and rounds once to bfloat16: error at most
    gamma_M(u32) sum|g| + u_bf16 (|db| + that), u_bf16 = 2^-8 (eps / 2 of bfloat16).
    g ~ N(1, 1), so the sums grow like M: a bfloat16 accumulator loses the increments once a
    partial sum's half ulp exceeds them (at 256 the ulp is 2), far outside the bound; the test
    records that error, and what `jnp.sum` with a bfloat16 accumulator (`dtype=bfloat16`, XLA's
    reduce on this backend) would give, beside the bound."""
    m, k, n = shape
    k_ops, k_g = jax.random.split(data.case_key(2, "grad-db-bf16", *shape))
    x, w, b = data.matmul_operands(k_ops, m, k, n, jnp.bfloat16)
    g = (1.0 + jax.random.normal(k_g, (m, n), jnp.float32)).astype(jnp.bfloat16)
    blocks = kernels.fit_matmul_blocks(m, k, n)

    def f_kernel(b_):
        y = kernels.matmul_bias_act(x, w, b_, blocks=blocks, activation="none")
        return jnp.sum(y.astype(jnp.float32) * g.astype(jnp.float32))

    db = jax.jit(jax.grad(f_kernel))(b)
    g64 = reference.to_f64(g)
    exact = g64.sum(axis=0)
    summation = gamma(m, U32) * np.abs(g64).sum(axis=0)
    bound = summation + U_BF16 * (np.abs(exact) + summation)
    condition = (
        f"(M, K, N)={shape}, bfloat16, none, blocks {blocks.block_m}/{blocks.block_n}/"
        f"{blocks.block_k}, mode={MODE}"
    )
    ok = db.dtype == jnp.bfloat16
    ok &= evidence.within_bound(
        "db (bfloat16): custom_vjp vs float64 sum of the cotangent", condition, db, exact, bound
    )
    running = _bf16_running_sum(g64)
    xla_bf16 = reference.to_f64(jnp.sum(g, axis=0, dtype=jnp.bfloat16))
    observed = {
        "kernel_fraction_of_bound": _fraction(db, exact, bound),
        "bf16_running_sum_fraction_of_bound": _fraction(running, exact, bound),
        "bf16_running_sum_max_rel_error": float(np.max(np.abs(running - exact) / np.abs(exact))),
        "jnp_sum_dtype_bf16_fraction_of_bound": _fraction(xla_bf16, exact, bound),
        "max_abs_db": float(np.abs(exact).max()),
    }
    # The batch is long enough for the bound to tell the two accumulators apart.
    ok &= evidence.record(
        "db (bfloat16): what a bfloat16 accumulator would make, in units of the bound",
        condition,
        observed,
        {"bound": "gamma_M(u32) sum|g| + 2^-8 (|db| + that)", "running_sum_fraction_min": 1.0},
        observed["bf16_running_sum_fraction_of_bound"] > 1.0,
    )
    assert ok, observed


# --- THE TABLE ------------------------------------------------------------------------------

ACTIVATION_FOR = dict(
    zip(
        [c.name for c in data.MATMUL_CASES],
        ["gelu", "relu", "gelu", "none", "gelu", "relu"],
        strict=True,
    )
)


@pytest.mark.claims(
    "edge-shapes-within-bound",
    "ragged-k-zeroed-by-select",
    "matmul-accumulates-in-float32",
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", data.MATMUL_CASES, ids=lambda c: c.name)
def test_matmul_shape_table(evidence, case, dtype):
    """The matmul is within its derived bound of float64 NumPy for every shape of the table, in
    float32 and bfloat16."""
    activation = ACTIVATION_FOR[case.name]
    blocks = table_blocks(case)
    key = data.case_key(0, "stage2", case.name, dtype)
    x, w, b = data.matmul_operands(key, case.m, case.k, case.n, kernels.DTYPES[dtype])
    y = kernels.matmul_bias_act(x, w, b, blocks=blocks, activation=activation)
    ragged = bool(case.m % blocks.block_m or case.k % blocks.block_k or case.n % blocks.block_n)
    assert evidence.within_bound(
        "matmul table vs float64 NumPy",
        f"{case.name} (M, K, N)=({case.m}, {case.k}, {case.n}), {dtype}, {activation}, "
        f"blocks {blocks.block_m}/{blocks.block_n}/{blocks.block_k}, "
        f"ragged={ragged}, "
        f"mode={MODE}",
        y,
        reference.matmul_bias_act_f64(x, w, b, activation),
        reference.matmul_error_bound(x, w, b, activation, dtype),
    )


@pytest.mark.claims("edge-shapes-within-bound", "layer-norm-float32-population-statistics")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", data.ROW_CASES, ids=lambda c: c.name)
def test_layer_norm_shape_table(evidence, case, dtype):
    """The layer norm is within its derived bound of float64 NumPy for every row shape of the table,
    in 2 dtypes."""
    key = data.case_key(0, "stage2-rows", case.name, dtype)
    x, g, b = data.layer_norm_operands(key, case.rows, case.cols, kernels.DTYPES[dtype])
    blocks = kernels.fit_row_blocks(case.rows, dtype)
    y = kernels.layer_norm(x, g, b, blocks=blocks)
    assert evidence.within_bound(
        "layer norm table vs float64 NumPy",
        f"{case.name} (R, C)=({case.rows}, {case.cols}), {dtype}, block_rows "
        f"{blocks.block_rows}, ragged rows={case.rows % blocks.block_rows != 0}, mode={MODE}",
        y,
        reference.layer_norm_f64(x, g, b),
        reference.layer_norm_error_bound(x, g, b, dtype),
    )


# --- PROPERTY-BASED CASES ---------------------------------------------------------------------

HYPOTHESIS = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,  # same examples every run: the suite stays deterministic
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.claims("edge-shapes-within-bound", "ragged-k-zeroed-by-select")
@HYPOTHESIS
@given(
    m=st.integers(1, 70),
    k=st.integers(1, 300),
    n=st.integers(1, 200),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    activation=st.sampled_from(["none", "relu", "gelu"]),
    block=st.sampled_from([16, 32]),
    seed=st.integers(0, 2**16),
)
def test_matmul_property_drawn_shapes(evidence, m, k, n, dtype, activation, block, seed):
    """The matmul is within its derived bound of float64 NumPy for hypothesis-drawn shapes, dtypes
    and blocks (16 or 32 rows, 128 columns and reduction steps, fitted)."""
    blocks = kernels.MatmulBlocks(fitted(block, m), fitted(128, n), fitted(128, k))
    x, w, b = data.matmul_operands(data.case_key(seed, "hyp"), m, k, n, kernels.DTYPES[dtype])
    y = kernels.matmul_bias_act(x, w, b, blocks=blocks, activation=activation)
    assert evidence.within_bound(
        "hypothesis: matmul vs float64 NumPy",
        f"(M, K, N)=({m}, {k}, {n}), {dtype}, {activation}, block {block}, seed {seed}, "
        f"mode={MODE}",
        y,
        reference.matmul_bias_act_f64(x, w, b, activation),
        reference.matmul_error_bound(x, w, b, activation, dtype),
    )


@pytest.mark.claims("edge-shapes-within-bound")
@HYPOTHESIS
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 300),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    block_rows=st.sampled_from([8, 16, 32]),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_property_drawn_shapes(evidence, rows, cols, dtype, block_rows, seed):
    """The layer norm is within its derived bound of float64 NumPy for hypothesis-drawn shapes,
    dtypes and blocks (8, 16 or 32 rows, at least the dtype's tile, fitted)."""
    tile = 16 if dtype == "bfloat16" else 8
    blocks = kernels.RowBlocks(block_rows=fitted(max(block_rows, tile), rows))
    x, g, b = data.layer_norm_operands(
        data.case_key(seed, "hyp-ln"), rows, cols, kernels.DTYPES[dtype]
    )
    y = kernels.layer_norm(x, g, b, blocks=blocks)
    assert evidence.within_bound(
        "hypothesis: layer norm vs float64 NumPy",
        f"(R, C)=({rows}, {cols}), {dtype}, block_rows {blocks.block_rows}, seed {seed}, "
        f"mode={MODE}",
        y,
        reference.layer_norm_f64(x, g, b),
        reference.layer_norm_error_bound(x, g, b, dtype),
    )


# --- OUT-OF-BOUNDS EDGES ------------------------------------------------------------------------


@pytest.mark.claims("unmasked-edge-fails-interpreted", "ragged-k-zeroed-by-select")
def test_unmasked_edge_fails_and_masked_edge_passes(evidence):
    """Only the unmasked ragged reduction edge breaks the bound; the masked one and a dividing shape
    pass.

    Ragged reduction edge, masking off: the interpreter's NaN fill reaches the
    result (the check fails); masking on: within bound. A shape that divides the
    blocks passes either way, so the failure is the edge and nothing else. The
    shapes, blocks and operands are the table's (float32), so the masked runs
    repeat the table's cells. On a TPU out-of-bounds reads are undefined (stale
    memory, often finite), so compiled runs check only the masked and dividing cells."""
    results = {}
    for case in (c for c in data.MATMUL_CASES if c.name in ("ragged", "divides")):
        activation = ACTIVATION_FOR[case.name]
        blocks = table_blocks(case)
        key = data.case_key(0, "stage2", case.name, "float32")
        x, w, b = data.matmul_operands(key, case.m, case.k, case.n, jnp.float32)
        f64 = reference.matmul_bias_act_f64(x, w, b, activation)
        bound = reference.matmul_error_bound(x, w, b, activation, "float32")
        for masked in (True, False):
            y = kernels.matmul_bias_act(
                x, w, b, blocks=blocks, activation=activation, mask_edges=masked
            )
            results[f"matmul_{case.name}_{'masked' if masked else 'unmasked'}"] = (
                evidence.within_bound(
                    "matmul vs float64 with edge masking " + ("on" if masked else "OFF"),
                    f"{case.name} (M, K, N)=({case.m}, {case.k}, {case.n}), K % block_k = "
                    f"{case.k % blocks.block_k}, mode={MODE}",
                    y,
                    f64,
                    bound,
                )
            )
    expected = {
        "matmul_ragged_masked": True,
        "matmul_ragged_unmasked": False,  # NaN from the interpreter's out-of-bounds fill
        "matmul_divides_masked": True,
        "matmul_divides_unmasked": True,
    }
    if MODE != "interpret":  # On a TPU out-of-bounds values are undefined, not NaN.
        del expected["matmul_ragged_unmasked"]
        results = {k: v for k, v in results.items() if k in expected}
    assert evidence.record(
        "out-of-bounds: only the unmasked ragged edge fails",
        "the table's ragged (K=300, block_k 128) and dividing (K=256) shapes, float32",
        results,
        expected,
        results == expected,
    )


def test_training_through_kernels_matches_references(evidence):
    """Kernel-trained losses are within 1e-5 relative of the references' and bitwise equal on rerun.

    Same initial weights and batches (batch 20, not a multiple of the blocks):
    per-step losses through the kernels and through the references agree. Each
    forward pass agrees to a few float32 ulps (the bounds above); 5 SGD steps of
    size 0.1 on an O(1)-Lipschitz loss amplify that by at most a small factor,
    so a relative gap above 1e-5 (~170 ulps) would be a real difference."""
    config = Config.tiny()
    metrics = train.train_and_evaluate(config)
    again = train.train_and_evaluate(config)
    observed = {
        "execution_mode": metrics["execution_mode"],
        "first_loss": metrics["losses"]["kernels"][0],
        "last_loss": metrics["losses"]["kernels"][-1],
        "max_rel_loss_gap": metrics["max_rel_loss_gap"],
        "max_param_gap": metrics["max_param_gap"],
        "loss_decreased": metrics["loss_decreased"],
        "rerun_bitwise_equal": metrics["losses"] == again["losses"],
    }
    assert evidence.record(
        "training demo: kernels (custom_vjp) vs references (autodiff), and a bitwise rerun",
        f"Config.tiny(): {config.train_steps} steps, batch {config.batch_size}, "
        f"hidden {config.hidden}",
        observed,
        {"max_rel_loss_gap": 1e-5},
        observed["max_rel_loss_gap"] <= 1e-5
        and observed["loss_decreased"]
        and observed["rerun_bitwise_equal"],
    )


def test_audit_command_writes_a_labelled_report(evidence, tmp_path):
    """The audit command writes a report whose every record names its mode and passes; an edited
    report is refused."""
    from kernel_audit import checkpoint

    # The tiny preset, cut to one ragged shape per kernel and one dtype to stay fast.
    config = Config.tiny().model_copy(
        update={"dtypes": ("float32",), "matmul_cases": ("ragged",), "row_cases": ("ragged",)}
    )
    (tmp_path / "config.json").write_text(config.to_json())
    result = CliRunner().invoke(
        main,
        ["audit", "--config", str(tmp_path / "config.json"), "--workdir", str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    report = checkpoint.load_record(tmp_path / "report.json")
    records = report["records"]
    observed = {
        "cells": len(records),
        "all_labelled": all(r.get("execution_mode") in ("interpret", "compiled") for r in records),
        "modes": sorted({r["execution_mode"] for r in records}),
        "all_passed": all(r["passed"] for r in records if not r.get("refused")),
        "max_bound_used": report["summary"]["max_bound_used_vs_f64"],
        "unmasked_edges_all_nan": report["summary"]["unmasked_edges_all_nan"],
        "png_written": (tmp_path / "audit.png").stat().st_size > 0,
    }
    assert evidence.record(
        "`kernel-audit audit`: every record labelled with its mode, all within bound",
        "tiny preset, ragged shapes, float32",
        observed,
        {"max_bound_used": 1.0},
        observed["all_labelled"]
        and observed["all_passed"]
        and observed["png_written"]
        and observed["unmasked_edges_all_nan"],
    )
    # A record edited after writing is detected.
    path = tmp_path / "report.json"
    path.write_text(path.read_text().replace('"passed": false', '"passed": true') + " ")
    with pytest.raises(checkpoint.RecordError, match="does not match its sha256"):
        checkpoint.load_record(path)
