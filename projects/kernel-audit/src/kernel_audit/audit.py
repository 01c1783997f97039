"""The audit: every kernel x shape x dtype x block size of a `Config`, each
compared with both references under its derived error bound, each record
labelled with the execution mode it ran in.

Run: `kernel-audit audit [--config FILE] [--workdir DIR]`. Writes
`report.json` (one record per table cell) and `audit.png` (observed error as
a fraction of the bound, per cell) into the work directory.

A record's figures:
  - `max_abs_error_vs_f64`: max |kernel - float64 reference|;
  - `bound_used_vs_f64`: max over elements of |kernel - f64| / bound (pass: <= 1);
  - `bound_used_jnp_vs_f64`: the same for the `jax.numpy` reference, which
    the bound must also cover (a check of the bound itself);
  - `bound_used_vs_jnp`: max |kernel - jnp| / (2 bound) (pass: <= 1);
  - `refused`: the kernel's own message when it refuses the block size for the
    shape (no kernel ran), and `unmasked_nan_fraction` on shapes with a ragged
    reduction edge, in interpret mode: the fraction of NaN outputs with edge
    masking switched off (on a TPU those reads are undefined, not NaN).
"""

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernel_audit import data, kernels, reference
from kernel_audit.config import Config, ConfigError


def compare(
    actual: jax.Array, jnp_out: jax.Array, f64: np.ndarray, bound: np.ndarray
) -> dict[str, Any]:
    """The figures of one comparison (see the module docstring)."""
    a, j = reference.to_f64(actual), reference.to_f64(jnp_out)
    tiny = np.finfo(np.float64).tiny
    finite = bool(np.all(np.isfinite(a)))
    err = np.abs(a - f64)
    used = err / np.maximum(bound, tiny)
    used_jnp = np.abs(j - f64) / np.maximum(bound, tiny)
    used_vs_jnp = np.abs(a - j) / np.maximum(2.0 * bound, tiny)
    figures = {
        "finite": finite,
        "max_abs_error_vs_f64": float(np.nanmax(err, initial=0.0)) if finite else float("nan"),
        "max_bound": float(bound.max(initial=0.0)),
        "bound_used_vs_f64": float(used.max(initial=0.0)) if finite else float("inf"),
        "bound_used_jnp_vs_f64": float(used_jnp.max(initial=0.0)),
        "bound_used_vs_jnp": float(used_vs_jnp.max(initial=0.0)) if finite else float("inf"),
        "num_values": int(a.size),
    }
    figures["passed"] = bool(
        finite
        and figures["bound_used_vs_f64"] <= 1.0
        and figures["bound_used_jnp_vs_f64"] <= 1.0
        and figures["bound_used_vs_jnp"] <= 1.0
    )
    return figures


def _check_dtype_name(dtype: str) -> None:
    if dtype not in kernels.DTYPES:
        raise kernels.KernelInputError(
            f"Unknown dtype `{dtype}`; use one of {', '.join(f'`{d}`' for d in kernels.DTYPES)}."
        )


def audit_matmul(
    case: data.MatmulCase,
    dtype: str,
    activation: str,
    blocks: kernels.MatmulBlocks,
    seed: int,
    interpret: bool | None = None,
    precision: str = "highest",
) -> dict[str, Any]:
    """One cell of the matmul table at the declared matmul `precision`; an unknown
    `dtype` is a `KernelInputError`."""
    _check_dtype_name(dtype)
    record: dict[str, Any] = {
        "kernel": "matmul_bias_act",
        "case": case.name,
        "shape": {"m": case.m, "k": case.k, "n": case.n},
        "dtype": dtype,
        "activation": activation,
        "blocks": dataclasses.asdict(blocks),
        "precision": precision,
        "backend": jax.default_backend(),
        "execution_mode": kernels.execution_mode(interpret),
    }
    key = data.case_key(seed, "matmul", case.name, dtype)
    x, w, b = data.matmul_operands(key, case.m, case.k, case.n, kernels.DTYPES[dtype])
    try:
        kernels.check_matmul(x, w, b, blocks, activation, precision)
    except kernels.KernelInputError as err:
        return {**record, "refused": str(err), "passed": None}
    start = time.perf_counter()
    y = jax.block_until_ready(
        kernels.matmul_bias_act(
            x,
            w,
            b,
            blocks=blocks,
            activation=activation,
            precision=precision,
            interpret=interpret,
        )
    )
    record["seconds_including_compile"] = time.perf_counter() - start
    figures = compare(
        y,
        reference.matmul_bias_act_jnp(x, w, b, activation, precision),
        reference.matmul_bias_act_f64(x, w, b, activation),
        reference.matmul_error_bound(x, w, b, activation, dtype, precision),
    )
    # Out-of-bounds reads are NaN only in the interpreter (undefined on a TPU), so the
    # unmasked control is run there.
    if case.k % blocks.block_k and record["execution_mode"] == "interpret":
        unmasked = kernels.matmul_bias_act(
            x,
            w,
            b,
            blocks=blocks,
            activation=activation,
            precision=precision,
            interpret=interpret,
            mask_edges=False,
        )
        figures["unmasked_nan_fraction"] = float(jnp.mean(jnp.isnan(unmasked)))
    return {**record, **figures}


def audit_layer_norm(
    case: data.RowCase,
    dtype: str,
    blocks: kernels.RowBlocks,
    seed: int,
    interpret: bool | None = None,
) -> dict[str, Any]:
    """One cell of the layer-norm table; an unknown `dtype` is a `KernelInputError`."""
    _check_dtype_name(dtype)
    record: dict[str, Any] = {
        "kernel": "layer_norm",
        "case": case.name,
        "shape": {"rows": case.rows, "cols": case.cols},
        "dtype": dtype,
        "blocks": dataclasses.asdict(blocks),
        "execution_mode": kernels.execution_mode(interpret),
    }
    key = data.case_key(seed, "layer_norm", case.name, dtype)
    x, g, b = data.layer_norm_operands(key, case.rows, case.cols, kernels.DTYPES[dtype])
    try:
        kernels.check_layer_norm(x, g, b, blocks)
    except kernels.KernelInputError as err:
        return {**record, "refused": str(err), "passed": None}
    start = time.perf_counter()
    y = jax.block_until_ready(kernels.layer_norm(x, g, b, blocks=blocks, interpret=interpret))
    record["seconds_including_compile"] = time.perf_counter() - start
    figures = compare(
        y,
        reference.layer_norm_jnp(x, g, b),
        reference.layer_norm_f64(x, g, b),
        reference.layer_norm_error_bound(x, g, b, dtype),
    )
    return {**record, **figures}


def run_audit(
    config: Config,
    interpret: bool | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every cell of the config's table; returns the report (records + summary)."""
    if not isinstance(config, Config):
        raise ConfigError(
            f"`config` must be a `Config` (e.g. `load_config(path)`), not a "
            f"`{type(config).__name__}`."
        )
    cells: list[Callable[[], dict[str, Any]]] = []
    for case in (c for c in data.MATMUL_CASES if c.name in config.matmul_cases):
        for dtype in config.dtypes:
            for activation in config.activations:
                fitted = [
                    kernels.fit_matmul_blocks(case.m, case.k, case.n, kernels.MatmulBlocks(*t))
                    for t in config.matmul_blocks
                ]
                # Targets that fit to the same blocks (a small dimension taken whole) run once.
                for blocks in dict.fromkeys(fitted):
                    cells.append(
                        lambda c=case, d=dtype, a=activation, bl=blocks: audit_matmul(
                            c, d, a, bl, config.seed, interpret
                        )
                    )
    for case in (c for c in data.ROW_CASES if c.name in config.row_cases):
        for dtype in config.dtypes:
            fitted_rows = [kernels.fit_row_blocks(case.rows, dtype, r) for r in config.row_blocks]
            for blocks in dict.fromkeys(fitted_rows):
                cells.append(
                    lambda c=case, d=dtype, bl=blocks: audit_layer_norm(
                        c, d, bl, config.seed, interpret
                    )
                )
    records = []
    for index, cell in enumerate(cells, start=1):
        record = cell()
        records.append(record)
        if progress is not None:
            status = (
                "refused" if record.get("refused") else ("ok" if record["passed"] else "FAILED")
            )
            blocks = "/".join(str(v) for v in record["blocks"].values())
            progress(
                f"[{index}/{len(cells)}] {record['kernel']} {record['case']} {record['dtype']} "
                f"{record.get('activation', '')} blocks {blocks} "
                f"({record['execution_mode']}): {status}"
            )
    ran = [r for r in records if r.get("refused") is None]
    summary = {
        "cells": len(records),
        "ran": len(ran),
        "refused": len(records) - len(ran),
        "passed": sum(bool(r["passed"]) for r in ran),
        "failed": sum(not r["passed"] for r in ran),
        "max_bound_used_vs_f64": max((r["bound_used_vs_f64"] for r in ran), default=0.0),
        "execution_modes": sorted({r["execution_mode"] for r in records}),
        "unmasked_edges_all_nan": all(
            r["unmasked_nan_fraction"] > 0 for r in ran if "unmasked_nan_fraction" in r
        ),
    }
    return {
        "summary": summary,
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "note": (
            "execution_mode `interpret` means the Pallas interpreter ran the kernel "
            "(correctness only: its speed says nothing about the compiled kernel); "
            "`compiled` means Mosaic compiled the kernel for the TPU it ran on."
        ),
        "config": config.model_dump(mode="json"),
        "records": records,
    }


def plot(report: dict[str, Any], path: Any) -> None:
    """PNG: observed error as a fraction of the bound, one bar per executed cell."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ran = [r for r in report["records"] if r.get("refused") is None]
    short = {"matmul_bias_act": "matmul", "layer_norm": "layer norm", "float32": "f32"}
    short["bfloat16"] = "bf16"
    labels = [
        f"{short[r['kernel']]} {r['case']} {short[r['dtype']]} {r.get('activation', '')} "
        f"{'/'.join(str(v) for v in r['blocks'].values())}"
        for r in ran
    ]
    used = [max(r["bound_used_vs_f64"], 1e-6) for r in ran]
    fig = Figure(figsize=(9, max(3.0, 0.18 * len(ran) + 1.5)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    colors = ["tab:green" if r["passed"] else "tab:red" for r in ran]
    ax.barh(range(len(ran)), used, color=colors)
    ax.axvline(1.0, color="black", linestyle="--", label="bound")
    ax.set_xscale("log")
    ax.set_yticks(range(len(ran)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("max |kernel - float64| / error bound (log scale; must be <= 1)")
    modes = ", ".join(report["summary"]["execution_modes"])
    ax.set_title(f"kernel-audit: error vs derived bound (execution mode: {modes})")
    ax.legend(loc="lower right")
    fig.savefig(path, dpi=110)
