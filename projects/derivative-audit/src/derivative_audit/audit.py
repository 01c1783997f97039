"""The stage-1 audit of one problem: every check of `checks.py`, at several
random directions, in the problem's dtype, with a verdict per check computed
from its figure and a tolerance derived from the dtype's eps.

Tolerances: the JVP/VJP identities hold to rounding, 50 eps; the central
difference at the theory step to 100 eps^(2/3) (the error model's minimum,
with room for |f|/|f'''| != 1), times |f| / |J u| where the JVP is
smaller than f (round-off scales with |f|); a bound past 0.1 makes the check
inconclusive, reported as such, not passed on figures it cannot resolve.
Finite differences are always judged against a float64 JVP of the same
function (`reference`), so in float32 they measure how far float32 finite
differences can be trusted. That JVP runs on JAX's CPU device whatever the
default backend (`ieee_float64_device`): a TPU emulates float64 in software, and
a float64 reference computed there was off by about 4e-4 relative on a TPU v5e,
flattening the float32 error-vs-step sweep at that floor.

Run: `derivative-audit audit FUNCTION [--dtype float32]`.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from derivative_audit import checks, data
from derivative_audit.config import Config


def ieee_float64_device() -> jax.Device | None:
    """The device whose float64 is IEEE arithmetic: JAX's CPU, where this process has
    one (it does unless `JAX_PLATFORMS` names another backend alone)."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return None


def float64_jvp(fn: Callable, x: jax.Array, u: jax.Array) -> np.ndarray:
    """`jax.jvp(fn, (x,), (u,))[1]` with `x` and `u` in float64, on
    `ieee_float64_device()` where there is one, as a float64 NumPy vector."""
    x64, u64 = x.astype(jnp.float64), u.astype(jnp.float64)
    device = ieee_float64_device()
    if device is not None:
        x64, u64 = jax.device_put(x64, device), jax.device_put(u64, device)
    return np.asarray(jax.jvp(fn, (x64,), (u64,))[1], np.float64)


def tolerances(dtype) -> dict[str, float]:
    eps = float(jnp.finfo(dtype).eps)
    return {"identity": 50 * eps, "finite_difference": 100 * eps ** (2 / 3)}


def audit_problem(
    problem: data.Problem,
    config: Config,
    reference_fn: Callable[[jax.Array], jax.Array] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """All stage-1 checks on `problem`; `reference_fn` is the float64 version of
    `problem.fn` (default: `problem.fn` itself on a float64 copy of x)."""
    say = progress or (lambda _: None)
    fn, x = problem.fn, problem.x
    checks.require_point(x, f"{problem.name}: x")
    if x.ndim != 1:
        raise checks.DerivativeInputError(
            f"`{problem.name}`: x must be a vector, but has shape {tuple(x.shape)}."
        )
    try:
        out = jax.eval_shape(fn, x)
    except (TypeError, ValueError, IndexError) as err:
        first = (str(err).strip() or type(err).__name__).splitlines()[0]
        raise checks.DerivativeInputError(
            f"`{problem.name}` cannot be called on x of shape {tuple(x.shape)}: {first}"
        ) from None
    checks.require_float(out, f"{problem.name}(x)")
    if len(out.shape) != 1:
        raise checks.DerivativeInputError(
            f"`{problem.name}` must return a vector, but returns shape {tuple(out.shape)}."
        )
    f_x = np.asarray(fn(x), np.float64)
    if not np.all(np.isfinite(f_x)):
        raise checks.DerivativeInputError(
            f"`{problem.name}(x)` holds NaN or inf at the audit point, so no derivative "
            f"there can be checked; pick a function finite at a standard-normal point."
        )
    tol = tolerances(x.dtype)
    ref_fn = reference_fn or fn
    m = int(out.shape[0])
    key = jax.random.fold_in(jax.random.key(config.seed), 1_000_003)
    ku, kv, kw = jax.random.split(key, 3)
    us = data.unit_directions(ku, config.directions, x.shape[0], x.dtype)
    vs = data.unit_directions(kv, config.directions, x.shape[0], x.dtype)
    ws = data.unit_directions(kw, config.directions, m, x.dtype)
    results: list[dict[str, Any]] = []

    def add(name: str, figures: dict, bound: float) -> None:
        results.append(
            {
                "check": name,
                "rel_error": figures["rel_error"],
                "tolerance": bound,
                "passed": bool(figures["rel_error"] <= bound),
                "figures": figures,
            }
        )

    say(f"{problem.name} {problem.dtype}: linearity, transpose, Jacobians")
    for i in range(config.directions):
        add(
            f"linearity[{i}]", checks.jvp_linearity(fn, x, us[i], vs[i], 0.7, -1.3), tol["identity"]
        )
        add(f"dot_product[{i}]", checks.dot_product_test(fn, x, us[i], ws[i]), tol["identity"])
    add("jacfwd_vs_jacrev", checks.jacobian_agreement(fn, x), tol["identity"])
    say(f"{problem.name} {problem.dtype}: finite differences")
    references = [float64_jvp(ref_fn, x, u) for u in us]
    f_norm = float(np.linalg.norm(f_x))
    for i in range(config.directions):
        figures = checks.fd_check(fn, x, us[i], references[i])
        # Round-off is eps |f| / h, so relative to |J u| it is amplified by |f| / |J u|
        # (a vanishing JVP, e.g. through a long contracting recurrence). The bound
        # grows with it; past 0.1 the check cannot resolve the JVP and says so.
        amplification = max(1.0, f_norm / max(float(np.linalg.norm(references[i])), 1e-300))
        figures["amplification"] = amplification
        bound = tol["finite_difference"] * amplification
        figures["conclusive"] = bound < 0.1
        add(f"central_difference[{i}]", figures, bound if bound < 0.1 else float("inf"))
    steps = checks.sweep_steps(
        config.sweep_min_exponent, config.sweep_max_exponent, config.sweep_points_per_decade
    )
    errors = checks.fd_sweep(fn, x, us[0], steps, references[0])
    sweep = checks.analyse_sweep(steps, errors, x.dtype, x)
    say(f"{problem.name} {problem.dtype}: check_grads")
    opinion = checks.second_opinion(fn, x)
    return {
        "function": problem.name,
        "dtype": problem.dtype,
        "n": int(x.shape[0]),
        "outputs": m,
        "checks": results,
        "sweep": {"steps": steps.tolist(), "rel_errors": errors.tolist(), **sweep},
        "check_grads": opinion,
        "verdict": verdict(results, opinion, sweep, problem.dtype),
    }


def verdict(results: list[dict], opinion: dict, sweep: dict, dtype: str) -> str:
    """One sentence computed from the figures."""
    failed = [r["check"] for r in results if not r["passed"]]
    worst_fd = max(
        (r["rel_error"] for r in results if r["check"].startswith("central")), default=float("nan")
    )
    head = (
        f"all {len(results)} checks passed"
        if not failed
        else f"{len(failed)} of {len(results)} checks FAILED ({', '.join(failed[:4])})"
    )
    blind = [r for r in results if r["figures"].get("conclusive") is False]
    if blind:
        amp = min(r["figures"]["amplification"] for r in blind)
        head += (
            f"; {len(blind)} finite-difference checks inconclusive (|f| / |J u| >= {amp:.0e}: "
            f"{dtype} differences cannot resolve a JVP this small)"
        )
    return (
        f"{head}; check_grads {'agrees' if opinion['passed'] else 'DISAGREES'}; "
        f"{dtype} finite differences agree with the exact JVP to {worst_fd:.1e} at the "
        f"theory step, best {sweep['best_rel_error']:.1e} at h = {sweep['best_step']:.1e} "
        f"(about {sweep['trusted_digits']:.1f} digits can be trusted)."
    )


def passed(report: dict) -> bool:
    return all(r["passed"] for r in report["checks"]) and report["check_grads"]["passed"]
