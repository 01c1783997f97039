"""`derivative-audit bench`: two derivative strategies against their naive forms.

- `implicit_vs_unrolled`: the gradient of a loss through the implicit layer's
  fixed point (batch of inputs), by implicit differentiation (solve forward to
  tolerance, then one adjoint solve; nothing stored) against reverse mode
  through K unrolled iterations, K the fewest whose float32 gradient is as
  close to the exact one (float64 implicit gradient of the same float32
  inputs) as the implicit float32 gradient is: both sides stop at the same
  accuracy. K is found by bisection (`unrolled_search` in the report).
- `implicit_vs_unrolled_200`: the same against 200 unrolled iterations, far
  past convergence: what an unrolled solver with a fixed, safe count costs.
- `hvp_vs_full_hessian`: H v of a GLM loss at n = 1000 by forward-over-reverse
  against materializing H (n forward passes over the gradient) and then H @ v.
- `hvp_vs_hvp_aa`, `implicit_vs_implicit_aa`: A/A controls, two separately
  compiled copies of the same program timed in the same rounds; their
  distance from 1 is the noise of this machine.

Every path is compiled apart (`lower` + `compile`, timed), called once, then
timed warm with `block_until_ready`, the paths interleaved for `rounds`
rounds (in a fresh seeded random order every round). Both sides of every
ratio run on the same single CPU device with XLA's default CPU thread pool.
A ratio is the median of its per-round ratios (round r's baseline time over
round r's time of the measured path), above 1 when the first path is faster;
`ratio_details` records per ratio its baseline, the per-round ratios with
min, median and max, and the A/A control of the measured side.
"""

import hashlib
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from derivative_audit import checkpoint, model, plots, rules
from derivative_audit.bench_stats import per_round, ratio_detail

SIZES = {
    # batch x width of the implicit layer; n of the Hessian problem and its rows m.
    "default": {
        "batch": 256,
        "width": 64,
        "unrolled": 200,
        "hessian_n": 1000,
        "rows": 500,
        "rounds": 20,
    },
    "tiny": {"batch": 8, "width": 8, "unrolled": 200, "hessian_n": 50, "rows": 20, "rounds": 3},
}
DTYPE = jnp.float32


def _implicit_problem(size: dict, key: jax.Array):
    """Float32 weights and inputs of the implicit layer, the implicit gradient
    of the loss (any dtype: the solver's tolerance follows it) and
    `unrolled(iterations)`, the gradient through that many unrolled steps."""
    kp, kx = jax.random.split(key)
    params = model.init(kp, size["width"], size["width"], contraction=0.6, dtype=DTYPE)
    x = jax.random.normal(kx, (size["batch"], size["width"]), jnp.float64).astype(DTYPE)

    def loss_implicit(p, xs):
        return jnp.mean(jnp.square(rules.fixed_point_implicit(p, xs, 1000)))

    def unrolled(iterations: int):
        def loss_unrolled(p, xs):
            return jnp.mean(jnp.square(model.solve_unrolled(p, xs, iterations)))

        return jax.grad(loss_unrolled)

    return params, x, jax.grad(loss_implicit), unrolled


def _relative_error(grad, reference) -> float:
    """max over the gradient's leaves of max|g - ref| / max|ref|, in float64."""
    return max(
        float(
            np.max(np.abs(np.asarray(g, np.float64) - np.asarray(r, np.float64)))
            / np.max(np.abs(np.asarray(r, np.float64)))
        )
        for g, r in zip(grad, reference, strict=True)
    )


def _matched_unroll(params, x, reference, target: float, most: int) -> tuple[int, dict[int, float]]:
    """The fewest unrolled iterations (1..`most`) whose gradient error against
    `reference` is at most `target`, by bisection over one compiled program
    (a `most`-step scan whose steps from K on leave the state unchanged, so its
    gradient is the K-step one); returns (K, {K tried: its error}). The error
    falls geometrically with K until float32 round-off, so bisection applies;
    if `most` steps do not reach `target`, K = `most`."""

    def loss_masked(p, xs, k):
        def body(z, t):
            return jnp.where(t < k, model.step(p, z, xs), z), None

        z0 = jnp.zeros(xs.shape[:-1] + p.b.shape, p.b.dtype)
        z, _ = jax.lax.scan(body, z0, jnp.arange(most, dtype=jnp.int32))
        return jnp.mean(jnp.square(z))

    masked = jax.jit(jax.grad(loss_masked))
    errors: dict[int, float] = {}

    def error(k: int) -> float:
        if k not in errors:
            errors[k] = _relative_error(masked(params, x, jnp.int32(k)), reference)
        return errors[k]

    lo, hi = 1, most
    if error(hi) > target:
        return most, errors
    while lo < hi:
        mid = (lo + hi) // 2
        if error(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return lo, errors


def _hessian_problem(size: dict, key: jax.Array):
    ka, kx, kv = jax.random.split(key, 3)
    n, m = size["hessian_n"], size["rows"]
    a = (jax.random.normal(ka, (m, n), jnp.float64) / np.sqrt(n)).astype(DTYPE)
    x = jax.random.normal(kx, (n,), jnp.float64).astype(DTYPE)
    v = jax.random.normal(kv, (n,), jnp.float64).astype(DTYPE)

    def loss(y):
        return jnp.mean(rules.softplus(a @ y)) + 0.05 * jnp.sum(jnp.square(y))

    def hvp(y, t):
        return rules.hvp(loss, y, t)

    def full(y, t):
        return rules.hessian_fwd_rev(loss, y) @ t

    return x, v, hvp, full


def _compile(fn: Callable, args: tuple) -> tuple[Any, dict[str, float]]:
    start = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    first_s = time.perf_counter() - start
    return (compiled, out), {"compile_s": compile_s, "first_call_s": first_s}


def run(
    size_name: str = "default",
    rounds: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measures every path; returns the report (identity, measurements, ratios)."""
    say = progress or (lambda _: None)
    if size_name not in SIZES:
        raise ValueError(f"Unknown bench size `{size_name}`; choose one of {sorted(SIZES)}.")
    if rounds is not None and (
        isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1
    ):
        raise ValueError(f"`rounds` must be a positive integer, but got `{rounds!r}`.")
    size = SIZES[size_name]
    rounds = rounds or size["rounds"]
    key_impl, key_hess = jax.random.split(jax.random.key(0))
    params, x, grad_implicit, unrolled = _implicit_problem(size, key_impl)
    hx, hv, hvp, full = _hessian_problem(size, key_hess)

    # The accuracy both gradient paths must reach: the float64 implicit gradient
    # of the same (float32-representable) weights and inputs is the exact one.
    say("float64 reference gradient and the matched unroll count")
    # Own jitted copies here: the timed `implicit` path compiles afresh below.
    reference = jax.jit(lambda p, xs: grad_implicit(p, xs))(
        model.cast(params, jnp.float64), x.astype(jnp.float64)
    )
    implicit_error = _relative_error(
        jax.jit(lambda p, xs: grad_implicit(p, xs))(params, x), reference
    )
    matched, search = _matched_unroll(params, x, reference, implicit_error, size["unrolled"])

    paths = {
        "implicit": (grad_implicit, (params, x)),
        "implicit_aa": (lambda p, xs: grad_implicit(p, xs), (params, x)),
        "unrolled": (unrolled(matched), (params, x)),
        "unrolled_200": (unrolled(size["unrolled"]), (params, x)),
        "hvp": (hvp, (hx, hv)),
        "hvp_aa": (lambda y, t: hvp(y, t), (hx, hv)),
        "full_hessian": (full, (hx, hv)),
    }
    compiled: dict[str, Any] = {}
    measurements: dict[str, dict[str, Any]] = {}
    for name, (fn, args) in paths.items():
        say(f"compiling {name}")
        (exe, out), figures = _compile(fn, args)
        compiled[name] = (exe, args, out)
        measurements[name] = figures
    # Agreement first: a fast wrong answer is not a speed-up.
    gi, gu = compiled["implicit"][2], compiled["unrolled"][2]
    agreement = {
        "implicit_vs_unrolled_max_rel": _relative_error(gi, gu),
        "implicit_vs_unrolled_200_max_rel": _relative_error(gi, compiled["unrolled_200"][2]),
        "hvp_vs_full_max_rel": float(
            jnp.max(jnp.abs(compiled["hvp"][2] - compiled["full_hessian"][2]))
            / jnp.max(jnp.abs(compiled["full_hessian"][2]))
        ),
    }
    gradient_error = {
        "implicit": _relative_error(gi, reference),
        "unrolled": _relative_error(gu, reference),
        "unrolled_200": _relative_error(compiled["unrolled_200"][2], reference),
    }
    z0 = jnp.zeros((size["batch"], size["width"]), DTYPE)
    _, iterations = rules._iterate(
        lambda z: model.step(params, z, x), z0, rules.solver_tolerance(DTYPE), 1000
    )
    times: dict[str, list[float]] = {name: [] for name in paths}
    say(f"timing {len(paths)} paths, {rounds} interleaved rounds")
    names = list(compiled)
    order_rng = np.random.default_rng(0)
    for _ in range(rounds):
        # A fresh order every round: a call right after a heavy one (the unrolled
        # gradient, the full Hessian) pays for it, and no path may always be that one.
        for name in order_rng.permutation(names):
            exe, args, _ = compiled[name]
            start = time.perf_counter()
            jax.block_until_ready(exe(*args))
            times[name].append(time.perf_counter() - start)
    for name, samples in times.items():
        measurements[name].update(
            {
                "median_s": statistics.median(samples),
                "p90_s": float(np.percentile(samples, 90)),
                "min_s": min(samples),
                "n": len(samples),
            }
        )
    best = {name: m["min_s"] for name, m in measurements.items()}
    aa_implicit = per_round(times["implicit_aa"], times["implicit"])
    aa_hvp = per_round(times["hvp_aa"], times["hvp"])
    details = {
        "implicit_vs_unrolled": ratio_detail(
            f"reverse mode through {matched} unrolled iterations (`lax.scan`), the fewest "
            f"whose float32 gradient is as close to the float64 implicit gradient as the "
            f"implicit float32 one ({gradient_error['unrolled']:.2g} against "
            f"{gradient_error['implicit']:.2g}); same device, same batch",
            per_round(times["unrolled"], times["implicit"]),
            aa_implicit,
            "implicit",
            unrolled_iterations=matched,
        ),
        "implicit_vs_unrolled_200": ratio_detail(
            f"reverse mode through {size['unrolled']} unrolled iterations, a fixed count "
            f"far past convergence (gradient error {gradient_error['unrolled_200']:.2g})",
            per_round(times["unrolled_200"], times["implicit"]),
            aa_implicit,
            "implicit",
            unrolled_iterations=size["unrolled"],
        ),
        "hvp_vs_full_hessian": ratio_detail(
            "the full Hessian materialized by `jacfwd(grad)` (one forward pass over the "
            "gradient per column), then H @ v",
            per_round(times["full_hessian"], times["hvp"]),
            aa_hvp,
            "hvp",
        ),
    }
    ratios = {name: d["median"] for name, d in details.items()}
    ratios["hvp_vs_hvp_aa"] = statistics.median(aa_hvp)
    ratios["implicit_vs_implicit_aa"] = statistics.median(aa_implicit)
    # The same ratios from the fastest call of each path: on a shared machine the
    # median of a sub-millisecond call measures the other jobs as much as the call.
    ratios_of_minimums = {
        "implicit_vs_unrolled": best["unrolled"] / best["implicit"],
        "implicit_vs_unrolled_200": best["unrolled_200"] / best["implicit"],
        "hvp_vs_full_hessian": best["full_hessian"] / best["hvp"],
        "hvp_vs_hvp_aa": best["hvp_aa"] / best["hvp"],
        "implicit_vs_implicit_aa": best["implicit_aa"] / best["implicit"],
    }
    return {
        "identity": _identity(size_name, size),
        "size": size_name,
        "settings": {
            **size,
            "rounds": rounds,
            "dtype": "float32",
            "implicit_forward_iterations": int(iterations),
            "unrolled_matched_iterations": matched,
            "unrolled_search": {str(k): v for k, v in sorted(search.items())},
            "threads": "every path: one CPU device, XLA's default CPU thread pool",
        },
        "agreement": agreement,
        "gradient_error_vs_float64": gradient_error,
        "measurements": measurements,
        "ratios": ratios,
        "ratio_details": details,
        "ratios_of_minimums": ratios_of_minimums,
        "targets": {"implicit_vs_unrolled": 5.0, "hvp_vs_full_hessian": 10.0},
        "verdicts": _verdicts(ratios, details, size_name),
    }


def _verdicts(ratios: dict[str, float], details: dict[str, Any], size_name: str) -> list[str]:
    if size_name != "default":
        return [f"size `{size_name}`: a smoke run; no speed claim is made at this size."]
    lines = []
    for name, target in (("implicit_vs_unrolled", 5.0), ("hvp_vs_full_hessian", 10.0)):
        d = details[name]
        met = "meets" if ratios[name] >= target else "MISSES"
        lines.append(
            f"{name} = {ratios[name]:.1f} (rounds {d['min']:.1f} to {d['max']:.1f}, "
            f"A/A {d['aa']:.2f}) {met} the target >= {target:g}."
        )
    for name in ("hvp_vs_hvp_aa", "implicit_vs_implicit_aa"):
        noise = max(ratios[name], 1 / ratios[name])
        lines.append(
            f"A/A control {name} = {ratios[name]:.2f}: ratios within {noise:.2f}x of 1 are noise."
        )
    return lines


def _identity(size_name: str, size: dict) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    import jaxlib

    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": commit,
        "config_sha256": hashlib.sha256(
            json.dumps({"size": size_name, **size}, sort_keys=True).encode()
        ).hexdigest(),
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"{'path':<14}{'compile s':>11}{'first s':>10}{'median s':>11}{'p90 s':>10}"]
    for name, m in result["measurements"].items():
        lines.append(
            f"{name:<14}{m['compile_s']:>11.3f}{m['first_call_s']:>10.4f}"
            f"{m['median_s']:>11.5f}{m['p90_s']:>10.5f}"
        )
    for name, d in result["ratio_details"].items():
        lines.append(
            f"{name}: {d['median']:.2f} (rounds {d['min']:.2f} to {d['max']:.2f}; "
            f"A/A {d['aa']:.2f}); baseline: {d['baseline']}"
        )
    lines += [
        f"agreement: {json.dumps(result['agreement'])}",
        f"gradient error vs float64: {json.dumps(result['gradient_error_vs_float64'])}",
        f"ratios of minimums: {json.dumps(result['ratios_of_minimums'])}",
    ]
    lines += result["verdicts"]
    return "\n".join(lines)


def write(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    checkpoint.save_record(path, result)
    plots.bars_plot(
        {k: v["median_s"] for k, v in result["measurements"].items()},
        path.with_suffix(".png"),
        f"derivative-audit bench ({result['size']}): median warm call, "
        + ", ".join(f"{k} {v:.1f}" for k, v in result["ratios"].items()),
        "seconds (log)",
    )
    return path
