"""`scientific-inverse bench`: diffrax vmapped over parameter sets against SciPy's
`solve_ivp` looping over them, and the cost of a gradient against a forward solve.

Measured with lowering and XLA
compilation timed apart from the first call and the warm calls; every timed
JAX call ends in `jax.block_until_ready`; compiles counted through
`jax.monitoring` (the timed rounds must add none); the paths timed interleaved
(A B C D A B C D ...) for `reps` rounds with an A/A control (`diffrax_aa`: the
same executable timed as a separate path, which shows the noise); median and
p90 reported; the identity of what ran recorded. Both solvers are explicit
5(4) Runge-Kutta pairs (Tsit5, Dormand-Prince RK45) at the same rtol = atol,
in float64, saving at the same times; their trajectories are compared so the
report also shows that they did the same work.

Ratios (above 1: the first is faster):
  diffrax_vs_scipy      = scipy loop / diffrax vmapped forward  (target >= 10)
  forward_vs_gradient   = forward / gradient                    (target >= 0.2)
  diffrax_vs_diffrax_aa = the A/A control                       (expected ~1)
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
from scipy.integrate import solve_ivp

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


def parameter_sets(batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`(batch, 3)` underdamped (m, c, k) and `(batch, 2)` initial states."""
    rng = np.random.default_rng(seed)
    theta = np.stack(
        [rng.uniform(0.5, 2.0, batch), rng.uniform(0.05, 0.5, batch), rng.uniform(1.0, 9.0, batch)],
        axis=1,
    )
    y0 = np.stack([rng.uniform(-1, 1, batch), rng.uniform(-1, 1, batch)], axis=1)
    return theta, y0


def scipy_loop(theta: np.ndarray, y0: np.ndarray, ts: np.ndarray, rtol: float) -> np.ndarray:
    """One `solve_ivp` (RK45) per parameter set: `(batch, time, 2)`."""
    out = np.empty((theta.shape[0], ts.shape[0], 2))
    for b, (m, c, k) in enumerate(theta):
        sol = solve_ivp(
            lambda t, y, m=m, c=c, k=k: [y[1], -(c * y[1] + k * y[0]) / m],
            (0.0, float(ts[-1])),
            y0[b],
            method="RK45",
            t_eval=ts,
            rtol=rtol,
            atol=rtol,
        )
        out[b] = sol.y.T
    return out


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

    def forward(th: jax.Array) -> jax.Array:
        # One checkpoint per allowed step: the reverse pass stores every step instead
        # of recomputing (memory ~ MAX_STEPS x state x batch, a few MB here).
        def solve(p: jax.Array, y: jax.Array) -> jax.Array:
            return diffrax_solve(
                OSCILLATOR,
                p,
                y,
                ts,
                rtol=rtol,
                atol=rtol,
                max_steps=MAX_STEPS,
                checkpoints=MAX_STEPS,
            )

        return jax.vmap(solve)(th, y0)

    def loss(th: jax.Array) -> jax.Array:
        return 0.5 * jnp.sum(forward(th)[:, :, 0] ** 2)

    measurements: dict[str, dict[str, Any]] = {}
    executables: dict[str, Callable[[], Any]] = {}
    for name, fn in (("diffrax_forward", forward), ("diffrax_gradient", jax.grad(loss))):
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

    say(f"timing {len(executables)} paths interleaved, {cfg['reps']} rounds")
    times: dict[str, list[float]] = {name: [] for name in executables}
    compiles_before = _compiles["count"]
    for _ in range(cfg["reps"]):
        for name, fn in executables.items():
            times[name].append(_timed(fn))
    compiles_in_timed_rounds = _compiles["count"] - compiles_before
    for name, values in times.items():
        measurements[name].update(_stats(values))

    ours = np.asarray(executables["diffrax_forward"]())
    theirs = scipy_loop(theta_np, y0_np, ts_np, rtol)
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
        "ratios": {
            "diffrax_vs_scipy": med["scipy_loop"] / med["diffrax_forward"],
            "forward_vs_gradient": med["diffrax_forward"] / med["diffrax_gradient"],
            "diffrax_vs_diffrax_aa": med["diffrax_aa"] / med["diffrax_forward"],
        },
        "targets": {"diffrax_vs_scipy": 10.0, "forward_vs_gradient": 0.2},
        "compiles_in_timed_rounds": compiles_in_timed_rounds,
        "agreement": {
            "max_abs_diffrax_minus_scipy": float(np.abs(ours - theirs).max()),
            "trajectory_scale": float(np.abs(theirs).max()),
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
    click.echo(f"{'path':<18} {'compile s':>10} {'median ms':>10} {'p90 ms':>10}")
    for name, m in report["measurements"].items():
        click.echo(
            f"{name:<18} {m['compile_s']:>10.3f} {m['median_s'] * 1e3:>10.3f} "
            f"{m['p90_s'] * 1e3:>10.3f}"
        )
    for name, value in report["ratios"].items():
        target = report["targets"].get(name)
        click.echo(f"{name} = {value:.2f}" + (f" (target >= {target:g})" if target else ""))
    click.echo(
        f"compiles during timed rounds: {report['compiles_in_timed_rounds']}; "
        f"max |diffrax - scipy| = {report['agreement']['max_abs_diffrax_minus_scipy']:.2g}"
        f"; report: {path}"
    )
