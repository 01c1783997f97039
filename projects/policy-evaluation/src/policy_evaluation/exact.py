"""Exact answers for the enumerated grid world, in NumPy float64.

Policy evaluation is one linear solve: V = (I - gamma P_pi)^-1 r_pi, where the
rows of terminal (absorbing) states are zero. The exact policy gradient of a
tabular softmax policy uses the discounted occupancy from the start state:
dJ/dtheta[s, a] = d(s) pi(a|s) (Q(s, a) - V(s)).
"""

import numpy as np


def check_mdp(P, R, terminal) -> None:
    """Raises `ValueError` naming the argument unless `P` is a transition table
    `[S, A, S]` whose rows are probability distributions, `R` finite rewards of the
    same shape and `terminal` a bool `[S]`: a damaged table would give values
    that look like answers."""
    P, R, terminal = np.asarray(P), np.asarray(R), np.asarray(terminal)
    if P.ndim != 3 or P.shape[0] != P.shape[2] or P.shape[0] == 0 or P.shape[1] == 0:
        raise ValueError(f"`P` must have shape [S, A, S], not {P.shape}.")
    if not np.isfinite(P).all() or (P < 0).any() or not np.allclose(P.sum(axis=2), 1.0):
        raise ValueError("`P` must hold probabilities: finite, >= 0, each P[s, a, :] summing to 1.")
    if R.shape != P.shape or not np.isfinite(R).all():
        raise ValueError(f"`R` must be finite with the shape of `P` {P.shape}, not {R.shape}.")
    if terminal.shape != P.shape[:1] or terminal.dtype != bool:
        raise ValueError(
            f"`terminal` must be a bool array of shape {P.shape[:1]}, not "
            f"{terminal.dtype}{list(terminal.shape)}."
        )


def check_gamma(gamma: float) -> None:
    if not (isinstance(gamma, int | float | np.floating) and 0.0 <= gamma < 1.0):
        raise ValueError(f"`gamma` must be a number in [0, 1), not {gamma!r}.")


def check_policy(pi, shape: tuple[int, int]) -> None:
    pi = np.asarray(pi)
    if pi.shape != shape:
        raise ValueError(f"`pi` must have shape {list(shape)} (states, actions), not {pi.shape}.")
    if not np.isfinite(pi).all() or (pi < 0).any() or not np.allclose(pi.sum(axis=1), 1.0):
        raise ValueError("`pi` must hold probabilities: finite, >= 0, each row summing to 1.")


def policy_matrices(P, R, terminal, pi):
    """`(P_pi [S, S], r_pi [S])` of the policy `pi [S, A]`, float64.

    Cases:
      a live state s -> `P_pi[s, t] = sum_a pi[s, a] P[s, a, t]` and
        `r_pi[s] = sum_a pi[s, a] sum_t P[s, a, t] R[s, a, t]` (expected reward)
        [claim:policy-matrices-average-over-pi].
      a terminal state s -> row `P_pi[s]` and `r_pi[s]` are 0 (absorbing, so V = 0
        there), whatever the table holds for s [claim:terminal-rows-absorbing].
      any set of terminal states (none included), `gamma` 0 to 0.9 -> `evaluate_policy`
        equals Bellman sweeps to 1e-9 [claim:evaluation-equals-bellman-sweeps].
    """
    # --- exercise stage 3: Average P and R over pi(a|s); terminal rows stay zero. ---
    live = (~terminal).astype(np.float64)[:, None]
    P_pi = np.einsum("sa,sat->st", pi, P) * live
    r_pi = np.einsum("sa,sat,sat->s", pi, P, R) * live[:, 0]
    return P_pi, r_pi
    # --- end exercise ---


def evaluate_policy(P, R, terminal, pi, gamma: float) -> np.ndarray:
    """V^pi for every state (0 at terminal states) [claim:evaluation-equals-bellman-sweeps].
    Raises `ValueError` naming a damaged argument (see `check_mdp`, `check_policy`,
    `check_gamma`) [claim:evaluation-refuses-damaged-arguments]."""
    check_mdp(P, R, terminal)
    check_policy(pi, np.shape(P)[:2])
    check_gamma(gamma)
    # --- exercise stage 3: Solve (I - gamma P_pi) V = r_pi. ---
    P_pi, r_pi = policy_matrices(P, R, terminal, pi)
    return np.linalg.solve(np.eye(len(r_pi)) - gamma * P_pi, r_pi)
    # --- end exercise ---


def q_values(P, R, terminal, V, gamma: float) -> np.ndarray:
    Q = np.einsum("sat,sat->sa", P, R + gamma * V[None, None, :])
    return Q * (~terminal)[:, None]


def value_iteration(P, R, terminal, gamma: float, tol: float = 1e-12, max_iter: int = 100_000):
    """Optimal values and a greedy optimal policy (one-hot table)
    [claim:value-iteration-optimal].

    Cases:
      terminal states -> V = 0 [claim:value-iteration-terminal-zero].
      stop -> once `max |V_new - V| < tol` [claim:value-iteration-stops-below-tol].
      the policy -> `np.eye(A)[argmax_a Q(s, a)]` for EVERY state, terminal rows
        included: each row one-hot, summing to 1 (`evaluate_policy` refuses other
        rows); its exact values must equal the returned V to 1e-9
        [claim:value-iteration-greedy-one-hot].
    """
    check_mdp(P, R, terminal)
    check_gamma(gamma)
    # --- exercise stage 4: Iterate V(s) <- max_a Q(s, a) to tol; return V and greedy pi. ---
    V = np.zeros(P.shape[0])
    for _ in range(max_iter):
        V_new = q_values(P, R, terminal, V, gamma).max(axis=1) * (~terminal)
        if np.max(np.abs(V_new - V)) < tol:
            V = V_new
            break
        V = V_new
    pi = np.eye(P.shape[1])[q_values(P, R, terminal, V, gamma).argmax(axis=1)]
    return V, pi
    # --- end exercise ---


def softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def exact_policy_gradient(P, R, terminal, theta, gamma: float, start: int) -> np.ndarray:
    """Gradient of J = V^pi(start) with respect to softmax logits `theta[s, a]`.

    Cases:
      occupancy `d` -> the unnormalised discounted visit count from `start`,
        `d = sum_t gamma^t Pr(s_t = s)`, i.e. `(I - gamma P_pi)^T d = e_start`; not
        multiplied by `1 - gamma` (the tests compare with differences of J itself)
        [claim:gradient-unnormalised-occupancy].
      `pi` -> `softmax(theta)` row by row; `Q` and `V` of that `pi` (0 at terminals)
        [claim:gradient-of-softmax-policy].
      result -> `d[s] pi[s, a] (Q[s, a] - V[s])`, equal to central differences of J
        to 1e-5, on drawn MDPs too [claim:gradient-equals-central-differences].
      `start` outside 0 to S - 1, or `theta` not finite `[S, A]` logits -> `ValueError`
        naming it [claim:gradient-refuses-bad-start-or-theta].
    """
    check_mdp(P, R, terminal)
    check_gamma(gamma)
    theta = np.asarray(theta)
    if theta.shape != np.shape(P)[:2] or not np.isfinite(theta).all():
        raise ValueError(
            f"`theta` must be finite logits of shape {list(np.shape(P)[:2])}, not {theta.shape}."
        )
    if type(start) not in (int, np.int32, np.int64) or not 0 <= start < np.shape(P)[0]:
        raise ValueError(f"`start` must be a state from 0 to {np.shape(P)[0] - 1}, not {start!r}.")
    # --- exercise stage 3: d(s) pi(a|s) (Q - V); occupancy d: (I - gamma P_pi)^T d = e_start. ---
    pi = softmax(theta)
    P_pi, r_pi = policy_matrices(P, R, terminal, pi)
    n = len(r_pi)
    V = np.linalg.solve(np.eye(n) - gamma * P_pi, r_pi)
    Q = q_values(P, R, terminal, V, gamma)
    d = np.linalg.solve((np.eye(n) - gamma * P_pi).T, np.eye(n)[start])
    return d[:, None] * pi * (Q - V[:, None])
    # --- end exercise ---
