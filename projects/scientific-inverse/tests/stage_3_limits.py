"""The limits of stage 3's statistical tests, shared by `test_stage_3_statistics.py`,
`test_stage_3_study.py` and the size sweep (the script `tests/size_sweep`, run on demand).

Each limit is a quantile of the distribution its figure has under a noise model, at
the tail SIZE (split over the parameters and sides the test checks); each test's
docstring says what backs its size.
"""

import math

from scipy import stats

# Each statistical check of the study's noisy figures fails a correct solution with
# probability at most SIZE under the noise model its limit is derived from (a union
# bound over the parameters and sides it checks); the stage's eight such checks
# together fail it less than once in 10^4. Their figures over 200 seeds and under
# the laplace rewrites of reformulations.toml: evidence/size_sweep.json, made by
# the `size_sweep` script beside the tests.
SIZE = 1e-5


def z_limit(dof: int) -> float:
    """Largest |estimate - truth| / se of two parameters: Student t with `dof` = n - 2
    degrees of freedom, two-sided."""
    return float(stats.t.isf(SIZE / 4, dof))


def se_ratio_range(seeds: int) -> tuple[float, float]:
    """Range of mean Laplace se / population std of `seeds` estimates, two parameters:
    the std is sigma sqrt(chi2(seeds - 1) / seeds) for estimates of spread sigma."""
    low = math.sqrt(seeds / stats.chi2.isf(SIZE / 4, seeds - 1))
    high = math.sqrt(seeds / stats.chi2.ppf(SIZE / 4, seeds - 1))
    return low, high


def fisher_rtol(dof: int) -> float:
    """Relative tolerance of Laplace se against expected-Fisher se: their ratio is
    sigma_hat / sigma = sqrt(chi2(dof) / dof), one draw for both parameters; the
    farther from 1 of its SIZE / 2 quantiles."""
    low = math.sqrt(stats.chi2.ppf(SIZE / 2, dof) / dof)
    high = math.sqrt(stats.chi2.isf(SIZE / 2, dof) / dof)
    return max(1.0 - low, high - 1.0)


def rmse_over_noise_range(n: int) -> tuple[float, float]:
    """Range of the RMSE of `n` held-out noisy values over the noise std, SIZE / 2
    each side: n RMSE^2 / sigma^2 is chi2(n) for the noise alone, plus the fit's own
    prediction error, which adds at most a chi2(2) (eigenvalues mu <= 1, see
    `heldout_rmse_truth_limit`)."""
    low = math.sqrt(stats.chi2.ppf(SIZE / 2, n) / n)
    return low, math.sqrt(stats.chi2.isf(SIZE / 2, n + 2) / n)


def coverage_floor(seeds: int, nominal: float) -> int:
    """Fewest seeds of `seeds` whose interval may cover, for each of two parameters:
    the SIZE / 2 quantile of Binomial(seeds, nominal)."""
    return int(stats.binom.ppf(SIZE / 2, seeds, nominal))


def coverage_band(draws: int, nominal: float) -> tuple[int, int]:
    """Fewest and most covering intervals of `draws`, two parameters, two-sided: the
    SIZE / 4 quantiles of Binomial(draws, nominal)."""
    return (
        int(stats.binom.ppf(SIZE / 4, draws, nominal)),
        int(stats.binom.isf(SIZE / 4, draws, nominal)),
    )
