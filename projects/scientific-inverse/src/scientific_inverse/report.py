"""The study's report: `report.md` and three PNGs (fits, profiles, convergence).

The markdown answers the review questions of the project from the numbers of
one run: does the estimate converge as the grid refines; do the solver's
sensitivities agree with finite differences; can different parameters explain
the same observations, and which measurement would tell them apart.
"""

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scientific_inverse import plots
from scientific_inverse.config import Config
from scientific_inverse.data import Observations, observation_times
from scientific_inverse.model import oscillator_exact
from scientific_inverse.numerics import in_float64
from scientific_inverse.solver import rk4_error_study


def _f(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}g}"


def _pair(values: list[float], digits: int = 5) -> str:
    return "(" + ", ".join(_f(v, digits) for v in values) + ")"


@in_float64
def scaling_check(config: Config, factor: float = 2.0) -> float:
    """Max |x(t; m, c, k) - x(t; a m, a c, a k)|: zero up to round-off, because the free
    response depends on c/m and k/m only."""
    ts = jnp.asarray(observation_times(config.t_end, config.obs_dt))
    y0 = jnp.asarray([config.x0, config.v0])
    theta = jnp.asarray(config.theta_true)
    return float(_scaling_gap(theta, factor * theta, y0, ts))


@jax.jit
def _scaling_gap(a: jax.Array, b: jax.Array, y0: jax.Array, ts: jax.Array) -> jax.Array:
    return jnp.abs(oscillator_exact(a, y0, ts)[:, 0] - oscillator_exact(b, y0, ts)[:, 0]).max()


def write(
    workdir: Path,
    config: Config,
    result: dict[str, Any],
    obs: Observations,
    short_obs: Observations,
    predictions: dict[str, np.ndarray],
    sensitivities: dict[str, Any] | None = None,
) -> Path:
    """Writes `report.md`, `fits.png`, `profiles.png` and `convergence.png` to `workdir`."""
    plots.fits(workdir / "fits.png", obs, short_obs, predictions, config.short_window)
    plots.profiles(workdir / "profiles.png", result)
    theta = np.array([config.theta_true, (1.0, 0.1, 9.0), (2.0, 0.5, 3.0)])
    y0 = np.array([[config.x0, config.v0], [0.5, 1.0], [-1.0, 0.3]])
    # The steps and batch size of the stage-1 test: the same compiled programs.
    simulation = rk4_error_study((0.1, 0.05, 0.025, 0.0125), theta, y0, config.t_end)
    result["simulation_convergence"] = simulation
    conv = result["convergence"]
    series = [
        {
            "title": "Stage 1: RK4 trajectory vs exact",
            "dt": simulation["dt"],
            "errors": {"max |x, v error|": simulation["max_abs_error"]},
            "order": _f(simulation["observed_order"], 3),
            "ylabel": "max abs error",
        },
        {
            "title": "Stage 3: estimate vs exact-model fit",
            "dt": conv["dt"],
            "errors": {name: [g[j] for g in conv["abs_gap"]] for j, name in enumerate("ck")},
            "order": _pair(conv["observed_order"], 3),
            "ylabel": "|estimate gap|",
        },
    ]
    if sensitivities is not None:
        rows = sensitivities["discrete"]
        series.insert(
            1,
            {
                "title": "Stage 2: discrete vs exact gradient",
                "dt": [r["dt"] for r in rows],
                "errors": {"relative gap": [r["rel_vs_exact"] for r in rows]},
                "order": _f(sensitivities["discrete_order"], 3),
                "ylabel": "relative gap",
            },
        )
        result["sensitivities"] = sensitivities
    plots.convergence(workdir / "convergence.png", series)
    path = workdir / "report.md"
    path.write_text(_markdown(config, result, scaling_check(config)), encoding="utf-8")
    return path


# --- VERDICTS: each computed from the figures it summarizes ----------------------------


def convergence_verdict(conv: dict[str, Any], se: list[float]) -> str:
    """Does the estimate converge as the grid refines, at what order, and does the
    solver limit the inference? From the observed order and the gaps."""
    order = min(conv["observed_order"])
    gaps = np.asarray(conv["abs_gap"], dtype=float)  # shape=(levels, 2), dt descending
    order_by_dt = np.argsort(conv["dt"])[::-1]
    shrinking = bool(np.all(np.diff(gaps[order_by_dt], axis=0) < 0))
    if shrinking and 3.5 <= order <= 4.5:
        first = f"Yes, at the order of the integrator (observed {order:.3g}; RK4: 4)."
    elif shrinking:
        first = f"Yes, but at observed order {order:.3g}, not the integrator's 4."
    else:
        first = "No: the gap to the exact-model fit does not shrink with every step refinement."
    in_se = float(np.max(gaps / np.asarray(se, dtype=float)[None, :]))
    if in_se < 0.1:
        second = (
            f"Every gap is far below the standard error (at most {in_se:.2g} se), so at "
            "these steps the solver does not limit the inference."
        )
    else:
        second = (
            f"The largest gap is {in_se:.2g} standard errors: at the coarsest step the "
            "solver limits the inference."
        )
    return f"{first} {second}"


def scaling_verdict(scaling_gap: float, free_eigenvalues: list[float]) -> str:
    """Can (m, c, k) and (2m, 2c, 2k) explain the same observations? From the
    trajectory gap and the smallest Fisher eigenvalue relative to the largest."""
    relative = abs(free_eigenvalues[0]) / max(abs(free_eigenvalues[-1]), 1e-300)
    if scaling_gap <= 1e-9 and relative <= 1e-10:
        return "**Yes, exactly, if the mass is not known.**"
    return (
        f"**Not exactly**: scaled parameters differ by {scaling_gap:.2g} in the trajectory and "
        f"the Fisher information's smallest eigenvalue is {relative:.2g} of its largest."
    )


def short_window_verdict(short_condition: float, long_condition: float) -> str:
    """Do damping and stiffness trade off in a short window? From the condition numbers."""
    ratio = short_condition / long_condition
    if ratio >= 10:
        return (
            f"**Nearly, in a short window** (condition number {ratio:.3g} times the long window's)."
        )
    return (
        f"**Not even in a short window**: its condition number is only {ratio:.3g} times "
        "the long window's."
    )


def coverage_verdict(cov: dict[str, Any]) -> str:
    """Are the intervals honest? Coverage within three binomial standard errors."""
    low = cov["nominal"] - 3 * cov["binomial_se"]
    high = min(1.0, cov["nominal"] + 3 * cov["binomial_se"])
    rates = [float(x) for x in cov["rate"]]
    if all(low <= x <= high for x in rates):
        return (
            f"**Yes**: coverage {_pair(rates, 3)} lies within three binomial standard errors "
            f"of the nominal {cov['nominal']:g}."
        )
    return (
        f"**No**: coverage {_pair(rates, 3)} lies outside [{low:.3f}, {high:.3f}], three "
        f"binomial standard errors around the nominal {cov['nominal']:g}."
    )


def _markdown(config: Config, r: dict[str, Any], scaling_gap: float) -> str:
    fit, ref, coarse = r["fit"], r["fit"]["refined"], r["fit"]["coarse"]
    pe, bias, conv, cov = r["parameter_error"], r["solver_bias"], r["convergence"], r["coverage"]
    pred, short, fisher = r["prediction_error"], r["short_window"], r["fisher"]
    lines = [
        "# Scientific inverse problem: report",
        "",
        f"Damped oscillator `m x'' + c x' + k x = 0`, known `m = {config.mass:g}`, "
        f"`x(0) = {config.x0:g}`, `v(0) = {config.v0:g}`; true `c = {config.damping:g}`, "
        f"`k = {config.stiffness:g}`. Position observed every {config.obs_dt:g} up to "
        f"t = {config.t_end:g} with Gaussian noise of std {config.noise_std:g} "
        f"(seed {config.seed}); {pred['refined']['n_heldout']} times held out. Fit: "
        "Levenberg-Marquardt (optimistix) on RK4 predictions; intervals at "
        f"{config.confidence:g}. Run time {r['seconds']:.1f} s.",
        "",
        "![fits](fits.png)",
        "",
        "## The error budget, kept apart",
        "",
        "| Quantity | c | k |",
        "|---|---|---|",
        f"| estimate (RK4, dt = {ref['dt']:g}) | {_f(ref['theta'][0], 6)} | "
        f"{_f(ref['theta'][1], 6)} |",
        f"| standard error (Laplace) | {_f(ref['se'][0])} | {_f(ref['se'][1])} |",
        f"| **parameter error** (estimate - truth) | {_f(pe['error'][0])} "
        f"({_f(pe['in_se'][0], 3)} se) | {_f(pe['error'][1])} ({_f(pe['in_se'][1], 3)} se) |",
        f"| **solver bias** (fit with dt = {coarse['dt']:g} minus dt = {ref['dt']:g}) | "
        f"{_f(bias['coarse_minus_refined'][0])} ({_f(bias['in_se'][0], 3)} se) | "
        f"{_f(bias['coarse_minus_refined'][1])} ({_f(bias['in_se'][1], 3)} se) |",
        f"| exact-model estimate (the dt -> 0 limit) | {_f(fit['exact_model']['theta'][0], 10)}"
        f" | {_f(fit['exact_model']['theta'][1], 10)} |",
        "",
        f"**Prediction error** on the {pred['refined']['n_heldout']} held-out times: RMSE "
        f"{_f(pred['refined']['heldout_rmse_vs_observed'])} against the noisy held-out values "
        f"(the noise std is {config.noise_std:g}, the floor no model can beat) and "
        f"{_f(pred['refined']['heldout_rmse_vs_truth'])} against the noise-free trajectory; "
        f"the coarse solver gives {_f(pred['coarse']['heldout_rmse_vs_truth'])}. "
        "The parameter error is set by the noise (about one standard error), the solver "
        "bias by the step, and the prediction error by both plus the noise floor: three "
        "different numbers.",
        "",
        "## Does the inferred parameter converge as the time grid refines?",
        "",
        convergence_verdict(conv, ref["se"]),
        "",
        "The same data fitted with RK4 at each step, against the fit with the exact solution:",
        "",
        "| dt | c estimate | k estimate | abs gap c | abs gap k |",
        "|---|---|---|---|---|",
    ]
    for dt, est, gap in zip(conv["dt"], conv["estimates"], conv["abs_gap"], strict=True):
        lines.append(f"| {dt:g} | {est[0]:.10f} | {est[1]:.10f} | {gap[0]:.3g} | {gap[1]:.3g} |")
    lines += [
        "",
        f"Observed order (slope of log gap against log dt): c {_f(conv['observed_order'][0], 3)}"
        f", k {_f(conv['observed_order'][1], 3)} (RK4: 4).",
        "",
        "![convergence](convergence.png)",
        "",
        "## Do solver sensitivities agree with finite differences?",
        "",
    ]
    sens = r.get("sensitivities")
    if sens is None:
        lines += [
            "The sensitivity study is skipped in this preset (`check_sensitivities = "
            "false`); `scientific-inverse fit` with the default config runs it.",
            "",
        ]
    else:
        lines += [
            "Gradient of `L = mean (x - d)^2 / 2` with respect to `(m, c, k)` (relative to the "
            "largest component). The forward sensitivity equations (SciPy DOP853) agree with "
            f"the exact gradient to {_f(sens['forward_sensitivity_rel_vs_exact'], 2)}.",
            "",
            "| dt | autodiff vs central FD | autodiff vs exact (continuous) |",
            "|---|---|---|",
        ]
        for row in sens["discrete"]:
            lines.append(
                f"| {row['dt']:g} | {row['rel_vs_finite_difference']:.2g} | "
                f"{row['rel_vs_exact']:.2g} |"
            )
        lines += [
            "",
            "Autodiff through the scan matches finite differences of the same discrete loss "
            "at every step (to the finite-difference error), while its distance to the "
            "continuous gradient shrinks at order "
            f"{_f(sens['discrete_order'], 3)}: the discrete derivative converges to the "
            "continuous one.",
            "",
            "| diffrax rtol = atol | RecursiveCheckpoint vs exact | Backsolve vs exact | "
            "Recursive vs Backsolve |",
            "|---|---|---|---|",
        ]
        for row in sens["diffrax"]:
            lines.append(
                f"| {row['rtol']:g} | {row['recursive_rel_vs_exact']:.2g} | "
                f"{row['backsolve_rel_vs_exact']:.2g} | "
                f"{row['recursive_vs_backsolve']:.2g} |"
            )
        lines.append("")
    long_f = fisher["long window, position"]
    short_f = fisher["short window, position"]
    vel_f = fisher["short window, position + velocity"]
    free_f = fisher["long window, m c k all free"]
    load_f = fisher["long window, m c k, known step load F0 = 1"]
    prof = r["profiles"]
    lines += [
        "## Can different parameters explain the same observations?",
        "",
        scaling_verdict(scaling_gap, free_f["eigenvalues"])
        + " The free response depends on `c/m` and "
        "`k/m` only: `(m, c, k)` and `(2m, 2c, 2k)` give the same trajectory (max difference "
        f"{scaling_gap:.2g}). The Fisher information of `(m, c, k)` is singular (smallest "
        f"eigenvalue {free_f['eigenvalues'][0]:.2g}, direction "
        f"{_pair(free_f['weakest_direction'], 3)} in log units: all three scaled together). "
        "**The measurement that separates them is a known force**: with a known constant "
        "load `F0 = 1` applied from t = 0 the equilibrium `F0 / k` fixes the scale, the "
        f"condition number becomes {_f(load_f['condition_number'], 3)} and the relative "
        f"standard errors {_pair(load_f['relative_se'], 3)}. This is why `m` is known here.",
        "",
        short_window_verdict(short_f["condition_number"], long_f["condition_number"])
        + f" Observed only up to t = {config.short_window:g} (less than a period):",
        "",
        "| Design (expected Fisher information, log units) | condition number | "
        "relative se c | relative se k |",
        "|---|---|---|---|",
    ]
    for name, row in (
        ("long window, position", long_f),
        ("short window, position", short_f),
        ("short window, position + velocity", vel_f),
    ):
        lines.append(
            f"| {name} | {_f(row['condition_number'], 3)} | "
            f"{_f(row['relative_se'][0], 3)} | {_f(row['relative_se'][1], 3)} |"
        )
    lines += [
        "",
        f"On data, the short-window fit has correlation {_f(short['correlation'], 3)} between "
        f"the estimates (long window {_f(ref['correlation'], 3)}) and standard errors "
        f"{_pair(short['se'], 3)} against {_pair(ref['se'], 3)}. Profile-likelihood intervals "
        "(from the curves below) against the Laplace intervals:",
        "",
        "| window | parameter | profile interval | Laplace interval |",
        "|---|---|---|---|",
    ]
    for window in ("long", "short"):
        for name in ("c", "k"):
            p = prof[window][name]
            lines.append(
                f"| {window} | {name} | [{_f(p['lower'], 5)}, {_f(p['upper'], 5)}] | "
                f"[{_f(p['laplace'][0], 5)}, {_f(p['laplace'][1], 5)}] |"
            )
    lines += [
        "",
        "In the long window the two agree (the likelihood is nearly quadratic); in the short "
        "window both widen several-fold, the profile is asymmetric, and the damping interval "
        "can reach below zero: the data alone cannot rule out an undamped oscillator. "
        "**The measurement that separates c from k in a short window is the velocity** "
        "(or a longer record): adding velocity observations at the same times lowers "
        f"the condition number from {_f(short_f['condition_number'], 3)} to "
        f"{_f(vel_f['condition_number'], 3)} and the relative standard error of c from "
        f"{_f(short_f['relative_se'][0], 3)} to {_f(vel_f['relative_se'][0], 3)}; observing "
        f"up to t = {config.t_end:g} brings it to {_f(long_f['relative_se'][0], 3)}. "
        f"Extrapolated to t = {config.t_end:g}, the short-window fit is off the truth by "
        f"RMSE {_f(pred['short_window_extrapolation_rmse_vs_truth'])}.",
        "",
        "![profiles](profiles.png)",
        "",
        "## Are the intervals honest?",
        "",
        coverage_verdict(cov),
        "",
        f"Laplace intervals (Student t, level {cov['nominal']:g}) over {cov['seeds']} "
        f"independent data sets: they hold the true c in {cov['covered'][0]} "
        f"({cov['rate'][0]:.3f}) and the true k in {cov['covered'][1]} ({cov['rate'][1]:.3f}); "
        f"the binomial standard error at the nominal level is {cov['binomial_se']:.3f}. "
        f"Standardized errors `(estimate - truth) / se` have mean {_pair(cov['z_mean'], 3)} "
        f"and std {_pair(cov['z_std'], 3)} (ideal 0 and 1); the standard error averages "
        f"{_pair(cov['mean_se'], 3)} against an actual spread of the estimates of "
        f"{_pair(cov['estimate_std'], 3)}.",
        "",
        "## Stage 1: the simulator",
        "",
    ]
    sim = r["simulation_convergence"]
    lines.append(
        "RK4 in `lax.scan`, vmapped over three oscillators, against the exact solution on "
        f"[0, {config.t_end:g}]: max errors "
        + ", ".join(
            f"{e:.2g} (dt {d:g})" for d, e in zip(sim["dt"], sim["max_abs_error"], strict=True)
        )
        + f"; observed order {_f(sim['observed_order'], 3)}."
    )
    lines.append("")
    return "\n".join(lines)
