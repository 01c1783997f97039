"""PNG plots: the loss curve of a run and the step-time breakdown of a profile."""

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def loss_curve(losses: dict[int, float], path: Path, title: str) -> Path:
    steps = sorted(losses)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [losses[s] for s in steps])
    ax.set_xlabel("step")
    ax.set_ylabel("count-weighted mean loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def step_breakdown(
    variants: dict[str, dict[str, float]], path: Path, parts: tuple[str, ...]
) -> Path:
    """Per variant, one bar of the step: the host-side `parts` (disjoint annotated
    spans of one thread) stacked, topped by the rest of the step that no part
    covers, so the bar's height is the median step; beside it, a hatched bar for
    the time devices were busy, which overlaps the host parts and is not stacked.
    `variants[name]` holds per-step seconds of each part, `iteration` and
    `device_busy`."""
    names = list(variants)
    positions = np.arange(len(names), dtype=np.float64)
    width = 0.38
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    bottom = np.zeros(len(names))
    for part in parts:
        values = np.array([variants[n][part] * 1e3 for n in names])
        ax.bar(positions - width / 2, values, width, bottom=bottom, label=part)
        bottom += values
    rest = np.array(
        [max(variants[n]["iteration"] * 1e3 - b, 0.0) for n, b in zip(names, bottom, strict=True)]
    )
    ax.bar(
        positions - width / 2, rest, width, bottom=bottom, label="rest of the step", color="0.85"
    )
    busy = np.array([variants[n]["device_busy"] * 1e3 for n in names])
    ax.bar(
        positions + width / 2,
        busy,
        width,
        label="device busy (overlaps)",
        color="white",
        edgecolor="0.3",
        hatch="//",
    )
    ax.set_xticks(positions, names)
    ax.set_ylabel("ms per training step (median)")
    ax.set_title("Where a steady training step goes (from the trace)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
