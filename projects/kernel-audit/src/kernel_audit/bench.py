"""`kernel-audit bench`: the kernels timed against XLA's compilation of the same
`jax.numpy` code, every figure labelled with the mode it was measured in.

Run: `kernel-audit bench [--out runs/bench.json] [--size auto|tiny|cpu|tpu]
[--mode auto|interpret|compiled] [--seed S]`. Writes the JSON report and a PNG
(same name) of the time distributions.

Execution modes:
  - `interpret`: the Pallas interpreter (any backend; the default off a TPU). Its
    timings are kept for the record and are correctness-only: the interpreter
    runs the kernel as a loop of XLA ops over the grid, so its speed says
    nothing about the compiled kernel. The report then makes no speed claim:
    no kernel ratio, no roofline placement of a kernel, every optimization,
    block-size verdict and `where_kernel_stops_helping` marked unmeasured.
  - `compiled`: the kernel compiled by Mosaic for the TPU. Ratios
    `pallas_<blocks>_vs_xla` (above 1: the kernel is faster), a block-size sweep
    summarised per setting (`blocking`: best block, best against worst), a
    fused-vs-unfused epilogue ratio, and each run on a roofline built from the
    tiling's bytes and FLOPs, against the ceilings measured in the same run (an
    XLA GEMM for FLOP/s, a device copy for bytes/s: `vs_measured_ceilings`) and
    against the chip's nominal figures (`vs_nominal_chip`, a TPU v5e only).
    `where_kernel_stops_helping` lists the settings where the best block size is
    slower than XLA.
  - `xla`: the `jax.numpy` reference compiled by XLA, on whatever backend runs.

Every path is timed the same way (`bench_timing.measure`), in rounds whose path
order is shuffled from the recorded seed; `xla_aa` is a second compilation of
the XLA path, the A/A control. A path that fails to lower, compile or first run
is recorded under `failed_paths` (setting -> path -> one-line error) and the run
goes on without it.
"""

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import jax
import jax.numpy as jnp

from kernel_audit import checkpoint, kernels
from kernel_audit.bench_report import _table, identity, nominal_chip, plot, ratio_details
from kernel_audit.bench_settings import measure_ceilings, run_matmul_setting, run_row_setting
from kernel_audit.bench_sizes import (
    SIZES,
    BenchSize,
    bench_configs,
    resolve_size,
    tpu_bench_configs,
)

__all__ = [
    "SIZES",
    "BenchSize",
    "analyse",
    "bench",
    "bench_configs",
    "layer_norm_cost",
    "matmul_tiling_cost",
    "resolve_size",
    "roofline_placement",
    "run_bench",
    "tpu_bench_configs",
]

UNMEASURED = (
    "unmeasured: the kernel ran in interpret mode, whose timings say nothing about "
    "the compiled kernel; run `kernel-audit bench` on a TPU to measure it"
)


XLA_FAILED = (
    "unmeasured: XLA's path of this setting failed to compile (see `failed_paths`), so "
    "there is no baseline to compare the kernel with"
)


# --- ROOFLINE ------------------------------------------------------------------------


def matmul_tiling_cost(m: int, k: int, n: int, blocks: kernels.MatmulBlocks, itemsize: int):
    """FLOPs and HBM bytes of the tiled matmul, from the tiling alone. The grid is
    ceil(M/bm) x ceil(N/bn) x ceil(K/bk): over its K steps each (i, j) program
    reads a (bm, K) strip of `x` and a (K, bn) strip of `w` block by block, reads
    bn bias entries once, and writes one (bm, bn) tile at its last step.

    Cases:
        FLOPs -> `2 M N K + 2 M N` (multiply-adds, plus one op each for bias and
            activation), independent of the blocks [claim:tiling-flops]
        an edge program (M or N not a multiple of its block) -> counts only its
            in-bounds rows and columns, so in total `x` is read `ceil(N/bn)` times,
            `w` and `b` `ceil(M/bm)` times, and the output written once
            [claim:tiling-bytes-per-program]
        bytes -> those element counts times `itemsize` [claim:tiling-bytes-times-itemsize]
    Returns `{"flops", "bytes", "intensity"}` as floats, intensity = flops / bytes
    [claim:tiling-intensity].
    (With a single K step, `block_k = K`, the pipeline may keep an `x` block for
    the next `j` instead of fetching it again; the count is then an upper bound.)
    """
    # --- exercise stage 3: Count FLOPs and the bytes every program reads and writes. ---
    gm, gn = -(-m // blocks.block_m), -(-n // blocks.block_n)
    flops = 2.0 * m * n * k + 2.0 * m * n  # multiply-adds, bias, activation ~ 1 op
    bytes_ = itemsize * (m * k * gn + k * n * gm + n * gm + m * n)
    return {"flops": flops, "bytes": float(bytes_), "intensity": flops / bytes_}
    # --- end exercise ---


def layer_norm_cost(rows: int, cols: int, itemsize: int) -> dict[str, float]:
    """FLOPs and HBM bytes of the layer norm, whatever its row block: every row is
    read once and written once, `gamma` and `beta` read once (their block never
    moves), and two float32 statistics written per row; about 8 operations per
    entry (sum, subtract, square, sum, scale, multiply, add, cast)."""
    flops = 8.0 * rows * cols
    bytes_ = float(itemsize * (2 * rows * cols + 2 * cols) + 8 * rows)
    return {"flops": flops, "bytes": bytes_, "intensity": flops / bytes_}


def _attach_costs(settings: list[dict[str, Any]]) -> None:
    """Puts the tiling's cost on every fused kernel path of every setting."""
    for s in settings:
        itemsize = jnp.dtype(kernels.DTYPES[s["dtype"]]).itemsize
        for name, blocks in s["kernel_blocks"].items():
            if s["kernel"] == "layer_norm":
                cost = layer_norm_cost(*s["shape"], itemsize)
            else:
                cost = matmul_tiling_cost(*s["shape"], kernels.MatmulBlocks(*blocks), itemsize)
            s["results"][name]["cost"] = cost


def roofline_placement(
    intensity: float, flops_per_s: float, bytes_per_s: float, peak_flops: float, peak_bytes: float
) -> dict[str, Any]:
    """A run at `flops_per_s` and `bytes_per_s` (intensity FLOPs/byte) under one
    pair of ceilings: attainable = min(peak_flops, intensity x peak_bytes), limited
    by compute where peak_flops is the smaller (a tie counts as compute), else by
    memory bandwidth; the fractions of the roofline and of each ceiling."""
    ridge = intensity * peak_bytes
    attainable = min(peak_flops, ridge)
    return {
        "flops_per_s": peak_flops,
        "bytes_per_s": peak_bytes,
        "attainable_flops_per_s": attainable,
        "limited_by": "compute" if peak_flops <= ridge else "memory bandwidth",
        "fraction_of_roofline": flops_per_s / attainable,
        "fraction_of_flops_ceiling": flops_per_s / peak_flops,
        "fraction_of_bytes_ceiling": bytes_per_s / peak_bytes,
    }


# --- ANALYSIS ------------------------------------------------------------------------


def analyse(
    settings: list[dict[str, Any]],
    ceilings: dict[str, Any],
    compiled: bool,
    nominal: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Ratios, roofline placements, block-size and fusion verdicts, the blocking
    summary and where the kernel stops helping.

    A path is placed on the roofline from its cost (`flops` and `bytes`, or XLA's
    `bytes_accessed`) and its median: against the ceilings measured in the run (the
    GEMM of the setting's `kind` where one was measured, else the headline one) and,
    given `nominal`, against the chip's nominal figures. With `compiled=False`
    (interpret mode) only the A/A ratios and the XLA placements are computed and
    everything about kernel speed is marked unmeasured. Returns `ratios`,
    `roofline`, `optimizations`, `blocking`, `where_kernel_stops_helping`."""
    ratios: dict[str, float] = {}
    roofline: dict[str, Any] = {}
    optimizations: list[dict[str, Any]] = []
    blocking: dict[str, Any] = {}
    stops_helping: list[dict[str, Any]] = []
    best_vs_xla: dict[str, float] = {}
    for s in settings:
        name, res = s["setting"], s["results"]
        has_xla = "xla" in res  # Absent only where XLA's own path failed to compile.
        if has_xla and "xla_aa" in res:
            ratios[f"{name}/xla_vs_xla_aa"] = res["xla_aa"]["median_s"] / res["xla"]["median_s"]
        kernel_paths = [p for p in res if p.startswith("pallas_") and "unfused" not in p]
        peak = ceilings.get("flops_per_s_by_kind", {}).get(s.get("kind"), ceilings["flops_per_s"])
        for p in kernel_paths + ["xla"] * has_xla:
            cost = res[p].get("cost", {})
            flops = cost.get("flops")
            bytes_ = cost.get("bytes", cost.get("bytes_accessed"))
            entry: dict[str, Any] = {
                "execution_mode": res[p]["execution_mode"],
                "flops": flops,
                "bytes": bytes_,
                "source": "XLA cost analysis" if p == "xla" else "the kernel's tiling",
            }
            if flops and bytes_ and (p == "xla" or compiled):
                achieved, moved = flops / res[p]["median_s"], bytes_ / res[p]["median_s"]
                entry.update(
                    intensity_flops_per_byte=flops / bytes_,
                    achieved_flops_per_s=achieved,
                    achieved_bytes_per_s=moved,
                    vs_measured_ceilings=roofline_placement(
                        flops / bytes_, achieved, moved, peak, ceilings["bytes_per_s"]
                    ),
                )
                if nominal is not None:
                    entry["vs_nominal_chip"] = roofline_placement(
                        flops / bytes_,
                        achieved,
                        moved,
                        nominal["flops_per_s"],
                        nominal["bytes_per_s"],
                    )
            elif flops and bytes_:
                entry["intensity_flops_per_byte"] = flops / bytes_
                entry["placement"] = UNMEASURED
            roofline[f"{name}/{p}"] = entry
        if not kernel_paths:
            continue
        refused = sorted(s.get("refused_blocks", {}))
        if compiled and not has_xla:
            blocking[name] = {"status": XLA_FAILED, "valid": kernel_paths, "refused": refused}
            optimizations.append({"optimization": f"{name}: block sizes", "status": XLA_FAILED})
        elif compiled:
            xla = res["xla"]["median_s"]
            for p in kernel_paths:
                ratios[f"{name}/{p}_vs_xla"] = xla / res[p]["median_s"]
            best = min(kernel_paths, key=lambda p: res[p]["median_s"])
            worst = max(kernel_paths, key=lambda p: res[p]["median_s"])
            speedup = xla / res[best]["median_s"]
            blocking[name] = {
                "status": "measured",
                "best": best,
                "worst": worst,
                "best_median_s": res[best]["median_s"],
                "worst_median_s": res[worst]["median_s"],
                "best_vs_worst": res[worst]["median_s"] / res[best]["median_s"],
                "valid": kernel_paths,
                "refused": refused,
            }
            optimizations.append(
                {
                    "optimization": f"{name}: block size {best.removeprefix('pallas_')}",
                    "status": "measured",
                    "evidence": {p: res[p]["median_s"] for p in kernel_paths},
                }
            )
            unfused = [p for p in res if "unfused" in p]
            fused = unfused[0].replace("unfused_", "") if unfused else None
            if fused in res:
                ratio = res[unfused[0]]["median_s"] / res[fused]["median_s"]
                ratios[f"{name}/{fused}_vs_{unfused[0]}"] = ratio
                optimizations.append(
                    {
                        "optimization": f"{name}: bias + gelu fused into the matmul epilogue",
                        "status": "measured",
                        "evidence": {"fused_vs_unfused": ratio},
                    }
                )
            best_vs_xla[name] = speedup
            if speedup < 1.0:
                stops_helping.append(
                    {"setting": name, "best_blocks": best, "best_kernel_vs_xla": speedup}
                )
        else:
            blocking[name] = {"status": UNMEASURED, "valid": kernel_paths, "refused": refused}
            optimizations.append(
                {"optimization": f"{name}: block sizes {kernel_paths}", "status": UNMEASURED}
            )
            if any("unfused" in p for p in res):
                optimizations.append(
                    {"optimization": f"{name}: fused epilogue", "status": UNMEASURED}
                )
    where: dict[str, Any] = (
        {
            "status": "measured",
            "settings_where_xla_is_faster": stops_helping,
            "best_kernel_vs_xla": best_vs_xla,
        }
        if compiled
        else {"status": UNMEASURED}
    )
    return {
        "ratios": ratios,
        "roofline": roofline,
        "optimizations": optimizations,
        "blocking": blocking,
        "where_kernel_stops_helping": where,
    }


# --- THE RUN ---------------------------------------------------------------------------


def run_bench(
    size_name: str = "auto",
    interpret: bool | None = None,
    repeats: int | None = None,
    seed: int = 0,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Runs every setting of the size and returns the report. `interpret=None`
    compiles on a TPU and interprets elsewhere; the `tpu` size needs compiled
    kernels (a `ValueError` otherwise: interpreting 8192^3 would take hours)."""
    if interpret is None:
        interpret = kernels.default_interpret()
    size_name = resolve_size(size_name, interpret)
    if size_name == "tpu" and interpret:
        raise ValueError(
            "The `tpu` bench size times compiled kernels up to 8192^3 and cannot run in "
            "interpret mode; use `--size cpu` or `--size tiny` there."
        )
    size = SIZES[size_name]
    if repeats is not None:
        size = dataclasses.replace(size, repeats=repeats)
    compiled = not interpret
    mode = kernels.execution_mode(interpret)
    log(f"kernel execution mode: {mode}; path order seed {seed}")
    ceilings = measure_ceilings(size, seed, log)
    settings = [run_matmul_setting(s, size, interpret, seed, log) for s in size.matmuls]
    settings += [run_row_setting(s, size, interpret, seed, log) for s in size.layer_norms]
    _attach_costs(settings)
    nominal = nominal_chip()
    analysis = analyse(settings, ceilings, compiled, nominal)
    measurements = {
        f"{s['setting']}/{path}": result for s in settings for path, result in s["results"].items()
    }
    if compiled:
        claim = (
            f"timed on the target ({jax.default_backend()}, kernels compiled): ratios "
            f"`*_vs_xla` compare the compiled kernel with XLA's compilation of the same "
            f"jax.numpy code; roofline fractions are given against the ceilings measured in "
            f"this run (`vs_measured_ceilings`) and the chip's nominal figures "
            f"(`vs_nominal_chip`, where the chip is known)"
        )
    else:
        claim = (
            "none: the kernels ran in interpret mode; their timings are correctness-only "
            "and no speed is claimed."
        )
    return {
        "identity": identity(size_name, size, interpret, seed),
        "size": size_name,
        "kernel_execution_mode": mode,
        "speed_claims": claim,
        "measurements": measurements,
        "ratios": analysis["ratios"],
        "ratio_details": ratio_details(analysis["ratios"], measurements),
        "ceilings": {k: v for k, v in ceilings.items() if k != "measurements"},
        "ceiling_measurements": ceilings["measurements"],
        "nominal_chip": nominal
        or {
            "status": f"not applicable: backend `{jax.default_backend()}`, device kind "
            f"`{jax.devices()[0].device_kind}`; the nominal figures are a TPU v5e's"
        },
        "roofline": analysis["roofline"],
        "optimizations": analysis["optimizations"],
        "blocking": analysis["blocking"],
        "where_kernel_stops_helping": analysis["where_kernel_stops_helping"],
        "refused_blocks": {s["setting"]: s["refused_blocks"] for s in settings},
        "failed_paths": {s["setting"]: s.get("failed_paths", {}) for s in settings},
        "settings": {
            s["setting"]: {
                "kernel": s["kernel"],
                "shape": s["shape"],
                "dtype": s["dtype"],
                "precision": s["precision"],
                "bound_checked_rows": s["bound_checked_rows"],
            }
            for s in settings
        },
        "path_order": {
            "method": "each round's path order shuffled: numpy.random.default_rng([seed, "
            "zlib.crc32(setting name)]).permutation, once per round",
            "seed": seed,
            "round_orders": {s["setting"]: s["round_orders"] for s in settings},
        },
        "notes": _notes(size_name),
    }


def _notes(size_name: str) -> list[str]:
    notes = [
        "Each measurement names its execution_mode: `interpret`, `compiled` or `xla`.",
        "bound_used_vs_f64 is each path's max error over its derived error bound "
        "(<= 1 is correct) at the precision the path ran; it is checked for every timed "
        "path, on bound_checked_rows rows of the output (all of them up to 128 rows).",
        "Ratios are `<a>_vs_<b>` = median time of b / median time of a: above 1, a is "
        "faster. `xla_vs_xla_aa` is the A/A control and shows the noise.",
        "Roofline: `vs_measured_ceilings` uses the GEMM and copy ceilings measured in this "
        "run; `vs_nominal_chip` the chip's published figures (TPU v5e: 197 TFLOP/s "
        "bfloat16, 819 GB/s HBM). A float32 product at `highest` takes several bfloat16 "
        "passes, so its fraction of the bfloat16 peak is low by construction.",
        "A path whose lowering, compilation or first call raised (a configuration the "
        "kernel's checks accept but the chip's compiler refuses, e.g. a scoped-VMEM "
        "overflow) is a rejected attempt: it is listed under `failed_paths` (setting -> "
        "path -> the error, on one line) and left out of the timings, ratios, roofline and "
        "blocking summary, while the rest of its setting and of the run go on. Blocks the "
        "kernel's own checks refuse before compiling are under `refused_blocks`.",
    ]
    if size_name == "tpu":
        notes.append(
            "float32 at `highest` is timed up to 4096^3 only: at 8192^3 one call takes "
            "about 40 ms, and its seven paths would take a sixth of the run."
        )
    return notes


class BenchInputError(click.ClickException):
    """A refused option: one line, exit code 2, no traceback."""

    exit_code = 2


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
    type=click.Choice(["auto", "tiny", "cpu", "tpu"]),
    default="auto",
    show_default=True,
    help="`auto`: `tpu` where the kernels compile, else `cpu`. `tiny`: seconds, for tests.",
)
@click.option("--repeats", type=click.IntRange(min=1), default=None, help="Timed rounds per path.")
@click.option(
    "--mode",
    type=click.Choice(["auto", "interpret", "compiled"]),
    default="auto",
    show_default=True,
    help="Kernel execution: `auto` compiles on a TPU and interprets elsewhere.",
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**31 - 1),
    default=0,
    show_default=True,
    help="Seed of the operands, the path orders and the rows checked.",
)
def bench(out: Path, size: str, repeats: int | None, mode: str, seed: int) -> None:
    """Time the kernels against XLA; every figure names its execution mode."""

    def log(message: str) -> None:
        click.echo(message, err=True)
        sys.stderr.flush()

    try:
        for target in (out, out.with_suffix(".png"), out.with_name(out.name + ".sha256")):
            checkpoint.check_writable(target, directory=False, what="Bench report")
    except checkpoint.RecordError as err:
        raise click.BadParameter(str(err), param_hint="'--out'") from None
    backend = jax.default_backend()
    if mode == "compiled" and backend != "tpu":
        raise BenchInputError(
            f"`--mode compiled` needs a TPU, but the JAX backend is `{backend}`; use "
            f"`--mode interpret` (timings are then correctness-only) or run on a TPU."
        )
    interpret = None if mode == "auto" else mode == "interpret"
    if size == "tpu" and (interpret or (interpret is None and kernels.default_interpret())):
        raise BenchInputError(
            "`--size tpu` times compiled kernels up to 8192^3 and needs them compiled (a TPU "
            "backend, not `--mode interpret`); use `--size cpu` or `--size tiny` here."
        )
    report = run_bench(size, interpret=interpret, repeats=repeats, seed=seed, log=log)
    checkpoint.save_record(out, report)
    plot(report, out.with_suffix(".png"))
    click.echo(_table(report))
    click.echo(f"\nwrote {out} and {out.with_suffix('.png')}")
