"""PNG plots: trace plots, rank plots, and posterior marginals against the exact ones."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from bayesian_regression.diagnostics import _rankdata  # noqa: E402


def trace_plot(draws: np.ndarray, names: list[str], path: Path, title: str) -> Path:
    """One panel per quantity, one line per chain; `draws`: `(chains, n, k)`."""
    draws = np.asarray(draws)
    k = draws.shape[2]
    fig, axes = plt.subplots(k, 1, figsize=(8, 1.6 * k + 0.6), sharex=True, squeeze=False)
    for i, ax in enumerate(axes[:, 0]):
        for c in range(draws.shape[0]):
            ax.plot(draws[c, :, i], lw=0.5, alpha=0.7)
        ax.set_ylabel(names[i])
    axes[-1, 0].set_xlabel("draw")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def rank_plot(draws: np.ndarray, names: list[str], path: Path, title: str, bins: int = 20) -> Path:
    """Histogram of pooled ranks per chain: flat bars when chains agree."""
    draws = np.asarray(draws)
    chains, n, k = draws.shape
    fig, axes = plt.subplots(1, k, figsize=(2.6 * k + 0.6, 2.6), squeeze=False)
    edges = np.linspace(0, chains * n, bins + 1)
    for i, ax in enumerate(axes[0]):
        ranks = _rankdata(draws[:, :, i].ravel()).reshape(chains, n)
        for c in range(chains):
            counts, _ = np.histogram(ranks[c], bins=edges)
            ax.step(np.arange(bins), counts, where="mid", lw=0.8)
        ax.axhline(n / bins, color="k", ls="--", lw=0.8)
        ax.set_title(names[i], fontsize=9)
        ax.set_yticks([])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def posterior_vs_exact(
    samples: dict[str, np.ndarray],
    exact_marginals: list[stats.rv_continuous],
    gaussians: dict[str, tuple[np.ndarray, np.ndarray]],
    names: list[str],
    path: Path,
) -> Path:
    """Per quantity: histograms of each sampler's draws `(m, k)`, the exact
    marginal density (black), and each Gaussian approximation `(mean, var)`."""
    k = len(names)
    fig, axes = plt.subplots(1, k, figsize=(3.0 * k + 0.6, 2.8), squeeze=False)
    for i, ax in enumerate(axes[0]):
        exact = exact_marginals[i]
        lo, hi = exact.ppf(0.0005), exact.ppf(0.9995)
        grid = np.linspace(lo, hi, 300)
        for label, draws in samples.items():
            ax.hist(draws[:, i], bins=60, range=(lo, hi), density=True, alpha=0.35, label=label)
        ax.plot(grid, exact.pdf(grid), "k", lw=1.2, label="exact")
        for label, (mean, var) in gaussians.items():
            ax.plot(
                grid, stats.norm(mean[i], np.sqrt(var[i])).pdf(grid), lw=1.0, ls="--", label=label
            )
        ax.set_title(names[i], fontsize=9)
        ax.set_yticks([])
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def sbc_histogram(ranks: np.ndarray, names: list[str], num_ranks: int, path: Path) -> Path:
    """SBC rank histograms with the uniform expectation."""
    ranks = np.asarray(ranks)
    k = ranks.shape[1]
    fig, axes = plt.subplots(1, k, figsize=(2.6 * k + 0.6, 2.4), squeeze=False)
    for i, ax in enumerate(axes[0]):
        ax.hist(ranks[:, i], bins=np.arange(num_ranks + 2) - 0.5, color="C0")
        ax.axhline(ranks.shape[0] / (num_ranks + 1), color="k", ls="--", lw=0.8)
        ax.set_title(names[i], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
