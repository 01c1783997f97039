"""The timed work of `kernel-audit bench`: the ceilings, and one setting (a
kernel at one shape and dtype) timed against XLA at every accepted block size.
A path the chip's compiler refuses (lowering, compilation or first call
raising) is recorded under the setting's `failed_paths` with its one-line
error, and the setting goes on without it.

Every timed path's output is checked against the float64 reference under its
derived error bound, at the precision the path ran (`bound_used_vs_f64`, at most
1 when correct). The bound is per element and each output row depends only on
its own row of `x`, so on a large problem the check takes `CHECK_ROWS` rows (half
evenly spaced, which meets every row block, half drawn from a seeded generator)
and the float64 reference of those rows only: an 8192^3 product in float64 on
the host would take longer than the whole run.
"""

import functools
import zlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernel_audit import data, kernels, reference, targets
from kernel_audit.bench_sizes import (
    BenchSize,
    blocks_name,
    kind_of,
    matmul_blocks_for,
    matmul_setting_name,
    row_blocks_for,
    row_setting_name,
)
from kernel_audit.bench_timing import Path as TimedPath
from kernel_audit.bench_timing import (
    copy_ceilings,
    cost_analysis,
    measure,
    order_rng,
    round_orders,
)

CHECK_ROWS = 128


def check_rows(rows: int, seed: int, label: str) -> np.ndarray:
    """Sorted row indices checked against float64: all `rows` up to `CHECK_ROWS`,
    else `CHECK_ROWS // 2` evenly spaced (first and last included) joined with as
    many drawn without replacement by `default_rng([seed, crc32("check/" + label)])`."""
    if rows <= CHECK_ROWS:
        return np.arange(rows)
    spaced = np.linspace(0, rows - 1, CHECK_ROWS // 2).round().astype(np.int64)
    rng = np.random.default_rng([seed, zlib.crc32(f"check/{label}".encode())])
    drawn = rng.choice(rows, CHECK_ROWS // 2, replace=False)
    return np.unique(np.concatenate([spaced, drawn]))


def unfused_matmul_bound(
    fused: np.ndarray, x64: np.ndarray, w64: np.ndarray, dtype: str, precision: str
) -> np.ndarray:
    """Per-element bound on |unfused path - float64| for `gelu(x @ w + b)` computed
    unfused: the kernel writes `z = x @ w` rounded to `dtype` (off from the float64
    product by at most `e_z = matmul_error_bound(x, w, 0, "none", ...)`, its own
    rounding included), then XLA adds `b` and applies gelu in float32 and casts.

    Against the fused computation the only new error is `e_z` in the pre-activation
    (the bias add's float32 rounding, u32 |z + b|, is within the fused bound's
    (K+1)-term accumulation term), and gelu is `GELU_LIPSCHITZ`-Lipschitz, so it adds
    `GELU_LIPSCHITZ (1 + u32) e_z` before, and `(1 + u_out)` times that after, the
    final rounding to `dtype`: `fused` (the fused kernel's bound, `matmul_error_bound(
    x, w, b, "gelu", ...)`) + (1 + u_out) GELU_LIPSCHITZ (1 + u32) e_z. In bfloat16
    the rounded intermediate alone exceeds the fused bound."""
    u32, u_out = reference.UNIT_ROUNDOFF["float32"], reference.UNIT_ROUNDOFF[dtype]
    zero_bias = np.zeros(w64.shape[1])
    e_z = reference.matmul_error_bound(x64, w64, zero_bias, "none", dtype, precision)
    return fused + (1.0 + u_out) * reference.GELU_LIPSCHITZ * (1.0 + u32) * e_z


def _gemm(p: jax.Array, q: jax.Array, *, precision: jax.lax.Precision) -> jax.Array:
    return jnp.dot(p, q, precision=precision)


def measure_ceilings(size: BenchSize, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """FLOP/s of large XLA GEMMs and bytes/s of a large copy, timed here.

    `flops_per_s` is the first of `size.gemms` (on a TPU a bfloat16 GEMM at the
    largest shape); `flops_per_s_by_kind` holds each GEMM's figure by its
    arithmetic (`bfloat16`, `float32_highest`), the ceiling of the settings of that
    kind. The copy ceiling (`bytes_per_s`) is XLA's read+write into a pre-touched
    buffer reused every call (`x + 1` with `x` donated, `bench_timing.copy_ceilings`),
    so it measures memory traffic, not the page faults of a fresh output buffer;
    the fresh-buffer figure, and on a CPU NumPy's `copyto` into a reused buffer,
    timed in the same shuffled rounds, are kept beside it under `copy`."""
    paths, kinds = [], {}
    for n, dtype, precision in size.gemms:
        a = jnp.ones((n, n), kernels.DTYPES[dtype])
        fn = functools.partial(_gemm, precision=targets.lax_precision(precision, dtype))
        name = f"ceiling_gemm_{n}_{kind_of(dtype, precision)}"
        paths.append(TimedPath(name, fn, (a, a), "xla"))
        kinds[name] = (n, kind_of(dtype, precision))
    repeats = max(5, size.repeats // 2)
    results = measure(paths, round_orders(len(paths), repeats, order_rng(seed, "gemm")), log)
    by_kind = {kind: 2.0 * n**3 / results[name]["median_s"] for name, (n, kind) in kinds.items()}
    host_copy = jax.default_backend() == "cpu"
    copy = copy_ceilings(size.copy_mib * 2**20 // 4, repeats, seed, host_copy)
    if host_copy:
        copy["xla_reused_vs_numpy_copy"] = (
            copy["xla_reused"]["bytes_per_s"] / copy["numpy_copy"]["bytes_per_s"]
        )
        copy["numpy_copy_vs_numpy_copy_aa"] = (
            copy["numpy_copy"]["bytes_per_s"] / copy["numpy_copy_aa"]["bytes_per_s"]
        )
    else:
        copy["numpy_copy"] = "left out: a host-memory copy says nothing about the device's memory"
    copy["xla_reused_vs_xla_fresh"] = (
        copy["xla_reused"]["bytes_per_s"] / copy["xla_fresh"]["bytes_per_s"]
    )
    log(
        f"  copy ceiling {copy['xla_reused']['bytes_per_s'] / 1e9:.2f} GB/s (reused buffer); "
        f"fresh buffer {copy['xla_fresh']['bytes_per_s'] / 1e9:.2f} GB/s"
    )
    gemms = "; ".join(f"{n}x{n} {kind}" for n, kind in kinds.values())
    host = (
        " and NumPy's copyto into a reused buffer (NumPy: host memory, one thread)"
        if host_copy
        else " (no host-side copy: on this backend it is not the device's memory)"
    )
    first = paths[0].name
    return {
        "flops_per_s": by_kind[kinds[first][1]],
        "flops_per_s_by_kind": by_kind,
        "bytes_per_s": copy["xla_reused"]["bytes_per_s"],
        "measured_with": (
            f"XLA GEMMs ({gemms}; the first is `flops_per_s`), median of "
            f"{results[first]['n']} calls each; a {size.copy_mib} MiB float32 read+write by "
            f"XLA into a pre-touched, reused (donated) buffer on the device, median of "
            f"{repeats} calls interleaved with the same copy into a fresh buffer{host}"
        ),
        "copy": copy,
        "measurements": results,
    }


def _time_and_check(
    setting: str,
    paths: list[TimedPath],
    size: BenchSize,
    seed: int,
    log: Callable[[str], None],
    rows: np.ndarray,
    f64: np.ndarray,
    bounds: dict[str, np.ndarray],
) -> tuple[dict[str, Any], list[list[str]], dict[str, str]]:
    """Times `paths` in shuffled rounds and checks each output's rows `rows` against
    `f64` under its bound: `bounds[<path name>]`, else `bounds["*"]`. A path whose
    lowering, compilation or first call fails is left out (`bench_timing.measure`
    with `failed`). Returns the results and the rounds' orders, by path name (the
    failed paths dropped from both), and the failed paths (name -> one-line error)."""
    orders = round_orders(len(paths), size.repeats, order_rng(seed, setting))
    failed: dict[str, str] = {}
    results = measure(paths, orders, log, failed=failed)
    for path in paths:
        if path.name in failed:
            continue
        out = reference.to_f64(np.asarray(path.output)[rows])
        err = np.abs(out - f64)
        results[path.name]["bound_used_vs_f64"] = float(
            np.max(err / bounds.get(path.name, bounds["*"]))
        )
        if path.name in bounds:  # Its own bound; how much of the fused one it uses, beside.
            results[path.name]["fused_bound_used_vs_f64"] = float(np.max(err / bounds["*"]))
        results[path.name]["bound_checked_rows"] = len(rows)
        if path.name.startswith("xla"):
            results[path.name]["cost"] = cost_analysis(path.compiled)
        path.output = None  # Device memory: a large setting's outputs go before the next.
    names = [[paths[i].name for i in order if paths[i].name not in failed] for order in orders]
    return results, names, failed


def run_matmul_setting(
    spec: tuple[int, int, int, str, str], size: BenchSize, interpret: bool, seed: int, log
) -> dict[str, Any]:
    """One matmul setting `(M, K, N, dtype, precision)`: XLA, its A/A copy, the fused
    kernel at every accepted block size, and the kernel without its fused epilogue
    (bias and gelu left to XLA) at the first."""
    m, k, n, dtype, precision = spec
    setting = matmul_setting_name(m, k, n, dtype, precision, size)
    x, w, b = data.matmul_operands(data.case_key(seed, setting), m, k, n, kernels.DTYPES[dtype])
    mode = kernels.execution_mode(interpret)
    xla = functools.partial(reference.matmul_bias_act_jnp, activation="gelu", precision=precision)
    paths = [
        TimedPath("xla", xla, (x, w, b), "xla"),
        TimedPath("xla_aa", lambda *a: xla(*a), (x, w, b), "xla"),
    ]
    valid, refused = matmul_blocks_for(m, k, n, dtype, precision, size)
    kernel_blocks = {}
    for blocks in valid:
        fn = functools.partial(
            kernels.matmul_bias_act,
            blocks=blocks,
            activation="gelu",
            precision=precision,
            interpret=interpret,
        )
        name = f"pallas_{blocks_name(blocks)}"
        paths.append(TimedPath(name, fn, (x, w, b), mode))
        kernel_blocks[name] = (blocks.block_m, blocks.block_n, blocks.block_k)
    if valid:
        first = valid[0]

        def unfused(x_, w_, b_, blocks=first):
            z = kernels.matmul_bias_act(
                x_,
                w_,
                jnp.zeros_like(b_),
                blocks=blocks,
                activation="none",
                precision=precision,
                interpret=interpret,
            )
            return jax.nn.gelu(
                z.astype(jnp.float32) + b_.astype(jnp.float32)[None, :], approximate=True
            ).astype(x_.dtype)

        paths.append(TimedPath(f"pallas_unfused_{blocks_name(first)}", unfused, (x, w, b), mode))
    log(f"{setting} ({dtype}, precision {precision}):")
    rows = check_rows(m, seed, setting)
    x64, w64, b64 = reference.to_f64(np.asarray(x)[rows]), reference.to_f64(w), reference.to_f64(b)
    f64 = reference.matmul_bias_act_f64(x64, w64, b64, "gelu")
    bounds = {"*": reference.matmul_error_bound(x64, w64, b64, "gelu", dtype, precision)}
    if valid:
        bounds[paths[-1].name] = unfused_matmul_bound(bounds["*"], x64, w64, dtype, precision)
    results, orders, failed = _time_and_check(setting, paths, size, seed, log, rows, f64, bounds)
    return {
        "setting": setting,
        "kernel": "matmul_bias_act",
        "shape": [m, k, n],
        "dtype": dtype,
        "precision": precision,
        "kind": kind_of(dtype, precision),
        "mode": mode,
        "results": results,
        "refused_blocks": refused,
        "failed_paths": failed,
        "kernel_blocks": {k: v for k, v in kernel_blocks.items() if k not in failed},
        "round_orders": orders,
        "bound_checked_rows": len(rows),
    }


def run_row_setting(
    spec: tuple[int, int, str], size: BenchSize, interpret: bool, seed: int, log
) -> dict[str, Any]:
    """One layer-norm setting `(R, C, dtype)`: XLA, its A/A copy, the kernel at every
    accepted row block."""
    rows, cols, dtype = spec
    setting = row_setting_name(rows, cols, dtype, size)
    x, g, b = data.layer_norm_operands(
        data.case_key(seed, setting), rows, cols, kernels.DTYPES[dtype]
    )
    mode = kernels.execution_mode(interpret)
    paths = [
        TimedPath("xla", reference.layer_norm_jnp, (x, g, b), "xla"),
        TimedPath("xla_aa", lambda *a: reference.layer_norm_jnp(*a), (x, g, b), "xla"),
    ]
    valid, refused = row_blocks_for(rows, cols, dtype, size)
    kernel_blocks = {}
    for blocks in valid:
        fn = functools.partial(kernels.layer_norm, blocks=blocks, interpret=interpret)
        name = f"pallas_rows{blocks.block_rows}"
        paths.append(TimedPath(name, fn, (x, g, b), mode))
        kernel_blocks[name] = (blocks.block_rows,)
    log(f"{setting} ({dtype}):")
    checked = check_rows(rows, seed, setting)
    x64, g64, b64 = (
        reference.to_f64(np.asarray(x)[checked]),
        reference.to_f64(g),
        reference.to_f64(b),
    )
    f64 = reference.layer_norm_f64(x64, g64, b64)
    bounds = {"*": reference.layer_norm_error_bound(x64, g64, b64, dtype)}
    results, orders, failed = _time_and_check(setting, paths, size, seed, log, checked, f64, bounds)
    return {
        "setting": setting,
        "kernel": "layer_norm",
        "shape": [rows, cols],
        "dtype": dtype,
        "precision": None,
        "kind": dtype,
        "mode": mode,
        "results": results,
        "refused_blocks": refused,
        "failed_paths": failed,
        "kernel_blocks": {k: v for k, v in kernel_blocks.items() if k not in failed},
        "round_orders": orders,
        "bound_checked_rows": len(checked),
    }
