"""PNG figures for the run dossier: learning curves, confusion matrix, errors.

Uses `matplotlib.figure.Figure` directly rather than `pyplot`: no global
figure state and no GUI backend, so it runs the same headless or not.
"""

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure


def learning_curves(history: list[dict[str, Any]], path: Path) -> None:
    """Loss and accuracy per epoch, training vs validation."""
    epochs = [r["epoch"] for r in history]
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    for ax, name in zip(fig.subplots(1, 2), ("loss", "accuracy"), strict=True):
        ax.plot(epochs, [r[f"train_{name}"] for r in history], label="train (dropout on)")
        ax.plot(epochs, [r[f"val_{name}"] for r in history], label="validation")
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Learning curves")
    fig.savefig(path, dpi=100)


def confusion_matrix(matrix: list[list[int]], path: Path) -> None:
    """Counts of (true label, prediction) on the test split."""
    counts = np.asarray(matrix)
    fig = Figure(figsize=(5, 4.5), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(counts, cmap="Blues")
    for (row, col), value in np.ndenumerate(counts):
        if value:
            color = "white" if value > counts.max() / 2 else "black"
            ax.text(col, row, str(value), ha="center", va="center", color=color, fontsize=8)
    ax.set_xticks(range(counts.shape[1]))
    ax.set_yticks(range(counts.shape[0]))
    ax.set_xlabel("prediction")
    ax.set_ylabel("true label")
    ax.set_title(f"Test confusion matrix ({counts.trace()}/{counts.sum()} correct)")
    fig.colorbar(image, ax=ax)
    fig.savefig(path, dpi=100)


def error_examples(errors: list[dict[str, int]], images: dict[int, np.ndarray], path: Path) -> None:
    """Every misclassified test image, titled with its sample ID, label and prediction."""
    columns = 8
    rows = max(1, -(-len(errors) // columns))
    fig = Figure(figsize=(columns * 1.2, rows * 1.4 + 0.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, columns)).ravel()
    for ax in axes:
        ax.axis("off")
    # More axes than errors: the last row may be partly empty.
    for ax, error in zip(axes, errors, strict=False):
        ax.imshow(images[error["id"]].reshape(8, 8), cmap="gray_r", vmin=0.0, vmax=1.0)
        ax.set_title(f"id {error['id']}\n{error['label']} -> {error['prediction']}", fontsize=7)
    title = "Misclassified test examples (true -> predicted)"
    fig.suptitle(title if errors else "No misclassified test examples")
    fig.savefig(path, dpi=100)
