"""Stage 1: two kernels and their references.

Independent checks: each Pallas kernel (the fused matmul + bias + activation,
the layer norm) is compared with a float64 NumPy version and with a plain
`jax.numpy` version, under a per-element error bound derived from the
floating-point error analysis (`kernel_audit.reference`), not picked to pass.
Repeated under changed conditions: float32 and bfloat16, three activations,
another seed, other block sizes, both declared matmul precisions. The bounds
take the arithmetic of the backend that runs (`reference`), and are checked to
catch realistic bugs (a dropped bias, bfloat16 accumulation, a skipped mean).
The kernels run interpreted on a CPU and compiled on a TPU (or interpreted
there under `KERNEL_AUDIT_MODE=interpret`), and the records say which.
"""

import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bound_formulas import TANH_ABS, U32, act, layer_norm_bound_loop, matmul_bound_loop
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl

from kernel_audit import data, kernels, reference
from kernel_audit.cli import main
from kernel_audit.config import Config, ConfigError, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MODE = kernels.execution_mode(None)
BACKEND = f"backend={jax.default_backend()}"


def matmul_inputs(seed: int, m: int, k: int, n: int, dtype: str):
    key = data.case_key(seed, "stage1-matmul", m, k, n, dtype)
    return data.matmul_operands(key, m, k, n, kernels.DTYPES[dtype])


def row_inputs(seed: int, rows: int, cols: int, dtype: str):
    key = data.case_key(seed, "stage1-rows", rows, cols, dtype)
    return data.layer_norm_operands(key, rows, cols, kernels.DTYPES[dtype])


def _operands(seed: int, shapes, dtype: str, scale: float):
    rng = np.random.default_rng(seed)
    arrays = [(rng.standard_normal(shape) * scale).astype(np.float32) for shape in shapes]
    return [np.asarray(jnp.asarray(a, kernels.DTYPES[dtype])) for a in arrays]


@pytest.mark.claims("bounds-equal-their-formulas", "bounds-for-backend-and-precision")
@settings(max_examples=30, derandomize=True, deadline=None, database=None)
@given(
    m=st.integers(1, 3),
    k=st.integers(1, 5),
    n=st.integers(1, 3),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    activation=st.sampled_from(["none", "relu", "gelu"]),
    scale=st.sampled_from([0.5, 3.0]),
    seed=st.integers(0, 2**16),
)
def test_matmul_bound_equals_its_formula_element_by_element(
    m, k, n, dtype, activation, scale, seed
):
    """matmul_error_bound equals the documented formula computed element by element in Python, over
    hypothesis cases."""
    x, w, b = _operands(seed, [(m, k), (k, n), (n,)], dtype, scale)
    for precision in kernels.PRECISIONS:
        for backend in ("cpu", "tpu"):
            got = reference.matmul_error_bound(x, w, b, activation, dtype, precision, backend)
            expected = matmul_bound_loop(x, w, b, activation, dtype, precision, backend)
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=0)


@pytest.mark.claims("bounds-equal-their-formulas")
@settings(max_examples=30, derandomize=True, deadline=None, database=None)
@given(
    rows=st.integers(1, 3),
    cols=st.integers(1, 6),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    level=st.sampled_from([0.0, 3.0, -40.0]),
    spread=st.sampled_from([1e-3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_bound_equals_its_formula_element_by_element(
    rows, cols, dtype, level, spread, seed
):
    """layer_norm_error_bound equals its documented propagation computed row by row in Python, over
    hypothesis cases."""
    x, g, b = _operands(seed, [(rows, cols), (cols,), (cols,)], dtype, 1.0)
    x = np.asarray(jnp.asarray(level + spread * x.astype(np.float32), kernels.DTYPES[dtype]))
    for backend in ("cpu", "tpu"):
        got = reference.layer_norm_error_bound(x, g, b, dtype, backend)
        expected = layer_norm_bound_loop(x, g, b, dtype, backend)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=0)


def test_gamma_is_finite_exactly_below_n_u_equal_to_one():
    """gamma(n, u) is infinite from n u = 1 on, n u / (1 - n u) just below it, 0 for n = 0."""
    u = 2.0**-24
    assert reference.gamma(2**24, u) == math.inf  # n u = 1 exactly
    assert reference.gamma(2**24 + 1, u) == math.inf
    n = 2**24 - 1
    assert reference.gamma(n, u) == n * u / (1 - n * u)
    assert reference.gamma(1000, u) == pytest.approx(1000 * u, rel=1e-4)
    assert reference.gamma(0, u) == 0.0


def test_gelu_lipschitz_constant_holds():
    """The bound's gelu Lipschitz constant 1.13 covers the largest |gelu'| on a fine grid.

    The 1.13 the bound uses: the largest |gelu'| of the tanh form, on a fine grid."""
    z = np.linspace(-10, 10, 200_001)
    slope = np.abs(np.gradient(reference.gelu_f64(z), z))
    assert 1.12 < slope.max() <= reference.GELU_LIPSCHITZ


@pytest.mark.claims("bounds-for-backend-and-precision")
@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
def test_epilogue_activation_against_float64(activation):
    """activate matches a float64 Python none and relu exactly and tanh-gelu within its roundings
    and the backend's tanh error, zeros included; tanh is refused.

    gelu's tolerance is the bound's own epilogue term: 8 float32 roundings of |z| + |y| plus
    half the documented tanh error of the backend that runs (2^-21 on a CPU, 2^-14 on a
    TPU) times |z|."""
    z = np.concatenate([np.linspace(-6, 6, 97), [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    got = np.asarray(kernels.activate(jnp.asarray(z), activation), dtype=np.float64)
    expected = np.array([act(float(v), activation) for v in z])
    z64 = z.astype(np.float64)
    tolerance = 8 * U32 * (np.abs(z64) + np.abs(expected))
    if activation == "gelu":
        tolerance += 0.5 * TANH_ABS[jax.default_backend()] * np.abs(z64)
    assert np.all(np.abs(got - expected) <= tolerance), np.max(np.abs(got - expected) - tolerance)
    if activation == "relu":
        assert np.array_equal(got, np.maximum(z, 0).astype(np.float64))
    with pytest.raises(kernels.KernelInputError, match="Unknown activation `tanh`"):
        kernels.activate(jnp.asarray(z), "tanh")


def _primitives(fn, *args) -> list[str]:
    """Every primitive in the traced program of `fn(*args)`, kernel bodies and loop
    bodies included."""
    names: list[str] = []

    def walk(jaxpr) -> None:
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
        for eqn in jaxpr.eqns:
            names.append(eqn.primitive.name)
            for value in eqn.params.values():
                for item in value if isinstance(value, tuple | list) else [value]:
                    if hasattr(getattr(item, "jaxpr", item), "eqns"):
                        walk(item)

    walk(jax.make_jaxpr(fn)(*args))
    return names


@pytest.mark.claims("matmul-no-mask-when-k-divides", "block-lane-rule")
def test_a_shape_that_divides_its_blocks_builds_no_edge_mask():
    """Shapes that divide their blocks trace no iota and no select_n, in matmul and layer norm.

    The mask is static: a reduction (K = 256, block_k = 128) that divides its block
    builds no index comparison and no select, so whole-block shapes pay nothing for
    the edge handling; the layer norm's blocks hold whole rows and need none."""
    x, w, b = matmul_inputs(7, 20, 256, 24, "float32")
    blocks = kernels.MatmulBlocks(block_m=16, block_n=24, block_k=128)
    matmul = _primitives(
        lambda *a: kernels.matmul_bias_act(*a, blocks=blocks, activation="relu"), x, w, b
    )
    xr, g, be = row_inputs(7, 8, 64, "float32")
    norm = _primitives(lambda *a: kernels.layer_norm(*a, blocks=kernels.RowBlocks(8)), xr, g, be)
    for names in (matmul, norm):
        assert "pallas_call" in names and "dot_general" in matmul
        assert names.count("select_n") == 0 and names.count("iota") == 0, names


def _pallas_calls(fn, *args) -> list:
    """The params of every `pallas_call` equation in the traced program of `fn(*args)`,
    nested jaxprs included (a `custom_vjp` and a `jit` hold the kernel's call)."""
    calls = []

    def walk(jaxpr) -> None:
        for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
            if eqn.primitive.name == "pallas_call":
                calls.append(eqn.params)
            for value in eqn.params.values():
                for item in value if isinstance(value, tuple | list) else [value]:
                    if hasattr(getattr(item, "jaxpr", item), "eqns"):
                        walk(item)

    walk(jax.make_jaxpr(fn)(*args))
    return calls


def _semantics(params) -> tuple:
    """The `dimension_semantics` the call declares to Mosaic (its TPU compiler
    params), each as its lower-case name; None when it declares none."""
    declared = getattr(params["compiler_params"], "dimension_semantics", None)
    if declared is None:
        return None
    return tuple(str(getattr(s, "value", s)).lower() for s in declared)


@pytest.mark.claims("matmul-reduction-axis-arbitrary", "matmul-k-grid-accumulator")
def test_the_reduction_axis_is_declared_arbitrary_and_the_output_axes_parallel(evidence):
    """Every matmul `pallas_call` declares dimension semantics `("parallel",
    "parallel", "arbitrary")` over an `(M, N, K)` grid whose last axis walks K.

    Read from the traced program, without running or compiling: each `pallas_call`
    equation's `compiler_params` (Mosaic's, which a TPU compiles by and the
    interpreter ignores, so no numerical test on a CPU can see them) and its
    `grid_mapping.grid`. Forward (20, 384) x (384, 24) in blocks of (16, 24, 128):
    grid (2, 1, 3), three reduction steps last; and the gradient, whose backward pass
    runs the same kernel three times (the pre-activation, dx and dw)."""
    x, w, b = matmul_inputs(8, 20, 384, 24, "float32")
    blocks = kernels.MatmulBlocks(block_m=16, block_n=24, block_k=128)

    def forward(x, w, b):
        return kernels.matmul_bias_act(x, w, b, blocks=blocks, activation="relu")

    def loss(x, w, b):
        return jnp.sum(forward(x, w, b))

    observed = {}
    for label, fn in (("forward", forward), ("gradient", jax.grad(loss, (0, 1)))):
        observed[label] = [
            {
                "name": params["name"],
                "grid": list(params["grid_mapping"].grid),
                "dimension_semantics": _semantics(params),
            }
            for params in _pallas_calls(fn, x, w, b)
        ]
    every = observed["forward"] + observed["gradient"]
    expected = ["parallel", "parallel", "arbitrary"]
    assert evidence.record(
        "matmul pallas_call dimension semantics, from the traced jaxpr",
        f"(20, 384) x (384, 24), blocks 16/24/128, forward and gradient, {BACKEND}, mode={MODE}",
        observed,
        {"dimension_semantics": expected, "forward_grid": [2, 1, 3]},
        len(observed["forward"]) == 1
        and len(observed["gradient"]) >= 3
        # cdiv(20, 16), cdiv(24, 24), cdiv(384, 128): the K steps are the last axis.
        and observed["forward"][0]["grid"] == [2, 1, 3]
        and all(c["dimension_semantics"] == tuple(expected) for c in every),
    ), observed


@pytest.mark.claims(
    "two-independent-references",
    "matmul-k-grid-accumulator",
    "matmul-acc-zeroed-at-first-step",
    "matmul-accumulates-in-float32",
    "matmul-epilogue-at-last-step",
)
@pytest.mark.parametrize(
    ("dtype", "precision"),
    [("float32", "highest"), ("float32", "default"), ("bfloat16", "highest")],
)
@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
def test_matmul_matches_both_references(evidence, dtype, precision, activation):
    """The fused matmul is within its bound of float64 NumPy and twice it of jax.numpy, 2 dtypes, 3
    activations, both declared precisions.

    (64, 256) x (256, 200) in blocks of (32, 128, 128): two reduction steps carry the
    accumulator, and N = 200 leaves a last column block that runs past the array."""
    x, w, b = matmul_inputs(0, 64, 256, 200, dtype)
    blocks = kernels.MatmulBlocks(block_m=32, block_n=128, block_k=128)
    y = kernels.matmul_bias_act(x, w, b, blocks=blocks, activation=activation, precision=precision)
    assert y.shape == (64, 200) and y.dtype == kernels.DTYPES[dtype]
    f64 = reference.matmul_bias_act_f64(x, w, b, activation)
    bound = reference.matmul_error_bound(x, w, b, activation, dtype, precision)
    condition = (
        f"(64, 256) x (256, 200), {dtype}, {activation}, precision {precision}, "
        f"blocks 32/128/128, {BACKEND}, mode={MODE}"
    )
    ok_f64 = evidence.within_bound("matmul vs float64 NumPy", condition, y, f64, bound)
    y_jnp = reference.matmul_bias_act_jnp(x, w, b, activation, precision)
    ok_jnp = evidence.within_bound(
        "matmul vs jax.numpy (two float32 computations: twice the bound)",
        condition,
        y,
        y_jnp,
        bound,
        scale=2.0,
    )
    # The bound must also hold for the jnp reference, or it is not a bound.
    ok_ref = evidence.within_bound("jax.numpy reference vs float64", condition, y_jnp, f64, bound)
    assert ok_f64 and ok_jnp and ok_ref


@pytest.mark.claims(
    "matmul-k-grid-accumulator",
    "matmul-acc-zeroed-at-first-step",
    "matmul-epilogue-at-last-step",
)
@pytest.mark.parametrize(
    ("seed", "blocks"),
    [(1, (8, 128, 128)), (2, (64, 256, 384)), (3, (16, 256, 128))],
)
def test_matmul_other_seed_and_blocks(evidence, seed, blocks):
    """The fused gelu matmul stays within its derived float64 bound for three other seeds and block
    shapes (one, two and three reduction steps)."""
    x, w, b = matmul_inputs(seed, 64, 384, 256, "float32")
    y = kernels.matmul_bias_act(x, w, b, blocks=kernels.MatmulBlocks(*blocks), activation="gelu")
    assert evidence.within_bound(
        "matmul vs float64 NumPy, changed seed and blocks",
        f"seed={seed}, blocks={blocks}, (64, 384) x (384, 256), float32 gelu, {BACKEND}, "
        f"mode={MODE}",
        y,
        reference.matmul_bias_act_f64(x, w, b, "gelu"),
        reference.matmul_error_bound(x, w, b, "gelu", "float32"),
    )


@pytest.mark.claims(
    "two-independent-references",
    "layer-norm-whole-rows",
    "layer-norm-float32-population-statistics",
    "layer-norm-affine-in-float32",
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_layer_norm_matches_both_references(evidence, dtype, seed):
    """The layer norm is within its derived bound of float64 NumPy and twice it of jax.numpy, for 2
    dtypes, 2 seeds."""
    x, g, b = row_inputs(seed, 24, 128, dtype)
    y = kernels.layer_norm(x, g, b, blocks=kernels.RowBlocks(block_rows=16))
    assert y.shape == (24, 128) and y.dtype == kernels.DTYPES[dtype]
    f64 = reference.layer_norm_f64(x, g, b)
    bound = reference.layer_norm_error_bound(x, g, b, dtype)
    condition = f"(24, 128), {dtype}, seed={seed}, block_rows=16, {BACKEND}, mode={MODE}"
    ok_f64 = evidence.within_bound("layer norm vs float64 NumPy", condition, y, f64, bound)
    y_jnp = reference.layer_norm_jnp(x, g, b)
    ok_jnp = evidence.within_bound(
        "layer norm vs jax.numpy (twice the bound)", condition, y, y_jnp, bound, scale=2.0
    )
    ok_ref = evidence.within_bound("jax.numpy layer norm vs float64", condition, y_jnp, f64, bound)
    assert ok_f64 and ok_jnp and ok_ref


def test_bounds_grow_with_the_reduction_length(evidence):
    """The float32 matmul bound grows like K squared (log-log slope 1.8 to 2.2), K = 64 to 1024.

    The matmul bound is gamma_{K+1} * (|x| @ |w| + |b|): gamma_{K+1} grows like
    (K + 1) u and, with the 1/sqrt(K) weight scale undone, |x| @ |w| like K (the
    definition, checked on data)."""
    sizes = [64, 256, 1024]
    widths = []
    for k in sizes:
        x, w, b = matmul_inputs(4, 4, k, 4, "float32")
        # Undo the 1/sqrt(K) weight scale so |x| @ |w| grows like K.
        w = w * jnp.sqrt(jnp.float32(k))
        widths.append(float(np.mean(reference.matmul_error_bound(x, w, b, "none", "float32"))))
    slope = float(np.polyfit(np.log(sizes), np.log(widths), 1)[0])
    # gamma_{K+1} ~ (K+1) u and sum |x||w| ~ K: log-log slope about 2.
    assert evidence.record(
        "bound growth with K (log-log slope of the mean bound)",
        "K in 64, 256, 1024; unit-scale x and w",
        {"mean_bounds": widths, "slope": slope},
        {"expected_slope": "about 2 (gamma_K ~ K u times a sum of K terms)", "range": [1.8, 2.2]},
        1.8 <= slope <= 2.2,
    )


@pytest.mark.claims("bounds-catch-realistic-bugs")
def test_bounds_catch_realistic_bugs(evidence):
    """The derived bounds reject a dropped bias, a bfloat16 accumulator and a missing mean.

    The bounds are tight enough to fail: a dropped bias, a bfloat16 accumulator
    and a layer norm that forgets to subtract the mean all break them."""
    x, w, b = matmul_inputs(5, 16, 2048, 16, "bfloat16")
    bound = reference.matmul_error_bound(x, w, b, "none", "bfloat16")
    f64 = reference.matmul_bias_act_f64(x, w, b, "none")
    no_bias = jnp.dot(x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
    # Sequential bfloat16 accumulation, as a kernel without a float32 accumulator would do.
    parts = jnp.einsum(
        "cmk,ckn->cmn",
        x.reshape(16, 128, 16).transpose(1, 0, 2),
        w.reshape(128, 16, 16),
        preferred_element_type=jnp.float32,
    )

    def accumulate(acc, part):
        return (acc.astype(jnp.float32) + part).astype(jnp.bfloat16), None

    acc, _ = jax.lax.scan(accumulate, jnp.zeros((16, 16), jnp.bfloat16), parts)
    bf16_acc = (acc.astype(jnp.float32) + b.astype(jnp.float32)[None, :]).astype(jnp.bfloat16)
    xr, g, be = row_inputs(5, 8, 64, "float32")
    x32 = xr.astype(jnp.float32)
    rms_only = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-5) * g[None, :]
    rms_only = rms_only + be[None, :]
    ln_bound = reference.layer_norm_error_bound(xr, g, be, "float32")
    caught = {
        "dropped_bias": not evidence.within_bound(
            "a matmul without its bias breaks the bound (must fail)",
            "bfloat16, K=2048",
            no_bias,
            f64,
            bound,
        ),
        "bfloat16_accumulator": not evidence.within_bound(
            "a bfloat16 accumulator breaks the bound (must fail)",
            "bfloat16, K=2048, 128 chunks of 16",
            bf16_acc,
            f64,
            bound,
        ),
        "no_mean_subtraction": not evidence.within_bound(
            "a layer norm without mean subtraction breaks the bound (must fail)",
            "float32, (8, 64), inputs of mean 3",
            rms_only,
            reference.layer_norm_f64(xr, g, be),
            ln_bound,
        ),
    }
    assert evidence.record(
        "the derived bounds reject three realistic bugs",
        "see the three preceding records",
        caught,
        {"all_caught": True},
        all(caught.values()),
    )


def _pallas_interpret_flags(fn, *args) -> list:
    """The `interpret` parameter of every `pallas_call` in the jaxpr of `fn(*args)`."""
    flags = []

    def walk(jaxpr) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                flags.append(eqn.params.get("interpret"))
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", None)
                if inner is not None:
                    walk(getattr(inner, "jaxpr", inner))

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return flags


def test_execution_mode_is_declared_and_interpret_is_what_ran(evidence):
    """The declared execution mode equals the traced pallas_call's interpret flag and the HLO's.

    The mode a record names is the mode the program holds: the traced program's
    `pallas_call` carries `interpret=True` exactly when the backend is not a TPU (or
    `KERNEL_AUDIT_MODE=interpret` asks for it), its lowered HLO holds a Mosaic
    kernel (`tpu_custom_call`) exactly when compiled, and the audit record names it."""
    from kernel_audit import audit

    x, w, b = matmul_inputs(6, 20, 256, 24, "float32")  # K a multiple of the block: no edge

    def call(x, w, b):
        return kernels.matmul_bias_act(x, w, b, activation="relu")

    flags = _pallas_interpret_flags(call, x, w, b)
    hlo = jax.jit(call).lower(x, w, b).as_text()
    record = audit.audit_layer_norm(data.ROW_CASES[0], "float32", kernels.RowBlocks(), seed=0)
    compiled = jax.default_backend() == "tpu" and os.environ.get("KERNEL_AUDIT_MODE") != "interpret"
    expected_mode = "compiled" if compiled else "interpret"
    observed = {
        "backend": jax.default_backend(),
        "default_mode": kernels.execution_mode(None),
        "pallas_call_interpret_flags": [bool(f) for f in flags],
        "hlo_holds_mosaic_kernel": "tpu_custom_call" in hlo,
        "audit_record_mode": record["execution_mode"],
    }
    assert evidence.record(
        "execution mode declared and equal to what the traced program holds",
        f"backend={jax.default_backend()}",
        observed,
        {"expected_mode": expected_mode},
        observed["default_mode"] == expected_mode
        and observed["audit_record_mode"] == expected_mode
        and flags == [not compiled]
        and observed["hlo_holds_mosaic_kernel"] == compiled,
    )


@pytest.mark.claims("layer-norm-eps-inside-rsqrt")
@pytest.mark.parametrize(("level", "spread"), [(3.0, 1e-3), (-40.0, 3e-3)])
def test_layer_norm_near_constant_rows_where_eps_matters(evidence, level, spread):
    """The layer norm stays within its bound on near-constant rows, where eps decides the output.

    Rows whose variance is far below `eps = 1e-5`: there the normalization is
    dominated by `eps`, so where `eps` enters (inside the square root) decides the
    output. A kernel that adds `eps` after the square root, or drops it, fails here
    although rows of unit variance cannot tell the difference."""
    key = data.case_key(11, "stage1-flat-rows", level, spread)
    noise = jax.random.normal(key, (16, 128), jnp.float32)  # Whole blocks: no edge
    x = jnp.float32(level) + jnp.float32(spread) * noise
    g = jnp.linspace(0.5, 1.5, 128, dtype=jnp.float32)
    b = jnp.linspace(-0.2, 0.2, 128, dtype=jnp.float32)
    y = kernels.layer_norm(x, g, b, blocks=kernels.RowBlocks(block_rows=8))
    variance = float(np.var(np.asarray(x, np.float64), axis=1).max())
    assert variance < 1e-4, variance  # Near or below eps: where eps decides the output.
    assert evidence.within_bound(
        "layer norm vs float64 NumPy on near-constant rows (variance near or below eps)",
        f"(16, 128) float32, rows {level} + {spread} * N(0, 1), max row variance "
        f"{variance:.2e}, mode={MODE}",
        y,
        reference.layer_norm_f64(x, g, b),
        reference.layer_norm_error_bound(x, g, b, "float32"),
    )


def test_same_seed_same_bits(evidence):
    """The same seed gives bit-equal matmul and layer-norm outputs; another seed gives different
    ones."""
    outs = []
    blocks = kernels.MatmulBlocks(block_m=32, block_n=128, block_k=128)  # as in the first test
    for seed in (7, 7, 8):
        x, w, b = matmul_inputs(seed, 64, 256, 200, "bfloat16")
        y = kernels.matmul_bias_act(x, w, b, blocks=blocks, activation="gelu")
        xr, g, be = row_inputs(seed, 24, 128, "float32")
        ln = kernels.layer_norm(xr, g, be, blocks=kernels.RowBlocks(block_rows=8))
        outs.append((np.asarray(y.astype(jnp.float32)), np.asarray(ln)))
    same = all(np.array_equal(a, b) for a, b in zip(outs[0], outs[1], strict=True))
    other = not any(np.array_equal(a, b) for a, b in zip(outs[0], outs[2], strict=True))
    assert evidence.record(
        "determinism: same seed gives bitwise-equal kernel outputs; another seed differs",
        "seeds 7, 7, 8; matmul (64, 256) x (256, 200) bfloat16, layer norm (24, 128) float32",
        {"same_seed_bitwise_equal": same, "other_seed_differs": other},
        {"bitwise": True},
        same and other,
    )


# --- BAD INPUT ----------------------------------------------------------------------------


def _f32(*shape):
    return jnp.ones(shape, jnp.float32)


BAD_MATMUL = [
    ((_f32(8, 16), _f32(17, 8), _f32(8)), {}, r"`x` has 16 columns but `w` has 17 rows"),
    ((_f32(8, 16), _f32(16, 8), _f32(9)), {}, r"`b` has 9 entries but `w` has 8 columns"),
    ((_f32(8, 16, 1), _f32(16, 8), _f32(8)), {}, r"Expected `x` \(M, K\)"),
    (
        (
            jnp.ones((8, 16), jnp.float16),
            jnp.ones((16, 8), jnp.float16),
            jnp.ones((8,), jnp.float16),
        ),
        {},
        r"`x` has dtype `float16`, which the kernels do not support",
    ),
    (
        (jnp.ones((8, 16), jnp.int32), jnp.ones((16, 8), jnp.int32), jnp.ones((8,), jnp.int32)),
        {},
        r"`x` has dtype `int32`",
    ),
    (
        (_f32(8, 16), jnp.ones((16, 8), jnp.bfloat16), _f32(8)),
        {},
        r"All operands must share one dtype.*`w`: `bfloat16`",
    ),
    ((_f32(0, 16), _f32(16, 8), _f32(8)), {}, r"at least 1"),
    (
        (_f32(64, 256), _f32(256, 256), _f32(256)),
        {"blocks": (12, 128, 128)},
        r"`block_m` = `12` breaks the TPU block rule for the sublane axis.*multiple of 8",
    ),
    (
        (jnp.ones((64, 256), jnp.bfloat16),) * 1
        + (jnp.ones((256, 256), jnp.bfloat16), jnp.ones((256,), jnp.bfloat16)),
        {"blocks": (8, 128, 128)},
        r"`block_m` = `8` breaks the TPU block rule for the sublane axis.*multiple of 16",
    ),
    (
        (_f32(64, 256), _f32(256, 256), _f32(256)),
        {"blocks": (16, 64, 128)},
        r"`block_n` = `64` breaks the TPU block rule for the lane axis.*multiple of 128",
    ),
    (
        (_f32(64, 300), _f32(300, 256), _f32(256)),
        {"blocks": (16, 128, 100)},
        r"`block_k` = `100` breaks the TPU block rule for the lane axis",
    ),
    (
        (_f32(5, 64), _f32(64, 64), _f32(64)),
        {"blocks": (16, 64, 64)},
        r"`block_m` = `16` exceeds M = 5 rounded up to the tile \(8\)",
    ),
    (
        (_f32(64, 64), _f32(64, 64), _f32(64)),
        {"precision": "high"},
        r"Unknown precision `high`",
    ),
    (
        (_f32(64, 64), _f32(64, 64), _f32(64)),
        {"activation": "swish"},
        r"Unknown activation `swish`",
    ),
]


@pytest.mark.claims(
    "target-rules-before-kernel",
    "block-lane-rule",
    "block-sublane-rule",
    "refusal-names-its-rule",
)
@pytest.mark.parametrize(("operands", "kwargs", "message"), BAD_MATMUL)
def test_bad_matmul_input_is_refused_before_any_kernel_runs(monkeypatch, operands, kwargs, message):
    """Each of 14 bad matmul inputs is refused with its message before any pallas_call is built."""

    def no_kernel(*args, **kw):
        raise AssertionError("a kernel was built for refused input")

    monkeypatch.setattr(pl, "pallas_call", no_kernel)
    if "blocks" in kwargs:
        kwargs = {**kwargs, "blocks": kernels.MatmulBlocks(*kwargs["blocks"])}
    with pytest.raises(kernels.KernelInputError, match=message):
        kernels.matmul_bias_act(*operands, **kwargs)


@pytest.mark.claims("vmem-budget")
def test_vmem_rule_depends_on_the_dtype_and_counts_every_buffer(evidence):
    """check_matmul refuses (1024, 1024, 1024) blocks for float32 and accepts them for bfloat16,
    at the byte count worked out by hand.

    One program holds two buffers of each input and output block plus a float32
    accumulator and a float32 product: for 1024^3 blocks that is 2 (2 * 1024^2 + 1024 +
    1024^2) itemsize + 8 * 1024^2 bytes, 32 MiB + 8 KiB + 8 MiB (refused) in float32 and
    16 MiB + 4 KiB + 8 MiB (accepted) in bfloat16, against a 32 MiB budget (float32 at
    `default` precision: `highest` adds the bfloat16 split of the inputs)."""
    blocks = kernels.MatmulBlocks(1024, 1024, 1024)
    by_hand = {4: 2 * (3 * 2**20 + 1024) * 4 + 8 * 2**20, 2: 2 * (3 * 2**20 + 1024) * 2 + 8 * 2**20}
    refused_f32 = False
    try:
        kernels.check_matmul(
            _f32(2048, 2048), _f32(2048, 2048), _f32(2048), blocks, "none", "default"
        )
    except kernels.KernelInputError as err:
        refused_f32 = f"need {by_hand[4]} bytes of VMEM" in str(err)
    bf = jnp.ones((2048, 2048), jnp.bfloat16)
    kernels.check_matmul(bf, bf, jnp.ones((2048,), jnp.bfloat16), blocks, "none")
    assert evidence.record(
        "VMEM rule: same blocks refused for float32, accepted for bfloat16",
        "blocks 1024/1024/1024, budget 32 MiB",
        {"float32_bytes": by_hand[4], "bfloat16_bytes": by_hand[2], "float32_refused": refused_f32},
        {"limit_bytes": 32 * 2**20},
        refused_f32 and by_hand[2] <= 32 * 2**20 < by_hand[4],
    )


@pytest.mark.claims(
    "target-rules-before-kernel",
    "block-sublane-rule",
    "vmem-budget",
    "refusal-names-its-rule",
    "layer-norm-whole-rows",
)
@pytest.mark.parametrize(
    ("shape", "params", "blocks", "message"),
    [
        (
            (64, 100),
            (100, 100),
            kernels.RowBlocks(12),
            r"`block_rows` = `12` breaks the TPU block rule for the sublane axis",
        ),
        ((5, 100), (100, 100), kernels.RowBlocks(16), r"exceeds R = 5 rounded up to the tile"),
        (
            (512, 8192),
            (8192, 8192),
            kernels.RowBlocks(256),
            r"`256` whole rows of C = 8192 `float32` values need \d+ bytes of VMEM",
        ),
        ((8, 100), (99, 100), kernels.RowBlocks(8), r"`gamma` and `beta` of shape \(C,\)"),
        ((8, 100), (100, 100), kernels.RowBlocks(0), r"`block_rows` must be a positive integer"),
    ],
)
def test_bad_layer_norm_input_is_refused(monkeypatch, shape, params, blocks, message):
    """Each of 5 bad layer-norm inputs or blocks is refused with its message before any pallas_call
    is built."""
    monkeypatch.setattr(pl, "pallas_call", lambda *a, **k: pytest.fail("kernel built"))
    with pytest.raises(kernels.KernelInputError, match=message):
        kernels.layer_norm(_f32(*shape), _f32(params[0]), _f32(params[1]), blocks=blocks)


def test_cli_check_refuses_bad_blocks_and_runs_good_ones(evidence):
    """The check command exits 2 naming block_m for blocks too large for M, and exits 0 naming the
    mode for good ones."""
    bad = CliRunner().invoke(main, ["check", "5", "64", "7", "--blocks", "64", "7", "64"])
    good = CliRunner().invoke(main, ["check", "5", "64", "7", "--blocks", "5", "7", "64"])
    observed = {
        "bad_exit": bad.exit_code,
        "bad_names_block_m": "`block_m`" in bad.output,
        "bad_traceback": "Traceback" in bad.output,
        "good_exit": good.exit_code,
        "good_declares_mode": f"[{MODE}]" in good.output,
    }
    assert evidence.record(
        "CLI `check`: invalid blocks are one clear error (exit 2); valid ones run and pass",
        "(5, 64) x (64, 7): block_m 64 vs 5",
        observed,
        {"bad_exit": 2, "good_exit": 0},
        observed["bad_exit"] == 2
        and observed["bad_names_block_m"]
        and not observed["bad_traceback"]
        and observed["good_exit"] == 0
        and observed["good_declares_mode"],
    )


def test_shipped_configs_equal_presets():
    """configs/tiny.json and configs/default.json load to exactly Config.tiny() and
    Config.default()."""
    assert load_config(PROJECT_ROOT / "configs" / "tiny.json") == Config.tiny()
    assert load_config(PROJECT_ROOT / "configs" / "default.json") == Config.default()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"seeds": 1}', "seeds"),
        ('{"dtypes": ["float16"]}', "dtypes"),
        ('{"matmul_cases": ["huge"]}', "matmul_cases"),
        ('{"matmul_blocks": [[16, 0, 16]]}', "matmul_blocks"),
        ('{"train_steps": 0}', "train_steps"),
    ],
)
def test_bad_config_names_the_field(tmp_path, text, field):
    """A config with one bad field is refused naming it, by load_config and the audit command (exit
    2, no workdir)."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"`{field}"):
        load_config(path)
    result = CliRunner().invoke(
        main, ["audit", "--config", str(path), "--workdir", str(tmp_path / "a")]
    )
    assert result.exit_code == 2, result.output
    assert f"`{field}" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "a").exists()


def test_evidence_round_trip(evidence, tmp_path):
    """The evidence file written for stage 1 reads back as JSON with records that each carry
    `passed`."""
    path = evidence.write(tmp_path)
    payload = json.loads(path.read_text())
    assert payload["stage"] == "1"
    assert payload["records"] and all("passed" in r for r in payload["records"])
