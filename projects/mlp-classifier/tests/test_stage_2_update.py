"""Stage 2: a verified update.

Independent checks: the loss against a NumPy softmax cross-entropy; gradients
against central finite differences in float64; three consecutive optimizer
steps of the real `train_step` (SGD with momentum, AdamW) against the published
update rules written in NumPy; and evaluation against a sha256 digest of the
whole training state, with deliberately mutating evaluations to show that the
digest would catch them. Each is repeated under a changed condition (masks,
points, optimizers, mutation kinds).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mlp_classifier import checkpoint, data
from mlp_classifier.config import Config
from mlp_classifier.train import (
    TrainState,
    create_model,
    create_train_state,
    evaluate,
    loss_fn,
    make_optimizer,
    train_step,
)

BATCH = 48


@pytest.fixture(scope="module")
def digits() -> data.Digits:
    return data.load()


def real_batches(digits: data.Digits, count: int, seed: int) -> list[dict[str, jax.Array]]:
    """`count` shuffled training-style batches of real digits (ids removed)."""
    ids = np.arange(count * BATCH - 5)  # Not a multiple of BATCH: the last batch has padding.
    batches = list(data.dataset(digits, ids, BATCH, seed=seed))
    for batch in batches:
        batch.pop("id")
    return batches


def numpy_loss(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    z = logits.astype(np.float64)
    log_probs = z - z.max(axis=1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(axis=1, keepdims=True))
    nll = -log_probs[np.arange(len(labels)), labels]
    return float(nll[mask].sum() / mask.sum())


@pytest.mark.claims("loss-masked-mean", "verified-updates")
@pytest.mark.parametrize("mask_kind", ["all valid", "last 20 rows padding", "one valid row"])
def test_loss_matches_numpy(evidence, digits, log_softmax_excess, mask_kind):
    """The masked loss equals a float64 NumPy cross-entropy, 3 masks; padded rows change no bit.

    Tolerance: float32's, times the backend's `log_softmax_excess` (1 on a CPU)."""
    model = create_model(Config.tiny(), jax.random.key(3))
    model.eval()
    batch = real_batches(digits, 1, seed=0)[0]
    mask = np.ones(BATCH, bool)
    if mask_kind == "last 20 rows padding":
        mask[-20:] = False
    elif mask_kind == "one valid row":
        mask[1:] = False
    batch["mask"] = mask
    loss, logits = loss_fn(model, batch)
    reference = numpy_loss(np.asarray(logits), np.asarray(batch["label"]), mask)
    assert evidence.allclose(
        "masked mean softmax cross-entropy vs NumPy float64",
        mask_kind,
        loss,
        reference,
        rtol=1e-6 * log_softmax_excess,
        atol=1e-6 * log_softmax_excess,
    )
    # Padding contributes nothing: scrambling the padded rows leaves the loss unchanged.
    scrambled = dict(batch)
    scrambled["image"] = np.where(mask[:, None], batch["image"], 1.0).astype(np.float32)
    scrambled["label"] = np.where(mask, batch["label"], 9).astype(np.int32)
    assert bool(loss_fn(model, scrambled)[0] == loss)


@pytest.mark.claims("verified-updates")
@pytest.mark.parametrize("point", [0, 1, 2])
def test_gradients_match_central_differences_float64(evidence, digits, point):
    """Float64 autodiff derivatives of the loss equal central finite differences, at 3 points."""
    config = Config.tiny().model_copy(update={"hidden_sizes": (16, 12), "dropout_rate": 0.0})
    batch = real_batches(digits, 1, seed=point)[0]
    with jax.enable_x64(True):
        model = create_model(config, jax.random.key(point))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        params = jax.tree.map(lambda x: x.astype(jnp.float64), params)
        batch64 = {**batch, "image": jnp.asarray(batch["image"], jnp.float64)}

        def f(p):
            model = nnx.merge(graphdef, p, rest, copy=True)
            model.eval()
            return loss_fn(model, batch64)[0]

        f = jax.jit(f)  # One compile; eager float64 ops would each compile separately.
        grads = jax.grad(f)(params)
        flat_params, unravel = jax.flatten_util.ravel_pytree(params)
        flat_grads = jax.flatten_util.ravel_pytree(grads)[0]
        directions = np.random.default_rng(point).normal(size=(6, flat_params.size))
        eps = 1e-6
        fd, ad = [], []
        for v in directions:
            v = jnp.asarray(v / np.linalg.norm(v))
            plus, minus = f(unravel(flat_params + eps * v)), f(unravel(flat_params - eps * v))
            fd.append(float((plus - minus) / (2 * eps)))
            ad.append(float(jnp.dot(flat_grads, v)))
        # And single coordinates of the largest gradient entries.
        for i in np.argsort(-np.abs(np.asarray(flat_grads)))[:4]:
            e = jnp.zeros_like(flat_params).at[i].set(1.0)
            plus, minus = f(unravel(flat_params + eps * e)), f(unravel(flat_params - eps * e))
            fd.append(float((plus - minus) / (2 * eps)))
            ad.append(float(flat_grads[i]))
    assert evidence.allclose(
        "autodiff directional derivatives vs central finite differences (float64, eps=1e-6)",
        f"point {point}: params from seed {point}, batch shuffled with seed {point}",
        ad,
        fd,
        rtol=1e-6,
        atol=1e-8,
    )


def sgd_momentum_rule(lr, momentum):
    """Heavy-ball SGD (Polyak 1964; PyTorch/optax form): t = g + m t; p -= lr t."""

    def init(p):
        return {"trace": np.zeros_like(p)}

    def step(p, g, s, t):
        del t
        s["trace"] = g + momentum * s["trace"]
        return p - lr * s["trace"]

    return init, step


def adamw_rule(lr, weight_decay, b1=0.9, b2=0.999, eps=1e-8):
    """AdamW (Loshchilov & Hutter 2019, Alg. 2, with the schedule multiplier folded
    into lr): bias-corrected Adam step plus decoupled weight decay, both scaled by lr."""

    def init(p):
        return {"m": np.zeros_like(p), "v": np.zeros_like(p)}

    def step(p, g, s, t):
        s["m"] = b1 * s["m"] + (1 - b1) * g
        s["v"] = b2 * s["v"] + (1 - b2) * g**2
        m_hat = s["m"] / (1 - b1**t)
        v_hat = s["v"] / (1 - b2**t)
        return p - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * p)

    return init, step


@pytest.mark.claims("step-applies-optax", "step-counts", "verified-updates")
@pytest.mark.parametrize(
    ("name", "overrides", "rule"),
    [
        (
            "sgd",
            {"optimizer": "sgd", "learning_rate": 0.1, "momentum": 0.9, "weight_decay": 0.0},
            lambda c: sgd_momentum_rule(c.learning_rate, c.momentum),
        ),
        (
            "adamw",
            {"optimizer": "adamw", "learning_rate": 0.01, "weight_decay": 0.05},
            lambda c: adamw_rule(c.learning_rate, c.weight_decay),
        ),
    ],
)
def test_three_optimizer_steps_match_published_rule(
    evidence, digits, log_softmax_excess, name, overrides, rule
):
    """Three train_step updates equal NumPy SGD-momentum and AdamW rules, state carried over.

    Tolerance: float32's, times the backend's `log_softmax_excess` (1 on a CPU): the
    gradients come through the loss's `exp` and `log`, and `jax.grad` outside the step
    and inside it may fuse them differently."""
    config = Config.tiny().model_copy(update={"dropout_rate": 0.0, **overrides})
    tx = make_optimizer(config)
    graphdef, state = create_train_state(config, tx, jax.random.key(11))
    init, step = rule(config)
    reference = {
        path: np.asarray(v.get_value(), np.float64) for path, v in nnx.to_flat_state(state.params)
    }
    slots = {path: init(p) for path, p in reference.items()}

    for t, batch in enumerate(real_batches(digits, 3, seed=4), start=1):
        # The gradients the step will use, taken independently at the same point.
        def loss_at(params, batch=batch, rng=state.rng):
            model = nnx.merge(graphdef, params, rng, copy=True)
            model.train()
            return loss_fn(model, batch)[0]

        grads = dict(nnx.to_flat_state(jax.grad(loss_at)(state.params)))
        state, _ = train_step(graphdef, tx, state, batch)
        for path in reference:
            g = np.asarray(grads[path].get_value(), np.float64)
            reference[path] = step(reference[path], g, slots[path], t)

        actual = dict(nnx.to_flat_state(state.params))
        paths = sorted(reference)
        assert evidence.allclose(
            f"{name}: params after train_step vs NumPy published update rule",
            f"step {t} of 3 (optimizer state carried over), lr={config.learning_rate}",
            np.concatenate([np.ravel(actual[p].get_value()) for p in paths]),
            np.concatenate([np.ravel(reference[p]) for p in paths]),
            rtol=1e-5 * log_softmax_excess,
            atol=1e-6 * log_softmax_excess,
        )
    assert int(state.step) == 3


@pytest.mark.claims("step-metrics")
@pytest.mark.parametrize("seed", [6, 7])
def test_train_step_metrics_count_the_valid_rows_only(evidence, digits, log_softmax_excess, seed):
    """train_step's metrics: the mean loss, the count and the correct predictions of the
    valid rows, at the parameters the step started from (5 padded rows of 48 left out).

    With dropout 0 the step's forward pass is the eval-mode model's; its logits at the
    starting parameters give a NumPy float64 loss and an argmax count here. Tolerance:
    float32's, times the backend's `log_softmax_excess` (1 on a CPU)."""
    config = Config.tiny().model_copy(update={"dropout_rate": 0.0})
    tx = make_optimizer(config)
    graphdef, state = create_train_state(config, tx, jax.random.key(seed))
    batch = real_batches(digits, 1, seed=seed)[0]
    mask = np.asarray(batch["mask"])
    model = nnx.merge(graphdef, state.params, state.rng, copy=True)
    model.eval()
    logits = np.asarray(model(batch["image"]))
    labels = np.asarray(batch["label"])
    _, metrics = train_step(graphdef, tx, state, batch)
    expected = {
        "count": int(mask.sum()),
        "correct": int(((logits.argmax(axis=1) == labels) & mask).sum()),
    }
    observed = {"count": int(metrics["count"]), "correct": int(metrics["correct"])}
    assert evidence.record(
        "train_step count and correct vs the valid rows counted in NumPy",
        f"seed {seed}, {mask.sum()} valid rows of {len(mask)}",
        {"observed": observed, "expected": expected},
        None,
        observed == expected and expected["count"] == BATCH - 5,
    )
    assert evidence.allclose(
        "train_step loss vs NumPy float64 masked mean at the starting parameters",
        f"seed {seed}, dropout 0",
        metrics["loss"],
        numpy_loss(logits, labels, mask),
        rtol=1e-6 * log_softmax_excess,
        atol=1e-6 * log_softmax_excess,
    )


def _rng_count(state: TrainState) -> int:
    """The dropout stream's draw counter (`RngCount`) in `state.rng`."""
    counts = [v.get_value() for path, v in nnx.to_flat_state(state.rng) if path[-1] == "count"]
    assert len(counts) == 1, counts
    return int(counts[0])


@pytest.mark.claims("step-advances-the-rng")
@pytest.mark.parametrize("hidden_sizes", [(32,), (24, 16)])
def test_every_step_draws_fresh_dropout_masks(evidence, digits, hidden_sizes):
    """train_step advances dropout a draw per hidden layer per step; the new masks change the loss.

    `train_step` returns the ADVANCED dropout stream: the draw counter grows by
    one draw per hidden layer per step (the forward pass calls dropout once per
    hidden layer), and a step from the advanced stream differs from the same step
    from the old stream (other masks, other loss). A step that returned the old
    stream would train every step with the same masks."""
    config = Config.tiny().model_copy(update={"dropout_rate": 0.5, "hidden_sizes": hidden_sizes})
    tx = make_optimizer(config)
    graphdef, s0 = create_train_state(config, tx, jax.random.key(5))
    batch = real_batches(digits, 1, seed=2)[0]
    s1, m1 = train_step(graphdef, tx, s0, batch)
    s2, _ = train_step(graphdef, tx, s1, batch)
    counts = [_rng_count(s) for s in (s0, s1, s2)]
    expected = [counts[0] + k * len(hidden_sizes) for k in range(3)]
    # Same params, same batch, the stream after one step: only the masks differ.
    _, replay = train_step(graphdef, tx, s0._replace(rng=s1.rng), batch)
    losses = (float(m1["loss"]), float(replay["loss"]))
    assert evidence.record(
        "dropout draw counter after 0, 1, 2 steps vs one draw per hidden layer per step",
        f"hidden {hidden_sizes}, dropout 0.5",
        {"counts": counts, "expected": expected},
        None,
        counts == expected,
    )
    assert evidence.record(
        "loss of the same step from the old vs the advanced dropout stream",
        f"hidden {hidden_sizes}, dropout 0.5, same params and batch",
        {"old_stream_loss": losses[0], "advanced_stream_loss": losses[1]},
        {"must_differ": True},
        losses[0] != losses[1],
    )


@pytest.fixture(scope="module")
def trained(digits) -> tuple[nnx.GraphDef, TrainState]:
    """A state after 2 steps (non-trivial optimizer moments and RNG count), dropout 0.5."""
    config = Config.tiny().model_copy(update={"dropout_rate": 0.5})
    tx = make_optimizer(config)
    graphdef, state = create_train_state(config, tx, jax.random.key(0))
    for batch in real_batches(digits, 2, seed=1):
        state, _ = train_step(graphdef, tx, state, batch)
    return graphdef, state


def state_and_batches(trained):
    """A fresh copy of the trained state: new Variable containers, so tests that
    mutate in place cannot leak into each other."""
    graphdef, state = trained
    return graphdef, jax.tree.map(lambda x: x, state), None


def eval_batches(digits):
    return data.dataset(digits, np.arange(300, 500), 64)


@pytest.mark.claims("explicit-state", "verified-updates")
def test_evaluate_does_not_mutate_training_state(evidence, digits, trained):
    """Two evaluate passes leave the state's sha256 digest unchanged and match eager eval mode."""
    graphdef, state, _ = state_and_batches(trained)
    before = checkpoint.digest(state)
    first = evaluate(graphdef, state, eval_batches(digits))
    second = evaluate(graphdef, state, eval_batches(digits))
    after = checkpoint.digest(state)

    # Dropout is off in evaluate: same predictions as an eager model in eval mode.
    model = nnx.merge(graphdef, state.params, state.rng, copy=True)
    model.eval()
    batch = next(iter(eval_batches(digits)))
    eager = np.asarray(jnp.argmax(model(batch["image"]), axis=-1))
    observed = {
        "digest_before": before,
        "digest_after": after,
        "repeat_evaluate_identical": first["loss"] == second["loss"]
        and np.array_equal(first["predictions"], second["predictions"]),
        "matches_eager_eval_mode": np.array_equal(first["predictions"][:64], eager),
    }
    assert evidence.record(
        "evaluate leaves the state digest (params, opt state, RNG, step) unchanged; dropout off",
        "dropout_rate=0.5, after 2 training steps",
        observed,
        {"bitwise": True},
        before == after
        and observed["repeat_evaluate_identical"]
        and observed["matches_eager_eval_mode"],
    )


def forgets_eval_mode(graphdef, state: TrainState, batches) -> None:
    """A buggy evaluation: runs the model eagerly in train mode. `nnx.merge` shares
    the Variables of `state`, so each dropout draw advances `state.rng` in place."""
    model = nnx.merge(graphdef, state.params, state.rng)
    model.train()
    for batch in batches:
        loss_fn(model, batch)


def steps_the_optimizer(graphdef, state: TrainState, batches) -> None:
    """A buggy evaluation: 'fine-tunes' on the evaluation data through a model that
    shares Variables with `state`, so `state.params` change in place."""
    model = nnx.merge(graphdef, state.params, state.rng)
    model.eval()
    for batch in batches:
        grads = nnx.grad(lambda m, b=batch: loss_fn(m, b)[0])(model)
        params = nnx.state(model, nnx.Param)
        nnx.update(
            model, jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
        )  # In-place update.


@pytest.mark.claims("verified-updates")
@pytest.mark.parametrize(
    ("bad_evaluate", "caught"),
    [(forgets_eval_mode, True), (steps_the_optimizer, True), (evaluate, False)],
)
def test_digest_catches_a_mutating_evaluation(evidence, digits, trained, bad_evaluate, caught):
    """The mutating variants change the digest; the real `evaluate` (control) does not."""
    graphdef, state, _ = state_and_batches(trained)
    before = checkpoint.digest(state)
    batches = list(eval_batches(digits))
    bad_evaluate(graphdef, state, batches)
    after = checkpoint.digest(state)
    assert evidence.record(
        "the digest check detects an evaluation that mutates training state",
        bad_evaluate.__name__,
        {"digest_before": before, "digest_after": after, "changed": before != after},
        {"expected_changed": caught},
        (before != after) == caught,
    )


@pytest.mark.parametrize("field", TrainState._fields)
def test_digest_covers_every_part_of_the_state(trained, field):
    """Adding 1 to one leaf of any TrainState field (params, rng, opt_state, step) changes it."""
    _, state, _ = state_and_batches(trained)
    leaves, treedef = jax.tree.flatten(getattr(state, field))
    # Bump one numeric leaf (not the typed PRNG key, which has no arithmetic) by one.
    i = next(
        i for i, x in enumerate(leaves) if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    )
    leaves[i] = leaves[i] + jnp.ones_like(leaves[i])
    changed = state._replace(**{field: jax.tree.unflatten(treedef, leaves)})
    assert checkpoint.digest(changed) != checkpoint.digest(state)


@pytest.mark.claims("loss-all-padding-is-zero")
def test_loss_of_an_all_padding_batch_is_zero(digits):
    """A batch with no valid row has loss exactly 0, not the NaN of 0 / 0."""
    model = create_model(Config.tiny(), jax.random.key(3))
    model.eval()
    batch = real_batches(digits, 1, seed=0)[0]
    batch["mask"] = np.zeros(BATCH, bool)
    loss, _ = loss_fn(model, batch)
    assert float(loss) == 0.0


def _numpy_eval(graphdef, state, digits, ids):
    """Eval-mode logits row by row from an eager model, then NumPy: mean
    cross-entropy and accuracy over exactly the rows `ids`."""
    model = nnx.merge(graphdef, state.params, state.rng, copy=True)
    model.eval()
    logits = np.asarray(model(jnp.asarray(digits.images[ids])), np.float64)
    labels = digits.labels[ids]
    predictions = logits.argmax(axis=1)
    loss = numpy_loss(logits, labels, np.ones(len(ids), bool))
    return loss, float((predictions == labels).mean()), predictions


@pytest.mark.parametrize(
    ("ids", "batch_size"),
    [(np.arange(300, 500), 64), (np.array([1234]), 4), (np.array([7, 1500, 42]), 2)],
    ids=["200 rows in 4 padded batches", "exactly one row", "3 rows in 2 batches"],
)
def test_evaluate_matches_numpy(evidence, digits, trained, log_softmax_excess, ids, batch_size):
    """evaluate's loss, accuracy, IDs and predictions equal NumPy's on eager logits: 200, 3, 1 rows.

    Loss and accuracy over the valid rows only, padding left out, with the
    per-example IDs, labels and predictions in batch order; including a pass of
    exactly one valid row (a mean over one).

    Size: the accuracy check needs both right and wrong predictions among the 200
    rows. Left to the 2-step state, the accuracy there was 0.02 to 0.22 over 64 init
    keys (evidence/size_sweep.json), 0 only 2.5 sd away: a correct update whose
    rounding took another path would have failed about once in 160. So the test
    labels the first row with the eager model's own class and the second with
    another: 0 < accuracy < 1 for every correct solution. Power: an evaluate whose
    accuracy or loss counts padding or drops a row fails. Loss tolerance: float32's,
    times the backend's `log_softmax_excess` (1 on a CPU)."""
    graphdef, state, _ = state_and_batches(trained)
    if len(ids) == 200:
        eager = _numpy_eval(graphdef, state, digits, ids)[2]
        labels = digits.labels.copy()
        labels[ids[0]] = eager[0]
        labels[ids[1]] = (eager[1] + 1) % 10
        digits = dataclasses.replace(digits, labels=labels)
    out = evaluate(graphdef, state, data.dataset(digits, ids, batch_size))
    loss, accuracy, predictions = _numpy_eval(graphdef, state, digits, ids)
    assert out["count"] == len(ids)
    np.testing.assert_array_equal(out["ids"], ids)
    np.testing.assert_array_equal(out["labels"], digits.labels[ids])
    np.testing.assert_array_equal(out["predictions"], predictions)
    assert evidence.allclose(
        "evaluate loss vs NumPy cross-entropy of eager eval-mode logits",
        f"{len(ids)} rows, batch size {batch_size}",
        out["loss"],
        loss,
        rtol=1e-5 * log_softmax_excess,
        atol=1e-6 * log_softmax_excess,
    )
    assert out["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    # The premise: both right and wrong predictions occur among the 200 rows.
    if len(ids) == 200:
        assert 0.0 < accuracy < 1.0


def test_evaluate_of_padding_only_is_zero(digits, trained):
    """A pass with no valid row: count 0, loss and accuracy 0, empty per-example arrays."""
    graphdef, state, _ = state_and_batches(trained)
    batch = next(iter(data.dataset(digits, np.arange(8), 8)))
    batch = {**batch, "mask": np.zeros(8, bool), "id": np.full(8, -1, np.int32)}
    out = evaluate(graphdef, state, [batch])
    assert (out["count"], out["loss"], out["accuracy"]) == (0, 0.0, 0.0)
    assert out["ids"].size == out["labels"].size == out["predictions"].size == 0


def _with_rng_leaf(state: TrainState, change: str) -> tuple[TrainState, bool]:
    """`state` with one part of its dropout stream changed, every other leaf kept,
    and whether the new state's bits differ (key data and counter compared here)."""
    leaves, treedef = jax.tree.flatten(state.rng)
    k = next(i for i, x in enumerate(leaves) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))
    c = next(i for i, x in enumerate(leaves) if i != k)  # The RngCount, uint32 ().
    impl = jax.random.key_impl(leaves[k])
    key_data = np.array(jax.random.key_data(leaves[k]))
    new = list(leaves)
    if change == "key data: one bit flipped":
        flipped = key_data.copy()
        flipped.flat[-1] ^= np.uint32(1)
        new[k] = jax.random.wrap_key_data(jnp.asarray(flipped), impl=impl)
    elif change == "key replaced by jax.random.key(12345)":
        new[k] = jax.random.key(12345, impl=impl)
    elif change == "draw counter + 1":
        new[c] = leaves[c] + jnp.ones_like(leaves[c])
    elif change == "control: same key data re-wrapped":
        new[k] = jax.random.wrap_key_data(jnp.asarray(key_data), impl=impl)
    differs = not (
        np.array_equal(np.asarray(jax.random.key_data(new[k])), key_data)
        and np.array_equal(np.asarray(new[c]), np.asarray(leaves[c]))
    )
    return state._replace(rng=jax.tree.unflatten(treedef, new)), differs


@pytest.mark.parametrize(
    "change",
    [
        "key data: one bit flipped",
        "key replaced by jax.random.key(12345)",
        "draw counter + 1",
        "control: same key data re-wrapped",
    ],
)
def test_digest_covers_the_dropout_key_data(evidence, trained, change):
    """A state that differs only in its dropout key's data (or draw counter) gets another digest.

    `checkpoint.digest`: "Equal digests mean bitwise-equal state: params, optimizer
    state, RNG state and step counter alike." The RNG state is the dropout stream's
    typed key AND its draw counter; a key has no arithmetic, so
    `test_digest_covers_every_part_of_the_state` only bumps the counter. Here only
    the key's data changes (one bit flipped; or another key, `jax.random.key(12345)`),
    or only the counter, every other leaf kept as it is. Expected, independently of
    `digest`: the digests differ exactly when the key data or the counter differ
    bitwise, compared here as `uint32` arrays; the control re-wraps the same key
    data into a new key object, so its digest must stay equal."""
    _, state, _ = state_and_batches(trained)
    changed, differs = _with_rng_leaf(state, change)
    before, after = checkpoint.digest(state), checkpoint.digest(changed)
    assert evidence.record(
        "digest changes when only the dropout RNG state (key data or counter) changes",
        f"{change}; params, opt state and step kept (dropout 0.5, after 2 steps)",
        {"rng_bits_differ": differs, "digest_before": before, "digest_after": after},
        {"digests_differ_iff_rng_bits_differ": True},
        (before != after) == differs and differs == (not change.startswith("control")),
    )
