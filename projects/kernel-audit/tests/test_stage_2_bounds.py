"""Stage 2: the derived error bounds themselves, forward and gradient.

Independent check: each bound of `kernel_audit.reference`, element by element,
against its documented formula written out in plain Python (`bound_formulas.py`)
with the unit roundoff taken from each dtype's description (eps / 2), for both
dtypes, several reduction lengths, both declared matmul precisions and the
arithmetic of both backends (CPU and TPU; a bound is plain NumPy, so both are
checked wherever the test runs); and an error between one and two bounds
refused by the audit's own verdict, so a bound twice too loose shows.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import pytest
from bound_formulas import (
    U_OUT,
    dense_grad_bound_loop,
    layer_norm_bound_loop,
    layer_norm_grad_bound_loop,
    matmul_bound_loop,
    same_bound,
)

from kernel_audit import audit, data, kernels, reference

# Bounds are NumPy: the arithmetic of either backend is checked on any machine.
BACKENDS = ("cpu", "tpu")


@pytest.mark.claims("bounds-equal-their-formulas")
def test_unit_roundoff_is_half_the_machine_epsilon(evidence):
    """The unit roundoff the bounds use is eps / 2 of each dtype (2^-24 and 2^-8), not eps."""
    expected = {"float32": 2.0**-24, "bfloat16": 2.0**-8}
    observed = {"reference": dict(reference.UNIT_ROUNDOFF), "eps_over_2": dict(U_OUT)}
    assert evidence.record(
        "unit roundoff: half the machine epsilon of each dtype",
        "np.finfo(float32).eps / 2, ml_dtypes.finfo(bfloat16).eps / 2",
        observed,
        expected,
        U_OUT == expected and reference.UNIT_ROUNDOFF == expected,
    )


@pytest.mark.claims("bounds-equal-their-formulas", "bounds-for-backend-and-precision")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 70, 2), (2, 300, 3), (2, 2048, 2)])
def test_matmul_bound_equals_its_formula_over_reduction_lengths(evidence, shape, dtype):
    """matmul_error_bound equals its documented formula, element by element, for K from 1 to 2048,
    three activations, both output dtypes, both precisions and the CPU's and the TPU's
    arithmetic."""
    m, k, n = shape
    x, w, b = data.matmul_operands(
        data.case_key(3, "bound-formula", *shape, dtype), m, k, n, kernels.DTYPES[dtype]
    )
    ok = True
    for activation, precision, backend in itertools.product(
        ("none", "relu", "gelu"), kernels.PRECISIONS, BACKENDS
    ):
        ok &= same_bound(
            evidence,
            "matmul_error_bound vs its formula element by element",
            f"(M, K, N)={shape}, {dtype}, {activation}, {precision}, {backend}",
            reference.matmul_error_bound(x, w, b, activation, dtype, precision, backend),
            matmul_bound_loop(x, w, b, activation, dtype, precision, backend),
        )
    assert ok


@pytest.mark.claims("bounds-equal-their-formulas")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 70), (2, 300), (1, 1000)])
def test_layer_norm_bound_equals_its_formula_over_row_lengths(evidence, shape, dtype):
    """layer_norm_error_bound equals its documented propagation, element by element, for rows of
    1 to 1000 values and both output dtypes."""
    rows, cols = shape
    x, g, b = data.layer_norm_operands(
        data.case_key(3, "ln-bound-formula", *shape, dtype), rows, cols, kernels.DTYPES[dtype]
    )
    ok = True
    for backend in BACKENDS:
        ok &= same_bound(
            evidence,
            "layer_norm_error_bound vs its formula element by element",
            f"(R, C)={shape}, {dtype}, {backend}",
            reference.layer_norm_error_bound(x, g, b, dtype, backend),
            layer_norm_bound_loop(x, g, b, dtype, backend),
        )
    assert ok


@pytest.mark.claims("bounds-equal-their-formulas")
@pytest.mark.parametrize(
    ("shape", "activation"),
    [((1, 1, 1), "none"), ((33, 70, 17), "gelu"), ((16, 48, 40), "relu"), ((70, 5, 9), "gelu")],
)
def test_dense_grad_bound_equals_its_formula(evidence, shape, activation):
    """dense_grad_error_bound (dx, dw, db) equals its documented formula element by element, with
    the reduction lengths K, N and M each varied."""
    m, k, n = shape
    k_ops, k_g = jax.random.split(data.case_key(3, "grad-bound-formula", *shape, activation))
    x, w, b = data.matmul_operands(k_ops, m, k, n, jnp.float32)
    g = jax.random.normal(k_g, (m, n), jnp.float32)
    ok = True
    for precision, backend in itertools.product(kernels.PRECISIONS, BACKENDS):
        got = reference.dense_grad_error_bound(x, w, b, g, activation, precision, backend)
        expected = dense_grad_bound_loop(x, w, b, g, activation, precision, backend)
        for name, gb, eb in zip(["dx", "dw", "db"], got, expected, strict=True):
            ok &= same_bound(
                evidence,
                f"dense_grad_error_bound {name} vs its formula element by element",
                f"(M, K, N)={shape}, {activation}, float32, {precision}, {backend}",
                gb,
                eb,
            )
    assert ok


@pytest.mark.claims("bounds-equal-their-formulas")
@pytest.mark.parametrize("shape", [(1, 1), (13, 70), (4, 300), (40, 5)])
def test_layer_norm_grad_bound_equals_its_formula(evidence, shape):
    """layer_norm_grad_error_bound (dx, dgamma, dbeta) equals its documented formula element by
    element, with the row length C and the batch R each varied."""
    rows, cols = shape
    k_ops, k_g = jax.random.split(data.case_key(3, "ln-grad-bound-formula", *shape))
    x, gam, bet = data.layer_norm_operands(k_ops, rows, cols, jnp.float32)
    g = jax.random.normal(k_g, (rows, cols), jnp.float32)
    ok = True
    for backend in BACKENDS:
        got = reference.layer_norm_grad_error_bound(x, gam, bet, g, backend)
        expected = layer_norm_grad_bound_loop(x, gam, g, backend)
        for name, gb, eb in zip(["dx", "dgamma", "dbeta"], got, expected, strict=True):
            ok &= same_bound(
                evidence,
                f"layer_norm_grad_error_bound {name} vs its formula element by element",
                f"(R, C)={shape}, float32, {backend}",
                gb,
                eb,
            )
    assert ok


@pytest.mark.claims("bounds-catch-realistic-bugs")
def test_an_error_between_one_and_two_bounds_is_refused(evidence):
    """An error of 1.5 times the formula's bound is refused and one of 0.75 times it accepted, by
    the audit's verdict (`audit.compare`) for both forward bounds in both dtypes and by the
    stage's bound check for every gradient bound.

    The bound each verdict uses is the library's; the error put on the float64 value is a
    multiple of the bound recomputed here from the formula with u = eps / 2, for the
    arithmetic of the backend this runs on (the library's bound defaults to it)."""
    runs = jax.default_backend()
    verdicts = {}
    forward = []
    for dtype in ("float32", "bfloat16"):
        key_mm, key_ln = jax.random.split(data.case_key(3, "refuse", dtype))
        x, w, b = data.matmul_operands(key_mm, 5, 300, 6, kernels.DTYPES[dtype])
        forward.append(
            (
                f"matmul {dtype} gelu",
                reference.matmul_bias_act_f64(x, w, b, "gelu"),
                reference.matmul_error_bound(x, w, b, "gelu", dtype),
                matmul_bound_loop(x, w, b, "gelu", dtype, backend=runs),
            )
        )
        xr, g, be = data.layer_norm_operands(key_ln, 4, 300, kernels.DTYPES[dtype])
        forward.append(
            (
                f"layer norm {dtype}",
                reference.layer_norm_f64(xr, g, be),
                reference.layer_norm_error_bound(xr, g, be, dtype),
                layer_norm_bound_loop(xr, g, be, dtype, runs),
            )
        )
    for name, f64, bound, true_bound in forward:
        for factor in (0.75, 1.5):
            figures = audit.compare(f64 + factor * true_bound, f64, f64, bound)
            verdicts[f"{name}, error {factor} x bound: passed"] = figures["passed"]

    k_ops, k_g, k_ln, k_lg = jax.random.split(data.case_key(3, "refuse-grad"), 4)
    x, w, b = data.matmul_operands(k_ops, 33, 70, 17, jnp.float32)
    g = jax.random.normal(k_g, (33, 17), jnp.float32)
    xr, gam, bet = data.layer_norm_operands(k_ln, 13, 70, jnp.float32)
    gr = jax.random.normal(k_lg, (13, 70), jnp.float32)
    gradients = [
        (
            f"matmul gelu {name}",
            exact,
            bound,
            true_bound,
        )
        for name, exact, bound, true_bound in zip(
            ["dx", "dw", "db"],
            reference.dense_grads_f64(x, w, b, g, "gelu"),
            reference.dense_grad_error_bound(x, w, b, g, "gelu"),
            dense_grad_bound_loop(x, w, b, g, "gelu", backend=runs),
            strict=True,
        )
    ] + [
        (f"layer norm {name}", exact, bound, true_bound)
        for name, exact, bound, true_bound in zip(
            ["dx", "dgamma", "dbeta"],
            reference.layer_norm_grads_f64(xr, gam, bet, gr),
            reference.layer_norm_grad_error_bound(xr, gam, bet, gr),
            layer_norm_grad_bound_loop(xr, gam, gr, runs),
            strict=True,
        )
    ]
    for name, exact, bound, true_bound in gradients:
        for factor in (0.75, 1.5):
            verdicts[f"{name}, error {factor} x bound: passed"] = evidence.within_bound(
                f"gradient {name} off by {factor} x its formula's bound "
                + ("(must pass)" if factor < 1 else "(must fail)"),
                "float32, the library's bound",
                exact + factor * true_bound,
                exact,
                bound,
            )
    expected = {name: name.endswith("0.75 x bound: passed") for name in verdicts}
    assert evidence.record(
        "errors of 0.75 and 1.5 times the formula's bound: accepted and refused",
        "forward: audit.compare, matmul (5, 300, 6) gelu and layer norm (4, 300), float32 and "
        "bfloat16; gradients: matmul (33, 70, 17) gelu and layer norm (13, 70), float32",
        verdicts,
        expected,
        verdicts == expected,
    )
