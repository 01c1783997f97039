"""Stage 3: gradients against the exact answer.

- Exact policy gradient of a tabular softmax policy on the grid world from the
  enumerated MDP (occupancy and values by linear solves), checked first by
  central finite differences of the exactly evaluated J, then against the
  sampled REINFORCE estimator: its mean lies within a z = 6 interval of the
  exact gradient in every entry, at two sample sizes, and the interval shrinks
  like 1/sqrt(samples).
- On drawn MDPs (2-6 states, 2-4 actions, any set of absorbing states, gamma
  0, 0.5 or 0.9, random policies and start states): `evaluate_policy`
  against Bellman iteration written with explicit sums, and the exact
  gradient against central differences of that independent J; `softmax`
  against SciPy at logits up to 700; `start` and `theta` checked on both
  sides of their bounds; `evaluate_policy` names the one damaged argument
  among P, R, terminal, pi and gamma.
- PPO's clipped objective on a hand-written table of signed cases: value and
  gradient as the formula says, gradient zero where clipped.
- The whole PPO loss against a NumPy float64 computation of its formula
  (network forward pass included): advantages normalized per minibatch, the
  value loss clipped around the old values (the pessimistic max), the entropy
  bonus subtracted from the loss; at two settings of clip range and
  coefficients, with the entropy term's contribution checked on its own.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_evaluation import exact
from policy_evaluation.config import Config
from policy_evaluation.envs import GridWorld
from policy_evaluation.model import apply, init_params
from policy_evaluation.rollout import discounted_returns, reset_all, rollout
from policy_evaluation.train import clipped_surrogate, ppo_loss

GAMMA = 0.9
HORIZON = 100  # truncation bias <= gamma^100 * max|return| ~ 3e-5, inside the slack below


def _theta(seed: int, env: GridWorld) -> np.ndarray:
    return 0.7 * np.random.default_rng(seed).normal(size=(env.num_states, env.num_actions))


def _j(env, theta):
    P, R, terminal = env.transition_table()
    return exact.evaluate_policy(P, R, terminal, exact.softmax(theta), GAMMA)[env.start]


@pytest.mark.claims(
    "exact-policy-gradients",
    "gradient-unnormalised-occupancy",
    "gradient-of-softmax-policy",
    "gradient-equals-central-differences",
)
@pytest.mark.parametrize("slip", [0.2, 0.0])
def test_exact_gradient_matches_finite_differences(evidence, slip):
    """The exact policy gradient equals central differences of the exact J (1e-5), 2 slips."""
    env = GridWorld(slip=slip)
    P, R, terminal = env.transition_table()
    theta = _theta(1, env)
    grad = exact.exact_policy_gradient(P, R, terminal, theta, GAMMA, env.start)
    h = 1e-6
    fd = np.zeros_like(theta)
    for idx in np.ndindex(theta.shape):
        e = np.zeros_like(theta)
        e[idx] = h
        fd[idx] = (_j(env, theta + e) - _j(env, theta - e)) / (2 * h)
    assert np.abs(grad).max() > 1e-3  # a non-trivial gradient
    assert evidence.allclose(
        "exact PG vs central differences", f"slip={slip}", grad, fd, rtol=1e-5, atol=1e-8
    )


def _sampled_gradients(env, theta, num_episodes, key):
    theta_j = jnp.asarray(theta, jnp.float32)

    def policy_fn(obs, key):
        logits = obs @ theta_j
        a = jax.random.categorical(key, logits)
        return a, jax.nn.log_softmax(logits)[a], jnp.float32(0.0)

    reset_key, roll_key = jax.random.split(key)
    carry = reset_all(env, reset_key, num_episodes)
    _, tr = rollout(env, policy_fn, carry, roll_key, HORIZON, auto_reset=False)
    G = discounted_returns(tr.reward, tr.done, tr.mask, jnp.zeros(num_episodes), GAMMA)
    weights = (GAMMA ** jnp.arange(HORIZON, dtype=jnp.float32))[:, None] * G * tr.mask

    def surrogate(th, obs, action, w):  # one episode: sum_t w_t log pi(a_t | s_t)
        logp = jax.nn.log_softmax(obs @ th, axis=-1)
        return (jnp.take_along_axis(logp, action[:, None], axis=1)[:, 0] * w).sum()

    grads = jax.vmap(jax.grad(surrogate), in_axes=(None, 1, 1, 1))(
        theta_j, tr.obs, tr.action, weights
    )
    return grads, tr.mask.sum(axis=0)


_SAMPLED = jax.jit(_sampled_gradients, static_argnums=(0, 2))

# The sampled-gradient test's limits: |mean - exact| <= PG_Z_LIMIT se + PG_BIAS_SLACK
# in every entry at each sample size, and the half-width ratio within PG_RATIO_RANGE.
PG_Z_LIMIT = 6.0
PG_BIAS_SLACK = 1e-4
PG_EPISODES = (2000, 16000)
PG_RATIO_RANGE = (2.2, 3.6)
PG_CUT_MAX = 0.01  # fraction of episodes that may reach the horizon


def _pg_figures(root: jax.Array) -> dict:
    """The sampled-gradient test's figures under the root key `root` (the test:
    `key(0)`), split into one key per sample size: per size the error of the
    mean, its standard error, z and the fraction of episodes cut by the horizon;
    the ratio of the interval half-widths and whether every check passes."""
    env = GridWorld(max_steps=HORIZON)
    P, R, terminal = env.transition_table()
    theta = _theta(2, env)
    ref = exact.exact_policy_gradient(P, R, terminal, theta, GAMMA, env.start)
    out = {"exact": ref, "by_n": {}}
    for n, key in zip(PG_EPISODES, jax.random.split(root, len(PG_EPISODES)), strict=True):
        grads, lengths = _SAMPLED(env, theta, n, key)
        g = np.asarray(grads, np.float64)
        mean = g.mean(axis=0)
        se = g.std(axis=0, ddof=1) / np.sqrt(n)
        err = np.abs(mean - ref)
        lengths = np.asarray(lengths)
        out["by_n"][n] = {
            "error": err,
            "se": se,
            "z": err / np.maximum(se, 1e-12),
            "passed": bool(np.all(err <= PG_Z_LIMIT * se + PG_BIAS_SLACK)),
            "half_width": float(np.max(PG_Z_LIMIT * se)),
            "cut_fraction": float((lengths >= HORIZON).mean()),
            "mean_length": float(lengths.mean()),
        }
    small, large = (out["by_n"][n]["half_width"] for n in PG_EPISODES)
    out["ratio"] = small / large
    return out


@pytest.mark.claims("exact-policy-gradients")
def test_sampled_policy_gradient_agrees_with_exact(evidence):
    """The sampled REINFORCE mean is within 6 se of the exact gradient; se falls as 1/sqrt n.

    Every entry of the mean of 2000 and of 16000 episode gradients lies within
    PG_Z_LIMIT = 6 standard errors (+ 1e-4 for the horizon's truncation) of the
    exact gradient, the half-width ratio is within [2.2, 3.6] (sqrt 8 = 2.83),
    and under 1% of episodes reach the horizon. Size 2e-5: the episode
    gradients are far from normal (skewness up to 9 in rarely visited cells),
    so each entry's z tail comes from a bootstrap of 512,000 episodes (the
    size sweep's `pg-tails` part), summed over the 56 random entries and both
    sizes: 1.7e-5 at 2000 episodes, none seen at 16000 (normal tails: 2e-7).
    Swept over 256 root keys (evidence/size_sweep.json, the `size_sweep`
    script beside the tests): none failed, the largest |z| 4.5 (2000) and 3.9
    (16000), ratio 2.67 to 3.02, at most 0.25% of episodes cut. Power: a bias
    of 6 se + 1e-4 in one entry fails with chance 1/2 (0.001 to 0.016 at 16000
    episodes); an exact evaluator whose terminal cells keep moving is off by
    0.016 to 0.039 where the sampled mean is exactly 0, and by up to 90 se."""
    figures = _pg_figures(jax.random.key(0))
    for n, f in figures["by_n"].items():
        ok = evidence.record(
            "sampled PG mean vs exact gradient",
            f"episodes={n}, gamma={GAMMA}, H={HORIZON}",
            {
                "max_abs_error": float(f["error"].max()),
                "max_z": float(f["z"].max()),
                "max_ci_half_width": f["half_width"],
                "mean_episode_length": f["mean_length"],
                "exact_grad_norm": float(np.linalg.norm(figures["exact"])),
            },
            {"z": PG_Z_LIMIT, "bias_slack": PG_BIAS_SLACK},
            f["passed"],
        )
        assert ok
        # Episodes cut by the horizon lose at most gamma^H of their return (the slack).
        assert f["cut_fraction"] < PG_CUT_MAX
    low, high = PG_RATIO_RANGE
    ok = evidence.record(
        "interval shrinks like 1/sqrt(n)",
        "2000 -> 16000 episodes",
        {"half_width_ratio": figures["ratio"], "expected": float(np.sqrt(8.0))},
        {"within": [low, high]},
        low <= figures["ratio"] <= high,
    )
    assert ok


# (ratio, advantage) -> (objective, d objective / d ratio), written out by hand.
CASES = {
    0.2: [
        (0.5, 2.0, 1.0, 2.0),  # A > 0, below the range: unclipped, gradient A
        (1.0, 2.0, 2.0, 2.0),  # A > 0, inside
        (1.5, 2.0, 2.4, 0.0),  # A > 0, above: clipped at 1.2, gradient 0
        (0.5, -2.0, -1.6, 0.0),  # A < 0, below: clipped at 0.8, gradient 0
        (1.0, -2.0, -2.0, -2.0),  # A < 0, inside
        (1.5, -2.0, -3.0, -2.0),  # A < 0, above: unclipped (pessimistic), gradient A
    ],
    0.3: [
        (0.5, 2.0, 1.0, 2.0),
        (1.0, 2.0, 2.0, 2.0),
        (1.5, 2.0, 2.6, 0.0),
        (0.5, -2.0, -1.4, 0.0),
        (1.0, -2.0, -2.0, -2.0),
        (1.5, -2.0, -3.0, -2.0),
    ],
}


@pytest.mark.claims(
    "ppo-clipped-objective",
    "clip-positive-advantage",
    "clip-negative-advantage",
    "clip-gradient-zero-where-clipped",
)
@pytest.mark.parametrize("clip_eps", [0.2, 0.3])
def test_ppo_clipped_objective_signed_cases(evidence, clip_eps):
    """The clipped objective and its gradients equal a hand table of signed cases, 2 clips.

    Through the log-probability the objective sees the ratio exp(log r) as the
    backend computes it (on a TPU v5e, exp(log 1.5) = 1.50009), so the gradient
    expected there is that ratio times the table's d objective / d ratio."""
    table = np.array(CASES[clip_eps], np.float32)
    ratio, adv = jnp.asarray(table[:, 0]), jnp.asarray(table[:, 1])
    value = clipped_surrogate(ratio, adv, clip_eps)
    grad_ratio = jax.vmap(jax.grad(clipped_surrogate), in_axes=(0, 0, None))(ratio, adv, clip_eps)
    # Through the log-probability, as PPO differentiates it: d/dlogp = ratio * dL/dratio.
    logp_old = jnp.zeros_like(ratio)

    def via_logp(logp_new, a):
        return clipped_surrogate(jnp.exp(logp_new - 0.0), a, clip_eps)

    grad_logp = jax.vmap(jax.grad(via_logp))(jnp.log(ratio) + logp_old, adv)
    ratio_seen = np.asarray(jnp.exp(jnp.log(ratio) + logp_old - 0.0))
    cond = f"clip_eps={clip_eps}"
    assert evidence.allclose(
        "clipped objective value", cond, value, table[:, 2], rtol=1e-6, atol=1e-6
    )
    assert evidence.allclose(
        "gradient wrt ratio", cond, grad_ratio, table[:, 3], rtol=1e-6, atol=1e-6
    )
    assert evidence.allclose(
        "gradient wrt new log-prob",
        cond,
        grad_logp,
        ratio_seen * table[:, 3],
        rtol=1e-5,
        atol=1e-6,
    )
    clipped = table[:, 3] == 0.0
    assert np.all(np.asarray(grad_ratio)[clipped] == 0.0)  # exactly zero where clipped


def _numpy_mlp(layers, x, activation=np.tanh):
    for i, (w, b) in enumerate(layers):
        x = x @ np.asarray(w, np.float64) + np.asarray(b, np.float64)
        if i < len(layers) - 1:
            x = activation(x)
    return x


def _backend_tanh(x: np.ndarray) -> np.ndarray:
    """tanh of `x` rounded to float32, as the running backend computes it, in float64."""
    return np.asarray(jnp.tanh(jnp.asarray(x, jnp.float32)), np.float64)


def _numpy_ppo_loss(params, batch, clip_eps, vf_coef, ent_coef):
    """PPO's loss, written from its formula in float64: returns (loss, parts)."""
    obs = np.asarray(batch["obs"], np.float64)
    logits = _numpy_mlp(params["actor"], obs)
    value = _numpy_mlp(params["critic"], obs)[:, 0]
    z = logits - logits.max(axis=1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    action = np.asarray(batch["action"])
    ratio = np.exp(log_probs[np.arange(len(action)), action] - np.asarray(batch["log_prob"]))
    adv = np.asarray(batch["advantage"], np.float64)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv).mean()
    v_old, target = np.asarray(batch["value"]), np.asarray(batch["target"])
    v_clipped = v_old + np.clip(value - v_old, -clip_eps, clip_eps)
    value_loss = 0.5 * np.maximum((value - target) ** 2, (v_clipped - target) ** 2).mean()
    entropy = -(np.exp(log_probs) * log_probs).sum(axis=1).mean()
    loss = -surrogate + vf_coef * value_loss - ent_coef * entropy
    parts = {"policy_objective": surrogate, "value_loss": value_loss, "entropy": entropy}
    return loss, parts, {"value": value, "v_clipped": v_clipped}


def _ppo_batch(seed: int, n: int = 96):
    """A CartPole-shaped minibatch: old log-probs and old values scattered around
    the network's own, so that both clips are active on some rows; advantages
    with a mean far from 0 and a spread far from 1."""
    rng = np.random.default_rng(seed)
    params = init_params(jax.random.key(seed), 4, 2, 16)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    logits = _numpy_mlp(params["actor"], obs)
    value = _numpy_mlp(params["critic"], obs)[:, 0]
    action = rng.integers(0, 2, n)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    batch = {
        "obs": obs,
        "action": action.astype(np.int32),
        "log_prob": (log_probs[np.arange(n), action] + rng.normal(0, 0.4, n)).astype(np.float32),
        "value": (value + rng.normal(0, 0.6, n)).astype(np.float32),
        "advantage": (3.0 + 2.5 * rng.normal(size=n)).astype(np.float32),
        "target": (value + rng.normal(0, 1.0, n)).astype(np.float32),
    }
    return params, batch


@pytest.mark.claims(
    "ppo-advantages-normalised",
    "ppo-value-loss-clipped",
    "ppo-entropy",
    "ppo-loss-combination",
    "ppo-aux-parts",
)
@pytest.mark.parametrize(
    "clip_eps,vf_coef,ent_coef", [(0.2, 0.5, 0.5), (0.1, 1.0, 0.05)], ids=["eps0.2", "eps0.1"]
)
def test_ppo_loss_matches_numpy_formula(evidence, clip_eps, vf_coef, ent_coef):
    """ppo_loss and its 3 parts equal a float64 NumPy formula, at 2 clip and coefficient sets."""
    params, batch = _ppo_batch(seed=3 if clip_eps == 0.2 else 4)
    config = Config.tiny("cartpole").replace(
        clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef, hidden_size=16
    )
    loss, aux = jax.jit(ppo_loss, static_argnums=2)(
        params, jax.tree.map(jnp.asarray, batch), config
    )
    ref_loss, ref_parts, inner = _numpy_ppo_loss(params, batch, clip_eps, vf_coef, ent_coef)
    # The batch exercises what it claims: both value branches occur, advantages are off-scale.
    value_clip_active = int(
        np.sum(
            (inner["v_clipped"] - batch["target"]) ** 2 > (inner["value"] - batch["target"]) ** 2
        )
    )
    assert 0 < value_clip_active < len(batch["target"])
    assert abs(batch["advantage"].mean()) > 1.0 and abs(batch["advantage"].std() - 1.0) > 0.5
    cond = f"clip_eps={clip_eps}, vf_coef={vf_coef}, ent_coef={ent_coef}, 96 rows"
    for name in ("policy_objective", "value_loss", "entropy"):
        assert evidence.allclose(
            f"ppo_loss {name} vs NumPy", cond, aux[name], ref_parts[name], rtol=1e-5, atol=1e-6
        )
    assert evidence.allclose("ppo_loss total vs NumPy", cond, loss, ref_loss, rtol=1e-5, atol=1e-6)
    # The entropy bonus on its own: raising ent_coef by 1 lowers the loss by the entropy.
    more = config.replace(ent_coef=ent_coef + 1.0)
    loss_more, _ = jax.jit(ppo_loss, static_argnums=2)(
        params, jax.tree.map(jnp.asarray, batch), more
    )
    assert evidence.allclose(
        "loss(ent_coef + 1) - loss(ent_coef) vs -entropy",
        cond,
        float(loss_more) - float(loss),
        -ref_parts["entropy"],
        rtol=1e-4,
        atol=1e-5,
    )


@st.composite
def _mdps(draw):
    """A random finite MDP, policy logits and start state, from a drawn seed."""
    S, A = draw(st.integers(2, 6)), draw(st.integers(2, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    P = rng.random((S, A, S)) ** 3  # uneven rows
    P[rng.random((S, A, S)) < 0.3] = 0.0
    P[:, :, 0] += 1e-3
    P /= P.sum(axis=2, keepdims=True)
    R = rng.normal(size=(S, A, S))
    terminal = rng.random(S) < draw(st.sampled_from([0.0, 0.3, 0.6]))
    theta = draw(st.sampled_from([0.5, 2.0])) * rng.normal(size=(S, A))
    gamma = draw(st.sampled_from([0.0, 0.5, 0.9]))
    return P, R, terminal, theta, gamma, draw(st.integers(0, S - 1))


def _bellman_values(P, R, terminal, pi, gamma, sweeps=400):
    """V(s) = sum_a pi(a|s) sum_s' P(s'|s, a) (R(s, a, s') + gamma V(s')), V = 0 at
    absorbing states, by repeated sweeps (gamma <= 0.9: error below 0.9^400)."""
    V = np.zeros(P.shape[0])
    for _ in range(sweeps):
        backup = (pi[:, :, None] * P * (R + gamma * V[None, None, :])).sum(axis=(1, 2))
        V = np.where(terminal, 0.0, backup)
    return V


def _solved_values(P, R, terminal, pi, gamma):
    """The same fixed point by one linear solve, the matrices built state by state."""
    S = P.shape[0]
    M, r = np.eye(S), np.zeros(S)
    for s in np.flatnonzero(~terminal):
        M[s] -= gamma * (pi[s][:, None] * P[s]).sum(axis=0)
        r[s] = (pi[s][:, None] * P[s] * R[s]).sum()
    return np.linalg.solve(M, r)


def _softmax_rows(theta):
    return scipy.special.softmax(theta, axis=1)


@pytest.mark.claims(
    "policy-matrices-average-over-pi",
    "terminal-rows-absorbing",
    "evaluation-equals-bellman-sweeps",
    "gradient-unnormalised-occupancy",
    "gradient-of-softmax-policy",
    "gradient-equals-central-differences",
)
@settings(max_examples=25, derandomize=True, deadline=None, database=None)
@given(_mdps())
def test_exact_evaluation_and_gradient_on_drawn_mdps(mdp):
    """On drawn MDPs V equals Bellman sweeps (1e-9) and the gradient central differences."""
    P, R, terminal, theta, gamma, start = mdp
    pi = _softmax_rows(theta)
    V = exact.evaluate_policy(P, R, terminal, pi, gamma)
    V_ref = _bellman_values(P, R, terminal, pi, gamma)
    np.testing.assert_allclose(_solved_values(P, R, terminal, pi, gamma), V_ref, atol=1e-10)
    np.testing.assert_allclose(V, V_ref, rtol=1e-9, atol=1e-9)
    grad = exact.exact_policy_gradient(P, R, terminal, theta, gamma, start)
    h = 1e-6
    fd = np.zeros_like(theta)
    for idx in np.ndindex(theta.shape):
        e = np.zeros_like(theta)
        e[idx] = h
        j_plus = _solved_values(P, R, terminal, _softmax_rows(theta + e), gamma)[start]
        j_minus = _solved_values(P, R, terminal, _softmax_rows(theta - e), gamma)[start]
        fd[idx] = (j_plus - j_minus) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("shape", [(3, 3), (5, 2), (2, 4)])
@pytest.mark.parametrize("scale", [1.0, 700.0])
def test_softmax_matches_scipy(shape, scale):
    """exact.softmax equals SciPy's softmax to 1e-12, for logits up to 700 and equal rows.

    Rows of logits, square and not, and logits up to 700 (exp overflows
    float64 past 709, so an unshifted softmax would give NaN)."""
    theta = scale * np.random.default_rng(shape[0] * 10 + shape[1]).normal(size=shape)
    theta[0] = scale  # a row of equal logits
    np.testing.assert_allclose(
        exact.softmax(theta), scipy.special.softmax(theta, axis=1), rtol=1e-12, atol=1e-300
    )


@pytest.mark.claims("gradient-refuses-bad-start-or-theta")
@pytest.mark.parametrize("start,ok", [(-1, False), (0, True), (15, True), (16, False)])
def test_exact_gradient_start_bounds(start, ok):
    """exact_policy_gradient accepts start 0 and 15 and refuses -1 and 16, naming the range."""
    env = GridWorld()
    P, R, terminal = env.transition_table()
    theta = _theta(3, env)
    if ok:
        assert exact.exact_policy_gradient(P, R, terminal, theta, GAMMA, start).shape == (16, 4)
    else:
        with pytest.raises(ValueError, match=f"^`start` must be a state from 0 to 15, not {start}"):
            exact.exact_policy_gradient(P, R, terminal, theta, GAMMA, start)


@pytest.mark.claims("gradient-refuses-bad-start-or-theta")
@pytest.mark.parametrize(
    "theta", [np.zeros((16, 3)), np.zeros((15, 4)), np.full((16, 4), np.nan)], ids=str
)
def test_exact_gradient_rejects_bad_logits(theta):
    """Logits of the wrong shape or with NaN raise ValueError naming `theta`."""
    P, R, terminal = GridWorld().transition_table()
    with pytest.raises(ValueError, match="`theta` must be finite logits of shape"):
        exact.exact_policy_gradient(P, R, terminal, theta, GAMMA, 0)


def _damaged_evaluation_arguments():
    """(name, damaged argument, P, R, terminal, pi, gamma): one damage per argument
    of `evaluate_policy` on the grid world, the other four left whole."""
    P, R, terminal = GridWorld().transition_table()
    pi = np.full(P.shape[:2], 1.0 / P.shape[1])
    short_row = P.copy()
    short_row[3, 1, :] *= 0.5  # one P[s, a, :] sums to 0.5
    nan_reward = R.copy()
    nan_reward[5, 2, 6] = np.nan
    bad_pi = pi.copy()
    bad_pi[0] = [0.5, 0.5, 0.5, -0.5]  # sums to 1, one negative entry
    return [
        ("P not [S, A, S]", "P", P[:, :, :-1], R, terminal, pi, GAMMA),
        ("P row not a distribution", "P", short_row, R, terminal, pi, GAMMA),
        ("R holds NaN", "R", P, nan_reward, terminal, pi, GAMMA),
        ("terminal as 0/1 ints", "terminal", P, R, terminal.astype(np.int64), pi, GAMMA),
        ("pi of the wrong shape", "pi", P, R, terminal, pi[:, :3], GAMMA),
        ("pi with a negative entry", "pi", P, R, terminal, bad_pi, GAMMA),
        ("gamma = 1", "gamma", P, R, terminal, pi, 1.0),
    ]


@pytest.mark.claims("evaluation-refuses-damaged-arguments")
def test_evaluate_policy_names_the_damaged_argument(evidence):
    """evaluate_policy raises ValueError naming the one damaged argument, 7 damages.

    Each of P (shape, a row not summing to 1), R (NaN), terminal (not bool), pi
    (shape, a negative entry) and gamma (1, outside [0, 1)) damaged alone on the
    grid world: the message starts with that argument's name in backticks, and
    the undamaged arguments solve without error."""
    P, R, terminal = GridWorld().transition_table()
    pi = np.full(P.shape[:2], 1.0 / P.shape[1])
    assert exact.evaluate_policy(P, R, terminal, pi, GAMMA).shape == (P.shape[0],)
    for label, name, *args in _damaged_evaluation_arguments():
        try:
            exact.evaluate_policy(*args)
            message = None
        except ValueError as error:
            message = str(error)
        assert evidence.record(
            "evaluate_policy refuses a damaged argument",
            label,
            {"message": message},
            {"message_starts_with": f"`{name}`"},
            message is not None and message.startswith(f"`{name}`"),
        ), f"{label}: {message!r}"


def _numpy_apply(params, obs, activation=np.tanh):
    actor = _numpy_mlp(params["actor"], obs, activation)
    return actor, _numpy_mlp(params["critic"], obs, activation)[..., 0]


@pytest.mark.parametrize("lead", [(), (5,), (2, 3)], ids=["one", "batch", "two_axes"])
def test_apply_matches_numpy_forward_pass(lead):
    """apply's logits and values equal a float64 NumPy forward pass, any leading axes.

    Random weights and biases (not the initializer's near-zero policy head),
    leading axes kept: logits and values against NumPy in float64, whose hidden
    activation is the backend's own float32 tanh: its accuracy is the backend's,
    not apply's (a TPU v5e's tanh errs up to 1,360 units of float32 roundoff, a
    CPU's 4, and the next layer's weights carry that past 1e-4)."""
    rng = np.random.default_rng(len(lead))
    sizes = [(4, 8), (8, 8), (8, 3), (4, 8), (8, 8), (8, 1)]
    layers = [
        (jnp.asarray(rng.normal(size=(n, m)), jnp.float32), jnp.asarray(rng.normal(size=m)))
        for n, m in sizes
    ]
    layers = [(w, b.astype(jnp.float32)) for w, b in layers]
    params = {"actor": layers[:3], "critic": layers[3:]}
    obs = rng.normal(size=(*lead, 4)).astype(np.float32)
    logits, value = apply(params, jnp.asarray(obs))
    ref_logits, ref_value = _numpy_apply(params, obs.astype(np.float64), _backend_tanh)
    assert logits.shape == (*lead, 3) and value.shape == lead
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(value, ref_value, rtol=1e-4, atol=1e-4)
