"""The parity report as a picture: error over tolerance per layer, log scale."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def parity_plot(report: dict, path: str | Path, title: str) -> Path:
    """One bar per layer (forward order); the line at 1 is the tolerance."""
    names = [row["name"] for row in report["layers"]]
    ratios = [max(row["ratio"], 1e-6) for row in report["layers"]]
    first = report["first_disagreement"]
    colors = [
        "tab:red" if first and i >= names.index(first) else "tab:blue" for i in range(len(names))
    ]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar(names, ratios, color=colors)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="tolerance")
    ax.set_yscale("log")
    ax.set_ylabel("max |error| / tolerance")
    ax.set_title(f"{title}: first disagreement {first or 'none'}")
    ax.tick_params(axis="x", rotation=45)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
