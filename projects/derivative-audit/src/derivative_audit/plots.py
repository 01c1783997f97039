"""PNG plots: the error-vs-step sweep, the training curves, the bench timings."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def sweep_plot(reports: list[dict], path: str | Path, title: str) -> Path:
    """Relative error of the central difference against the step, log-log, one
    line per (function, dtype), with each theory step marked and the model's
    slopes (-1 round-off, +2 truncation) drawn through the float64 minimum."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for report in reports:
        sweep = report["sweep"]
        steps, errors = np.asarray(sweep["steps"]), np.asarray(sweep["rel_errors"])
        keep = errors > 0
        style = "-" if report["dtype"] == "float64" else "--"
        (line,) = ax.loglog(
            steps[keep],
            errors[keep],
            style,
            marker=".",
            label=f"{report['function']} {report['dtype']}",
        )
        ax.axvline(sweep["theory_step"], color=line.get_color(), alpha=0.3, linewidth=1)
    for dtype in ("float64", "float32"):
        first = next((r for r in reports if r["dtype"] == dtype), None)
        if first is None:
            continue
        h, e = first["sweep"]["theory_step"], first["sweep"]["expected_best_rel_error"]
        grid = np.logspace(np.log10(h) - 3, np.log10(h) + 3, 20)
        ax.loglog(grid, e * (grid / h) ** 2, ":", color="gray")
        ax.loglog(grid, e * (h / grid), ":", color="gray")
    ax.set_xlabel("finite-difference step h")
    ax.set_ylabel("relative error vs the exact JVP")
    ax.set_title(title + "\n(vertical lines: theory step; dotted: slopes +2 and -1)", fontsize=9)
    ax.set_ylim(1e-13, 10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curves_plot(curves: dict[str, list[float]], path: str | Path, title: str, ylabel: str) -> Path:
    """One line per named curve against its index (log y)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, values in curves.items():
        ax.semilogy(np.arange(1, len(values) + 1), values, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bars_plot(values: dict[str, float], path: str | Path, title: str, xlabel: str) -> Path:
    """Horizontal bars, log scale (the bench's median times)."""
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(values) + 1.5))
    names = list(values)
    ax.barh(names, [values[n] for n in names])
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
