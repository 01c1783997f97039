"""Stage 1: the model and its explicit state.

Independent check: parameters drawn from a seeded NumPy generator are loaded
into the NNX model; its forward pass is compared with a float64 NumPy MLP
written here, separately from the model code. Repeated under changed
conditions: other widths, batch sizes, eval vs train mode. `inspect` is checked
against the model's own state and against a parameter count computed from the
widths alone.
"""

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from flax import nnx

from mlp_classifier import inspect_model
from mlp_classifier.cli import main
from mlp_classifier.config import Config, ConfigError, load_config
from mlp_classifier.model import MLP
from mlp_classifier.train import create_model

IN, OUT = 64, 10
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def numpy_mlp(x: np.ndarray, weights: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Reference forward pass in float64: relu between affine maps, none after the last."""
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(weights):
        h = h @ w.astype(np.float64) + b.astype(np.float64)
        if i < len(weights) - 1:
            h = np.maximum(h, 0.0)
    return h


def known_weights(
    rng: np.random.Generator, widths: list[int]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """float32 weights with fan-in scaling, so activations stay O(1) at any depth."""
    return [
        (
            rng.normal(0.0, 1.0 / np.sqrt(d_in), (d_in, d_out)).astype(np.float32),
            rng.normal(0.0, 0.5, (d_out,)).astype(np.float32),
        )
        for d_in, d_out in zip(widths[:-1], widths[1:], strict=True)
    ]


def load_weights(model: MLP, weights: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for layer, (w, b) in zip([*model.hidden, model.head], weights, strict=True):
        layer.kernel[...] = jnp.asarray(w)  # In-place update.
        layer.bias[...] = jnp.asarray(b)  # In-place update.


@pytest.mark.claims("mlp-matches-numpy")
@pytest.mark.parametrize(
    ("hidden", "batch"),
    [((32,), 1), ((32,), 7), ((256, 128), 64), ((16, 16, 16), 5), ((), 3)],
)
def test_forward_matches_numpy_float64(evidence, hidden, batch):
    """Eval-mode float32 logits equal a float64 NumPy MLP (1e-5), for 0 to 3 hidden layers."""
    rng = np.random.default_rng(1000 + batch)
    widths = [IN, *hidden, OUT]
    weights = known_weights(rng, widths)
    x = rng.uniform(0.0, 1.0, (batch, IN)).astype(np.float32)
    model = MLP(IN, hidden, OUT, 0.3, rngs=nnx.Rngs(params=0, dropout=1))
    load_weights(model, weights)
    model.eval()

    logits = model(jnp.asarray(x))
    assert logits.shape == (batch, OUT) and logits.dtype == jnp.float32
    assert evidence.allclose(
        "forward pass vs float64 NumPy MLP (eval mode)",
        f"hidden={list(hidden)}, batch={batch}",
        logits,
        numpy_mlp(x, weights),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.claims("mlp-eval-deterministic")
def test_eval_mode_is_deterministic(evidence):
    """Eval mode: two calls give bitwise-equal logits and leave the dropout RNG count unchanged."""
    model = MLP(IN, [64, 32], OUT, 0.5, rngs=nnx.Rngs(params=0, dropout=1))
    model.eval()
    x = jnp.asarray(np.random.default_rng(0).uniform(size=(16, IN)), jnp.float32)
    count_before = int(model.dropout.rngs.count[...])
    first, second = model(x), model(x)
    identical = bool(jnp.array_equal(first, second))
    untouched = int(model.dropout.rngs.count[...]) == count_before
    assert evidence.record(
        "eval mode: two calls give identical logits and draw no dropout key",
        "dropout_rate=0.5, hidden=[64, 32]",
        {"bitwise_identical": identical, "rng_count_unchanged": untouched},
        {"bitwise": True},
        identical and untouched,
    )


@pytest.mark.claims("mlp-train-draws-a-fresh-key")
def test_train_mode_dropout_changes_outputs_and_is_reproducible(evidence):
    """Train-mode dropout differs from eval and between calls; the same key repeats it bitwise."""
    x = jnp.asarray(np.random.default_rng(0).uniform(size=(16, IN)), jnp.float32)

    def train_outputs(dropout_seed: int) -> list[jax.Array]:
        model = MLP(IN, [64, 32], OUT, 0.5, rngs=nnx.Rngs(params=0, dropout=dropout_seed))
        model.train()
        return [model(x), model(x)]  # In-place update: each call advances the dropout RNG.

    model = MLP(IN, [64, 32], OUT, 0.5, rngs=nnx.Rngs(params=0, dropout=1))
    model.eval()
    eval_out = model(x)
    a, b, c = train_outputs(1), train_outputs(1), train_outputs(2)
    observed = {
        "train_differs_from_eval": not bool(jnp.array_equal(a[0], eval_out)),
        "consecutive_calls_differ": not bool(jnp.array_equal(a[0], a[1])),
        "same_key_bitwise_equal": all(
            bool(jnp.array_equal(p, q)) for p, q in zip(a, b, strict=True)
        ),
        "other_key_differs": not bool(jnp.array_equal(a[0], c[0])),
    }
    assert evidence.record(
        "train mode: dropout changes outputs; same key reproduces them bitwise",
        "dropout_rate=0.5, keys 1 (twice) and 2",
        observed,
        {"bitwise": True},
        all(observed.values()),
    )


@pytest.mark.claims("mlp-matches-numpy")
def test_train_mode_without_dropout_matches_numpy(evidence):
    """In train mode with dropout rate 0 the logits equal the float64 NumPy MLP (1e-5)."""
    rng = np.random.default_rng(7)
    weights = known_weights(rng, [IN, 48, OUT])
    x = rng.uniform(size=(9, IN)).astype(np.float32)
    model = MLP(IN, [48], OUT, 0.0, rngs=nnx.Rngs(params=0, dropout=1))
    load_weights(model, weights)
    model.train()
    assert evidence.allclose(
        "forward pass vs float64 NumPy MLP (train mode, dropout_rate=0)",
        "hidden=[48], batch=9",
        model(jnp.asarray(x)),
        numpy_mlp(x, weights),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.claims("mlp-dropout-once-per-hidden-layer")
@pytest.mark.parametrize(
    ("hidden", "rate"),
    [((32,), 0.1), ((256, 128), 0.2), ((16, 16, 16), 0.5), ((64, 32), 0.0), ((), 0.3)],
    ids=["tiny preset", "default preset", "three hidden", "rate 0", "no hidden layer"],
)
def test_dropout_acts_once_per_hidden_layer_in_train_mode_only(evidence, hidden, rate):
    """Train mode scales each carried unit by 1/(1-p) once per hidden layer; eval = NumPy.

    A zero input makes every layer before the lit one output exactly zero;
    the lit layer's bias is 1, so its relu output is 1 everywhere; later
    kernels are (rectangular) identities with zero bias, so that 1 reaches the
    first logits untouched. Eval mode must then equal the float64 NumPy MLP
    (no dropout). Train mode must give, per carried logit, either 0 or
    (1/(1-p))**k with k the number of dropout layers at or after the lit one,
    both seen in 32 rows: dropout in eval mode, no dropout in train mode, or
    dropout on only some of the hidden layers each gives another k or breaks
    eval == NumPy. With rate 0, or with no hidden layer, train equals eval
    bitwise. The lit layer runs over every hidden layer (the head when none).
    """
    rng = np.random.default_rng(42)
    widths = [IN, *hidden, OUT]
    x = np.zeros((32, IN), np.float32)
    for lit in range(max(len(hidden), 1)):
        weights = []
        for j, (w, b) in enumerate(known_weights(rng, widths)):
            if j > lit:  # Pass the lit layer's units straight through to the logits.
                w = np.eye(*w.shape, dtype=np.float32)
            weights.append((w, np.full_like(b, 1.0 if j == lit else 0.0)))
        model = MLP(IN, hidden, OUT, rate, rngs=nnx.Rngs(params=0, dropout=1 + lit))
        load_weights(model, weights)
        model.eval()
        eval_out = np.asarray(model(jnp.asarray(x)), np.float64)
        model.train()
        train_out = np.asarray(model(jnp.asarray(x)), np.float64)

        ref = numpy_mlp(x, weights)
        carried = ref == 1.0  # Logits reached by the lit layer's units; the rest are 0.
        n_dropout = len(hidden) - lit if rate > 0 else 0
        scale = (1.0 / (1.0 - rate)) ** n_dropout
        kept = train_out[carried] != 0.0
        observed = {
            "eval_matches_numpy": bool(np.allclose(eval_out, ref, rtol=1e-5, atol=1e-5)),
            "carried_logits": int(carried.sum()),
            "uncarried_stay_zero": bool(np.all(train_out[~carried] == 0.0)),
            "kept_fraction": float(kept.mean()),
            "expected_kept_value": scale,
            "kept_values_ok": bool(
                np.allclose(train_out[carried][kept], scale, rtol=1e-5, atol=0.0)
            ),
            "train_equals_eval": bool(np.array_equal(train_out, eval_out)),
        }
        if n_dropout == 0:
            passed = observed["eval_matches_numpy"] and observed["train_equals_eval"]
        else:
            # Both dropped (0) and kept units must show up among the 32 x 10 carried logits.
            passed = (
                observed["eval_matches_numpy"]
                and observed["carried_logits"] == 32 * OUT
                and observed["uncarried_stay_zero"]
                and 0.0 < observed["kept_fraction"] < 1.0
                and observed["kept_values_ok"]
                and not observed["train_equals_eval"]
            )
        assert evidence.record(
            "dropout: eval = NumPy; train keeps a unit as 0 or (1/(1-p))**k, k = layers from lit",
            f"hidden={list(hidden)}, dropout_rate={rate}, bias 1 at layer {lit}",
            observed,
            {"rtol": 1e-5, "atol": 1e-5},
            passed,
        ), observed


def expected_param_count(hidden: list[int]) -> int:
    widths = [IN, *hidden, OUT]
    return sum(d_in * d_out + d_out for d_in, d_out in zip(widths[:-1], widths[1:], strict=True))


@pytest.mark.claims("explicit-state")
@pytest.mark.parametrize("hidden", [[32], [100, 50, 25]])
def test_inspect_lists_state_and_param_count(evidence, tmp_path, hidden):
    """`inspect` lists nnx.state's paths and kinds, and the parameter count the widths give."""
    config = Config.tiny().model_copy(update={"hidden_sizes": tuple(hidden)})
    config_file = tmp_path / "config.json"
    config_file.write_text(config.to_json())

    result = CliRunner().invoke(main, ["inspect", "--config", str(config_file)])
    assert result.exit_code == 0, result.output

    model = create_model(config, jax.random.key(config.seed))
    state_paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model))}
    listed = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r"^  (\S+)\s+(\w+) \((\w+)\)", result.output, re.MULTILINE)
    }
    printed = int(re.search(r"Parameters: (\d+) scalars", result.output).group(1))
    kinds = {v.path: v.kind for v in inspect_model.variables(model)}
    observed = {
        "paths_equal_state": set(listed) == state_paths,
        "kinds_equal_state": {p: k for p, (k, _) in listed.items()} == kinds,
        "rng_listed": listed.get("dropout/rngs/key") == ("RngKey", "RngState"),
        "printed_param_count": printed,
        "expected_param_count": expected_param_count(hidden),
    }
    assert evidence.record(
        "inspect: listed paths/kinds equal nnx.state; param count equals the count from widths",
        f"hidden={hidden}",
        observed,
        {"exact": True},
        observed["paths_equal_state"]
        and observed["kinds_equal_state"]
        and observed["rng_listed"]
        and printed == expected_param_count(hidden),
    )


def test_shipped_configs_equal_presets():
    """configs/tiny.json and configs/default.json load to exactly the two Config presets."""
    assert load_config(PROJECT_ROOT / "configs" / "tiny.json") == Config.tiny()
    assert load_config(PROJECT_ROOT / "configs" / "default.json") == Config.default()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"lr": 0.1}', "lr"),
        ('{"dropout_rate": 1.5}', "dropout_rate"),
        ('{"batch_size": 0}', "batch_size"),
        ('{"hidden_sizes": [32, 0]}', "hidden_sizes"),
        ('{"optimizer": "rmsprop"}', "optimizer"),
        ('{"val_fraction": 0.5, "test_fraction": 0.5}', "val_fraction"),
    ],
)
def test_bad_config_names_the_field(tmp_path, text, field):
    """Six out-of-range configs raise ConfigError naming the field; inspect and train exit 2."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"`{field}`"):
        load_config(path)

    for command in ("inspect", "train"):
        args = [command, "--config", str(path)]
        if command == "train":
            args += ["--workdir", str(tmp_path / "run")]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert f"`{field}`" in result.output
        assert "Traceback" not in result.output
        assert not (tmp_path / "run").exists()


def test_unreadable_config_is_a_clear_error(tmp_path):
    """A missing or non-JSON config file raises ConfigError; the CLI exits 2 naming the file."""
    with pytest.raises(ConfigError, match="Cannot read config file"):
        load_config(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path / "broken.json")
    result = CliRunner().invoke(main, ["inspect", "--config", str(tmp_path / "missing.json")])
    assert result.exit_code == 2 and "missing.json" in result.output
    assert "Traceback" not in result.output


def test_evidence_round_trip(evidence, tmp_path):
    """The stage's evidence file reads back as JSON with the stage id and a verdict per record."""
    path = evidence.write(tmp_path)
    payload = json.loads(path.read_text())
    assert payload["stage"] == "1"
    assert payload["records"] and all("passed" in r for r in payload["records"])


@pytest.mark.claims("mlp-leading-axes", "mlp-no-hidden-layer")
@pytest.mark.parametrize("hidden", [(32,), ()], ids=["one hidden layer", "no hidden layer"])
@pytest.mark.parametrize("lead", [(), (2, 3)], ids=["one row", "two leading axes"])
def test_any_leading_axes_match_numpy(hidden, lead):
    """Inputs shaped (64,) and (2, 3, 64) give the NumPy MLP's logits row by row (0 or 1 hidden)."""
    rng = np.random.default_rng(len(lead) + 10 * len(hidden))
    weights = known_weights(rng, [IN, *hidden, OUT])
    x = rng.uniform(size=(*lead, IN)).astype(np.float32)
    model = MLP(IN, hidden, OUT, 0.3, rngs=nnx.Rngs(params=0, dropout=1))
    load_weights(model, weights)
    model.eval()
    logits = model(jnp.asarray(x))
    assert logits.shape == (*lead, OUT)
    ref = numpy_mlp(x.reshape(-1, IN), weights).reshape(*lead, OUT)
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.claims("mlp-refuses-bad-input")
@pytest.mark.parametrize("hidden", [(32,), ()], ids=["one hidden layer", "no hidden layer"])
@pytest.mark.parametrize("width", [IN - 1, IN + 1])
def test_input_one_column_too_narrow_or_too_wide_is_refused(hidden, width):
    """An input 63 or 65 columns wide raises ValueError naming the expected and the actual shape."""
    model = MLP(IN, hidden, OUT, 0.0, rngs=nnx.Rngs(params=0, dropout=1))
    x = jnp.zeros((3, width), jnp.float32)
    message = rf"shape \(batch, {IN}\), but it has shape \(3, {width}\)"
    with pytest.raises(ValueError, match=message):
        model(x)


@pytest.mark.claims("mlp-refuses-bad-input")
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_refused(bad):
    """A NaN or infinite input raises ValueError eagerly; under jit the check is skipped.

    Eagerly (a concrete array), one non-finite value anywhere is an error;
    under `jit` (a traced array) the check is skipped and the same bad row
    reaches the logits."""
    model = MLP(IN, (32,), OUT, 0.0, rngs=nnx.Rngs(params=0, dropout=1))
    x = np.zeros((4, IN), np.float32)
    x[2, 17] = bad
    with pytest.raises(ValueError, match="holds NaN or infinite values"):
        model(jnp.asarray(x))
    graphdef, state = nnx.split(model)
    logits = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, jnp.asarray(x))
    assert np.isfinite(np.asarray(logits)[[0, 1, 3]]).all()
