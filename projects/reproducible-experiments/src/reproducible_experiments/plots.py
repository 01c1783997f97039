"""PNG figures: a run's learning curve and a comparison's paired differences."""

import matplotlib

matplotlib.use("Agg")  # Files only: no display is needed or assumed.

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def learning_curve(history: list[dict[str, float]], title: str) -> Figure:
    """Training and validation loss, and validation accuracy, per epoch."""
    epochs = [record["epoch"] for record in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
    ax_loss.plot(epochs, [r["train_loss"] for r in history], label="train (smoothed targets)")
    ax_loss.plot(epochs, [r["val_loss"] for r in history], label="validation")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", yscale="log", title="loss")
    ax_loss.legend()
    ax_acc.plot(epochs, [r["val_accuracy"] for r in history], color="C1")
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="validation accuracy")
    fig.suptitle(title)
    return fig


def paired_differences(
    labels: list[str],
    differences: list[float | None],
    ci: tuple[float, float] | None,
    mean: float | None,
    threshold: float,
    title: str,
) -> Figure:
    """One point per pair (`None` marks an incomplete pair, drawn as a cross at 0),
    the mean difference with its bootstrap interval, and the decision threshold."""
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(labels) + 1.8), layout="constrained")
    for row, diff in enumerate(differences):
        if diff is None:
            ax.plot([0.0], [row], marker="x", color="C3", linestyle="none")
            ax.annotate("incomplete", (0.0, row), xytext=(6, -3), textcoords="offset points")
        else:
            ax.plot([diff], [row], marker="o", color="C0", linestyle="none")
    if mean is not None and ci is not None:
        ax.axvspan(ci[0], ci[1], color="C0", alpha=0.15, label="bootstrap CI of the mean")
        ax.axvline(mean, color="C0", label="mean paired difference")
    ax.axvline(threshold, color="C3", linestyle="--", label="decision threshold")
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="candidate - baseline", title=title)
    ax.legend(loc="best", fontsize="small")
    return fig


def close(fig: Figure) -> None:
    plt.close(fig)
