"""`derivative-audit report`: all three stages over the suite, in one record.

`build(config, out)` writes under `out/`: `report.json` (every figure, with a
sha256 sidecar), `report.md` (the same, for a person, with the verdicts),
`sweep_float64.png` and `sweep_float32.png` (the error-vs-step sweeps) and
`training.png` (the implicit-layer loss curves, both gradient modes).
Each verdict is computed from the figures beside it.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from derivative_audit import (
    audit,
    checkpoint,
    data,
    functions,
    jaxpr_audit,
    model,
    plots,
    rules,
    train,
)
from derivative_audit.config import Config


def stage_1(config: Config, say: Callable[[str], None]) -> list[dict[str, Any]]:
    reports = []
    for name in functions.SUITE:
        reference = data.make_problem(name, config, "float64")
        for dtype in ("float64", "float32"):
            problem = reference if dtype == "float64" else data.make_problem(name, config, dtype)
            reports.append(audit.audit_problem(problem, config, reference.fn, progress=say))
    return reports


def stage_2(say: Callable[[str], None]) -> dict[str, Any]:
    say("stage 2: custom rules, implicit differentiation, Hessians")
    x = jnp.asarray([-1000.0, 0.0, 1000.0], jnp.float64)
    grads = {
        name: np.asarray(jax.jit(jax.vmap(jax.grad(fn)))(x)).tolist()
        for name, fn in (
            ("naive", rules.softplus_naive),
            ("where", rules.softplus_where),
            ("custom_jvp", rules.softplus),
        )
    }
    zero = jnp.zeros(3, jnp.float64)
    norm = {
        "naive": np.asarray(jax.grad(rules.norm_naive)(zero)).tolist(),
        "custom_jvp": np.asarray(jax.grad(rules.safe_norm)(zero)).tolist(),
    }
    kp, kx = jax.random.split(jax.random.key(0))
    params = model.init(kp, 6, 4, contraction=0.6)
    xs = jax.random.normal(kx, (4,), jnp.float64)
    z = rules.fixed_point_implicit(params, xs, 1000)
    implicit = np.asarray(jax.jacrev(rules.fixed_point_implicit, argnums=1)(params, xs, 1000))
    unrolled = np.asarray(jax.jacrev(model.solve_unrolled, argnums=1)(params, xs, 200))
    d = np.diag(1 - np.asarray(z) ** 2)
    analytic = np.linalg.solve(np.eye(6) - d @ np.asarray(params.w), d @ np.asarray(params.u))
    a = jax.random.normal(kx, (8, 6), jnp.float64)
    y = jax.random.normal(kp, (6,), jnp.float64)
    logits = np.asarray(a) @ np.asarray(y)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    h_true = np.asarray(a).T @ (np.diag(p) - np.outer(p, p)) @ np.asarray(a)

    def lse(w):
        return jax.nn.logsumexp(a @ w)

    h = np.asarray(jax.jit(lambda v: rules.hessian_fwd_rev(lse, v))(y))
    scale = np.abs(analytic).max()
    figures = {
        "softplus_grad_at_-1000_0_1000": grads,
        "norm_grad_at_0": norm,
        "implicit_vs_ift_max_rel": float(np.abs(implicit - analytic).max() / scale),
        "unrolled_vs_ift_max_rel": float(np.abs(unrolled - analytic).max() / scale),
        "hessian_logsumexp_vs_analytic_max_rel": float(
            np.abs(h - h_true).max() / np.abs(h_true).max()
        ),
        "forward_mode_on_custom_vjp": rules.forward_mode_refusal(),
    }
    figures["passed"] = bool(
        np.all(np.isfinite(grads["custom_jvp"]))
        and np.isnan(grads["naive"][-1])
        and norm["custom_jvp"] == [0.0, 0.0, 0.0]
        and figures["implicit_vs_ift_max_rel"] < 1e-10
        and figures["hessian_logsumexp_vs_analytic_max_rel"] < 1e-12
        and figures["forward_mode_on_custom_vjp"]["refused"]["jvp"] is not None
    )
    return figures


def _callback(x):
    return jax.pure_callback(lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _unbounded_while(x):
    return jax.lax.while_loop(lambda c: c[0] < 10.0, lambda c: c * 1.5 + 1.0, x)


def _float64_inside(x):
    return (x.astype(jnp.float64) * 2).astype(jnp.float32)


def _random_inside(x):
    return x + jax.random.normal(jax.random.key(0), x.shape, x.dtype)


REJECTED_EXAMPLES = {
    "host callback": _callback,
    "unbounded while (reverse mode)": _unbounded_while,
    "float64 under a float32 policy": _float64_inside,
    "random bits, declared deterministic": _random_inside,
}


def stage_3(config: Config, say: Callable[[str], None]) -> dict[str, Any]:
    say("stage 3: jaxpr audits")
    policy = jaxpr_audit.Policy(float_dtype="float32")
    suite = {}
    for name in functions.SUITE:
        p = data.make_problem(name, config, "float32")
        result = jaxpr_audit.audit(p.fn, (p.x,), policy).to_json()
        result.pop("equations")
        result["consistency"] = jaxpr_audit.consistency(p.fn, p.x, policy)
        suite[name] = result
    x = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
    rejected = {}
    for label, fn in REJECTED_EXAMPLES.items():
        result = jaxpr_audit.audit(fn, (x,), policy).to_json()
        rejected[label] = {
            "verdict": result["verdict"],
            "findings": result["findings"],
            "consistency": jaxpr_audit.consistency(fn, x, policy),
        }
    passed = all(
        s["verdict"] == "accepted" and s["consistency"]["consistent"] for s in suite.values()
    ) and all(
        r["verdict"] == "rejected" and r["consistency"]["consistent"] for r in rejected.values()
    )
    return {"suite": suite, "rejected": rejected, "passed": passed}


def build(config: Config, out: str | Path, progress: Callable[[str], None] | None = None) -> dict:
    say = progress or (lambda _: None)
    out = checkpoint.check_output_path(out, is_dir=True)  # before any work, not after it
    s1 = stage_1(config, say)
    s2 = stage_2(say)
    s3 = stage_3(config, say)
    say(f"training the implicit layer two ways ({config.train_steps} steps each)")
    demo = train.train_and_evaluate(config)
    for dtype in ("float64", "float32"):
        plots.sweep_plot(
            [r for r in s1 if r["dtype"] == dtype],
            out / f"sweep_{dtype}.png",
            f"central differences vs the exact JVP, {dtype}",
        )
    plots.curves_plot(
        demo["curves"],
        out / "training.png",
        f"implicit layer: implicit vs unrolled gradients "
        f"(max relative gap {demo['max_rel_gap']:.1e})",
        "mean squared error",
    )
    verdicts = _verdicts(s1, s2, s3, demo)
    payload = {
        "config": config.model_dump(),
        "stage_1": s1,
        "stage_2": s2,
        "stage_3": s3,
        "training": demo,
        "verdicts": verdicts["lines"],
        "passed": verdicts["passed"],
    }
    checkpoint.save_record(out / "report.json", payload)
    (out / "report.md").write_text(_markdown(payload), encoding="utf-8")
    return {"verdicts": verdicts["lines"], "passed": verdicts["passed"]}


def _verdicts(s1, s2, s3, demo) -> dict[str, Any]:
    lines = []
    ok1 = all(audit.passed(r) for r in s1)
    for dtype in ("float64", "float32"):
        rows = [r for r in s1 if r["dtype"] == dtype]
        best = [r["sweep"]["best_rel_error"] for r in rows]
        digits = [r["sweep"]["trusted_digits"] for r in rows]
        lines.append(
            f"stage 1, {dtype}: {sum(audit.passed(r) for r in rows)}/{len(rows)} functions pass "
            f"every check; finite differences reach {min(best):.1e} to {max(best):.1e} at best "
            f"({min(digits):.1f} to {max(digits):.1f} trusted digits)."
        )
    lines.append(
        f"stage 2: custom rules {'hold' if s2['passed'] else 'FAIL'}; implicit vs "
        f"IFT Jacobian {s2['implicit_vs_ift_max_rel']:.1e}, Hessian vs analytic "
        f"{s2['hessian_logsumexp_vs_analytic_max_rel']:.1e}."
    )
    accepted = sum(s["verdict"] == "accepted" for s in s3["suite"].values())
    rejected = sum(r["verdict"] == "rejected" for r in s3["rejected"].values())
    lines.append(
        f"stage 3: {accepted}/{len(s3['suite'])} suite programs accepted, "
        f"{rejected}/{len(s3['rejected'])} unsupported programs rejected; "
        f"{'consistent' if s3['passed'] else 'NOT consistent'} under jit, vmap, grad."
    )
    agree = demo["max_rel_gap"] < 1e-8
    lines.append(
        f"training: loss {demo['first_loss']:.4f} -> {demo['final_loss']:.4f}; implicit "
        f"and unrolled curves {'agree' if agree else 'DIFFER'} to "
        f"{demo['max_rel_gap']:.1e}."
    )
    return {"lines": lines, "passed": ok1 and s2["passed"] and s3["passed"] and agree}


def _markdown(payload: dict) -> str:
    parts = [
        "# Derivative audit report",
        "",
        *[f"- {v}" for v in payload["verdicts"]],
        "",
        _stage_1_table(payload["stage_1"]),
        _stage_3_table(payload["stage_3"]),
        "Plots: `sweep_float64.png`, `sweep_float32.png`, `training.png`. "
        "Every figure is in `report.json`.",
        "",
    ]
    return "\n".join(parts)


def _stage_1_table(rows: list[dict]) -> str:
    lines = [
        "## Stage 1",
        "",
        "| Function | dtype | checks passed | worst identity error | "
        "best FD error | at h | theory h | slopes (trunc, round-off) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ident = max(c["rel_error"] for c in r["checks"] if not c["check"].startswith("central"))
        s = r["sweep"]
        slopes = ", ".join(
            "-" if v is None else f"{v:.2f}" for v in (s["truncation_slope"], s["roundoff_slope"])
        )
        lines.append(
            f"| {r['function']} | {r['dtype']} | "
            f"{sum(c['passed'] for c in r['checks'])}/{len(r['checks'])} | {ident:.1e} | "
            f"{s['best_rel_error']:.1e} | {s['best_step']:.1e} | {s['theory_step']:.1e} "
            f"| {slopes} |"
        )
    return "\n".join(lines) + "\n"


def _stage_3_table(s3: dict) -> str:
    lines = [
        "## Stage 3",
        "",
        "| Program | Verdict | Primitives | Consistent (jit, vmap, grad) |",
        "|---|---|---|---|",
    ]
    for name, s in s3["suite"].items():
        lines.append(
            f"| {name} | {s['verdict']} | {sum(s['counts'].values())} equations, "
            f"{len(s['counts'])} kinds | {s['consistency']['consistent']} |"
        )
    for label, r in s3["rejected"].items():
        reason = r["findings"][0]["reason"].split(".")[0] if r["findings"] else ""
        lines.append(f"| {label} | {r['verdict']}: {reason} | | {r['consistency']['consistent']} |")
    return "\n".join(lines) + "\n"
