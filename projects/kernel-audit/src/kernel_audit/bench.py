"""`kernel-audit bench`: the kernels timed against XLA's fusion of the same
`jax.numpy` code, every figure labelled with the mode it was measured in.

Run: `kernel-audit bench [--out runs/bench.json] [--size auto|tiny|cpu|gpu]`.
Writes the JSON report and a PNG (same name) of the time distributions.

Execution modes:
  - `interpret`: the Pallas interpreter (any backend without a GPU). Its
    timings are kept for the record and are correctness-only: the interpreter
    runs the kernel as a loop of XLA ops over the grid, so its speed says
    nothing about the compiled kernel. The report then makes no speed claim:
    no kernel ratio, no roofline placement of a kernel, every optimization
    marked unmeasured.
  - `compiled`: the kernel compiled for the GPU. Ratios `pallas_<blocks>_vs_xla`
    (above 1: the kernel is faster), a block-size sweep, a fused-vs-unfused
    epilogue ratio, and each run on a roofline built from the tiling's bytes and
    FLOPs against ceilings measured in the same run (a large XLA GEMM for
    FLOP/s, a large copy for bytes/s). `where_kernel_stops_helping` lists the
    shapes where the best block size is slower than XLA.
  - `xla`: the `jax.numpy` reference compiled by XLA, on whatever backend runs.

Every path is timed the same way (`bench_timing.measure`);
`xla_aa` is a second compilation of the XLA path, the A/A control.
"""

import dataclasses
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import jax
import jax.numpy as jnp
import numpy as np

from kernel_audit import checkpoint, data, kernels, reference
from kernel_audit.bench_report import _table, identity, plot, ratio_details
from kernel_audit.bench_timing import Path as TimedPath
from kernel_audit.bench_timing import copy_ceilings, cost_analysis, measure


@dataclasses.dataclass(frozen=True)
class BenchSize:
    """Shapes and blocks of one bench run.

    matmul_shapes: (M, K, N) per setting; blocks: (block_m, block_n, block_k)
    swept per shape (refused ones are recorded as such); dtype: operand dtype;
    row_shapes: (R, C) of the layer-norm settings; repeats: timed rounds;
    gemm_n, copy_mib: sizes of the ceiling measurements.
    """

    matmul_shapes: tuple[tuple[int, int, int], ...]
    blocks: tuple[tuple[int, int, int], ...]
    dtype: str
    row_shapes: tuple[tuple[int, int], ...]
    repeats: int
    gemm_n: int
    copy_mib: int


SIZES = {
    # Seconds; for tests only.
    "tiny": BenchSize(
        ((64, 64, 48),), ((16, 16, 16), (32, 32, 32)), "float32", ((32, 96),), 3, 128, 4
    ),
    # The CPU run: interpret mode, correctness-only timings.
    "cpu": BenchSize(
        ((256, 512, 256), (100, 1000, 40)),
        ((32, 32, 32), (64, 64, 32), (64, 64, 64)),
        "float32",
        ((256, 1000),),
        20,
        1024,
        64,
    ),
    # The GPU run: shapes from launch-bound to compute-bound, to find where the
    # kernel stops helping.
    "gpu": BenchSize(
        (
            (128, 128, 128),
            (512, 512, 512),
            (1000, 1000, 1000),
            (2048, 2048, 2048),
            (4096, 4096, 4096),
        ),
        ((32, 32, 32), (64, 64, 32), (64, 64, 64), (128, 128, 32), (128, 128, 64), (128, 256, 32)),
        "bfloat16",
        ((4096, 1000), (16384, 4096)),
        30,
        8192,
        1024,
    ),
}


def resolve_size(name: str) -> str:
    """`auto` means `gpu` on a GPU backend and `cpu` elsewhere; an unknown name is a
    `ValueError` naming it."""
    if name == "auto":
        return "gpu" if jax.default_backend() == "gpu" else "cpu"
    if name not in SIZES:
        raise ValueError(f"Unknown bench size `{name}`; use `auto` or one of {sorted(SIZES)}.")
    return name


# --- ROOFLINE ------------------------------------------------------------------------


def matmul_tiling_cost(m: int, k: int, n: int, blocks: kernels.MatmulBlocks, itemsize: int):
    """FLOPs and global-memory bytes of the tiled matmul, from the tiling alone:
    each of the ceil(M/bm) x ceil(N/bn) programs reads a (bm, K) strip of `x`, a
    (K, bn) strip of `w` and bn bias entries, and writes one (bm, bn) tile.

    Cases:
        FLOPs -> `2 M N K + 2 M N` (multiply-adds, plus one op each for bias and
            activation), independent of the blocks
        an edge program (M or N not a multiple of its block) -> counts only its
            in-bounds rows and columns, so in total `x` is read `ceil(N/bn)` times,
            `w` and `b` `ceil(M/bm)` times, and the output written once
        bytes -> those element counts times `itemsize`
    Returns `{"flops", "bytes", "intensity"}` as floats, intensity = flops / bytes.
    """
    # --- exercise stage 3: Count FLOPs and the bytes every program reads and writes. ---
    gm, gn = -(-m // blocks.block_m), -(-n // blocks.block_n)
    flops = 2.0 * m * n * k + 2.0 * m * n  # multiply-adds, bias, activation ~ 1 op
    bytes_ = itemsize * (m * k * gn + k * n * gm + n * gm + m * n)
    return {"flops": flops, "bytes": float(bytes_), "intensity": flops / bytes_}
    # --- end exercise ---


def measure_ceilings(size: BenchSize, log: Callable[[str], None]) -> dict[str, Any]:
    """FLOP/s of a large XLA GEMM and bytes/s of a large copy, timed here.

    The copy ceiling (`bytes_per_s`) is XLA's read+write into a pre-touched buffer
    reused every call (`x + 1` with `x` donated, `bench_timing.copy_ceilings`), so it
    measures memory traffic, not the page faults of a fresh output buffer; the
    fresh-buffer figure and NumPy's `copyto` into a reused buffer, timed in the same
    interleaved rounds, are kept beside it under `copy`."""
    dtype = kernels.DTYPES[size.dtype]
    n = size.gemm_n
    a = jnp.ones((n, n), dtype)
    elements = size.copy_mib * 2**20 // 4
    paths = [TimedPath("ceiling_gemm", lambda p, q: p @ q, (a, a), "xla")]
    repeats = max(5, size.repeats // 2)
    results = measure(paths, repeats, log)
    gemm_s = results["ceiling_gemm"]["median_s"]
    copy = copy_ceilings(elements, repeats)
    copy["xla_reused_vs_numpy_copy"] = (
        copy["xla_reused"]["bytes_per_s"] / (copy["numpy_copy"]["bytes_per_s"])
    )
    copy["numpy_copy_vs_numpy_copy_aa"] = (
        copy["numpy_copy"]["bytes_per_s"] / (copy["numpy_copy_aa"]["bytes_per_s"])
    )
    copy["xla_reused_vs_xla_fresh"] = (
        copy["xla_reused"]["bytes_per_s"] / (copy["xla_fresh"]["bytes_per_s"])
    )
    log(
        f"  copy ceiling {copy['xla_reused']['bytes_per_s'] / 1e9:.2f} GB/s (reused buffer); "
        f"fresh buffer {copy['xla_fresh']['bytes_per_s'] / 1e9:.2f} GB/s; NumPy copyto "
        f"{copy['numpy_copy']['bytes_per_s'] / 1e9:.2f} GB/s"
    )
    return {
        "flops_per_s": 2.0 * n**3 / gemm_s,
        "bytes_per_s": copy["xla_reused"]["bytes_per_s"],
        "measured_with": (
            f"{n}x{n} {size.dtype} GEMM (XLA), median of {results['ceiling_gemm']['n']} calls; "
            f"a {size.copy_mib} MiB float32 read+write by XLA into a pre-touched, reused "
            f"(donated) buffer, median of {repeats} calls interleaved with the same copy into "
            f"a fresh buffer and NumPy's copyto into a reused buffer (NumPy: host memory, "
            f"one thread)"
        ),
        "copy": copy,
        "measurements": results,
    }


# --- SETTINGS ---------------------------------------------------------------------------


def _blocks_name(b: kernels.MatmulBlocks) -> str:
    return f"{b.block_m}x{b.block_n}x{b.block_k}"


def run_matmul_setting(
    shape: tuple[int, int, int], size: BenchSize, interpret: bool, seed: int, log
) -> dict[str, Any]:
    """One shape: XLA, its A/A copy, the fused kernel at every valid block size,
    and the kernel without its fused epilogue (bias and gelu left to XLA)."""
    m, k, n = shape
    setting = f"matmul_{m}x{k}x{n}"
    dtype = kernels.DTYPES[size.dtype]
    x, w, b = data.matmul_operands(data.case_key(seed, setting), m, k, n, dtype)
    mode = kernels.execution_mode(interpret)
    xla = functools.partial(reference.matmul_bias_act_jnp, activation="gelu")
    paths = [
        TimedPath("xla", xla, (x, w, b), "xla"),
        TimedPath("xla_aa", lambda *a: xla(*a), (x, w, b), "xla"),
    ]
    refused = {}
    valid_blocks = []
    for bm, bn, bk in size.blocks:
        blocks = kernels.MatmulBlocks(block_m=bm, block_n=bn, block_k=bk)
        try:
            kernels.check_matmul(x, w, b, blocks, "gelu")
        except kernels.KernelInputError as err:
            refused[_blocks_name(blocks)] = str(err)
            continue
        valid_blocks.append(blocks)
        fn = functools.partial(
            kernels.matmul_bias_act, blocks=blocks, activation="gelu", interpret=interpret
        )
        paths.append(TimedPath(f"pallas_{_blocks_name(blocks)}", fn, (x, w, b), mode))
    if valid_blocks:
        first = valid_blocks[0]

        def unfused(x_, w_, b_, blocks=first):
            z = kernels.matmul_bias_act(
                x_, w_, jnp.zeros_like(b_), blocks=blocks, activation="none", interpret=interpret
            )
            return jax.nn.gelu(
                z.astype(jnp.float32) + b_.astype(jnp.float32)[None, :], approximate=True
            ).astype(x_.dtype)

        paths.append(TimedPath(f"pallas_unfused_{_blocks_name(first)}", unfused, (x, w, b), mode))
    log(f"{setting} ({size.dtype}):")
    results = measure(paths, size.repeats, log)
    f64 = reference.matmul_bias_act_f64(x, w, b, "gelu")
    bound = reference.matmul_error_bound(x, w, b, "gelu", size.dtype)
    itemsize = jnp.dtype(dtype).itemsize
    for path in paths:
        out = reference.to_f64(path.output)
        results[path.name]["bound_used_vs_f64"] = float(np.max(np.abs(out - f64) / bound))
        if path.name.startswith("xla"):
            results[path.name]["cost"] = cost_analysis(path.compiled)
    for blocks in valid_blocks:
        results[f"pallas_{_blocks_name(blocks)}"]["cost"] = matmul_tiling_cost(
            m, k, n, blocks, itemsize
        )
    return {"setting": setting, "results": results, "refused_blocks": refused, "mode": mode}


def run_row_setting(
    shape: tuple[int, int], size: BenchSize, interpret: bool, seed: int, log
) -> dict[str, Any]:
    """One layer-norm shape: XLA, its A/A copy, the kernel."""
    rows, cols = shape
    setting = f"layer_norm_{rows}x{cols}"
    dtype = kernels.DTYPES[size.dtype]
    x, g, b = data.layer_norm_operands(data.case_key(seed, setting), rows, cols, dtype)
    mode = kernels.execution_mode(interpret)
    paths = [
        TimedPath("xla", reference.layer_norm_jnp, (x, g, b), "xla"),
        TimedPath("xla_aa", lambda *a: reference.layer_norm_jnp(*a), (x, g, b), "xla"),
        TimedPath(
            "pallas_rows8",
            functools.partial(
                kernels.layer_norm, blocks=kernels.RowBlocks(block_rows=8), interpret=interpret
            ),
            (x, g, b),
            mode,
        ),
    ]
    log(f"{setting} ({size.dtype}):")
    results = measure(paths, size.repeats, log)
    f64 = reference.layer_norm_f64(x, g, b)
    bound = reference.layer_norm_error_bound(x, g, b, size.dtype)
    itemsize = jnp.dtype(dtype).itemsize
    for path in paths:
        out = reference.to_f64(path.output)
        results[path.name]["bound_used_vs_f64"] = float(np.max(np.abs(out - f64) / bound))
    results["pallas_rows8"]["cost"] = {
        "flops": 8.0 * rows * cols,
        "bytes": float(itemsize * (2 * rows * cols + 2 * cols) + 8 * rows),
    }
    return {"setting": setting, "results": results, "refused_blocks": {}, "mode": mode}


# --- REPORT -----------------------------------------------------------------------------


def analyse(settings: list[dict[str, Any]], ceilings: dict[str, Any], compiled: bool):
    """Ratios, roofline placement, optimization verdicts and where the kernel
    stops helping. With `compiled=False` (interpret mode) only the A/A control
    ratios are computed and everything about kernel speed is marked unmeasured."""
    ratios: dict[str, float] = {}
    roofline: dict[str, Any] = {}
    optimizations: list[dict[str, Any]] = []
    stops_helping: list[dict[str, Any]] = []
    unmeasured = (
        "unmeasured: the kernel ran in interpret mode, whose timings say nothing about "
        "the compiled kernel; run `kernel-audit bench` on a GPU to measure it"
    )
    for s in settings:
        name, res = s["setting"], s["results"]
        xla = res["xla"]["median_s"]
        ratios[f"{name}/xla_vs_xla_aa"] = res["xla_aa"]["median_s"] / xla
        kernel_paths = [p for p in res if p.startswith("pallas_") and "unfused" not in p]
        for p in kernel_paths + ["xla"]:
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
                achieved = flops / res[p]["median_s"]
                attainable = min(ceilings["flops_per_s"], flops / bytes_ * ceilings["bytes_per_s"])
                entry.update(
                    intensity_flops_per_byte=flops / bytes_,
                    achieved_flops_per_s=achieved,
                    attainable_flops_per_s=attainable,
                    fraction_of_roofline=achieved / attainable,
                )
            elif flops and bytes_:
                entry["intensity_flops_per_byte"] = flops / bytes_
                entry["placement"] = unmeasured
            roofline[f"{name}/{p}"] = entry
        if not kernel_paths:
            continue
        if compiled:
            for p in kernel_paths:
                ratios[f"{name}/{p}_vs_xla"] = xla / res[p]["median_s"]
            best = min(kernel_paths, key=lambda p: res[p]["median_s"])
            speedup = xla / res[best]["median_s"]
            optimizations.append(
                {
                    "optimization": f"{name}: block size {best.removeprefix('pallas_')}",
                    "status": "measured",
                    "evidence": {p: res[p]["median_s"] for p in kernel_paths},
                }
            )
            unfused = [p for p in res if "unfused" in p]
            if unfused:
                fused = unfused[0].replace("unfused_", "")
                ratio = res[unfused[0]]["median_s"] / res[fused]["median_s"]
                ratios[f"{name}/{fused}_vs_{unfused[0]}"] = ratio
                optimizations.append(
                    {
                        "optimization": f"{name}: bias + gelu fused into the matmul epilogue",
                        "status": "measured",
                        "evidence": {"fused_vs_unfused": ratio},
                    }
                )
            if speedup < 1.0:
                stops_helping.append(
                    {"setting": name, "best_blocks": best, "best_kernel_vs_xla": speedup}
                )
        else:
            optimizations.append(
                {"optimization": f"{name}: block sizes {kernel_paths}", "status": unmeasured}
            )
            if any("unfused" in p for p in res):
                optimizations.append(
                    {"optimization": f"{name}: fused epilogue", "status": unmeasured}
                )
    where = (
        {"status": "measured", "settings_where_xla_is_faster": stops_helping}
        if compiled
        else {"status": unmeasured}
    )
    return ratios, roofline, optimizations, where


def run_bench(
    size_name: str = "auto",
    interpret: bool | None = None,
    repeats: int | None = None,
    seed: int = 0,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Runs every setting of the size and returns the report."""
    size_name = resolve_size(size_name)
    size = SIZES[size_name]
    if repeats is not None:
        size = dataclasses.replace(size, repeats=repeats)
    if interpret is None:
        interpret = kernels.default_interpret()
    compiled = not interpret
    log(f"kernel execution mode: {kernels.execution_mode(interpret)}")
    ceilings = measure_ceilings(size, log)
    settings = [run_matmul_setting(s, size, interpret, seed, log) for s in size.matmul_shapes]
    settings += [run_row_setting(s, size, interpret, seed, log) for s in size.row_shapes]
    ratios, roofline, optimizations, where = analyse(settings, ceilings, compiled)
    measurements = {
        f"{s['setting']}/{path}": result for s in settings for path, result in s["results"].items()
    }
    details = ratio_details(ratios, measurements)
    if compiled:
        claim = "timed on the target: ratios `*_vs_xla` compare the compiled kernel with XLA"
    else:
        claim = (
            "none: the kernels ran in interpret mode; their timings are correctness-only "
            "and no speed is claimed. No GPU figure has been measured in this record."
        )
    return {
        "identity": identity(size_name, size, interpret),
        "size": size_name,
        "kernel_execution_mode": kernels.execution_mode(interpret),
        "speed_claims": claim,
        "measurements": measurements,
        "ratios": ratios,
        "ratio_details": details,
        "ceilings": {k: v for k, v in ceilings.items() if k != "measurements"},
        "ceiling_measurements": ceilings["measurements"],
        "roofline": roofline,
        "optimizations": optimizations,
        "where_kernel_stops_helping": where,
        "refused_blocks": {s["setting"]: s["refused_blocks"] for s in settings},
        "notes": [
            "Each measurement names its execution_mode: `interpret`, `compiled` or `xla`.",
            "bound_used_vs_f64 is each path's max error over its derived error bound "
            "(<= 1 is correct); it is checked for every timed path.",
            "Ratios are `<a>_vs_<b>` = median time of b / median time of a: above 1, a is "
            "faster. `xla_vs_xla_aa` is the A/A control and shows the noise.",
        ],
    }


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
    type=click.Choice(["auto", "tiny", "cpu", "gpu"]),
    default="auto",
    show_default=True,
    help="`auto`: `gpu` on a GPU, else `cpu`. `tiny`: seconds, for tests.",
)
@click.option("--repeats", type=click.IntRange(min=1), default=None, help="Timed rounds per path.")
@click.option(
    "--mode",
    type=click.Choice(["auto", "interpret", "compiled"]),
    default="auto",
    show_default=True,
    help="Kernel execution: `auto` compiles on a GPU and interprets elsewhere.",
)
def bench(out: Path, size: str, repeats: int | None, mode: str) -> None:
    """Time the kernels against XLA's fusion; every figure names its execution mode."""

    def log(message: str) -> None:
        click.echo(message, err=True)
        sys.stderr.flush()

    try:
        for target in (out, out.with_suffix(".png"), out.with_name(out.name + ".sha256")):
            checkpoint.check_writable(target, directory=False, what="Bench report")
    except checkpoint.RecordError as err:
        raise click.BadParameter(str(err), param_hint="'--out'") from None
    if mode == "compiled" and jax.default_backend() != "gpu":
        raise click.UsageError(
            f"`--mode compiled` needs a GPU, but the JAX backend is `{jax.default_backend()}`; "
            f"use `--mode interpret` (timings are then correctness-only) or run on a GPU."
        )
    interpret = None if mode == "auto" else mode == "interpret"
    report = run_bench(size, interpret=interpret, repeats=repeats, log=log)
    checkpoint.save_record(out, report)
    plot(report, out.with_suffix(".png"))
    click.echo(_table(report))
    click.echo(f"\nwrote {out} and {out.with_suffix('.png')}")
