"""Stage 2: custom derivative rules, and derivatives of a solve without the solver.

- `softplus`: log(1 + e^x) with a `custom_jvp`. The plain formula overflows at
  x = 1000 (e^1000 = inf) and its derivative is inf/inf = NaN; the stable
  `where` form still has a NaN gradient there (autodiff differentiates the
  branch it does not select, and 0 * inf = NaN). The rule says d/dx = sigmoid(x).
- `safe_norm`: |x| with a `custom_jvp`; the plain derivative x/|x| is 0/0 = NaN
  at x = 0, the rule gives the subgradient 0 there.
- `clip_gradient`: identity forward, cotangent clipped to [lo, hi] backward (`custom_vjp`).
- `straight_through_round`: round(x) forward, identity backward (`custom_vjp`),
  the straight-through estimator: plain autodiff of round gives 0 everywhere.
- `fixed_point_implicit`: the implicit layer's fixed point (model.py) solved by
  iteration to a tolerance in a `while_loop`, differentiated by the implicit
  function theorem: with z* = g(z*, theta), dz*/dtheta = (I - dg/dz)^-1 dg/dtheta,
  so the VJP solves the adjoint fixed point a = v + (dg/dz)^T a and pulls a
  back through one step. No iteration is stored.
- `hvp`: a Hessian-vector product, forward over reverse, without the Hessian.

Rules are written with JAX operations, so they are differentiable again: the
Hessian of `softplus` is sigmoid'(x), exact even at x = 1000.
"""

import functools
import numbers

import jax
import jax.numpy as jnp

from derivative_audit import model


def softplus_naive(x: jax.Array) -> jax.Array:
    """log(1 + e^x) as written: inf at x = 1000, NaN gradient there."""
    return jnp.log1p(jnp.exp(x))


def softplus_where(x: jax.Array) -> jax.Array:
    """The stable value by cases; its gradient is still NaN at x = 1000."""
    return jnp.where(x > 0, x + jnp.log1p(jnp.exp(-x)), jnp.log1p(jnp.exp(x)))


@jax.custom_jvp
def softplus(x: jax.Array) -> jax.Array:
    """log(1 + e^x), finite for every finite x, with derivative sigmoid(x)."""
    return jnp.maximum(x, 0) + jnp.log1p(jnp.exp(-jnp.abs(x)))


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    """`(softplus(x), sigmoid(x) * t)`: the primal output and its tangent.
    [claim:softplus-rule-sigmoid]

    Cases: x = +-1000 -> a finite tangent, and a finite derivative of the tangent
    (the rule is differentiated again for the second derivative s (1 - s)): use
    a stable sigmoid such as `jax.nn.sigmoid`, not `1 / (1 + exp(-x))`, whose
    derivative is inf / inf = NaN at x = -1000. [claim:softplus-rule-finite-at-1000]
    """
    (x,), (t,) = primals, tangents
    # --- exercise stage 2: Return softplus(x) and sigmoid(x) * t. ---
    return softplus(x), jax.nn.sigmoid(x) * t
    # --- end exercise ---


def norm_naive(x: jax.Array) -> jax.Array:
    """sqrt(sum x^2): its gradient at x = 0 is NaN."""
    return jnp.sqrt(jnp.sum(jnp.square(x)))


@jax.custom_jvp
def safe_norm(x: jax.Array) -> jax.Array:
    """The Euclidean norm of `x` (any shape); derivative x/|x|, and 0 at x = 0."""
    return jnp.sqrt(jnp.sum(jnp.square(x)))


@safe_norm.defjvp
def _safe_norm_jvp(primals, tangents):
    """`(|x|, <x, t> / |x|)`, the tangent 0 at x = 0.

    Cases: x != 0 -> `sum(x * t) / |x|` [claim:safe-norm-tangent] (any shape of x)
    [claim:safe-norm-any-shape], differentiable again, so
    forward over reverse gives the Hessian (I - x x^T / |x|^2) / |x|
    [claim:safe-norm-hessian]; x = 0 ->
    tangent exactly 0, with no 0/0 anywhere in the program (not even in a branch
    `where` discards: its derivative would still be NaN). [claim:safe-norm-zero-tangent]
    """
    (x,), (t,) = primals, tangents
    # --- exercise stage 2: Tangent <x, t>/|x|, and 0 at x = 0 without ever forming 0/0. ---
    y = safe_norm(x)
    nonzero = y > 0
    denominator = jnp.where(nonzero, y, jnp.ones_like(y))
    return y, jnp.where(nonzero, jnp.sum(x * t) / denominator, jnp.zeros_like(y))
    # --- end exercise ---


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def clip_gradient(x: jax.Array, lo: float, hi: float) -> jax.Array:
    """Identity forward; the cotangent clipped to [lo, hi] on the way back."""
    return x


def _clip_fwd(x, lo, hi):
    del lo, hi
    return x, None


def _clip_bwd(lo, hi, residual, g):
    """The cotangent `g` clipped to [lo, hi], as a 1-tuple. [claim:clip-gradient-cotangent]"""
    del residual
    # --- exercise stage 2: Return the cotangent g clipped to [lo, hi], as a 1-tuple. ---
    return (jnp.clip(g, lo, hi),)
    # --- end exercise ---


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


@jax.custom_vjp
def straight_through_round(x: jax.Array) -> jax.Array:
    """round(x) forward; the cotangent passes through unchanged (straight-through)."""
    return jnp.round(x)


def _ste_fwd(x):
    return jnp.round(x), None


def _ste_bwd(residual, g):
    """The cotangent `g` unchanged, as a 1-tuple: round is the identity backward.
    [claim:straight-through-identity-backward]"""
    del residual
    # --- exercise stage 2: Round backward is the identity: pass g through. ---
    return (g,)
    # --- end exercise ---


straight_through_round.defvjp(_ste_fwd, _ste_bwd)


def _iterate(f, z0, tol: float, max_iterations: int):
    """z <- f(z) until max|f(z) - z| <= tol * max|f(z)| or `max_iterations`;
    returns (z, count). The test is relative: an adjoint's scale is the
    cotangent's, which may be far from 1 (a mean over a batch)."""

    def cond(carry):
        _, delta, count = carry
        return (delta > tol) & (count < max_iterations)

    def body(carry):
        z, _, count = carry
        z_next = f(z)
        scale = jnp.maximum(jnp.max(jnp.abs(z_next)), jnp.finfo(z_next.dtype).tiny)
        return z_next, jnp.max(jnp.abs(z_next - z)) / scale, count + 1

    inf = jnp.asarray(jnp.inf, z0.dtype)
    z, _, count = jax.lax.while_loop(cond, body, (z0, inf, jnp.asarray(0, jnp.int32)))
    return z, count


def solver_tolerance(dtype) -> float:
    """Stop when successive iterates differ by less than 100 eps, relatively."""
    return 100.0 * float(jnp.finfo(dtype).eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def fixed_point_implicit(params: model.Params, x: jax.Array, max_iterations: int) -> jax.Array:
    """z* = tanh(W z* + U x + b) solved to tolerance; `x`: `(..., d_in)`, returns `(..., n)`."""
    if (
        isinstance(max_iterations, bool)
        or not isinstance(max_iterations, numbers.Integral)
        or max_iterations < 1
    ):
        raise ValueError(f"`max_iterations` must be a positive integer, got `{max_iterations!r}`.")
    z0 = jnp.zeros(x.shape[:-1] + params.b.shape, params.b.dtype)
    tol = solver_tolerance(x.dtype)
    z, _ = _iterate(lambda z: model.step(params, z, x), z0, tol, max_iterations)
    return z


def _fixed_point_fwd(params, x, max_iterations):
    z = fixed_point_implicit(params, x, max_iterations)
    return z, (params, x, z)


def _fixed_point_bwd(max_iterations, residual, v):
    """The cotangents `(params_bar, x_bar)` for the output cotangent `v`.

    Solves the adjoint fixed point `a = v + (dg/dz)^T a` at z* with `_iterate`,
    from `a = v`, to `solver_tolerance(v.dtype)` [claim:implicit-adjoint-solve]
    within `max_iterations` [claim:implicit-adjoint-budget]; then
    returns the VJP of one step `g(params, z*, x)` with respect to `(params, x)`,
    applied to `a`. No forward iteration is replayed. [claim:implicit-one-step-pullback]
    """
    params, x, z = residual
    # --- exercise stage 2: Solve a = v + (dg/dz)^T a, then pull a back through one step. ---
    _, pull_z = jax.vjp(lambda zz: model.step(params, zz, x), z)
    a, _ = _iterate(lambda a: v + pull_z(a)[0], v, solver_tolerance(v.dtype), max_iterations)
    _, pull_theta = jax.vjp(lambda p, xx: model.step(p, z, xx), params, x)
    return pull_theta(a)
    # --- end exercise ---


fixed_point_implicit.defvjp(_fixed_point_fwd, _fixed_point_bwd)


def hvp(f, x: jax.Array, v: jax.Array) -> jax.Array:
    """H v for scalar `f` at `x`: the JVP of the gradient (forward over reverse).
    [claim:hvp-forward-over-reverse]"""
    if jnp.shape(v) != jnp.shape(x):
        raise ValueError(
            f"`v` has shape {jnp.shape(v)}, but H v needs the shape of x, {jnp.shape(x)}."
        )
    # --- exercise stage 2: H v is the tangent output of jax.jvp of jax.grad(f). ---
    return jax.jvp(jax.grad(f), (x,), (v,))[1]
    # --- end exercise ---


def hessian_fwd_rev(f, x: jax.Array) -> jax.Array:
    """The full Hessian of scalar `f`, forward over reverse (`jacfwd(grad(f))`)."""
    return jax.jacfwd(jax.grad(f))(x)


def forward_mode_refusal() -> dict:
    """What JAX does with forward mode around a `custom_vjp` function, with the reason.

    A `custom_vjp` supplies only the backward (transposed) linear map. Forward
    mode needs the linear map itself, J t, and JAX cannot recover it from a
    rule it can only call on cotangents, so `jvp`, `jacfwd` and
    reverse-over-forward (`jacrev(jacfwd(f))`) are refused. Forward over
    reverse (`jacfwd(grad(f))`, what `jax.hessian` does) works: `grad` first
    replaces the call by its forward and backward rules, which are plain JAX
    code that forward mode can differentiate. `custom_jvp` is the other way
    round: JAX transposes a linear JVP rule to get reverse mode, so it gives
    both modes.
    """
    x = jnp.linspace(-1.0, 1.0, 3, dtype=jnp.float64)

    def square_sum(y):
        return jnp.sum(straight_through_round(y) ** 2)

    attempts = {
        "jvp": lambda: jax.jvp(lambda y: clip_gradient(y, -1.0, 1.0), (x,), (x,)),
        "jacfwd": lambda: jax.jacfwd(straight_through_round)(x),
        "jacrev(jacfwd)": lambda: jax.jacrev(jax.jacfwd(square_sum))(x),
        "jacfwd(grad)": lambda: jax.jacfwd(jax.grad(square_sum))(x),
        "grad": lambda: jax.grad(lambda y: jnp.sum(clip_gradient(y, -1.0, 1.0)))(x),
    }
    refused: dict[str, str | None] = {}
    for name, attempt in attempts.items():
        try:
            jax.block_until_ready(attempt())
            refused[name] = None
        except TypeError as err:
            refused[name] = str(err).splitlines()[0]
    return {
        "refused": refused,
        "explanation": " ".join(forward_mode_refusal.__doc__.split("\n\n")[1].split()),
    }
