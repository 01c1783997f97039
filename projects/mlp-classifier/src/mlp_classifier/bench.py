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
The timed paths are in `bench_paths.py` (the PyTorch one in `bench_torch.py`),
the timing harness in `bench_timing.py`, the report helpers in
`bench_report.py`; this file holds the settings, runs them and writes the report.
"""

import dataclasses
import functools
import json
import math
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
    SplitJitPath,
    TrainStepPath,
    init_train_state,
)
from mlp_classifier.bench_report import identity, plot, ratio, ratio_entry, round_ratios, table
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

# The baseline of each ratio `<a>_vs_<b>`, named by its `b` path.
BASELINES = {
    "split_jit": "split_jit: the lean per-step loop a practitioner writes, nnx.split once, "
    "a Python loop over one jax.jit step on (graphdef, state) with the state donated, "
    "nnx.merge when the weights are read",
    "nnx_jit": "nnx_jit: a Python loop over an nnx.jit step, which walks the object graph "
    "in Python on every call (the slowest per-step loop, kept to show that cost)",
    "scan_aa": "scan_aa: a second copy of the scan path (same executable, own state), "
    "interleaved with it: the A/A control",
    "torch": "torch: the same MLP, loss, AdamW, weights and batches in PyTorch eager, "
    "a Python loop over optimizer steps",
    "train_step": "train_step: the project's own train.train_step (split + jax.jit, no "
    "donation) in a Python loop, what `mlp-classifier train` runs",
    "gemm_ceiling": "gemm_ceiling: one jitted f32 n x n @ n x n matmul timed in the same "
    "rounds; the ratio is the epoch's FLOP/s (cost analysis) over the GEMM's",
}


# --- SIZES -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    """One workload, run identically by every path.

    name: `small` or `large`; prefixes the setting's measurement and ratio keys.
    config: the project config that fixes the model, optimizer, dropout and
      batch size (`Config.seed` fixes the initial weights and data order).
    source: `digits` (the project's train split, padded to whole batches) or
      `synthetic` (uniform [0, 1) features, uniform labels, no padding).
    in_features: input width; 64 for `digits`.
    num_steps: steps per epoch; for `digits`, None means the whole train split.
    """

    name: str
    config: Config
    source: str
    in_features: int
    num_steps: int | None

    def describe(self) -> dict[str, Any]:
        """The setting as JSON-ready data (also what the config hash covers)."""
        return {
            "config": self.config.model_dump(mode="json"),
            "source": self.source,
            "in_features": self.in_features,
            "num_steps": self.num_steps,
        }


@dataclasses.dataclass(frozen=True)
class BenchSize:
    """A full bench run: both settings, `repeats` timed epochs per path, and a
    `gemm_n`-cubed f32 matmul for the FLOP/s ceiling."""

    small: Setting
    large: Setting
    repeats: int
    gemm_n: int


def bench_size(size: str) -> BenchSize:
    """`default`: the measured run (1-3 minutes). `tiny`: the same code on
    toy shapes and 3 repeats, a few seconds, for tests only."""
    base = Config.default()
    if size == "tiny":
        small = Config(**{**base.model_dump(), "hidden_sizes": (16,), "dropout_rate": 0.1})
        large = Config(**{**base.model_dump(), "hidden_sizes": (32, 32), "batch_size": 64})
        return BenchSize(
            small=Setting("small", small, "digits", data.NUM_FEATURES, num_steps=4),
            large=Setting("large", large, "synthetic", 32, num_steps=3),
            repeats=3,
            gemm_n=128,
        )
    if size == "default":
        # The project default, widened: same depth as its (256, 128), width 512.
        large_hidden = tuple(512 for _ in base.hidden_sizes) or (512,)
        large = Config(**{**base.model_dump(), "hidden_sizes": large_hidden, "batch_size": 512})
        return BenchSize(
            small=Setting("small", base, "digits", data.NUM_FEATURES, num_steps=None),
            large=Setting("large", large, "synthetic", 512, num_steps=16),
            repeats=25,
            gemm_n=2048,
        )
    raise click.BadParameter(f"Unknown bench size `{size}`; use `tiny` or `default`.")


# --- DATA --------------------------------------------------------------------


def make_batches(setting: Setting) -> dict[str, np.ndarray]:
    """One epoch of batches, stacked: `image` float32 `(S, B, F)`, `label`
    int32 `(S, B)`, `mask` bool `(S, B)`. Same setting, same arrays."""
    config = setting.config
    batch_size = config.batch_size
    rng = np.random.default_rng(config.seed)
    if setting.source == "digits":
        digits, ids = _digits_train_split(
            config.split_seed, config.val_fraction, config.test_fraction
        )
        ids = rng.permutation(ids)
        num_steps = math.ceil(len(ids) / batch_size)
        if setting.num_steps is not None:
            num_steps = min(num_steps, setting.num_steps)
        ids = ids[: num_steps * batch_size]
        # The last batch is padded and masked, as in the project's pipeline.
        padded = np.full(num_steps * batch_size, -1)
        padded[: len(ids)] = ids
        images = np.where(padded[:, None] >= 0, digits.images[padded], 0.0).astype(np.float32)
        labels = np.where(padded >= 0, digits.labels[padded], 0).astype(np.int32)
        mask = padded >= 0
    elif setting.source == "synthetic":
        n = setting.num_steps * batch_size
        images = rng.random((n, setting.in_features), dtype=np.float32)
        labels = rng.integers(0, data.NUM_CLASSES, n).astype(np.int32)
        mask = np.ones(n, dtype=bool)
    else:
        raise ValueError(f"Unknown data source `{setting.source}`; use `digits` or `synthetic`.")
    return {
        "image": images.reshape(-1, batch_size, setting.in_features),
        "label": labels.reshape(-1, batch_size),
        "mask": mask.reshape(-1, batch_size),
    }


@functools.cache
def _digits_train_split(
    split_seed: int, val_fraction: float, test_fraction: float
) -> tuple[data.Digits, np.ndarray]:
    """The digits and the project's train IDs; cached because `split_ids`
    compiles a permutation per class size, seconds on a busy 2-core machine."""
    digits = data.load()
    key = jax.random.key(split_seed)
    return digits, data.split_ids(digits.labels, key, val_fraction, test_fraction)["train"]


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
    }
    return {k: v for k, v in pairs.items() if v[0] in measurements and v[1] in measurements}


# The bounds timed in the large setting: what the epoch would cost if a part
# of its work were free. Their `*_vs_gemm_ceiling` ratios use the real
# model's epoch FLOPs, so they read "the fraction of the ceiling the epoch
# would reach without ...".
LIMIT_PATHS = {
    "scan_no_dropout": "the scan epoch with dropout_rate 0 (no random bits, no masks)",
    "scan_sgd_no_dropout": "also with optax.sgd (momentum 0.9) instead of AdamW",
    "matmul_floor": "the epoch's 8 matrix products per step alone (bench_paths.MatmulFloorPath)",
}


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


def limit_costs(measurements: dict[str, dict[str, Any]], steps: int) -> dict[str, float]:
    """Milliseconds per step, from the medians: `dropout` (scan minus
    scan_no_dropout), `adamw_over_sgd` (scan_no_dropout minus
    scan_sgd_no_dropout), `other_non_matmul` (scan_sgd_no_dropout minus
    matmul_floor: biases, relu, softmax cross-entropy, SGD, copies) and
    `matmuls` (matmul_floor). Differences of medians: noisy, can be negative."""
    med = {k: measurements[k]["median_s"] * 1e3 / steps for k in ("scan", *LIMIT_PATHS)}
    return {
        "dropout": med["scan"] - med["scan_no_dropout"],
        "adamw_over_sgd": med["scan_no_dropout"] - med["scan_sgd_no_dropout"],
        "other_non_matmul": med["scan_sgd_no_dropout"] - med["matmul_floor"],
        "matmuls": med["matmul_floor"],
        "step": med["scan"],
    }


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
    Measurement keys are `<setting>/<path>`."""
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
        for path in ("scan", *LIMIT_PATHS):
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
            if path != "scan":
                baseline += f"; {path} is a bound, not a result: {LIMIT_PATHS[path]}"
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
            small = run_setting(size.small, size.repeats, None, torch_module, counter, log)
            large = run_setting(size.large, size.repeats, size.gemm_n, torch_module, counter, log)
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
