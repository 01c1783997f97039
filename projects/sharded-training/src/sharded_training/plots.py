"""PNG plots: the loss curve of a run and the step-time breakdown of a profile."""

from pathlib import Path

import matplotlib

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


def step_breakdown(variants: dict[str, dict[str, float]], path: Path) -> Path:
    """Stacked bars: per-step milliseconds of each trace category, one bar per variant."""
    names = list(variants)
    categories = sorted({c for v in variants.values() for c in v})
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    bottom = [0.0] * len(names)
    for category in categories:
        values = [variants[n].get(category, 0.0) * 1e3 for n in names]
        ax.bar(names, values, bottom=bottom, label=category)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("ms per training step (median)")
    ax.set_title("Where a steady training step goes (from the trace)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
