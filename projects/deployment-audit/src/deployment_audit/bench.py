"""`deployment-audit bench`: the exported artifact against the in-process model,
and batched against unbatched, timed side by side (compile apart, interleaved rounds, A/A).

Run: `deployment-audit bench [--out runs/bench.json] [--size default|tiny] [--no-load]`.

It trains the model (the size's config), exports it, deserializes the bytes,
and times these paths, every call ending in `jax.block_until_ready`:
  `native_b1`      the in-process model, `jax.jit`, batch 1
  `native_b1_aa`   a second jitted copy of the same: the A/A control
  `exported_b1`    `jax.jit(exported.call)` on the deserialized bytes, batch 1
                   (jitted: `exported.call` outside `jax.jit` is several times slower)
  `exported_b1_aa` a second jitted copy of `exported_b1`: the A/A of the unbatched side
  `native_b64`, `exported_b64`   the same at batch 64
  `native_b64_aa`  a second jitted copy of `native_b64`: the A/A at batch 64
Each path is lowered and compiled ahead of time (`lower_s`, `compile_s`),
called once (`first_call_s`), then timed in interleaved rounds (A B C ...,
starting from another path each round); one timed value is a path's mean
over `calls_per_round` blocked calls. Compiles are
counted through `jax.monitoring`: the timed rounds must compile nothing.

Ratios (above 1 means the first is faster), from the median rounds:
  `exported_vs_native`     native_b1 / exported_b1 time (target >= 0.83)
  `batched_vs_unbatched`   rows/s of exported_b64 over exported_b1 (target >= 8)
  `native_vs_native_aa`    the noise floor
`ratio_details` gives, per ratio: the baseline (a sentence), the A/A control
of the baseline's side (the baseline against its second jitted copy, timed in
the same rounds), the per-round ratio (each round times every path once) with
its min, median and max, and `from_fastest`: the ratio of the two paths' fastest
rounds (the least disturbed by other work on the machine).
With the load part (default), a `deployment-audit load` run adds
`p99_over_p50_at_highest_sustained` (target <= 5) from a real server.
"""

import gc
import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import flax
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from deployment_audit import data, export, train
from deployment_audit.config import Config, ConfigError, LoadConfig, ServeConfig, check_output_path

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
TARGETS = {"exported_vs_native": 0.83, "batched_vs_unbatched": 8.0}
SIZES = {
    "default": {"config": Config.default(), "rounds": 30, "calls": 200, "load": LoadConfig()},
    "tiny": {
        "config": Config.tiny().model_copy(update={"num_epochs": 2}),
        "rounds": 20,
        "calls": 5,
        "load": LoadConfig(rates=(40.0, 80.0), requests_per_rate=30, max_seconds_per_rate=5.0),
    },
}


class _Compiles:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, event: str, duration: float, **kwargs: Any) -> None:
        del duration, kwargs
        if event == BACKEND_COMPILE_EVENT:
            self.count += 1


def _path(fn: Any, x: jax.Array) -> dict[str, Any]:
    start = time.perf_counter()
    lowered = jax.jit(fn).lower(x)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    out = jax.block_until_ready(compiled(x))
    return {
        "call": compiled,
        "x": x,
        "lower_s": lowered_at - start,
        "compile_s": compiled_at - lowered_at,
        "first_call_s": time.perf_counter() - compiled_at,
        "output": np.asarray(out),
    }


def _round(path: dict[str, Any], calls: int) -> float:
    """Mean seconds per call over `calls` blocked calls of one path."""
    call, x = path["call"], path["x"]
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(calls):
            jax.block_until_ready(call(x))
        return (time.perf_counter() - start) / calls
    finally:
        gc.enable()


def run_bench(size: str, with_load: bool, log: Any) -> dict[str, Any]:
    if size not in SIZES:
        raise ValueError(f"Unknown bench size `{size}`; use one of {sorted(SIZES)}.")
    setting = SIZES[size]
    config: Config = setting["config"]
    log(f"[{size}] training {config.hidden_sizes} for {config.num_epochs} epochs")
    trained = train.train_and_evaluate(config)
    params, spec = trained["_params"], trained["_spec"]
    mean, scale = (jnp.asarray(a) for a in data.spec_arrays(spec["preprocessing"]))
    blob = bytes(export.export_model(params, spec["preprocessing"]).serialize())
    exported = jax.export.deserialize(bytearray(blob))
    images = data.load().images

    def native(x: jax.Array) -> jax.Array:
        return train.predict_logits(params, mean, scale, x)

    def native_aa(x: jax.Array) -> jax.Array:  # A/A: the same computation, another jit object.
        return train.predict_logits(params, mean, scale, x)

    x1, x64 = jnp.asarray(images[:1]), jnp.asarray(images[:64])
    counter = _Compiles()
    jax.monitoring.register_event_duration_secs_listener(counter)
    try:
        paths = {
            "native_b1": _path(native, x1),
            "native_b1_aa": _path(native_aa, x1),
            "exported_b1": _path(exported.call, x1),
            "exported_b1_aa": _path(lambda x: exported.call(x), x1),
            "native_b64": _path(native, x64),
            "native_b64_aa": _path(native_aa, x64),
            "exported_b64": _path(exported.call, x64),
        }
        prepare_compiles = counter.count
        times: dict[str, list[float]] = {name: [] for name in paths}
        for r in range(setting["rounds"]):
            gc.collect()
            # Rotate the order each round, so that no path always runs first.
            names = list(paths)
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                times[name].append(_round(paths[name], setting["calls"]))
            if (r + 1) % 10 == 0:
                log(f"  round {r + 1}/{setting['rounds']}")
        timed_compiles = counter.count - prepare_compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(counter)
    measurements = {}
    for name, path in paths.items():
        arr = np.asarray(times[name])
        measurements[name] = {
            "lower_s": path["lower_s"],
            "compile_s": path["compile_s"],
            "first_call_s": path["first_call_s"],
            "median_s": float(np.median(arr)),
            "p90_s": float(np.percentile(arr, 90)),
            "min_s": float(arr.min()),
            "max_s": float(arr.max()),
            "n": len(arr),
            "calls_per_round": setting["calls"],
            "batch": int(path["x"].shape[0]),
            "times_s": arr.tolist(),
        }
    med = {name: m["median_s"] for name, m in measurements.items()}
    ratios = {
        "exported_vs_native": med["native_b1"] / med["exported_b1"],
        "batched_vs_unbatched": (64 / med["exported_b64"]) / (1 / med["exported_b1"]),
        "native_vs_native_aa": med["native_b1_aa"] / med["native_b1"],
        "exported_b64_vs_native_b64": med["native_b64"] / med["exported_b64"],
    }
    details = ratio_details(times)
    checks = {
        "exported_equals_native_b1_bitwise": bool(
            np.array_equal(paths["exported_b1"]["output"], paths["native_b1"]["output"])
        ),
        "exported_equals_native_b64_bitwise": bool(
            np.array_equal(paths["exported_b64"]["output"], paths["native_b64"]["output"])
        ),
        "compiles_while_preparing": prepare_compiles,
        "compiles_while_timed": timed_compiles,
    }
    result: dict[str, Any] = {
        "identity": _identity(config),
        "size": size,
        "measurements": measurements,
        "ratios": ratios,
        "ratio_details": details,
        "targets": {**TARGETS, "p99_over_p50_at_highest_sustained": "<= 5"},
        "checks": checks,
    }
    if with_load:
        from deployment_audit import loadgen

        with tempfile.TemporaryDirectory() as tmp:
            export.write_artifact(
                tmp,
                exported,
                spec,
                train.golden_record(np.arange(1), images[:1], paths["native_b1"]["output"]),
            )
            log(f"[{size}] load test on a real server")
            load = loadgen.run_load_test(tmp, setting["load"], ServeConfig(), log=log)
        obs = load["observed_cpu"]
        result["load"] = {
            "highest_sustained_rps": obs["highest_sustained_rps"],
            "p99_over_p50_at_highest_sustained": obs["p99_over_p50_at_highest_sustained"],
            "runs": [
                {
                    k: r[k]
                    for k in (
                        "rate_rps",
                        "ok",
                        "requests",
                        "throughput_rps",
                        "latency",
                        "sustained",
                    )
                }
                for r in obs["runs"]
            ],
            "simulated_capacity_rps": load["simulated_queue"]["capacity"]["capacity_rps"],
        }
    return result


# name: (faster side, baseline side, rows factor, A/A of the baseline side, baseline sentence)
RATIO_SIDES = {
    "exported_vs_native": (
        "exported_b1",
        "native_b1",
        1,
        "native_b1_aa",
        "The in-process model under `jax.jit` (compiled ahead of time), batch 1: what a "
        "practitioner serves without an exported artifact.",
    ),
    "batched_vs_unbatched": (
        "exported_b64",
        "exported_b1",
        64,
        "exported_b1_aa",
        "The same exported artifact called once per row (batch 1, jitted, compiled ahead of "
        "time), back to back: rows/s of batch 64 over rows/s of batch 1.",
    ),
    "native_vs_native_aa": (
        "native_b1",
        "native_b1_aa",
        1,
        "native_b1",
        "A/A: the in-process model at batch 1 against a second jitted copy of itself.",
    ),
    "exported_b64_vs_native_b64": (
        "exported_b64",
        "native_b64",
        1,
        "native_b64_aa",
        "The in-process model under `jax.jit` at batch 64.",
    ),
}


def ratio_details(times: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per ratio of `RATIO_SIDES`: baseline, A/A, per-round ratios, min/median/max,
    and the ratio of the fastest rounds. A ratio is `rows * t(baseline) / t(faster)`
    (above 1: the first-named path is faster); the A/A is `t(baseline) / t(its copy)`
    at the medians (1 is no difference; its distance from 1 is the noise)."""

    def ratio(fast: float, base: float, rows: int) -> float:
        return rows * base / fast

    out = {}
    for name, (fast, base, rows, aa, sentence) in RATIO_SIDES.items():
        per_round = [ratio(f, b, rows) for f, b in zip(times[fast], times[base], strict=True)]
        aa_rounds = [b / c for b, c in zip(times[base], times[aa], strict=True)]
        out[name] = {
            "baseline": sentence,
            "paths": {"faster": fast, "baseline": base, "aa_copy": aa},
            "value": ratio(float(np.median(times[fast])), float(np.median(times[base])), rows),
            "from_fastest": ratio(min(times[fast]), min(times[base]), rows),
            "aa": float(np.median(times[base]) / np.median(times[aa])),
            "aa_rounds_min_median_max": [
                min(aa_rounds),
                float(np.median(aa_rounds)),
                max(aa_rounds),
            ],
            "rounds": per_round,
            "min": min(per_round),
            "median": float(np.median(per_round)),
            "max": max(per_round),
        }
    return out


def _identity(config: Config) -> dict[str, Any]:
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                cwd=Path(__file__).parent,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": flax.__version__,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": commit,
        "config_sha256": hashlib.sha256(config.to_json().encode()).hexdigest(),
        "cpus": os.cpu_count(),
        "loadavg_at_end": list(os.getloadavg()),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["measurements"])
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.boxplot([np.asarray(result["measurements"][n]["times_s"]) * 1e6 for n in names])
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_ylabel("time per call (us)")
    ax.set_yscale("log")
    ratios = ", ".join(f"{k} {v:.2f}" for k, v in result["ratios"].items() if "aa" not in k)
    ax.set_title(ratios, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@click.command()
@click.option("--out", default="runs/bench.json", show_default=True, type=click.Path())
@click.option("--size", default="default", show_default=True, type=click.Choice(sorted(SIZES)))
@click.option("--load/--no-load", "with_load", default=True, help="Include the server load run.")
def bench(out: str, size: str, with_load: bool) -> None:
    """Time the exported call against the in-process model, batch 64 against batch 1."""
    try:
        for target in (Path(out), Path(out).with_suffix(".png")):
            check_output_path(target, directory=False, what="Bench report")
    except ConfigError as err:
        raise click.BadParameter(str(err), param_hint="'--out'") from None
    result = run_bench(size, with_load, log=lambda m: click.echo(m, err=True))
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out_path.with_suffix(".png"))
    click.echo(f"{'path':<14} {'compile s':>9} {'first s':>8} {'median us':>10} {'p90 us':>8}")
    for name, m in result["measurements"].items():
        click.echo(
            f"{name:<14} {m['compile_s']:>9.3f} {m['first_call_s']:>8.4f} "
            f"{1e6 * m['median_s']:>10.1f} {1e6 * m['p90_s']:>8.1f}"
        )
    click.echo(f"{'ratio':<28} {'median':>7} {'fastest':>8} {'rounds min-max':>15} {'A/A':>5}")
    for name, value in result["ratios"].items():
        target = result["targets"].get(name)
        d = result["ratio_details"][name]
        click.echo(
            f"{name:<28} {value:7.2f} {d['from_fastest']:8.2f} "
            f"{d['min']:7.2f}-{d['max']:<7.2f} {d['aa']:5.2f}"
            + (f"   (target >= {target})" if target else "")
        )
    if "load" in result:
        load = result["load"]
        click.echo(
            f"load: highest sustained {load['highest_sustained_rps']} req/s, "
            f"p99/p50 {load['p99_over_p50_at_highest_sustained']} (target <= 5)"
        )
    click.echo(f"report: {out_path} (plot {out_path.with_suffix('.png')})")
