"""`mlp-classifier bench`: one training epoch of the project's MLP, four ways, timed
side by side: compile apart from execution, interleaved rounds, ratios with an A/A control.

Run: `mlp-classifier bench [--out runs/bench.json] [--size default|tiny]`.
The default size takes one to three minutes on a shared 2-core CPU (mostly
the 25 rounds of the large setting); `tiny` takes seconds and is for tests.
It prints a table, writes the JSON report to `--out` and a plot of the time
distributions next to it (same name, `.png`). Progress goes to stderr.

The paths, all training the same `model.MLP` with `train.loss_fn`, the same
optimizer, initial weights and batches:
  (a) `nnx_jit`: a Python loop over an `nnx.jit` step (in-place updates).
  (b) `split_jit`: `nnx.split` once, a Python loop over a pure `jax.jit` step
      on `(graphdef, state)`, `nnx.merge` when the weights are read back: the
      lean per-step loop, the baseline of `scan_vs_per_step`.
  (c) `scan`: the whole epoch as one `jax.lax.scan` inside one `jax.jit`.
  (d) `torch`: the same MLP in PyTorch eager (only if torch is installed), at
      the thread count (1 or one per core) that was faster in a trial.
  `scan_aa`: a second instance of (c) with its own state, reusing (c)'s
      executable: the A/A control; its ratio to (c) shows the noise.
  `train_step` (small setting only): the project's own `train.train_step` in
      a Python loop, i.e. what `mlp-classifier train` runs per step.
(b) and (c) donate the training state to the step, so XLA may update it in
place. The batches of an epoch are put on the device before timing (their
transfer time is reported apart), so no path waits for input.

Two settings: `small` (the project's default config: hidden (256, 128),
batch 32, the digits train split) for the loop-overhead ratios, and `large`
(hidden (512, 512), batch 512, synthetic uniform [0, 1) inputs of width 512)
where the epoch's FLOP rate is compared with a large f32 GEMM timed in the
same rounds (`gemm_ceiling`). The large setting also times three bounds
(`LIMIT_PATHS`): the scan epoch without dropout, also with SGD instead of
AdamW, and the epoch's matrix products alone (`matmul_floor`); their
`*_vs_gemm_ceiling` ratios and `flops.large.limits_ms_per_step` say what
stops the epoch short of the ceiling.

Ratios are `<setting>/<a>_vs_<b>` = median time of b / median time of a:
above 1 means a is faster. `ratio_details` gives each one's baseline, the
A/A control and the per-round ratios (min, median, max); see `bench_report`.
The settings and their batches are in `bench_settings.py`, the timed paths in
`bench_paths.py` (the PyTorch one in `bench_torch.py`), the timing harness in
`bench_timing.py`, the ratio and report helpers in `bench_report.py`; this
file runs the settings and writes the report.
"""

import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import jax
import numpy as np

from mlp_classifier import data
from mlp_classifier.bench_paths import (
    GemmPath,
    MatmulFloorPath,
    NnxJitPath,
    ScanPath,
    ScopedPath,
    SplitJitPath,
    TrainStepPath,
    init_train_state,
)
from mlp_classifier.bench_report import (
    BASELINES,
    LIMIT_PATHS,
    identity,
    limit_costs,
    plot,
    ratio,
    ratio_entry,
    round_ratios,
    table,
)
from mlp_classifier.bench_settings import Setting, bench_size, make_batches
from mlp_classifier.bench_timing import CompileCounter, TimedPath, measure
from mlp_classifier.config import Config

# Expected ratios (from the project's issues); reported, never asserted.
# `scan_vs_per_step` is the scan against the lean per-step loop (split_jit);
# the same 3x expected of it was first measured against the nnx.jit loop,
# kept as `scan_vs_nnx_jit`.
TARGETS = {
    "small/scan_vs_per_step": 3.0,
    "small/scan_vs_nnx_jit": 3.0,
    "small/scan_vs_torch": 1.5,
    "large/scan_vs_gemm_ceiling": 0.85,
}

# --- ONE SETTING ---------------------------------------------------------------


def _pairs(measurements: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """The time ratios of a setting, `name -> (a, b)`, for the paths it measured."""
    pairs = {
        "scan_vs_per_step": ("scan", "split_jit"),
        "scan_vs_nnx_jit": ("scan", "nnx_jit"),
        "split_jit_vs_nnx_jit": ("split_jit", "nnx_jit"),
        "scan_vs_scan_aa": ("scan", "scan_aa"),
        "scan_vs_torch": ("scan", "torch"),
        "scan_vs_train_step": ("scan", "train_step"),
        "scan_vs_scan_partitionable_bits": ("scan", "scan_partitionable_bits"),
        "scan_vs_scan_original_bits": ("scan", "scan_original_bits"),
    }
    return {k: v for k, v in pairs.items() if v[0] in measurements and v[1] in measurements}


def limit_paths(setting: Setting, batches: dict[str, np.ndarray]) -> list[TimedPath]:
    """The `LIMIT_PATHS` of `setting`, on the same batches and initial weights."""

    def variant(**update: Any) -> Setting:
        config = Config(**{**setting.config.model_dump(), **update})
        return dataclasses.replace(setting, config=config)

    sgd = variant(dropout_rate=0.0, optimizer="sgd", weight_decay=0.0)
    return [
        ScanPath("scan_no_dropout", variant(dropout_rate=0.0), batches),
        ScanPath("scan_sgd_no_dropout", sgd, batches),
        MatmulFloorPath("matmul_floor", setting, batches),
    ]


def threefry_mode(setting: Setting) -> contextlib.AbstractContextManager[Any]:
    """The PRNG mode `setting` runs under: `jax.threefry_partitionable(value)`
    when the setting names one (a `scan_partitionable_bits` path then runs
    under the opposite value), else JAX's default, left untouched."""
    if setting.threefry_partitionable is None:
        return contextlib.nullcontext()
    return jax.threefry_partitionable(setting.threefry_partitionable)


def run_setting(
    setting: Setting,
    repeats: int,
    gemm_n: int | None,
    torch_module: Any,
    counter: CompileCounter,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Builds every path for `setting`, measures them interleaved and derives
    the ratios, the loss-agreement checks and (with `gemm_n`) the FLOP rates.
    Measurement keys are `<setting>/<path>`. The caller enters
    `threefry_mode(setting)` around it."""
    batches = make_batches(setting)
    # Host->device placement of one epoch, timed apart: the paths get their
    # batches on the device before the clock starts, so no step waits for data.
    start = time.perf_counter()
    jax.block_until_ready(jax.device_put(batches))
    transfer_s = time.perf_counter() - start

    scan = ScanPath("scan", setting, batches)
    split = SplitJitPath("split_jit", setting, batches)
    paths: list[TimedPath] = [NnxJitPath("nnx_jit", setting, batches), split, scan]
    torch_path = None
    if torch_module is not None:
        model, _optimizer = init_train_state(setting)
        torch_path = torch_module.TorchPath(model, setting.config, batches, setting.config.seed)
        paths.append(torch_path)
    paths.append(ScanPath("scan_aa", setting, batches, twin_of=scan))
    if setting.threefry_partitionable is not None:
        other = not setting.threefry_partitionable
        name = "scan_partitionable_bits" if other else "scan_original_bits"
        paths.append(ScopedPath(other, lambda: ScanPath(name, setting, batches)))
    if setting.in_features == data.NUM_FEATURES:
        paths.append(TrainStepPath("train_step", setting, batches))
    gemm = None
    if gemm_n is not None:
        gemm = GemmPath("gemm_ceiling", gemm_n, setting.config.seed)
        paths.append(gemm)
        paths.extend(limit_paths(setting, batches))

    steps = batches["image"].shape[0]
    log(
        f"[{setting.name}] hidden {setting.config.hidden_sizes}, batch "
        f"{setting.config.batch_size}, {steps} steps/epoch, {setting.source} data"
    )
    measurements, first_losses = measure(paths, repeats, counter, log)
    if torch_path is not None:
        measurements["torch"].update(
            threads=torch_path.threads, thread_trials_s=torch_path.thread_trials_s
        )

    ratios: dict[str, float] = {}
    details: dict[str, dict[str, Any]] = {}
    aa = ratio(measurements, "scan", "scan_aa")
    for name, (a, b) in _pairs(measurements).items():
        ratios[name] = ratio(measurements, a, b)
        rounds = round_ratios(measurements, a, b)
        details[name] = ratio_entry(BASELINES[b], aa, rounds)
    if torch_path is not None:
        details["scan_vs_torch"]["baseline"] += (
            f" ({torch_path.threads} thread(s), its faster of "
            f"{', '.join(torch_path.thread_trials_s)} in a trial)"
        )

    # Same init, same batches: the JAX paths' first-epoch losses must agree to
    # float32 rounding (dropout keys included, since the RNG state is part of
    # the model state). Torch draws other dropout masks, so its losses are
    # compared only when dropout is off.
    reference = first_losses["nnx_jit"]
    checks = {
        f"{name}_vs_nnx_jit_max_abs_loss_diff": float(np.max(np.abs(losses - reference)))
        for name, losses in first_losses.items()
        if name != "nnx_jit"
        and name not in LIMIT_PATHS
        and name not in ("scan_partitionable_bits", "scan_original_bits")
        and (name != "torch" or setting.config.dropout_rate == 0.0)
    }

    # XLA's cost analysis counts a while loop's body once, whatever its trip
    # count (checked: the scan executable reports the FLOPs of one step), so
    # the epoch's FLOPs are the scan's figure times the number of steps.
    flops = {
        "scan_cost_analysis_flops": scan.cost["flops"],
        "scan_cost_analysis_bytes_accessed": scan.cost["bytes_accessed"],
        "step_cost_analysis_flops": split.cost["flops"],
        "steps_per_epoch": steps,
        "epoch_flops": scan.cost["flops"] * steps,
        "scan_flop_per_s": scan.cost["flops"] * steps / measurements["scan"]["median_s"],
    }
    if gemm is not None:
        gemm_rate = gemm.flops / measurements["gemm_ceiling"]["median_s"]
        flops.update(
            gemm_n=gemm.n,
            gemm_flops=gemm.flops,
            gemm_cost_analysis_flops=gemm.cost["flops"],
            gemm_flop_per_s=gemm_rate,
        )
        bits = [p for p in ("scan_partitionable_bits", "scan_original_bits") if p in measurements]
        for path in ("scan", *bits, *LIMIT_PATHS):
            name = f"{path}_vs_gemm_ceiling"
            ratios[name] = flops["epoch_flops"] / measurements[path]["median_s"] / gemm_rate
            # Per round: the epoch's FLOP rate over the GEMM's, both from that round.
            rounds = [
                (flops["epoch_flops"] / t_path) / (gemm.flops / t_gemm)
                for t_path, t_gemm in zip(
                    measurements[path]["times_s"],
                    measurements["gemm_ceiling"]["times_s"],
                    strict=True,
                )
            ]
            baseline = BASELINES["gemm_ceiling"]
            if path in LIMIT_PATHS:
                baseline += f"; {path} is a bound, not a result: {LIMIT_PATHS[path]}"
            elif path != "scan":
                baseline += f"; {BASELINES[path]}"
            details[name] = ratio_entry(baseline, aa, rounds)
        flops["limits_ms_per_step"] = limit_costs(measurements, steps)

    return {
        "measurements": {f"{setting.name}/{k}": v for k, v in measurements.items()},
        "ratios": {f"{setting.name}/{k}": v for k, v in ratios.items()},
        "ratio_details": {f"{setting.name}/{k}": v for k, v in details.items()},
        "checks": {f"{setting.name}/{k}": v for k, v in checks.items()},
        "setting": {**setting.describe(), "steps_per_epoch": steps, "transfer_s": transfer_s},
        "flops": flops,
    }


def _torch_or_reason() -> tuple[Any, str | None]:
    """The torch path module, or None and the reason it is skipped."""
    try:
        from mlp_classifier import bench_torch
    except ImportError as err:
        return None, (
            f"torch is not importable ({err}); install the optional extra "
            f"`mlp-classifier[torch]` to run the PyTorch baseline."
        )
    return bench_torch, None


def run_bench(size_name: str, repeats: int | None, log: Callable[[str], None]) -> dict[str, Any]:
    """Runs both settings and returns the report (see the module docstring)."""
    size = bench_size(size_name)
    if repeats is not None:
        size = dataclasses.replace(size, repeats=repeats)
    torch_module, skip_reason = _torch_or_reason()
    torch_info: dict[str, Any] = {}
    previous_threads = None
    if torch_module is not None:
        import torch

        # TorchPath.prepare picks the thread count per setting; restore after.
        previous_threads = torch.get_num_threads()
        torch_info = {"version": torch.__version__, "threads": "per setting"}
    try:
        with CompileCounter() as counter:
            with threefry_mode(size.small):
                small = run_setting(size.small, size.repeats, None, torch_module, counter, log)
            with threefry_mode(size.large):
                large = run_setting(
                    size.large, size.repeats, size.gemm_n, torch_module, counter, log
                )
    finally:
        if previous_threads is not None:
            torch.set_num_threads(previous_threads)

    notes = [
        "One call of a training path is one epoch; ratios compare median epoch times.",
        "Batches are placed on the device before timing; settings.*.transfer_s is that "
        "placement, timed apart.",
        "epoch_flops = the scan executable's cost-analysis FLOPs x steps per epoch: XLA "
        "counts a while-loop body once.",
        "large uses synthetic inputs (uniform [0, 1), width 512), not the digits.",
    ]
    if skip_reason is not None:
        notes.append(f"torch path skipped: {skip_reason}")
    return {
        "identity": identity(size, size_name, torch_info),
        "measurements": {**small["measurements"], **large["measurements"]},
        "ratios": {**small["ratios"], **large["ratios"]},
        "ratio_details": {**small["ratio_details"], **large["ratio_details"]},
        "targets": {
            name: {
                "expected_at_least": target,
                "measured": (value := {**small["ratios"], **large["ratios"]}.get(name)),
                "met": None if value is None else bool(value >= target),
            }
            for name, target in TARGETS.items()
        },
        "checks": {**small["checks"], **large["checks"]},
        "settings": {"small": small["setting"], "large": large["setting"]},
        "flops": {"small": small["flops"], "large": large["flops"]},
        "size": size_name,
        "repeats": size.repeats,
        "torch_skipped": skip_reason,
        "notes": notes,
    }


class BadInput(click.ClickException):
    """A user-facing error: printed as one message, exit code 2, no traceback."""

    exit_code = 2


def _check_out(out: Path) -> None:
    """`--out` must be creatable, and not the plot's own path."""
    if out.with_suffix(".png") == out:
        raise BadInput(f"`--out {out}` is where the plot goes; give the JSON report another name.")
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"`--out {out}` cannot be written: `{parent}` is not a directory.")


@click.command("bench")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("runs/bench.json"),
    show_default=True,
    help="JSON report; the plot is written next to it with a .png suffix.",
)
@click.option(
    "--size",
    type=click.Choice(["tiny", "default"]),
    default="default",
    show_default=True,
    help="`default`: the measured run (1-3 minutes). `tiny`: seconds, for tests.",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=None,
    help="Timed epochs per path (default: 25, or 3 for `tiny`).",
)
def bench(out: Path, size: str, repeats: int | None) -> None:
    """Time one training epoch four ways (nnx.jit loop, split+jit loop, one
    scan, PyTorch eager) and write a JSON report and a plot."""

    def log(message: str) -> None:
        click.echo(message, err=True)
        sys.stderr.flush()

    _check_out(out)  # Before the minutes of timing, not after.
    report = run_bench(size, repeats, log)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot_path = out.with_suffix(".png")
    plot(report, plot_path)
    click.echo(table(report))
    click.echo(f"\nwrote {out} and {plot_path}")
