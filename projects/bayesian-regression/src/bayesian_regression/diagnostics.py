"""Sampler diagnostics, by hand: rank-normalized split R-hat, bulk and tail
effective sample size, and the Monte-Carlo standard error of a mean.

The definitions are those of Vehtari, Gelman, Simpson, Carpenter and Buerkner
(2021), "Rank-normalization, folding, and localization: an improved R-hat
for assessing convergence of MCMC", as Stan and ArviZ compute them:

  - split every chain in two halves (so a trend within a chain shows up as
    disagreement between halves);
  - rank-normalize: replace draws by `Phi^{-1}((rank - 3/8) / (S + 1/4))`
    over all `S` pooled draws (Blom's offsets), so heavy tails cannot hide;
  - R-hat = max(R-hat of the rank-normalized draws, R-hat of the
    rank-normalized folded draws `|x - median|`);
  - bulk-ESS: ESS of the rank-normalized split draws; tail-ESS: the smaller
    ESS of the indicators `x <= q_0.05` and `x <= q_0.95`;
  - ESS from autocorrelations pooled over chains (FFT autocovariance),
    truncated by Geyer's initial positive sequence and made monotone.

Every function takes draws of shape `(chains, draws)` for one scalar and
refuses input it cannot judge (a `DiagnosticError` naming the problem)
instead of returning NaN.
"""

import numpy as np
from scipy import special

MIN_DRAWS = 4  # per chain: each half of a split chain needs at least 2


class DiagnosticError(ValueError):
    """Draws a diagnostic cannot judge; the message says why."""


def check_draws(draws, *, min_chains: int = 1) -> np.ndarray:
    """Returns `draws` as float64 `(chains, draws)` after checking them."""
    arr = _as_float_array(draws)
    if arr.ndim != 2:
        raise DiagnosticError(
            f"Draws of one quantity must have shape `(chains, draws)`, not `{arr.shape}`."
        )
    chains, n = arr.shape
    if chains == 0:
        raise DiagnosticError(f"The draws are empty: shape `{arr.shape}`, no chain at all.")
    if n < MIN_DRAWS:
        raise DiagnosticError(
            f"A diagnostic needs at least `{MIN_DRAWS}` draws per chain to split chains in "
            f"halves, but there are `{n}`; draw more samples."
        )
    if chains < min_chains:
        raise DiagnosticError(
            f"R-hat compares chains and needs at least `{min_chains}` of them, but there is "
            f"`{chains}`; run more chains."
        )
    if not np.all(np.isfinite(arr)):
        raise DiagnosticError(
            f"The draws hold `{int((~np.isfinite(arr)).sum())}` non-finite values; a sampler "
            f"that produced them has failed, and no diagnostic can summarize them."
        )
    return arr


def _as_float_array(draws) -> np.ndarray:
    """`draws` as a float64 array; a DiagnosticError for anything that is not real numbers."""
    try:
        raw = np.asarray(draws)
    except ValueError as err:  # ragged nested lists
        raise DiagnosticError(f"The draws are not an array: {str(err).rstrip('.')}.") from None
    if raw.dtype.kind not in "fiub":
        raise DiagnosticError(f"The draws must be real numbers, but their dtype is `{raw.dtype}`.")
    return raw.astype(np.float64)


def split_chains(draws: np.ndarray) -> np.ndarray:
    """`(chains, n)` -> `(2 chains, n // 2)`: first and last halves (the middle
    draw of an odd-length chain is dropped)."""
    half = draws.shape[1] // 2
    return np.concatenate([draws[:, :half], draws[:, -half:]], axis=0)


def rank_normalize(draws: np.ndarray) -> np.ndarray:
    """Normal scores of the pooled ranks (ties averaged), same shape as `draws`."""
    ranks = _rankdata(draws.ravel()).reshape(draws.shape)
    return special.ndtri((ranks - 3.0 / 8.0) / (draws.size + 0.25))


def _rankdata(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties given their average rank."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Group equal values; every member gets the mean of its group's positions.
    boundaries = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])
    group = np.cumsum(boundaries) - 1
    positions = np.arange(1, x.size + 1, dtype=np.float64)
    sums = np.bincount(group, weights=positions)
    counts = np.bincount(group)
    ranks = np.empty_like(positions)
    ranks[order] = (sums / counts)[group]
    return ranks


def basic_rhat(draws: np.ndarray) -> float:
    """Gelman-Rubin potential scale reduction of `(chains, n)` draws (no splitting).

    W = mean of the chains' variances and B = n x variance of the chain means, both
    with `ddof=1` (the unbiased ones ArviZ uses; the tests compare to 1e-9).
    [claim:basic-rhat-ddof-1]
    """
    # --- exercise stage 3: R-hat = sqrt(((n-1)/n W + B/n) / W), B = n Var(chain means). ---
    n = draws.shape[1]
    within = np.mean(np.var(draws, axis=1, ddof=1))
    between = n * np.var(np.mean(draws, axis=1), ddof=1)
    var_plus = (n - 1.0) / n * within + between / n
    return float(np.sqrt(var_plus / within))
    # --- end exercise ---


def rhat(draws) -> float:
    """Rank-normalized split R-hat: `max(bulk, folded)`. Needs >= 2 chains."""
    arr = check_draws(draws, min_chains=2)
    split = split_chains(arr)
    if np.ptp(split) == 0.0:
        raise DiagnosticError("Every draw is the same value; R-hat is undefined for a constant.")
    bulk = basic_rhat(rank_normalize(split))
    folded = basic_rhat(rank_normalize(np.abs(split - np.median(split))))
    return max(bulk, folded)


def autocovariance(draws: np.ndarray) -> np.ndarray:
    """Biased autocovariance of every chain at every lag, by FFT; shape `(chains, n)`."""
    n = draws.shape[1]
    centred = draws - draws.mean(axis=1, keepdims=True)
    size = 2 ** int(np.ceil(np.log2(2 * n)))  # zero-padded: no circular wrap-around
    spectrum = np.fft.rfft(centred, n=size, axis=1)
    return np.fft.irfft(spectrum * np.conjugate(spectrum), n=size, axis=1)[:, :n] / n


def basic_ess(draws: np.ndarray) -> float:
    """Effective sample size of `(chains, n)` draws from the autocorrelation pooled
    over chains (Stan's estimator).

    Stan's steps, each needed to match ArviZ to 1e-9:
        W = mean of `autocovariance` at lag 0 x n / (n - 1); var+ = W (n - 1) / n,
            plus the variance of the chain means (ddof=1) [claim:ess-var-plus] when chains > 1
            [claim:ess-between-term-only-with-chains]
        rho_t = 1 - (W - mean over chains of the lag-t autocovariance) / var+, rho_0 = 1
        Geyer's initial positive sequence over pairs (rho_{t+1}, rho_{t+2}), then the
            initial monotone sequence (no pair sum above the one before)
        tau = -1 + 2 sum of the kept rho + the last positive even term, floored at
            1 / log10(S); ESS = S / tau with S = chains x n [claim:ess-stan-steps]
    Draws that are all equal carry no autocorrelation to estimate: their ESS is S.
    [claim:ess-constant-draws]
    """
    chains, n = draws.shape
    if np.ptp(draws) == 0.0:
        return float(chains * n)
    # --- exercise stage 3: Pooled autocorrelations, Geyer pairs, tau; ESS = S / tau. ---
    acov = autocovariance(draws)
    within = np.mean(acov[:, 0]) * n / (n - 1.0)
    var_plus = within * (n - 1.0) / n
    if chains > 1:
        var_plus += np.var(draws.mean(axis=1), ddof=1)
    rho = 1.0 - (within - acov.mean(axis=0)) / var_plus
    rho[0] = 1.0
    # Geyer's initial positive sequence: add pairs (rho_{t+1}, rho_{t+2}) while the
    # previous pair sum is positive; a negative pair is left out (Stan's loop).
    kept = np.zeros(n)
    kept[:2] = rho[:2]
    even, odd = rho[0], rho[1]
    t = 1
    while t < n - 3 and even + odd > 0.0:
        even, odd = rho[t + 1], rho[t + 2]
        if even + odd >= 0.0:
            kept[t + 1], kept[t + 2] = even, odd
        t += 2
    max_t = t - 2
    if even > 0.0:  # the positive even term of the first non-positive pair counts once
        kept[max_t + 1] = even
    # Geyer's initial monotone sequence: no pair sum larger than the one before.
    t = 1
    while t <= max_t - 2:
        if kept[t + 1] + kept[t + 2] > kept[t - 1] + kept[t]:
            kept[t + 1] = kept[t + 2] = (kept[t - 1] + kept[t]) / 2.0
        t += 2
    tau = -1.0 + 2.0 * np.sum(kept[: max_t + 1]) + kept[max_t + 1]
    total = chains * n
    tau = max(tau, 1.0 / np.log10(total))
    return float(total / tau)
    # --- end exercise ---


def ess_bulk(draws) -> float:
    """Bulk-ESS: ESS of the rank-normalized split chains."""
    arr = check_draws(draws)
    return basic_ess(rank_normalize(split_chains(arr)))


def ess_tail(draws, prob: float = 0.05) -> float:
    """Tail-ESS: min ESS of the indicators of the `prob` and `1 - prob` quantiles."""
    arr = check_draws(draws)
    out = []
    for p in (prob, 1.0 - prob):
        indicator = (arr <= np.quantile(arr, p)).astype(np.float64)
        out.append(basic_ess(split_chains(indicator)))
    return min(out)


def ess_mean(draws) -> float:
    """ESS for the mean (no rank normalization), the one an MCSE of a mean uses."""
    arr = check_draws(draws)
    return basic_ess(split_chains(arr))


def mcse_mean(draws) -> float:
    """Monte-Carlo standard error of the mean: `sd / sqrt(ESS_mean)`."""
    arr = check_draws(draws)
    return float(np.std(arr, ddof=1) / np.sqrt(ess_mean(arr)))


def summarize(draws, names: list[str]) -> list[dict[str, float | str]]:
    """One row per quantity of `draws` `(chains, n, k)`: mean, sd, MCSE, R-hat,
    bulk-ESS, tail-ESS (R-hat omitted, as None, for a single chain)."""
    named = isinstance(names, list | tuple) and all(isinstance(n, str) and n for n in names)
    if not named or not names:
        raise DiagnosticError(f"`names` must be a list of non-empty strings, not `{names!r}`.")
    if len(set(names)) != len(names):
        raise DiagnosticError(f"`names` must not repeat a name: `{list(names)}`.")
    arr = _as_float_array(draws)
    if arr.ndim != 3 or arr.shape[2] != len(names):
        raise DiagnosticError(
            f"Expected draws of shape `(chains, draws, {len(names)})`, got `{arr.shape}`."
        )
    rows = []
    for i, name in enumerate(names):
        x = check_draws(arr[:, :, i])
        rows.append(
            {
                "name": name,
                "mean": float(x.mean()),
                "sd": float(x.std(ddof=1)),
                "mcse": mcse_mean(x),
                "rhat": rhat(x) if x.shape[0] >= 2 else None,
                "ess_bulk": ess_bulk(x),
                "ess_tail": ess_tail(x),
            }
        )
    return rows
