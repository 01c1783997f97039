"""PNG figures of the report: fits, profiles, convergence."""

from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # Files only, no display.
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from scientific_inverse.data import Observations  # noqa: E402


def fits(
    path: Path,
    obs: Observations,
    short_obs: Observations,
    predictions: dict[str, np.ndarray],
    short_window: float,
) -> Path:
    """Long window: data, truth and the refined fit; short window: its fit extrapolated."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    ax = axes[0]
    fitted = ~obs.heldout
    ax.plot(obs.ts, obs.x_true, color="0.6", lw=2, label="truth")
    ax.plot(obs.ts, predictions["refined"], color="C0", lw=1.2, label="fit (RK4, refined)")
    ax.plot(obs.ts[fitted], obs.x[fitted], ".", color="C1", ms=4, label="fitted observations")
    ax.plot(obs.ts[~fitted], obs.x[~fitted], "x", color="C3", ms=5, label="held out")
    ax.set_ylabel("position x")
    ax.set_title("Long window: fit and held-out observations")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[1]
    ax.plot(obs.ts, obs.x_true, color="0.6", lw=2, label="truth")
    ax.plot(obs.ts, predictions["short"], color="C2", lw=1.2, label="short-window fit")
    seen = np.isfinite(short_obs.x) & ~short_obs.heldout
    ax.plot(
        short_obs.ts[seen],
        short_obs.x[seen],
        ".",
        color="C1",
        ms=5,
        label="short-window observations",
    )
    ax.axvline(short_window, color="k", ls=":", lw=1)
    ax.set_xlabel("time t")
    ax.set_ylabel("position x")
    ax.set_title(f"Short window (t <= {short_window:g}): extrapolated beyond the data")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def profiles(path: Path, result: dict[str, Any]) -> Path:
    """Deviance curves of c and k for both windows, with the Laplace intervals."""
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5))
    for row, window in enumerate(("long", "short")):
        for col, name in enumerate(("c", "k")):
            ax = axes[row, col]
            prof = result["profiles"][window][name]
            ax.plot(prof["values"], prof["deviance"], "o-", ms=3, label="profile deviance")
            ax.axhline(prof["threshold"], color="k", ls="--", lw=1, label="chi2(1) threshold")
            lo, hi = prof["laplace"]
            ax.axvspan(lo, hi, color="C2", alpha=0.15, label="Laplace interval")
            ax.axvline(result["truth"][name], color="C3", lw=1, label="true value")
            ax.set_title(f"{window} window: profile of {name}")
            ax.set_xlabel(name)
            ax.set_ylabel("n log(RSS / RSS_min)")
            ax.set_ylim(bottom=0, top=max(3 * prof["threshold"], 1.0))
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def convergence(path: Path, series: list[dict[str, Any]]) -> Path:
    """log-log error against step, one panel per series `{title, dt, errors: {label: []},
    order}`, each with its fitted slope."""
    fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.8))
    for ax, s in zip(np.atleast_1d(axes), series, strict=True):
        dt = np.asarray(s["dt"])
        for label, errors in s["errors"].items():
            ax.loglog(dt, errors, "o-", label=label)
        ref = np.asarray(next(iter(s["errors"].values())))
        ax.loglog(dt, ref[-1] * (dt / dt[-1]) ** 4, "k--", lw=1, label="slope 4")
        ax.set_title(f"{s['title']}\nobserved order {s['order']}")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no crowded labels
        ax.set_xlabel("step dt")
        ax.set_ylabel(s.get("ylabel", "error"))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def trajectories(
    path: Path, ts: np.ndarray, ys: np.ndarray, labels: list[str], state_names: tuple[str, str]
) -> Path:
    """Each simulated trajectory (`ys`: `(batch, time, 2)` at times `ts`): both state
    components against time, and the phase portrait."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for row, label in zip(ys, labels, strict=True):
        axes[0].plot(ts, row[:, 0], label=label)
        axes[1].plot(ts, row[:, 1], label=label)
        axes[2].plot(row[:, 0], row[:, 1], label=label)
    axes[0].set(xlabel="t", ylabel=state_names[0], title=f"{state_names[0]}(t)")
    axes[1].set(xlabel="t", ylabel=state_names[1], title=f"{state_names[1]}(t)")
    axes[2].set(xlabel=state_names[0], ylabel=state_names[1], title="phase portrait")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
