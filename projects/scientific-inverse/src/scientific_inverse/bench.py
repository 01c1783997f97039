"""`scientific-inverse bench`: diffrax vmapped over parameter sets against SciPy's
`solve_ivp` looping over them, and the cost of a gradient against a forward solve.

Measured with lowering and XLA compilation timed apart from the first call and
the warm calls; every timed JAX call ends in `jax.block_until_ready`; compiles
counted through `jax.monitoring` (the timed rounds must add none); the paths
timed interleaved (one call of each path per round, in `PATHS` order, each JAX
path right after an untimed call of itself, i.e. in steady state) for `reps`
rounds, with an A/A control (`diffrax_aa`: the forward executable timed
again as a separate path, which shows the noise); median and p90 reported; the
identity of what ran recorded. Both solvers are explicit 5(4) Runge-Kutta
pairs (Tsit5, Dormand-Prince RK45) at the same rtol = atol, in float64, saving
at the same times; their trajectories are compared so the report also shows
that they did the same work. Both run on the process's one CPU device with
their default threading (XLA's CPU thread pool; SciPy's loop is
single-threaded Python).

The gradient is that of `0.5 * sum(x**2)` over all trajectories with respect to
every `(m, c, k)`, four ways, all differentiating the same Tsit5 steps:
  gradient_sensitivity_ode  forward mode as one solve of the state with its
                          sensitivities, `z = (y, dy/dtheta)`, 2 + 2 x 3 numbers in
                          ONE flat array (`d/dt dy/dtheta = J_y dy/dtheta + J_theta`,
                          from `jax.jvp` of the right-hand side), error control on
                          `y` only: the primal's steps, whose sizes diffrax does not
                          differentiate, so it equals `gradient_jacfwd` to round-off;
  gradient_jacfwd         forward mode through the solve (`diffrax.ForwardMode`,
                          `jax.jacfwd` per trajectory, vmapped);
  gradient_reverse        reverse mode, `RecursiveCheckpointAdjoint` with one
                          checkpoint per allowed step (nothing recomputed);
  gradient_reverse_sqrt_checkpoints  reverse mode with diffrax's default
                          checkpointing (O(sqrt(max_steps)) checkpoints at
                          `max_steps = 100000`, the rest recomputed).
All four are checked against `gradient_reverse` (`agreement`).

Ratios, each with its baseline, per-round spread and the A/A control in
`ratio_details`:
  diffrax_vs_scipy      = scipy loop time / diffrax vmapped forward time
                          (above 1: diffrax is faster; target >= 10)
  forward_vs_gradient   = forward time / gradient time, the cheapest exact
                          gradient (`gradient_sensitivity_ode`): its inverse is the
                          gradient's cost in forward solves (target >= 0.5)
  forward_vs_gradient_jacfwd, forward_vs_gradient_reverse,
  forward_vs_gradient_reverse_sqrt_checkpoints: the same for the other three
  diffrax_vs_diffrax_aa = the A/A control (expected ~1)
"""

import gc
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import click
import jax
import jax.numpy as jnp
import numpy as np

from scientific_inverse.bench_problems import (
    parameter_sets,
    scipy_loop,
    sensitivity_ode_gradient,
)
from scientific_inverse.config import ConfigError, check_output_path
from scientific_inverse.model import OSCILLATOR
from scientific_inverse.numerics import in_float64
from scientific_inverse.solver import diffrax_solve

SIZES = {
    "tiny": {"batch": 8, "reps": 20, "n_save": 20, "t_end": 10.0, "rtol": 1e-6, "seed": 0},
    "default": {"batch": 256, "reps": 20, "n_save": 50, "t_end": 10.0, "rtol": 1e-6, "seed": 0},
}
# Far above the ~100-300 steps these solves take at rtol 1e-6; a solve that hit it
# would return an error value, and the agreement check with SciPy would fail.
MAX_STEPS = 1024
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles = {"count": 0}


def _on_event(event: str, duration: float, **kwargs: Any) -> None:
    del duration, kwargs
    if event == BACKEND_COMPILE_EVENT:
        _compiles["count"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


def _timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of `fn()`, with the garbage collector paused during the call."""
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _stats(times: list[float]) -> dict[str, float]:
    return {
        "median_s": float(np.median(times)),
        "p90_s": float(np.percentile(times, 90)),
        "min_s": float(np.min(times)),
        "n": len(times),
    }


# Timed once per round, in this order.
PATHS = (
    "diffrax_forward",
    "gradient_sensitivity_ode",
    "gradient_jacfwd",
    "gradient_reverse",
    "gradient_reverse_sqrt_checkpoints",
    "diffrax_aa",
    "scipy_loop",
)
GRADIENTS = (
    "gradient_sensitivity_ode",
    "gradient_jacfwd",
    "gradient_reverse",
    "gradient_reverse_sqrt_checkpoints",
)
# ratio name -> (path b, path a, the baseline in a sentence): ratio = median(b) / median(a).
RATIOS = {
    "diffrax_vs_scipy": (
        "scipy_loop",
        "diffrax_forward",
        "SciPy solve_ivp (RK45, the same rtol = atol, float64) called once per parameter "
        "set in a Python loop, the plain SciPy way",
    ),
    "forward_vs_gradient": (
        "diffrax_forward",
        "gradient_sensitivity_ode",
        "the gradient by forward sensitivities: state and its 2 x 3 sensitivities in one "
        "flat array, one Tsit5 solve on the primal's steps (error control on the state); "
        "equal to jax.jacfwd through the solve to round-off, the cheapest exact gradient",
    ),
    "forward_vs_gradient_jacfwd": (
        "diffrax_forward",
        "gradient_jacfwd",
        "the gradient by jax.jacfwd through the solve (diffrax ForwardMode, 3 tangents "
        "per trajectory, vmapped)",
    ),
    "forward_vs_gradient_reverse": (
        "diffrax_forward",
        "gradient_reverse",
        "the gradient by reverse mode through the solver, RecursiveCheckpointAdjoint "
        "storing every step (checkpoints = max_steps = 1024)",
    ),
    "forward_vs_gradient_reverse_sqrt_checkpoints": (
        "diffrax_forward",
        "gradient_reverse_sqrt_checkpoints",
        "the gradient by reverse mode with diffrax's default checkpointing "
        "(O(sqrt(max_steps)) checkpoints at max_steps = 100000, the rest recomputed)",
    ),
    "diffrax_vs_diffrax_aa": (
        "diffrax_aa",
        "diffrax_forward",
        "A/A control: the forward executable timed again as a second path in each round",
    ),
}


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "rounds": [float(v) for v in values],
        "min": float(np.min(values)),
        "median": float(np.median(values)),
        "max": float(np.max(values)),
    }


def ratio_details(times: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per ratio of `RATIOS`: its baseline sentence, the per-round ratios (b over a
    in the same round) with min, median and max, and the A/A control's per-round
    spread (`diffrax_aa / diffrax_forward`; every ratio has the forward on one side)."""
    aa = _spread(
        [x / y for x, y in zip(times["diffrax_aa"], times["diffrax_forward"], strict=True)]
    )
    details = {}
    for name, (b, a, sentence) in RATIOS.items():
        rounds = [x / y for x, y in zip(times[b], times[a], strict=True)]
        details[name] = {"a": a, "b": b, "baseline": sentence, "aa": aa, **_spread(rounds)}
    return details


@in_float64
def run(size: str = "default", progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs the benchmark; returns the report dict (see the module docstring)."""
    say = progress or (lambda message: None)
    if size not in SIZES:
        raise ValueError(f"Unknown bench size `{size}`; use one of {sorted(SIZES)}.")
    cfg = SIZES[size]
    theta_np, y0_np = parameter_sets(cfg["batch"], cfg["seed"])
    ts_np = np.linspace(0.0, cfg["t_end"], cfg["n_save"])
    theta, y0, ts = jnp.asarray(theta_np), jnp.asarray(y0_np), jnp.asarray(ts_np)
    rtol = cfg["rtol"]

    def solve(p: jax.Array, y: jax.Array, adjoint: str = "recursive", **kw: Any) -> jax.Array:
        return diffrax_solve(OSCILLATOR, p, y, ts, rtol=rtol, atol=rtol, adjoint=adjoint, **kw)

    # One checkpoint per allowed step: the reverse pass stores every step instead
    # of recomputing (memory ~ MAX_STEPS x state x batch, a few MB here).
    stored = {"max_steps": MAX_STEPS, "checkpoints": MAX_STEPS}

    def forward(th: jax.Array) -> jax.Array:
        return jax.vmap(lambda p, y: solve(p, y, **stored))(th, y0)

    def loss_of(solve_one: Callable[[jax.Array, jax.Array], jax.Array]):
        def loss(th: jax.Array) -> jax.Array:
            return 0.5 * jnp.sum(jax.vmap(solve_one)(th, y0)[:, :, 0] ** 2)

        return loss

    def forward_mode_gradient(th: jax.Array) -> jax.Array:
        # Trajectory b depends on theta[b] only: the gradient of the sum is, row by
        # row, the gradient of each trajectory's own term (three tangents each).
        def one(p: jax.Array, y: jax.Array) -> jax.Array:
            def term(q: jax.Array) -> jax.Array:
                return 0.5 * jnp.sum(solve(q, y, "forward", max_steps=MAX_STEPS)[:, 0] ** 2)

            return jax.jacfwd(term)(p)

        return jax.vmap(one)(th, y0)

    def sensitivity_gradient(th: jax.Array) -> jax.Array:
        return jax.vmap(lambda p, y: sensitivity_ode_gradient(p, y, ts, rtol, MAX_STEPS))(th, y0)

    programs = {
        "diffrax_forward": forward,
        "gradient_sensitivity_ode": sensitivity_gradient,
        "gradient_jacfwd": forward_mode_gradient,
        "gradient_reverse": jax.grad(loss_of(lambda p, y: solve(p, y, **stored))),
        "gradient_reverse_sqrt_checkpoints": jax.grad(loss_of(solve)),
    }
    measurements: dict[str, dict[str, Any]] = {}
    executables: dict[str, Callable[[], Any]] = {}
    for name, fn in programs.items():
        say(f"compiling {name}")
        start = time.perf_counter()
        lowered = jax.jit(fn).lower(theta)
        lowered_at = time.perf_counter()
        compiled = lowered.compile()
        compiled_at = time.perf_counter()
        first = _timed(lambda compiled=compiled: jax.block_until_ready(compiled(theta)))
        measurements[name] = {
            "lower_s": lowered_at - start,
            "compile_s": compiled_at - lowered_at,
            "first_call_s": first,
        }
        executables[name] = lambda compiled=compiled: jax.block_until_ready(compiled(theta))
    # A/A control: the forward executable timed again as its own path.
    executables["diffrax_aa"] = executables["diffrax_forward"]
    measurements["diffrax_aa"] = {"compile_s": 0.0, "first_call_s": 0.0}
    executables["scipy_loop"] = lambda: scipy_loop(theta_np, y0_np, ts_np, rtol)
    measurements["scipy_loop"] = {
        "compile_s": 0.0,
        "first_call_s": _timed(executables["scipy_loop"]),
    }
    executables = {name: executables[name] for name in PATHS}

    say(f"timing {len(executables)} paths interleaved, {cfg['reps']} rounds")
    times: dict[str, list[float]] = {name: [] for name in executables}
    compiles_before = _compiles["count"]
    for _ in range(cfg["reps"]):
        for name, fn in executables.items():
            # Every JAX path is timed right after an untimed call of itself: in steady
            # state, as in a loop that calls it repeatedly. Without it, the call after
            # another executable measured slower (A/A 0.78-0.96 after the SciPy loop,
            # 1.31 after the checkpointed gradient).
            if name != "scipy_loop":
                fn()
            times[name].append(_timed(fn))
    compiles_in_timed_rounds = _compiles["count"] - compiles_before
    for name, values in times.items():
        measurements[name].update(_stats(values))

    ours = np.asarray(executables["diffrax_forward"]())
    theirs = scipy_loop(theta_np, y0_np, ts_np, rtol)
    gradients = {name: np.asarray(executables[name]()) for name in GRADIENTS}
    reference = gradients["gradient_reverse"]
    med = {name: measurements[name]["median_s"] for name in measurements}
    identity = {
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "diffrax": _version("diffrax"),
        "scipy": _version("scipy"),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": _git_commit(),
        "config_sha256": hashlib.sha256(
            json.dumps({"size": size, **cfg}, sort_keys=True).encode()
        ).hexdigest(),
    }
    return {
        "identity": identity,
        "config": {
            "size": size,
            **cfg,
            "solvers": "diffrax Tsit5 + PIDController vs "
            "scipy solve_ivp RK45, rtol = atol, float64",
        },
        "measurements": measurements,
        "ratios": {name: med[b] / med[a] for name, (b, a, _) in RATIOS.items()},
        "ratio_details": ratio_details(times),
        "targets": {"diffrax_vs_scipy": 10.0, "forward_vs_gradient": 0.5},
        "compiles_in_timed_rounds": compiles_in_timed_rounds,
        "agreement": {
            "max_abs_diffrax_minus_scipy": float(np.abs(ours - theirs).max()),
            "trajectory_scale": float(np.abs(theirs).max()),
            "gradient_scale": float(np.abs(reference).max()),
            **{
                f"max_abs_{name}_minus_gradient_reverse": float(np.abs(g - reference).max())
                for name, g in gradients.items()
                if name != "gradient_reverse"
            },
        },
    }


def plot(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["measurements"])
    med = [report["measurements"][n]["median_s"] * 1e3 for n in names]
    p90 = [report["measurements"][n]["p90_s"] * 1e3 for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh(names, med, color="C0", label="median")
    ax.errorbar(p90, names, fmt="|", color="k", ms=12, label="p90")
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds per call (log)")
    ratios = ", ".join(f"{k} {v:.2f}" for k, v in report["ratios"].items())
    ax.set_title(f"batch {report['config']['batch']}: {ratios}", fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@click.command(name="bench")
@click.option("--size", type=click.Choice(sorted(SIZES)), default="default", show_default=True)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default="runs/bench.json",
    show_default=True,
    help="Report JSON; the plot goes next to it (.png).",
)
def bench(size: str, out: str) -> None:
    """Time diffrax (vmapped) against SciPy's solve_ivp loop, and gradient against forward."""
    try:
        for target in (Path(out), Path(out).with_suffix(".png")):
            check_output_path(target, directory=False, what="Bench report")
    except ConfigError as err:
        raise click.BadParameter(str(err), param_hint="'--out'") from None
    report = run(size, progress=lambda message: click.echo(message, err=True))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    plot(report, path.with_suffix(".png"))
    click.echo(f"{'path':<34} {'compile s':>10} {'median ms':>10} {'p90 ms':>10}")
    for name, m in report["measurements"].items():
        click.echo(
            f"{name:<34} {m['compile_s']:>10.3f} {m['median_s'] * 1e3:>10.3f} "
            f"{m['p90_s'] * 1e3:>10.3f}"
        )
    for name, value in report["ratios"].items():
        target = report["targets"].get(name)
        d = report["ratio_details"][name]
        click.echo(
            f"{name} = {value:.2f} (rounds {d['min']:.2f}..{d['max']:.2f}, A/A "
            f"{d['aa']['min']:.2f}..{d['aa']['max']:.2f})"
            + (f" (target >= {target:g})" if target else "")
        )
    click.echo(
        f"compiles during timed rounds: {report['compiles_in_timed_rounds']}; "
        f"max |diffrax - scipy| = {report['agreement']['max_abs_diffrax_minus_scipy']:.2g}"
        f"; report: {path}"
    )
