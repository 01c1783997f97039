"""The float32 elementwise evaluations the model's figures are made of, with their weights.

Each function returns the terms `(name, coef, value)` of `ElementwiseExtra` (conftest)
for one figure: an evaluation of `name` whose output has magnitude `value` and enters
the figure with weight `coef = |d figure / d f|` (first order). The weights are read
off the code of `model.py`, `hmc.py` and `vi.py` (each function says which lines) and
evaluated in float64 NumPy from the test's own reference quantities, never from the
code under test. Where an output enters the figure twice (`exp(log sigma^2)` in the
likelihood and in the prior's `log`), its weights add by the triangle inequality; an
evaluation that appears in two figures compared with each other (`a_n log b_n` in
`log_posterior` and in the log evidence) is counted in both: no cancellation between
two compiled programs is assumed.

The float32 matrix products, solves and the QR factorization (its square roots
included) are not terms: they are the rounding every CPU tolerance already holds, and
the session asks for float32 products on every backend (conftest).
"""

import numpy as np
from scipy import special

GAMMA, T0, KAPPA = 0.05, 10.0, 0.75  # Hoffman & Gelman (2014), Algorithm 5

Term = tuple[str, object, object]


def relative(name: str, weight, value) -> Term:
    """A term whose `weight` multiplies the function's relative error: `|d figure / d f|`
    is `weight / |f|`."""
    value = np.abs(np.asarray(value, np.float64))
    return name, np.abs(weight) / value, value


def nig_posterior(x, y, scale, a0, b0, m0=None):
    """Float64 closed form `(m_n, Lambda_n, a_n, b_n)` from the normal equations (fine in
    float64 for the designs the weights are read on)."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    n, d = x.shape
    m0 = np.zeros(d) if m0 is None else np.asarray(m0, np.float64)
    prec = x.T @ x + np.eye(d) / scale**2
    mean = np.linalg.solve(prec, x.T @ y + m0 / scale**2)
    b = b0 + 0.5 * (y @ y + m0 @ m0 / scale**2 - mean @ prec @ mean)
    return mean, prec, a0 + 0.5 * n, b


def log_joint(theta, x, y, scale, a0, b0, m0=None) -> list[Term]:
    """`model.log_joint` at one `theta = (w, u)`, `u = log sigma^2`:

        -0.5 (n (LOG_2PI + u) + sum(r^2) / exp(u))
        -0.5 (d (LOG_2PI + log(s^2 exp(u))) + sum(dw^2) / (s^2 exp(u)))
        + a0 log(b0) - gammaln(a0) - a0 u - b0 exp(-u)

    with `r = y - X w`, `dw = w - m0`. `exp(u)` enters the likelihood, the prior's
    quadratic form and the prior's `log`: relative weight
    `sum(r^2) / (2 sigma^2) + sum(dw^2) / (2 s^2 sigma^2) + d / 2`. `log(s^2 sigma^2)`: weight
    `d / 2`; `log(b0)`: `a0`; `gammaln(a0)`: 1; `exp(-u)`: `b0`."""
    theta = np.asarray(theta, np.float64)
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    n, d = x.shape
    w, u = theta[:d], theta[d]
    m0 = np.zeros(d) if m0 is None else np.asarray(m0, np.float64)
    sigma2 = np.exp(u)
    r2 = np.sum((y - x @ w) ** 2)
    dw2 = np.sum((w - m0) ** 2)
    return [
        relative("exp", r2 / (2 * sigma2) + dw2 / (2 * scale**2 * sigma2) + d / 2, sigma2),
        ("log", d / 2, np.log(scale**2 * sigma2)),
        ("log", a0, np.log(b0)),
        ("gammaln", 1.0, special.gammaln(a0)),
        ("exp", b0, np.exp(-u)),
    ]


def log_posterior(theta, mean, prec, a_n, b_n) -> list[Term]:
    """`model.log_posterior` at one `theta = (w, u)`:

        -0.5 (d (LOG_2PI + u) - 2 sum(log |R_ii|) + sum(z^2) / exp(u))
        + a_n log(b_n) - gammaln(a_n) - a_n u - b_n exp(-u)

    with `z = R (w - m_n)`, `R^T R = Lambda_n`. `exp(u)`: relative weight
    `sum(z^2) / (2 sigma^2)`; each `log |R_ii|`: 1; `log(b_n)`: `a_n`; `gammaln(a_n)`: 1;
    `exp(-u)`: `b_n`."""
    theta = np.asarray(theta, np.float64)
    d = prec.shape[0]
    w, u = theta[:d], theta[d]
    z2 = (w - mean) @ prec @ (w - mean)
    return [
        relative("exp", z2 / (2 * np.exp(u)), np.exp(u)),
        ("log", 1.0, np.log(np.diag(np.linalg.cholesky(prec)))),
        ("log", a_n, np.log(b_n)),
        ("gammaln", 1.0, special.gammaln(a_n)),
        ("exp", b_n, np.exp(-u)),
    ]


def log_evidence(prec, scale, a0, b0, a_n, b_n) -> list[Term]:
    """`model.log_marginal_likelihood`:

        -0.5 n LOG_2PI + 0.5 (-2 d log(s) - 2 sum(log |R_ii|))
        + a0 log(b0) - a_n log(b_n) + gammaln(a_n) - gammaln(a0)

    Each `log |R_ii|`: 1; `log(s)`: `d`; `log(b0)`: `a0`; `log(b_n)`: `a_n`;
    `gammaln(a_n)` and `gammaln(a0)`: 1 each."""
    d = prec.shape[0]
    return [
        ("log", 1.0, np.log(np.diag(np.linalg.cholesky(prec)))),
        ("log", d, np.log(scale)),
        ("log", a0, np.log(b0)),
        ("log", a_n, np.log(b_n)),
        ("gammaln", 1.0, special.gammaln(a_n)),
        ("gammaln", 1.0, special.gammaln(a0)),
    ]


def bayes_rule(thetas, x, y, scale, a0, b0) -> tuple[list[list[Term]], list[list[Term]]]:
    """Per point of `thetas` `(k, d + 1)` (a prior mean of zero): the terms of
    `log_joint` alone, and of `log_joint - log_posterior` compared with the log evidence
    (the three functions' terms together; weights from the float64 closed form)."""
    mean, prec, a_n, b_n = nig_posterior(x, y, scale, a0, b0)
    evid = log_evidence(prec, scale, a0, b0, a_n, b_n)
    joint = [log_joint(t, x, y, scale, a0, b0) for t in thetas]
    post = [log_posterior(t, mean, prec, a_n, b_n) for t in thetas]
    return joint, [j + p + evid for j, p in zip(joint, post, strict=True)]


def log_sigma2_mean(a_n, b_n) -> list[Term]:
    """`E[log sigma^2] = log(b_n) - digamma(a_n)` (`model.moments`): weight 1 each."""
    return [("log", 1.0, np.log(b_n)), ("digamma", 1.0, special.digamma(a_n))]


def log_sigma2_var(a_n) -> list[Term]:
    """`Var[log sigma^2] = trigamma(a_n)` (`model.moments`): weight 1."""
    return [("trigamma", 1.0, special.polygamma(1, a_n))]


def entropy(raw_diagonal) -> list[Term]:
    """`vi.entropy`: `d/2 (1 + LOG_2PI) + sum(log(exp(raw_ii)))`. Each `exp(raw_ii)`:
    relative weight 1 (its relative error is the log's absolute one); each `log`: 1, at
    `|raw_ii|`."""
    raw = np.asarray(raw_diagonal, np.float64)
    return [relative("exp", 1.0, np.exp(raw)), ("log", 1.0, raw)]


def dual_averaging(step0, accepts, target) -> list[list[Term]]:
    """`hmc.dual_averaging_init` and `dual_averaging_update`, iterate by iterate: for the
    `m`-th update, the terms of `log_step_m`, `log_step_avg_m` and `h_bar_m` (in that
    order, three lists per update).

        mu = log(10) + log(eps_0)
        h_bar_m = (1 - 1/(m + t0)) h_bar_{m-1} + (target - a_m) / (m + t0)   (no term)
        log_step_m = mu - sqrt(m) / gamma * h_bar_m
        log_step_avg_m = eta_m log_step_m + (1 - eta_m) log_step_avg_{m-1},  eta_m = m**-0.75

    `log(10)` and `log(eps_0)`: weight 1 in every `log_step_m` and, the averaging
    weights summing to 1, in every `log_step_avg_m`. `sqrt(k)`: `|h_bar_k| / gamma` in
    `log_step_k`, times `c_{m,k} = eta_k prod_{j=k+1..m} (1 - eta_j)` in `log_step_avg_m`.
    `eta_k`: `|log_step_k - log_step_avg_{k-1}| prod_{j=k+1..m} (1 - eta_j)` in
    `log_step_avg_m`."""
    mu_terms = [("log", 1.0, np.log(10.0)), ("log", 1.0, np.log(step0))]
    mu = np.log(10.0 * step0)
    h_bar, avg = 0.0, 0.0
    sqrt_w, eta_w, roots, etas = [], [], [], []  # per k: weights in the current average
    out = []
    for m, a in enumerate(accepts, start=1):
        h_bar = (1.0 - 1.0 / (m + T0)) * h_bar + (target - a) / (m + T0)
        log_step = mu - np.sqrt(m) / GAMMA * h_bar
        eta = m**-KAPPA
        sqrt_w = [c * (1.0 - eta) for c in sqrt_w] + [eta * abs(h_bar) / GAMMA]
        eta_w = [c * (1.0 - eta) for c in eta_w] + [abs(log_step - avg)]
        roots.append(np.sqrt(m))
        etas.append(eta)
        avg = eta * log_step + (1.0 - eta) * avg
        out.append(mu_terms + [("sqrt", abs(h_bar) / GAMMA, np.sqrt(m))])
        out.append(mu_terms + [("sqrt", np.array(sqrt_w), np.array(roots))])
        out[-1].append(("pow", np.array(eta_w), np.array(etas)))
        out.append([])
    return out
