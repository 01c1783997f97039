"""Stage 2: custom derivative rules, implicit differentiation, higher order.

Independent checks: derivatives against NumPy float64 formulas (sigmoid, the
unit vector, clipping, the implicit-function-theorem Jacobian solved by
`numpy.linalg.solve`, analytic Hessians), against differentiating the unrolled
solver, and against central differences. Changed conditions: float32, a
batch of inputs, another seed, another clipping interval.
"""

import decimal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import IEEE_FLOAT64
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from derivative_audit import checks, model, rules

# A claim at float64's rounding runs where float64 is IEEE double (see conftest.py).
FLOAT64 = pytest.param(jnp.float64, marks=pytest.mark.ieee_float64)

# No shrinking: a failing example is reported as drawn (kept fast under mutation).
FAST = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
)

POINTS = np.array([-1000.0, -30.0, -3.0, -0.5, 0.0, 0.5, 3.0, 30.0, 1000.0])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Stable float64 logistic, by cases (never overflows)."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


@pytest.mark.claims("custom-rules-finite", "softplus-rule-sigmoid", "softplus-rule-finite-at-1000")
@pytest.mark.parametrize("dtype", [FLOAT64, jnp.float32])
def test_softplus_rule_is_finite_where_autodiff_is_nan(evidence, float32_excess, dtype):
    """softplus and its first two derivatives match float64 formulas, even at 1000 where autodiff is
    NaN.

    In float32, within 10 eps times how many times the backend's log1p(exp) and
    sigmoid err more than faithful float32 ones (about 1 on a CPU)."""
    x = jnp.asarray(POINTS, dtype)
    value = np.logaddexp(0.0, POINTS)
    grad = jax.jit(jax.vmap(jax.grad(rules.softplus)))(x)
    second = jax.jit(jax.vmap(jax.grad(jax.grad(rules.softplus))))(x)
    naive = jax.jit(jax.vmap(jax.grad(rules.softplus_naive)))(x)
    where = jax.jit(jax.vmap(jax.grad(rules.softplus_where)))(x)
    factor = 1.0
    if dtype == jnp.float32:
        factor = max(float32_excess["log1p_exp"], float32_excess["sigmoid"])
    tol = 10 * float(jnp.finfo(dtype).eps) * factor
    s = _sigmoid(POINTS)
    ok = [
        evidence.allclose(
            "softplus value", str(dtype.__name__), rules.softplus(x), value, rtol=tol, atol=tol
        ),
        evidence.allclose("softplus' = sigmoid", str(dtype.__name__), grad, s, rtol=tol, atol=tol),
        evidence.allclose(
            "softplus'' = s(1-s) (rule differentiated)",
            str(dtype.__name__),
            second,
            s * (1 - s),
            rtol=10 * tol,
            atol=tol,
        ),
        evidence.record(
            "plain autodiff at 1000",
            str(dtype.__name__),
            {"naive_grad": float(naive[-1]), "where_grad": float(where[-1])},
            None,
            bool(np.isnan(naive[-1]) and np.isnan(where[-1])),
        ),
    ]
    assert all(ok)


def _decimal_softplus_and_sigmoid(x: float) -> tuple[float, float]:
    """log(1 + e^x) and 1 / (1 + e^-x) in decimal arithmetic with enough digits that
    1 + e^x keeps e^x's leading 40 digits (e^-700 is 1e-304), rounded once to float64."""
    d = decimal.Decimal(x)
    with decimal.localcontext() as ctx:
        ctx.prec = 40 + int(abs(x) / 2.3)
        return float((1 + d.exp()).ln()), float(1 / (1 + (-d).exp()))


# (dtype, most negative x, to 1%): e^x stays a normal number of the dtype (e^-87.3 is float32's
# smallest normal, e^-708 float64's).
SOFTPLUS_RANGE = [
    pytest.param(jnp.float64, -700.0, marks=pytest.mark.ieee_float64),
    (jnp.float32, -85.0),
]


@pytest.mark.claims("softplus-rule-sigmoid")
@pytest.mark.parametrize(("dtype", "lo"), SOFTPLUS_RANGE)
def test_softplus_has_a_few_ulps_relative_error_in_every_regime(
    evidence, float32_excess, dtype, lo
):
    """softplus and its rule's derivative are within 4 eps, RELATIVELY, of a decimal reference.

    A grid from `lo` (-700 in float64, -85 in float32: large negative x, where
    softplus(x) ~ e^x is tiny and only log1p keeps its digits) through -3 ... -0.25
    (where log(1 + e^-|x|) is still accurate), around 0, to 1000; eager and jitted.
    The grid is shown to cross the regime boundary: the formula log(1 + e^-|x|) in
    NumPy, in the same dtype, is within the bound near 0 and outside it below -5. The
    backend's figures in float32 are held to 4 eps times how many times its log1p(exp)
    and sigmoid err more than faithful float32 ones (about 1 on a CPU); the grid's own
    NumPy control keeps 4 eps."""
    rng = np.random.default_rng(7)
    neg = -np.geomspace(-lo, 0.25, 48) * np.exp(0.01 * rng.uniform(-1, 1, 48))
    grid = np.concatenate([neg, np.linspace(-0.25, 0.25, 11), np.geomspace(0.3, 1000.0, 24)])
    x = grid.astype(np.dtype(dtype))
    x64 = x.astype(np.float64)
    reference = np.array([_decimal_softplus_and_sigmoid(float(v)) for v in x64])
    value, slope = reference[:, 0], reference[:, 1]
    tol = 4 * float(jnp.finfo(dtype).eps)
    factor = 1.0
    if dtype == jnp.float32:
        factor = max(float32_excess["log1p_exp"], float32_excess["sigmoid"])
    name = dtype.__name__
    grad = jax.jit(jax.vmap(jax.grad(rules.softplus)))(jnp.asarray(x))
    ok = [
        evidence.allclose(
            "softplus value, relative",
            f"{name} eager",
            rules.softplus(jnp.asarray(x)),
            value,
            rtol=tol * factor,
            atol=0,
        ),
        evidence.allclose(
            "softplus value, relative",
            f"{name} jit",
            jax.jit(rules.softplus)(jnp.asarray(x)),
            value,
            rtol=tol * factor,
            atol=0,
        ),
        evidence.allclose(
            "softplus' = sigmoid, relative", f"{name} jit", grad, slope, rtol=tol * factor, atol=0
        ),
    ]
    one = np.asarray(1.0, x.dtype)
    plain = (np.maximum(x, 0) + np.log(one + np.exp(-np.abs(x)))).astype(np.float64)
    plain_rel = np.abs(plain - value) / value
    near, far = np.abs(x64) <= 0.25, x64 <= -5.0
    ok.append(
        evidence.record(
            "grid crosses where log(1 + e^-|x|) loses digits",
            f"{name} NumPy log(1 + e^-|x|)",
            {
                "max_rel_near_0": float(plain_rel[near].max()),
                "min_rel_below_-5": float(plain_rel[far].min()),
                "points_near_0": int(near.sum()),
                "points_below_-5": int(far.sum()),
            },
            {"rel": tol},
            bool(plain_rel[near].max() <= tol and plain_rel[far].min() > tol),
        )
    )
    assert all(ok)


@pytest.mark.claims("custom-rules-finite", "safe-norm-tangent", "safe-norm-hessian")
@pytest.mark.claims("safe-norm-zero-tangent")
@pytest.mark.parametrize("seed", [0, 1])
def test_safe_norm_has_a_subgradient_at_zero_and_the_right_hessian(evidence, seed):
    """safe_norm's gradient is x/|x| (also by central difference), exactly 0 at 0, and its Hessian
    the analytic one."""
    x = jax.random.normal(jax.random.key(seed), (4,), jnp.float64)
    xn = np.asarray(x)
    r = np.linalg.norm(xn)
    zero = jnp.zeros(4, jnp.float64)
    hessian = (np.eye(4) - np.outer(xn, xn) / r**2) / r
    u = jnp.asarray(np.eye(4)[seed], jnp.float64)
    fd = checks.central_difference(
        jax.jit(lambda y: jnp.reshape(rules.safe_norm(y), (1,))), x, u, 1e-5
    )
    ok = [
        evidence.allclose(
            "grad |x| = x/|x|",
            f"seed {seed}",
            jax.grad(rules.safe_norm)(x),
            xn / r,
            rtol=1e-14,
            atol=1e-15,
        ),
        evidence.allclose(
            "grad |x| vs central difference",
            f"seed {seed}",
            jax.grad(rules.safe_norm)(x)[seed],
            fd[0],
            rtol=1e-8,
            atol=1e-9,
        ),
        evidence.allclose(
            "grad at 0 = 0", "x = 0", jax.grad(rules.safe_norm)(zero), np.zeros(4), rtol=0, atol=0
        ),
        evidence.allclose(
            "Hessian fwd-over-rev",
            f"seed {seed}",
            jax.jit(lambda y: rules.hessian_fwd_rev(rules.safe_norm, y))(x),
            hessian,
            rtol=1e-12,
            atol=1e-13,
        ),
        evidence.record(
            "plain autodiff at 0",
            "x = 0",
            {"grad": np.asarray(jax.grad(rules.norm_naive)(zero))},
            None,
            bool(np.all(np.isnan(jax.grad(rules.norm_naive)(zero)))),
        ),
    ]
    assert all(ok)


@pytest.mark.claims("safe-norm-any-shape")
@pytest.mark.parametrize("shape", [(), (1,), (5,), (2, 3), (3, 1, 2)])
@pytest.mark.parametrize("dtype", [FLOAT64, jnp.float32])
def test_safe_norm_tangent_is_the_full_inner_product_for_any_shape(evidence, shape, dtype):
    """safe_norm's JVP is sum(x * t) / |x| and its gradient x / |x|, for a scalar, vectors, a matrix
    and a 3-d array, against NumPy float64 on the dtype's values.

    |x| is over every entry (the Frobenius norm of a matrix), the inner product
    over every entry too. Bound for k = x.size entries: the k-term sum of products
    errs by at most k eps/2 times sum |x t|, the k-term |x| by (k/2 + 1) eps/2
    relatively, the quotient by eps/2: within (k + 2) eps sum |x t| / |x| for the
    tangent, (k + 2) eps |x_i| / |x| for each gradient entry, (k + 2) eps |x| for |x|."""
    rng = np.random.default_rng(sum(shape) + len(shape))
    x = rng.normal(size=shape).astype(dtype)
    t = rng.normal(size=shape).astype(dtype)
    x64, t64 = x.astype(np.float64), t.astype(np.float64)
    norm = float(np.sqrt(np.sum(x64**2)))
    k = x.size
    eps = float(jnp.finfo(dtype).eps)
    primal, tangent = jax.jvp(rules.safe_norm, (jnp.asarray(x),), (jnp.asarray(t),))
    grad = jax.grad(rules.safe_norm)(jnp.asarray(x))
    cond = f"shape {shape} {jnp.dtype(dtype).name}"
    ok = [
        evidence.allclose(
            "|x| over every entry", cond, primal, norm, rtol=0, atol=(k + 2) * eps * norm
        ),
        evidence.allclose(
            "tangent sum(x t) / |x|",
            cond,
            tangent,
            np.sum(x64 * t64) / norm,
            rtol=0,
            atol=(k + 2) * eps * np.sum(np.abs(x64 * t64)) / norm,
        ),
        evidence.allclose(
            "grad x / |x| of x's shape", cond, grad, x64 / norm, rtol=(k + 2) * eps, atol=0
        ),
    ]
    assert np.shape(primal) == () and np.shape(tangent) == ()
    assert all(ok)


@pytest.mark.claims("clip-gradient-cotangent")
@pytest.mark.parametrize(("lo", "hi"), [(-1.0, 1.0), (-0.25, 2.0)])
def test_clip_gradient_clips_only_the_cotangent(evidence, lo, hi):
    """clip_gradient is the identity forward and its gradient is NumPy's clip of the cotangent, for
    two intervals."""
    k1, k2 = jax.random.split(jax.random.key(3))
    x = jax.random.normal(k1, (16,), jnp.float64)
    w = 3.0 * jax.random.normal(k2, (16,), jnp.float64)

    def loss(y):
        return jnp.sum(w * rules.clip_gradient(y, lo, hi))

    ok = [
        evidence.allclose(
            "forward is identity",
            f"[{lo}, {hi}]",
            rules.clip_gradient(x, lo, hi),
            x,
            rtol=0,
            atol=0,
        ),
        evidence.allclose(
            "grad = clip(upstream)",
            f"[{lo}, {hi}]",
            jax.grad(loss)(x),
            np.clip(np.asarray(w), lo, hi),
            rtol=0,
            atol=0,
        ),
    ]
    assert all(ok)


@pytest.mark.claims("straight-through-identity-backward")
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_straight_through_round_passes_the_gradient(evidence, dtype):
    """The straight-through round's gradient is f'(round(x)), where plain round's is 0, in float64
    and float32."""
    x = jnp.asarray([-1.7, -0.2, 0.4, 1.6, 2.5], dtype)

    def loss(fn):
        return lambda y: jnp.sum(jnp.sin(fn(y)))

    rounded = np.round(np.asarray(x, np.float64))
    ok = [
        evidence.allclose(
            "STE grad = f'(round(x))",
            dtype.__name__,
            jax.grad(loss(rules.straight_through_round))(x),
            np.cos(rounded),
            rtol=1e-6,
            atol=1e-6,
        ),
        evidence.allclose(
            "plain round grad = 0",
            dtype.__name__,
            jax.grad(loss(jnp.round))(x),
            np.zeros(5),
            rtol=0,
            atol=0,
        ),
    ]
    assert all(ok)


@pytest.mark.claims("custom-vjp-forward-mode-refused")
def test_custom_vjp_refuses_forward_mode_and_says_why(evidence):
    """jvp, jacfwd and jacrev(jacfwd) of a custom_vjp are refused naming it; grad and jacfwd(grad)
    work."""
    r = rules.forward_mode_refusal()
    refused = r["refused"]
    expected = {
        "jvp": True,
        "jacfwd": True,
        "jacrev(jacfwd)": True,
        "jacfwd(grad)": False,
        "grad": False,
    }
    observed = {k: refused[k] is not None for k in expected}
    messages_name_it = all("custom_vjp" in refused[k] for k in expected if expected[k])
    assert evidence.record(
        "forward mode on custom_vjp",
        "five transformations",
        {"refused": refused},
        {"expected_refused": expected},
        observed == expected and messages_name_it and "transposed" in r["explanation"],
    )


def _ift_jacobian(params: model.Params, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """dz*/dx = (I - D W)^-1 D U with D = diag(1 - z*^2), in NumPy float64."""
    w, u = np.asarray(params.w, np.float64), np.asarray(params.u, np.float64)
    d = np.diag(1 - np.asarray(z, np.float64) ** 2)
    return np.linalg.solve(np.eye(w.shape[0]) - d @ w, d @ u)


@pytest.mark.claims("implicit-fixed-point-gradient", "implicit-adjoint-solve")
@pytest.mark.claims("implicit-one-step-pullback")
@pytest.mark.parametrize(
    ("seed", "dtype"),
    [pytest.param(0, jnp.float64, marks=pytest.mark.ieee_float64), (2, jnp.float32)],
)
def test_implicit_gradient_matches_analytic_and_unrolled(evidence, float32_excess, seed, dtype):
    """The implicit-function Jacobian and gradients match NumPy's IFT solve and the unrolled solver,
    in 2 dtypes (float32 within 1e3 eps times the backend's tanh excess, about 1 on a CPU)."""
    kp, kx = jax.random.split(jax.random.key(seed))
    params = model.init(kp, 6, 4, contraction=0.6, dtype=dtype)
    x = jax.random.normal(kx, (4,), jnp.float64).astype(dtype)
    z = rules.fixed_point_implicit(params, x, 500)
    jacobian = jax.jit(jax.jacrev(rules.fixed_point_implicit, argnums=1), static_argnums=2)
    implicit = jacobian(params, x, 500)
    unrolled = jax.jit(jax.jacrev(model.solve_unrolled, argnums=1), static_argnums=2)(
        params, x, 200
    )
    analytic = _ift_jacobian(params, np.asarray(x, np.float64), np.asarray(z, np.float64))
    factor = float32_excess["tanh"] if dtype == jnp.float32 else 1.0
    tol = 1e3 * float(jnp.finfo(dtype).eps) * factor

    def loss_implicit(p):
        return jnp.sum(jnp.square(rules.fixed_point_implicit(p, x, 500)))

    def loss_unrolled(p):
        return jnp.sum(jnp.square(model.solve_unrolled(p, x, 200)))

    g_imp = jax.jit(jax.grad(loss_implicit))(params)
    g_unr = jax.jit(jax.grad(loss_unrolled))(params)
    cond = f"seed {seed} {dtype.__name__}"
    ok = [
        evidence.allclose(
            "fixed point residual", cond, model.step(params, z, x), z, rtol=tol, atol=tol
        ),
        evidence.allclose(
            "implicit dz/dx vs IFT formula (NumPy)", cond, implicit, analytic, rtol=tol, atol=tol
        ),
        evidence.allclose(
            "unrolled dz/dx vs IFT formula (NumPy)", cond, unrolled, analytic, rtol=tol, atol=tol
        ),
    ] + [
        evidence.allclose(f"implicit vs unrolled grad {name}", cond, a, b, rtol=tol, atol=tol)
        for name, a, b in zip(params._fields, g_imp, g_unr, strict=True)
    ]
    assert all(ok)


@pytest.mark.claims("implicit-fixed-point-gradient", "implicit-adjoint-solve")
def test_implicit_gradient_batched(evidence):
    """The gradient through one batched solve equals the sum of per-row gradients within 1e-11.

    A batch of inputs through one solve: each row's gradient as if alone."""
    kp, kx = jax.random.split(jax.random.key(4))
    params = model.init(kp, 5, 3, contraction=0.5)
    xs = jax.random.normal(kx, (4, 3), jnp.float64)

    def loss(p, x):
        return jnp.sum(jnp.tanh(rules.fixed_point_implicit(p, x, 500)))

    grad = jax.jit(jax.grad(loss))
    batched = grad(params, xs)
    per_row = [grad(params, xs[i]) for i in range(4)]
    summed = [sum(np.asarray(g[k]) for g in per_row) for k in range(3)]
    ok = [
        evidence.allclose(
            f"batched grad {name}", "batch of 4 vs rows", a, b, rtol=1e-11, atol=1e-12
        )
        for name, a, b in zip(params._fields, batched, summed, strict=True)
    ]
    assert all(ok)


def _glm_loss(a: jax.Array, lam: float):
    def f(x):
        return jnp.mean(rules.softplus(a @ x)) + 0.5 * lam * jnp.sum(jnp.square(x))

    return f


@pytest.mark.claims("hessians-forward-over-reverse", "hvp-forward-over-reverse")
@pytest.mark.parametrize(
    ("n", "dtype"), [pytest.param(6, jnp.float64, marks=pytest.mark.ieee_float64), (9, jnp.float32)]
)
def test_hessians_forward_over_reverse_match_analytic(evidence, float32_excess, n, dtype):
    """Forward-over-reverse Hessians and hvp match analytic logsumexp and GLM ones within 100 eps.

    logsumexp(A x): A^T (diag p - p p^T) A; a softplus GLM loss:
    A^T diag(s(1-s)) A / m + lambda I; and H v from `hvp` against both. In float32 the
    bound is times the backend's exp, log1p(exp) and sigmoid excess (about 1 on a CPU)."""
    ka, kx, kv = jax.random.split(jax.random.key(n), 3)
    a = jax.random.normal(ka, (n + 2, n), jnp.float64)
    x = jax.random.normal(kx, (n,), jnp.float64)
    v = jax.random.normal(kv, (n,), jnp.float64)
    an, xn = np.asarray(a), np.asarray(x)
    logits = an @ xn
    p = np.exp(logits - logits.max())
    p /= p.sum()
    h_lse = an.T @ (np.diag(p) - np.outer(p, p)) @ an
    s = _sigmoid(logits)
    h_glm = an.T @ np.diag(s * (1 - s)) @ an / (n + 2) + 0.1 * np.eye(n)
    ac, xc, vc = a.astype(dtype), x.astype(dtype), v.astype(dtype)
    factor = 1.0
    if dtype == jnp.float32:
        factor = max(float32_excess[k] for k in ("exp", "log1p_exp", "sigmoid"))
    tol = 100 * float(jnp.finfo(dtype).eps) * factor

    def lse(y):
        return jax.nn.logsumexp(ac @ y)

    glm = _glm_loss(ac, 0.1)

    @jax.jit
    def everything(y, t):
        return (
            rules.hessian_fwd_rev(lse, y),
            rules.hessian_fwd_rev(glm, y),
            rules.hvp(glm, y, t),
            rules.hvp(lse, y, t),
        )

    h1, h2, hv_glm, hv_lse = everything(xc, vc)
    cond = f"n={n} {dtype.__name__}"
    ok = [
        evidence.allclose(
            "Hessian logsumexp", cond, h1, h_lse, rtol=tol, atol=tol * np.abs(h_lse).max()
        ),
        evidence.allclose(
            "Hessian GLM (custom softplus)",
            cond,
            h2,
            h_glm,
            rtol=tol,
            atol=tol * np.abs(h_glm).max(),
        ),
        evidence.allclose(
            "hvp GLM",
            cond,
            hv_glm,
            h_glm @ np.asarray(v),
            rtol=tol,
            atol=tol * np.abs(h_glm @ np.asarray(v)).max(),
        ),
        evidence.allclose(
            "hvp logsumexp",
            cond,
            hv_lse,
            h_lse @ np.asarray(v),
            rtol=tol,
            atol=tol * np.abs(h_lse @ np.asarray(v)).max(),
        ),
    ]
    assert all(ok)


@FAST
@given(
    rate=st.sampled_from([0.5, -0.5, 0.25, -0.25]),
    centre=st.lists(st.sampled_from([1.0, 64.0, 1 / 64, -2.0]), min_size=1, max_size=3),
    # Bitwise against NumPy: float64 only where it is IEEE double (see conftest.py).
    dtype=st.sampled_from([np.float64, np.float32] if IEEE_FLOAT64 else [np.float32]),
    tol=st.sampled_from(["1e-3", "1e-6", "100eps"]),
    max_iterations=st.integers(1, 40),
)
def test_iterate_stops_where_a_python_loop_stops(rate, centre, dtype, tol, max_iterations):
    """_iterate stops at the iterate and count of a plain Python loop, over hypothesis cases.

    z <- r (z - c) + c from 0 (exact in binary: r and c are powers of two)
    until max|z' - z| <= tol max|z'| or the iteration budget is spent; the
    iterate and the count against a plain Python loop in the same dtype."""
    c = np.asarray(centre, dtype)
    r = dtype(rate)
    tolerance = 100 * float(np.finfo(dtype).eps) if tol == "100eps" else float(tol)
    z, delta, count = np.zeros_like(c), np.inf, 0
    while delta > tolerance and count < max_iterations:
        z_next = r * (z - c) + c
        delta = np.max(np.abs(z_next - z)) / max(np.max(np.abs(z_next)), np.finfo(dtype).tiny)
        z, count = z_next, count + 1
    got, got_count = rules._iterate(
        lambda y: r * (y - c) + c, jnp.zeros(c.shape, dtype), tolerance, max_iterations
    )
    assert int(got_count) == count
    np.testing.assert_array_equal(np.asarray(got), z)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_solver_tolerance_is_100_eps(dtype):
    """solver_tolerance is 100 times NumPy's eps of the dtype, for float64 and float32."""
    assert rules.solver_tolerance(jnp.dtype(dtype)) == pytest.approx(
        100 * float(np.finfo(dtype).eps), rel=1e-12
    )


@pytest.mark.ieee_float64
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("iterations", [1, 2, 3, 7])
def test_fixed_point_budget_is_that_many_numpy_steps(evidence, batch, iterations):
    """A too-small budget gives exactly that many NumPy float64 steps, for one input or a batch.

    A budget too small to converge: exactly that many steps tanh(W z + U x + b)
    from z = 0, in NumPy float64, one input or a batch."""
    kp, kx = jax.random.split(jax.random.key(5))
    params = model.init(kp, 5, 3, contraction=0.9)
    x = jax.random.normal(kx, (3,) if batch is None else (batch, 3), jnp.float64)
    w, u, b = (np.asarray(a) for a in params)
    xn = np.asarray(x)
    z = np.zeros(xn.shape[:-1] + (5,))
    for _ in range(iterations):
        z = np.tanh(z @ w.T + xn @ u.T + b)
    assert evidence.allclose(
        "budget-limited solve = NumPy steps",
        f"{iterations} steps, batch {batch}",
        rules.fixed_point_implicit(params, x, iterations),
        z,
        rtol=1e-13,
        atol=1e-14,
    )


@pytest.mark.claims("implicit-adjoint-budget")
@pytest.mark.ieee_float64
@pytest.mark.parametrize("iterations", [1, 2, 3, 6])
def test_adjoint_solve_stops_at_the_iteration_budget(evidence, iterations):
    """With a budget too small to converge, the implicit VJP pulls back exactly that many adjoint
    iterations, not one more or one fewer: NumPy float64.

    The forward solve stops at the budget too (k steps z <- tanh(W z + U x + b)
    from 0), so the reference is built on that z: with d = 1 - tanh(W z + U x + b)^2
    (one step's derivative at z), a_0 = v, a_(j+1) = v + W^T (d a_j), and the
    cotangents of one step for d a_k: W-bar = (d a_k) z^T, U-bar = (d a_k) x^T,
    b-bar = d a_k, x-bar = U^T (d a_k). Bound: each of the k forward and k adjoint
    iterations and the one pullback is a dot product of at most n + d_in = 8 terms
    (8 eps relatively) and a tanh or its derivative (4 eps allowed); the map
    contracts, so earlier errors do not grow: (2k + 1) 12 eps times the largest
    cotangent entry. The budgets k - 1 and k + 1 give cotangents at least 100 times
    that far away, so the comparison tells k from its neighbours."""
    n, d_in = 5, 3
    kp, kx, kv = jax.random.split(jax.random.key(7), 3)
    params = model.init(kp, n, d_in, contraction=0.9)
    x = jax.random.normal(kx, (d_in,), jnp.float64)
    v = jax.random.normal(kv, (n,), jnp.float64)
    w, u, b = (np.asarray(p) for p in params)
    xn, vn = np.asarray(x), np.asarray(v)
    z = np.zeros(n)
    for _ in range(iterations):
        z = np.tanh(w @ z + u @ xn + b)
    d = 1 - np.tanh(w @ z + u @ xn + b) ** 2

    def cotangents(count: int) -> list[np.ndarray]:
        a = vn
        for _ in range(count):
            a = vn + w.T @ (d * a)
        da = d * a
        return [np.outer(da, z), np.outer(da, xn), da, u.T @ da]

    _, pullback = jax.vjp(lambda p, y: rules.fixed_point_implicit(p, y, iterations), params, x)
    params_bar, x_bar = pullback(v)
    got = [*params_bar, x_bar]
    want = cotangents(iterations)
    scale = max(float(np.abs(c).max()) for c in want)
    tol = (2 * iterations + 1) * 12 * float(jnp.finfo(jnp.float64).eps) * scale
    gaps = {
        f"budget {k}": max(
            float(np.abs(c - e).max()) for c, e in zip(cotangents(k), want, strict=True)
        )
        for k in (iterations - 1, iterations + 1)
    }
    cond = f"budget {iterations}"
    ok = [
        evidence.record(
            "neighbouring budgets are distinguishable",
            cond,
            gaps,
            {"at_least": 100 * tol},
            min(gaps.values()) >= 100 * tol,
        )
    ] + [
        evidence.allclose(f"{name}-bar = {iterations} adjoint steps", cond, g, e, rtol=0, atol=tol)
        for name, g, e in zip(("W", "U", "b", "x"), got, want, strict=True)
    ]
    assert all(ok)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_fixed_point_refuses_a_budget_that_is_not_a_positive_integer(bad):
    """A budget of 0, -1, True or 2.0 iterations is refused with a message naming max_iterations."""
    params = model.init(jax.random.key(6), 3, 2, contraction=0.5)
    with pytest.raises(ValueError, match="`max_iterations` must be a positive integer"):
        rules.fixed_point_implicit(params, jnp.ones(2, jnp.float64), bad)


@pytest.mark.parametrize("shape", [(3,), (5,), (4, 1)])
def test_hvp_refuses_a_direction_of_another_shape(shape):
    """hvp refuses a direction of shape (3,), (5,) or (4, 1) for an x of shape (4,), naming both
    shapes."""
    with pytest.raises(ValueError, match=r"H v needs the shape of x, \(4,\)"):
        rules.hvp(lambda y: jnp.sum(y**3), jnp.ones(4, jnp.float64), jnp.ones(shape, jnp.float64))
