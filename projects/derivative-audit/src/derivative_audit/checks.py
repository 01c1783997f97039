"""Stage 1: JVPs and VJPs checked by independent means.

Every check takes a function `f: (n,) -> (m,)` and a point `x` and returns a
small dict of the figures it compared (relative error and what it was
relative to), so that a test, the report and a person read the same numbers:

- `jvp_linearity`: J(a u + b v) = a J u + b J v, the JVP is linear in the tangent;
- `dot_product_test`: <w, J u> = <J^T w, u>, the VJP is the transpose of the JVP;
- `jacobian_agreement`: `jacfwd` (n JVPs) equals `jacrev` (m VJPs);
- `central_difference` / `fd_check`: (f(x + h u) - f(x - h u)) / 2h against J u,
  at the step `theory_step` chosen from the error model below;
- `fd_sweep` / `analyse_sweep`: the error against the step over many decades.

Error model of the central difference (float precision eps, |f| ~ |f'''| ~ 1):
truncation h^2 |f'''| / 6 plus round-off eps |f| / h. Their sum is smallest at
h* = (3 eps)^(1/3), where the error is about eps^(2/3): 4e-11 in float64,
2e-5 in float32. Left of h* the error grows like 1/h (slope -1 on log-log
axes), right of it like h^2 (slope +2).
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Fn = Callable[[jax.Array], jax.Array]


class DerivativeInputError(TypeError, ValueError):
    """An input a derivative check cannot use; the message says why. A `TypeError`
    (a wrong dtype is one) and a `ValueError`, like every bad input here."""


def require_float(x: jax.Array, what: str = "x") -> None:
    """Derivatives are defined for floating inputs only; anything else is refused."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise DerivativeInputError(
            f"Derivative checks need a floating-point `{what}`, but it has dtype `{dtype}`; "
            f"cast it with `.astype(jnp.float64)` (or float32)."
        )


def _require_finite(a: Any, what: str) -> None:
    if not bool(np.all(np.isfinite(np.asarray(a, np.float64)))):
        raise DerivativeInputError(
            f"`{what}` holds NaN or inf; a derivative check there compares NaN with NaN."
        )


def require_point(x: jax.Array, what: str = "x") -> None:
    """A point to differentiate at: a floating, non-empty array of finite values."""
    require_float(x, what)
    if x.size == 0:
        raise DerivativeInputError(f"`{what}` is empty (shape {tuple(x.shape)}).")
    _require_finite(x, what)


def require_direction(like: Any, u: Any, what: str) -> None:
    """A tangent (or a cotangent): the shape and dtype of `like`, finite values."""
    shape, dtype = getattr(u, "shape", None), getattr(u, "dtype", None)
    if shape is None or tuple(shape) != tuple(like.shape):
        raise DerivativeInputError(
            f"`{what}` has shape {shape if shape is None else tuple(shape)}, but must have "
            f"shape {tuple(like.shape)}."
        )
    if dtype != like.dtype:
        raise DerivativeInputError(f"`{what}` has dtype `{dtype}`, but must have `{like.dtype}`.")
    _require_finite(u, what)


def _require_step(h: float, dtype) -> None:
    """A positive finite step that stays nonzero when rounded to the point's dtype."""
    if not np.isfinite(h) or h <= 0 or float(np.asarray(h, dtype)) == 0.0:
        raise DerivativeInputError(
            f"The finite-difference step `h` must be positive and finite in `{dtype}`, "
            f"but it is `{h}`."
        )


def _norm(a) -> float:
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64).ravel()))


def _rel(diff: float, scale: float) -> float:
    return diff / max(scale, np.finfo(np.float64).tiny)


def jvp_linearity(f: Fn, x: jax.Array, u: jax.Array, v: jax.Array, a: float, b: float) -> dict:
    """Relative error of J(a u + b v) against a J u + b J v. [claim:jvp-linearity-error]

    The region leaves `diff` = |J(a u + b v) - (a J u + b J v)| and `scale` =
    |a| |J u| + |b| |J v| (2-norms, in float64); `rel_error` is their ratio.
    [claim:jvp-linearity-figures] The
    combined tangent `a u + b v` is formed in x's dtype (cast `a`, `b` first:
    strict dtype promotion refuses a float64 scalar array times a float32 one).
    [claim:jvp-linearity-tangent-in-x-dtype]
    """
    require_point(x)
    require_direction(x, u, "u")
    require_direction(x, v, "v")
    _require_finite([a, b], "a, b")
    # --- exercise stage 1: Compare J(a u + b v) with a J u + b J v, using jax.jvp. ---
    a_ = jnp.asarray(a, x.dtype)
    b_ = jnp.asarray(b, x.dtype)
    _, ju = jax.jvp(f, (x,), (u,))
    _, jv = jax.jvp(f, (x,), (v,))
    _, jw = jax.jvp(f, (x,), (a_ * u + b_ * v,))
    ju64, jv64 = np.asarray(ju, np.float64), np.asarray(jv, np.float64)
    diff = _norm(np.asarray(jw, np.float64) - (a * ju64 + b * jv64))
    scale = abs(a) * _norm(ju) + abs(b) * _norm(jv)
    # --- end exercise ---
    return {"rel_error": _rel(diff, scale), "scale": scale}


def dot_product_test(f: Fn, x: jax.Array, u: jax.Array, w: jax.Array) -> dict:
    """Relative mismatch of <w, J u> (forward mode) and <J^T w, u> (reverse mode).
    [claim:dot-product-transpose]

    Returns `forward` = <w, J u> and `reverse` = <J^T w, u> (float64 dot products),
    and `rel_error` = |forward - reverse| / (|w| |J u| + |J^T w| |u|), 2-norms: the
    region leaves `left`, `right` and that `scale`. [claim:dot-product-figures]
    """
    require_point(x)
    require_direction(x, u, "u")
    require_direction(jax.eval_shape(f, x), w, "w")
    # --- exercise stage 1: Compare <w, J u> (jax.jvp) with <J^T w, u> (jax.vjp). ---
    _, ju = jax.jvp(f, (x,), (u,))
    _, pullback = jax.vjp(f, x)
    (jtw,) = pullback(w)
    left = float(np.vdot(np.asarray(w, np.float64), np.asarray(ju, np.float64)))
    right = float(np.vdot(np.asarray(jtw, np.float64), np.asarray(u, np.float64)))
    scale = _norm(w) * _norm(ju) + _norm(jtw) * _norm(u)
    # --- end exercise ---
    return {"forward": left, "reverse": right, "rel_error": _rel(abs(left - right), scale)}


def jacobian_agreement(f: Fn, x: jax.Array) -> dict:
    """Largest difference of the forward- and reverse-mode Jacobians, relative
    to the largest Jacobian entry. [claim:jacfwd-equals-jacrev]"""
    require_point(x)
    # --- exercise stage 1: Build the Jacobian with jax.jacfwd and with jax.jacrev. ---
    fwd = np.asarray(jax.jacfwd(f)(x), np.float64)
    rev = np.asarray(jax.jacrev(f)(x), np.float64)
    # --- end exercise ---
    scale = float(np.max(np.abs(rev)))
    return {"rel_error": _rel(float(np.max(np.abs(fwd - rev))), scale), "shape": list(fwd.shape)}


def theory_step(dtype, x: jax.Array) -> float:
    """The central-difference step that balances truncation and round-off:
    (3 eps)^(1/3) times the scale of x (at least 1). [claim:theory-step]"""
    require_point(jnp.asarray(x))
    # --- exercise stage 1: Balance h^2/6 against eps/h: h* = (3 eps)^(1/3) * max(1, |x|). ---
    eps = float(jnp.finfo(dtype).eps)
    scale = max(1.0, float(np.max(np.abs(np.asarray(x, np.float64)))))
    return (3.0 * eps) ** (1.0 / 3.0) * scale
    # --- end exercise ---


def central_difference(f: Fn, x: jax.Array, u: jax.Array, h: float) -> np.ndarray:
    """(f(x + h u) - f(x - h u)) / (2 h), evaluated in x's dtype.
    [claim:central-difference-in-x-dtype]

    `h` is first rounded to x's dtype; the two evaluations run in x's dtype; their
    difference is divided by 2 times that ROUNDED step, in float64 (the step that
    was taken, not the one asked for). Returns a float64 array.
    [claim:central-difference-rounded-step]
    """
    require_point(x)
    require_direction(x, u, "u")
    _require_step(h, x.dtype)
    # --- exercise stage 1: Step h along u both ways in x's dtype; divide by 2h. ---
    h_ = jnp.asarray(h, x.dtype)
    forward = np.asarray(f(x + h_ * u), np.float64)
    backward = np.asarray(f(x - h_ * u), np.float64)
    # Divide by h as rounded to x's dtype: that is the step that was taken.
    return (forward - backward) / (2.0 * float(np.asarray(h_, np.float64)))
    # --- end exercise ---


def fd_check(f: Fn, x: jax.Array, u: jax.Array, reference: np.ndarray | None = None) -> dict:
    """Central difference at `theory_step` against J u (the JVP in x's dtype, or
    `reference` when given, e.g. a float64 JVP for a float32 function)."""
    require_point(x)
    require_direction(x, u, "u")
    if reference is not None:
        _require_finite(reference, "reference")
    h = theory_step(x.dtype, x)
    if reference is None:
        reference = np.asarray(jax.jvp(f, (x,), (u,))[1], np.float64)
    fd = central_difference(f, x, u, h)
    return {"step": h, "rel_error": _rel(_norm(fd - reference), _norm(reference))}


def sweep_steps(min_exponent: int, max_exponent: int, per_decade: int) -> np.ndarray:
    """Logarithmically spaced steps 10**min_exponent .. 10**max_exponent."""
    count = (max_exponent - min_exponent) * per_decade + 1
    return np.logspace(min_exponent, max_exponent, count)


def fd_sweep(
    f: Fn, x: jax.Array, u: jax.Array, steps: np.ndarray, reference: np.ndarray
) -> np.ndarray:
    """Relative error of the central difference at every step against `reference`."""
    require_point(x)
    _require_finite(reference, "reference")
    if np.ndim(steps) != 1 or np.size(steps) == 0:
        raise DerivativeInputError(
            f"`steps` must be a non-empty vector, got shape {np.shape(steps)}."
        )
    scale = _norm(reference)
    return np.array([_rel(_norm(central_difference(f, x, u, h) - reference), scale) for h in steps])


def analyse_sweep(steps: np.ndarray, errors: np.ndarray, dtype, x: jax.Array) -> dict:
    """Where the minimum lies and the log-log slopes on either side of it.

    Truncation slope: fitted over steps >= 3 h* with error below 1e-2 (beyond
    that the Taylor model stops holding). Round-off slope: over steps <= h*/3
    with error below 0.1 (at the smallest steps the difference can be zero).
    [claim:sweep-fit-windows]
    Steps whose error is exactly 0 are left out of the minimum and both fits.
    [claim:sweep-zero-errors-left-out]

    Cases: a step of exactly 3 h* or h*/3 is in its fit; an error of exactly 1e-2
    (right) or 0.1 (left) is not [claim:sweep-window-edges]; among equal least errors
    the first step wins [claim:sweep-first-least-error-wins];
    a side with fewer than 2 steps has slope `None`. [claim:sweep-short-side-no-slope]
    """
    if np.ndim(steps) != 1 or np.shape(steps) != np.shape(errors) or np.size(steps) == 0:
        raise DerivativeInputError(
            f"`steps` and `errors` must be non-empty vectors of one length, got shapes "
            f"{np.shape(steps)} and {np.shape(errors)}."
        )
    _require_finite(steps, "steps")
    _require_finite(errors, "errors")
    h_star = theory_step(dtype, x)
    eps = float(jnp.finfo(dtype).eps)
    # --- exercise stage 1: Find the least error; pick steps >= 3h* and <= h*/3 to fit slopes. ---
    positive = errors > 0
    best = int(np.argmin(np.where(positive, errors, np.inf)))
    right = (steps >= 3 * h_star) & (errors < 1e-2) & positive
    left = (steps <= h_star / 3) & (errors < 0.1) & positive
    # --- end exercise ---
    return {
        "theory_step": h_star,
        "best_step": float(steps[best]),
        "best_rel_error": float(errors[best]),
        "expected_best_rel_error": eps ** (2.0 / 3.0),
        "truncation_slope": _slope(steps[right], errors[right]),
        "roundoff_slope": _slope(steps[left], errors[left]),
        "trusted_digits": float(-np.log10(errors[best])) if errors[best] > 0 else float("inf"),
    }


def _slope(steps: np.ndarray, errors: np.ndarray) -> float | None:
    if steps.size < 2:
        return None
    return float(np.polyfit(np.log10(steps), np.log10(errors), 1)[0])


def second_opinion(f: Fn, x: jax.Array, order: int = 2) -> dict:
    """`jax.test_util.check_grads` in both modes to `order`; it raises on a mismatch,
    recorded here as `passed: False` with its message."""
    require_point(x)
    from jax.test_util import check_grads

    eps = float(jnp.finfo(x.dtype).eps)
    # check_grads uses its own step (1e-4 in float64); tolerances as its docs suggest.
    tol = 1e-5 if x.dtype == jnp.float64 else 5e-2
    try:
        check_grads(f, (x,), order=order, modes=("fwd", "rev"), atol=tol, rtol=tol)
    except AssertionError as err:
        return {"passed": False, "order": order, "message": str(err)[:500], "eps": eps}
    return {"passed": True, "order": order, "tolerance": tol, "eps": eps}
