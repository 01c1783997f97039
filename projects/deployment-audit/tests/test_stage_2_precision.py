"""Stage 2: precision: four policies, int8 quantization, the precision report.

Independent checks: every precision policy against a NumPy implementation of
the same arithmetic (int32 accumulators compared exactly) and the byte table
against counts from the layer widths; the int8 scales and integer weights
against a float64 per-output-channel reference, ties rounded to even and
values clipped to +-127; the report's int8_w8a8 logit error recomputed with
activation scales fitted on the training split. Changed conditions: random
weights of one and two hidden layers, two calibrations, a second model with
two hidden layers.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from deployment_audit import data, precision, report, train
from deployment_audit.config import Config


def _quantize_reference(params, policy: str, calibration: np.ndarray) -> list[dict]:
    """Each policy's stored arrays from their definitions (module docstring of
    `precision`): per-output-column int8 scales, round-to-nearest, and, for
    `int8_w8a8`, each matmul input's largest magnitude over 127 in the float32
    network run on the calibration set (ReLU after every hidden layer)."""
    layers = [{k: np.asarray(v, np.float32) for k, v in lay.items()} for lay in params["layers"]]
    out = []
    x = np.asarray(calibration, np.float64)
    for i, lay in enumerate(layers):
        kernel, bias = lay["kernel"], lay["bias"]
        entry = {"bias": bias}
        if policy == "f32":
            entry["kernel"] = kernel
        elif policy == "bf16":
            entry["kernel"] = kernel.astype(ml_dtypes.bfloat16)
        else:
            peak = np.abs(kernel.astype(np.float64)).max(axis=0)
            w_scale = np.where(peak > 0, peak / 127, 1.0)
            entry["w_scale"] = w_scale
            entry["kernel"] = np.clip(np.rint(kernel / w_scale), -127, 127).astype(np.int8)
            if policy == "int8_w8a8":
                a_peak = float(np.abs(x).max())
                entry["a_scale"] = a_peak / 127 if a_peak > 0 else 1.0
        x = x @ kernel.astype(np.float64) + bias
        if i < len(layers) - 1:
            x = np.maximum(x, 0.0)
        out.append(entry)
    return out


def _random_params(seed: int, hidden: tuple[int, ...]) -> dict:
    rng = np.random.default_rng(seed)
    widths = [data.NUM_FEATURES, *hidden, 10]
    layers = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        kernel = (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32)
        kernel[:, 1] = 0.0  # a zero column: its scale is 1
        layers.append({"kernel": kernel, "bias": rng.normal(size=b).astype(np.float32)})
    return {"layers": layers}


@pytest.mark.claims(
    "four-precision-policies",
    "int8-scale-per-output-column",
    "int8-zero-column-scale-one",
    "int8-round-to-nearest",
    "int8-dtype",
)
@pytest.mark.parametrize("hidden", [(12,), (16, 8)], ids=["1 hidden", "2 hidden"])
@pytest.mark.parametrize("calibration", ["normal", "zeros"])
@pytest.mark.parametrize("policy", precision.POLICIES)
def test_quantize_against_its_definition(policy, calibration, hidden):
    """Each policy's quantized arrays equal a NumPy rebuild from their definitions, for two
    calibrations and depths."""
    params = _random_params(len(hidden), hidden)
    rng = np.random.default_rng(11)
    calib = (
        rng.normal(scale=2.0, size=(20, data.NUM_FEATURES)).astype(np.float32)
        if calibration == "normal"
        else np.zeros((4, data.NUM_FEATURES), np.float32)
    )
    got = precision.quantize(params, policy, calib)["layers"]
    ref = _quantize_reference(params, policy, calib)
    assert [sorted(g) for g in got] == [sorted(r) for r in ref]
    for g, r in zip(got, ref, strict=True):
        assert g["kernel"].dtype == r["kernel"].dtype
        if policy.startswith("int8"):
            assert np.array_equal(g["kernel"], r["kernel"])
            np.testing.assert_allclose(g["w_scale"], r["w_scale"], rtol=1e-6)
            assert g["w_scale"].dtype == np.float32
        else:
            assert np.array_equal(g["kernel"].astype(np.float32), r["kernel"].astype(np.float32))
        assert np.array_equal(g["bias"], r["bias"]) and g["bias"].dtype == np.float32
        if "a_scale" in r:
            assert float(g["a_scale"]) == pytest.approx(r["a_scale"], rel=1e-5)


@pytest.mark.claims("four-precision-policies", "precision-byte-table")
@pytest.mark.parametrize("hidden", [(12,), (16, 8)], ids=["1 hidden", "2 hidden"])
@pytest.mark.parametrize("policy", precision.POLICIES)
def test_policy_forward_and_bytes_on_random_weights(policy, hidden):
    """Each policy's forward pass matches NumPy's version of its arithmetic, its bytes the widths.

    Each policy's forward pass against the NumPy arithmetic below, and its byte
    table against counts from the widths, on random weights with non-zero biases
    (in process, before any artifact is built)."""
    params = _random_params(len(hidden), hidden)
    rng = np.random.default_rng(5)
    calib = rng.normal(size=(20, data.NUM_FEATURES)).astype(np.float32)
    x = rng.normal(size=(9, data.NUM_FEATURES)).astype(np.float32)
    qparams = precision.quantize(params, policy, calib)
    got = np.asarray(
        precision.forward_jit(jax.tree.map(jnp.asarray, qparams), policy, jnp.asarray(x))
    )
    reference, _, _ = _numpy_policy(qparams, policy, x)
    tol = {"f32": 1e-4, "bf16": 2e-2, "int8_w": 1e-4, "int8_w8a8": 1e-4}[policy]
    np.testing.assert_allclose(got, reference, rtol=0, atol=tol)
    widths = [data.NUM_FEATURES, *hidden, 10]
    assert precision.account(qparams, policy) == _bytes_from_widths(widths, policy)


# An activation within this many steps of half a step from a grid point may round either
# way: float32 sums in another order move it by about an ulp (under 1e-5 of a step).
QUANT_TIE = 1e-4


def _numpy_policy(qparams, policy, x, flip_ties=False):
    """The policy's arithmetic in NumPy: float64 where the policy accumulates in
    float32 (products of bf16/int8-dequantized values), exact integers for int8 x int8.
    With `flip_ties`, activations within `QUANT_TIE` of half a step round the other way.
    Returns `(logits, int_accumulators, rows holding such a tie)`."""
    x = np.asarray(x, np.float32)
    accs = []
    ties = np.zeros(len(x), bool)
    layers = qparams["layers"]
    for i, lay in enumerate(layers):
        if policy == "f32":
            y = x.astype(np.float64) @ lay["kernel"].astype(np.float64) + lay["bias"]
        elif policy == "bf16":
            xb = x.astype(ml_dtypes.bfloat16).astype(np.float64)
            y = xb @ lay["kernel"].astype(np.float64) + lay["bias"]
        elif policy == "int8_w":
            y = (x.astype(np.float64) @ lay["kernel"].astype(np.float64)) * lay["w_scale"] + lay[
                "bias"
            ]
        else:
            xq = np.clip(np.rint(x / lay["a_scale"]), -127, 127).astype(np.int64)
            v = x.astype(np.float64) / np.float64(lay["a_scale"])
            tie = np.abs(np.abs(v - np.floor(v)) - 0.5) < QUANT_TIE
            if flip_ties:
                other = np.where(xq == np.floor(v), np.floor(v) + 1, np.floor(v))
                xq = np.where(tie, np.clip(other, -127, 127), xq).astype(np.int64)
            ties |= tie.any(axis=1)
            acc = xq @ lay["kernel"].astype(np.int64)
            accs.append(acc)
            y = acc.astype(np.float32) * (lay["a_scale"] * lay["w_scale"]) + lay["bias"]
        y = np.maximum(y, 0.0) if i < len(layers) - 1 else y
        x = y.astype(np.float32)
    return x, accs, ties


def _bytes_from_widths(widths, policy):
    pairs = list(zip(widths[:-1], widths[1:], strict=True))
    kernel = sum(a * b for a, b in pairs)
    bias = sum(b for _, b in pairs)
    per_weight = {"f32": 4, "bf16": 2, "int8_w": 1, "int8_w8a8": 1}[policy]
    act = {"f32": 4, "bf16": 2, "int8_w": 4, "int8_w8a8": 1}[policy]
    scales = {"f32": 0, "bf16": 0, "int8_w": 4 * bias, "int8_w8a8": 4 * bias + 4 * len(pairs)}
    return {
        "weights_bytes": per_weight * kernel + 4 * bias,
        "scales_bytes": scales[policy],
        "activations_bytes_per_example": act * sum(a for a, _ in pairs),
        "accumulator_bytes_per_example": 4 * bias,
    }


@pytest.fixture(scope="module")
def models(trained):
    """The session's model (one hidden layer) and a quick two-hidden-layer one."""
    second = train.train_and_evaluate(
        Config.tiny().model_copy(update={"hidden_sizes": (48, 24), "num_epochs": 4, "seed": 3})
    )
    return {"hidden (32,)": trained, "hidden (48, 24)": second}


@pytest.mark.claims(
    "four-precision-policies",
    "precision-byte-table",
    "precision-accuracy-error-and-flips",
)
@pytest.mark.parametrize("which", ["hidden (32,)", "hidden (48, 24)"])
def test_precision_policies_against_numpy(evidence, models, which):
    """Every policy's logits, int32 accumulators, byte table and flipped examples match NumPy, on
    two trained models.

    An int8_w8a8 activation within `QUANT_TIE` of half a step may round either way
    (float32 sums in another order: XLA fuses the rescale and bias), which moves its
    row's logits by about 0.03 and its later accumulators by a kernel row; such a row
    is compared with both roundings, and counted as a near-tie where they give two
    classes. Size: before that, 2 of 264 training runs failed (about 1 in 100 per
    model); since, none of 208 (each model holds 2 to 5 tie rows at the two seeds that
    had failed); it now needs two ties in one row that round apart. Power: activations
    rounded by another rule, or any logit off by more than the tolerance in a row
    without a tie, fail. (sweep: evidence/size_sweep.json, the `size_sweep` script
    beside the tests)"""
    run = models[which]
    digits = data.load()
    mean, scale = data.spec_arrays(run["_spec"]["preprocessing"])
    test = np.asarray(run["split"]["test"])
    train_ids = np.asarray(run["split"]["train"])
    x = ((digits.images[test] - mean) * scale).astype(np.float32)
    calib = ((digits.images[train_ids] - mean) * scale).astype(np.float32)
    table = precision.compare(run["_params"], x, digits.labels[test], test, calib)
    widths = [64, *run["_spec"]["config"]["hidden_sizes"], 10]
    ref_f32 = _numpy_policy(precision.quantize(run["_params"], "f32", calib), "f32", x)[0]
    ties_seen = 0
    ok = True
    for row in table["rows"]:
        policy = row["policy"]
        qparams = precision.quantize(run["_params"], policy, calib)
        logits = np.asarray(
            precision.forward_jit(jax.tree.map(jnp.asarray, qparams), policy, jnp.asarray(x))
        )
        reference, accs, ties = _numpy_policy(qparams, policy, x)
        # The same with every quantization tie rounded the other way (equal outside them).
        other, other_accs, _ = _numpy_policy(qparams, policy, x, flip_ties=True)
        closer = np.abs(logits - other).max(axis=1) < np.abs(logits - reference).max(axis=1)
        ties_seen += int(ties.sum())
        # f32 / int8_w: float32 sums vs float64, ~1e-6 relative. bf16: the hidden
        # activations are rounded to bf16 (2^-8 relative), so a float32-vs-float64
        # difference can move one rounding by one bf16 step: 2e-2 bounds its effect.
        # int8_w8a8: the accumulators are compared exactly below; 1e-4 for the rest.
        tol = {"f32": 1e-4, "bf16": 2e-2, "int8_w": 1e-4, "int8_w8a8": 1e-4}[policy]
        ok &= evidence.allclose(
            f"{policy} forward vs NumPy implementation of the same arithmetic",
            which,
            logits,
            np.where(closer[:, None], other, reference),
            rtol=0.0,
            atol=tol,
        )
        if policy == "int8_w8a8":
            jax_accs = precision.int8_accumulators(
                jax.tree.map(jnp.asarray, qparams), jnp.asarray(x)
            )
            # Each row equal to the exact integers of one rounding of its ties.
            exact = all(
                bool(
                    np.all(
                        np.all(np.asarray(a, np.int64) == b, axis=1)
                        | np.all(np.asarray(a, np.int64) == c, axis=1)
                    )
                )
                for a, b, c in zip(jax_accs, accs, other_accs, strict=True)
            )
            ok &= evidence.record(
                "int8 x int8 -> int32 accumulators equal exact integer arithmetic",
                which,
                {"exact": exact, "dtype": str(jax_accs[0].dtype)},
                {"exact": True},
                exact and jax_accs[0].dtype == jnp.int32,
            )
        expected_bytes = _bytes_from_widths(widths, policy)
        got_bytes = {k: row[k] for k in expected_bytes}
        ok &= evidence.record(
            f"{policy} byte accounting vs counts from the layer widths",
            which,
            {"table": got_bytes, "from_widths": expected_bytes},
            None,
            got_bytes == expected_bytes,
        )
        # Flips: the IDs whose NumPy-policy class differs from the NumPy-f32 class,
        # except near-ties (top-2 margin < 1e-3) that float rounding may decide.
        ref_pred, pol_pred = ref_f32.argmax(1), reference.argmax(1)
        top2 = np.sort(reference, axis=1)[:, -2:]
        near_tie = set(test[(top2[:, 1] - top2[:, 0]) < 1e-3].tolist())
        near_tie |= set(test[reference.argmax(1) != other.argmax(1)].tolist())
        numpy_flips = set(test[ref_pred != pol_pred].tolist())
        table_flips = {f["id"] for f in row["flipped"]}
        ok &= evidence.record(
            f"{policy} flipped examples vs NumPy recomputation",
            which,
            {
                "table": sorted(table_flips),
                "numpy": sorted(numpy_flips),
                "accuracy": row["accuracy"],
                "accuracy_change": row["accuracy_change"],
                "max_abs_logit_error": row["max_abs_logit_error"],
                "rows_with_a_quantization_tie": int(ties.sum()),
            },
            None,
            (table_flips ^ numpy_flips) <= near_tie,
        )
        # The row's figures from the NumPy recomputation: accuracy and its change
        # against f32 (signed; a near-tie may move one example each way), and the
        # LARGEST logit error against f32 (a mean would sit far inside any bound).
        labels = digits.labels[test]
        ties = len(near_tie) / len(test)
        accuracy = float((pol_pred == labels).mean())
        change = accuracy - float((ref_pred == labels).mean())
        err = np.abs(reference - ref_f32).max(axis=1)
        err_other = np.abs(other - ref_f32).max(axis=1)
        largest = float(err.max())
        # Between the largest error of the rows' closer and farther roundings (equal
        # without a tie).
        low = float(np.minimum(err, err_other).max())
        high = float(np.maximum(err, err_other).max())
        ok &= evidence.record(
            f"{policy} accuracy, its change and the largest logit error vs NumPy",
            which,
            {
                "table": [row["accuracy"], row["accuracy_change"], row["max_abs_logit_error"]],
                "numpy": [accuracy, change, largest],
                "near_ties": len(near_tie),
            },
            {"logit_error_atol": 2 * tol},
            abs(row["accuracy"] - accuracy) <= ties + 1e-12
            and abs(row["accuracy_change"] - change) <= 2 * ties + 1e-12
            and low - 2 * tol <= row["max_abs_logit_error"] <= high + 2 * tol,
        )
    assert ok, f"{ties_seen} rows with a quantization tie"


@pytest.mark.claims("int8-ties-to-even", "int8-round-to-nearest")
def test_int8_quantization_rounds_ties_to_even(evidence):
    """`_quantize_int8` rounds a value exactly half-way between two steps to the even
    one (2.5 -> 2, 3.5 -> 4, -2.5 -> -2, 0.5 -> 0), and others to the nearest; with
    one scale per column (1, 0.5, 0.25: exact powers of two, so `x / scale` is the
    tie itself)."""
    steps = np.array(
        [[2.5, 3.5, -2.5], [-3.5, 0.5, -0.5], [1.5, 126.5, -126.5], [2.4, 2.6, -2.6]], np.float64
    )
    expected = np.array([[2, 4, -2], [-4, 0, 0], [2, 126, -126], [2, 3, -3]], np.int8)
    scale = np.array([1.0, 0.5, 0.25], np.float32)
    x = (steps * scale).astype(np.float32)  # Exact: float32 holds each product.
    got = precision._quantize_int8(x, scale)
    assert evidence.record(
        "int8 quantization: ties to even",
        "x / scale on half-steps and near them, per-column scales 1, 0.5, 0.25",
        {"steps": steps, "got": got, "dtype": str(got.dtype)},
        {"expected": expected},
        got.dtype == np.int8 and np.array_equal(got, expected),
    ), got


@pytest.mark.claims("int8-clip-to-127", "int8-dtype")
def test_int8_quantization_clips_to_plus_minus_127_never_minus_128(evidence):
    """A value past +-127 steps clips to +-127: 127.5 (which rounds to 128), 128, 1e6
    and their negatives, -127.5 and -128 among them, give +-127, never -128 (the int8
    value that has no positive twin) and never a wrapped-around int8; 127.4 and -127.4
    round to +-127 without clipping."""
    steps = np.array([127.4, 127.5, 128.0, 200.0, 1e6, -127.4, -127.5, -128.0, -200.0, -1e6])
    expected = np.array([127, 127, 127, 127, 127, -127, -127, -127, -127, -127], np.int8)
    for scale in (1.0, 0.125):
        scales = np.full(len(steps), scale, np.float32)
        got = precision._quantize_int8((steps * scale).astype(np.float32), scales)
        assert evidence.record(
            "int8 quantization: clipped to +-127",
            f"values beyond +-127 steps, scale {scale}",
            {"steps": steps, "got": got, "dtype": str(got.dtype), "min": int(got.min())},
            {"expected": expected},
            got.dtype == np.int8 and np.array_equal(got, expected) and got.min() == -127,
        ), got


def _int8_reference(kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 quantization, in float64 from the float32
    kernel `(d_in, d_out)`: one scale per column, max |W| / 127."""
    w = np.asarray(kernel, np.float64)
    peak = np.abs(w).max(axis=0)
    scale = np.where(peak > 0, peak / 127.0, 1.0)
    return np.clip(np.rint(w / scale), -127, 127), scale


# Each policy's largest |accuracy change| against f32 and largest logit error as a
# fraction of the f32 logit range, on held-out data.
EFFECT_BOUNDS = {"bf16": (0.02, 0.02), "int8_w": (0.02, 0.03), "int8_w8a8": (0.03, 0.18)}


@pytest.mark.claims("int8-scale-per-output-column", "int8-round-to-nearest")
@pytest.mark.parametrize("which", ["hidden (32,)", "hidden (48, 24)"])
def test_int8_is_per_channel_and_its_error_is_bounded(evidence, models, which):
    """int8 scales and weights equal a float64 per-channel reference; policy errors stay bounded.

    The int8 scales and integer weights against a float64 per-channel reference
    computed here; every dequantized weight within half a step of its column's
    scale; and the policies' effect on held-out data bounded: accuracy within
    2 points of f32 (3 for w8a8), logit error within a fraction of the f32 logit
    range (bf16 2%, int8 weights 3%, w8a8 18%). Two models.

    Size: below 1e-5 per model over training seeds. Over 264 seeds per model (200, and
    32 under each of two rewrites) nothing came near a bound but the w8a8 logit error:
    its fraction of the range (median 0.015 and 0.019, largest 0.069 and 0.077) is
    log-normal, and with its spread at the upper end of its 99% interval 18% lies 5.0
    and 4.4 spreads above the mean (the former 10%: 3.7 and 3.2, a size of 1e-4 and
    8e-4). Accuracy changes (at most 5 of 450 examples; 9 and 13 allowed): gains and
    losses as Poisson counts at their upper 99% rates, below 1e-6. Power: a per-tensor
    scale or truncation fails the exact scale and weight checks; a policy that moves
    accuracy by 2 points (w8a8: 3) or a logit by the fraction above fails. (sweep:
    evidence/size_sweep.json, the `size_sweep` script beside the tests)"""
    run = models[which]
    digits = data.load()
    mean, scale = data.spec_arrays(run["_spec"]["preprocessing"])
    test = np.asarray(run["split"]["test"])
    x = ((digits.images[test] - mean) * scale).astype(np.float32)
    calib = ((digits.images[np.asarray(run["split"]["train"])] - mean) * scale).astype(np.float32)
    qparams = precision.quantize(run["_params"], "int8_w", calib)
    layers = []
    ok = True
    for i, (lay, q) in enumerate(zip(run["_params"]["layers"], qparams["layers"], strict=True)):
        ref_q, ref_scale = _int8_reference(np.asarray(lay["kernel"]))
        w = np.asarray(lay["kernel"], np.float64)
        # A weight exactly half-way between two steps may round either way in float32.
        ratio = w / ref_scale
        tie = np.abs(np.abs(ratio - np.floor(ratio)) - 0.5) < 1e-4
        dequant_err = np.abs(q["kernel"].astype(np.float64) * q["w_scale"] - w)
        layers.append(
            {
                "layer": i,
                "scale_max_rel_err": float(np.max(np.abs(q["w_scale"] / ref_scale - 1))),
                "distinct_scales": int(len(np.unique(q["w_scale"]))),
                "int_weights_differing": int(np.sum((q["kernel"] != ref_q) & ~tie)),
                "max_dequant_err_in_steps": float(np.max(dequant_err / ref_scale)),
            }
        )
        ok &= (
            q["w_scale"].shape == ref_scale.shape
            and layers[-1]["scale_max_rel_err"] <= 1e-6
            and layers[-1]["int_weights_differing"] == 0
            and layers[-1]["max_dequant_err_in_steps"] <= 0.5 + 1e-4
        )
    table = {
        r["policy"]: r
        for r in precision.compare(run["_params"], x, digits.labels[test], test, calib)["rows"]
    }
    f32_logits = np.asarray(
        precision.forward_jit(
            jax.tree.map(jnp.asarray, precision.quantize(run["_params"], "f32", calib)),
            "f32",
            jnp.asarray(x),
        )
    )
    logit_range = float(f32_logits.max() - f32_logits.min())
    bounds = EFFECT_BOUNDS
    effects = {}
    for policy, (acc_bound, logit_fraction) in bounds.items():
        row = table[policy]
        effects[policy] = {
            "accuracy_change": row["accuracy_change"],
            "max_abs_logit_error": row["max_abs_logit_error"],
            "logit_error_fraction_of_range": row["max_abs_logit_error"] / logit_range,
        }
        ok &= (
            abs(row["accuracy_change"]) <= acc_bound
            and row["max_abs_logit_error"] <= logit_fraction * logit_range
        )
    assert evidence.record(
        "int8 per-channel scales vs a float64 reference; policy effects bounded",
        which,
        {"layers": layers, "effects": effects, "f32_logit_range": logit_range},
        {
            "scale_rel": 1e-6,
            "dequant_steps": 0.5,
            "accuracy": {k: v[0] for k, v in bounds.items()},
            "logit_fraction": {k: v[1] for k, v in bounds.items()},
        },
        ok,
    ), (layers, effects)


@pytest.fixture(scope="module")
def workdirs(trained, tmp_path_factory):
    """Stage-1 workdirs: the session's (one hidden layer) and a two-hidden-layer run
    trained into its own workdir (the `models` fixture's second model has none)."""
    second = tmp_path_factory.mktemp("two-hidden") / "run"
    config = Config.tiny().model_copy(update={"hidden_sizes": (48, 24), "num_epochs": 4, "seed": 3})
    return {
        "hidden (32,)": (trained, trained["workdir"]),
        "hidden (48, 24)": (train.train_and_evaluate(config, second), second),
    }


def _w8a8_error_range(params, calibration: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """The largest |int8_w8a8 logit - f32 logit| over `x`, from the NumPy
    definitions in this file, with the activation scales fitted on `calibration`:
    (low, high) over the two roundings of activations within `QUANT_TIE` of a tie."""
    f32 = _numpy_policy({"layers": _quantize_reference(params, "f32", x)}, "f32", x)[0]
    qparams = {"layers": _quantize_reference(params, "int8_w8a8", calibration)}
    err = np.abs(_numpy_policy(qparams, "int8_w8a8", x)[0] - f32).max(axis=1)
    other = np.abs(_numpy_policy(qparams, "int8_w8a8", x, flip_ties=True)[0] - f32).max(axis=1)
    return float(np.minimum(err, other).max()), float(np.maximum(err, other).max())


@pytest.mark.claims("w8a8-calibrated-on-training-split")
@pytest.mark.parametrize("which", ["hidden (32,)", "hidden (48, 24)"])
def test_precision_report_calibrates_w8a8_on_the_training_split(evidence, workdirs, which):
    """The precision report's int8_w8a8 logit error equals the one of activation scales fitted on
    the workdir's TRAINING split, recomputed in NumPy, not the one of scales fitted on the held-out
    split it is evaluated on; two trained workdirs.

    The rule (README, Precision policies; `precision` module docstring): "int8
    weights and activations with int32 accumulation (static activation scales
    calibrated on the training split)", each layer's scale `max |x| / 127` of
    its matmul input in the float32 network run on the training inputs. The
    expected figure is computed here from the trained run's split and
    parameters (in memory, not read back through the code under test):
    per-layer scales from the normalized training images (float64), the int8
    x int8 arithmetic in exact integers, the largest |logit - f32
    logit| over the held-out split, between its two roundings where an
    activation sits within `QUANT_TIE` of a tie, with the 2e-4 slack of
    `test_precision_policies_against_numpy`. The same figure with the scales
    fitted on the held-out split is recorded beside it: a report calibrated on
    the data it is judged on looks better than the deployed model is (1.26 vs
    0.24 for the session's model). Changed condition: one and two hidden layers
    (two and three activation scales), each trained into its own workdir."""
    run, workdir = workdirs[which]
    result = report.precision_report(workdir)
    row = {r["policy"]: r for r in result["rows"]}["int8_w8a8"]
    digits = data.load()
    mean, scale = data.spec_arrays(run["_spec"]["preprocessing"])
    split = run["split"]

    def normalized(ids) -> np.ndarray:
        return ((digits.images[np.asarray(ids)] - mean) * scale).astype(np.float32)

    x = normalized(split["test"])
    params = run["_params"]
    tol = 2e-4
    low, high = _w8a8_error_range(params, normalized(split["train"]), x)
    held_low, held_high = _w8a8_error_range(params, x, x)
    observed = {
        "report_max_abs_logit_error": row["max_abs_logit_error"],
        "scales_from_training_split": [low, high],
        "scales_from_held_out_split": [held_low, held_high],
        "calibration_text": result.get("calibration"),
    }
    assert evidence.record(
        "int8_w8a8 activation scales calibrated on the training split (report's logit error)",
        f"{which}: precision report of a stage-1 workdir, {len(split['train'])} training and "
        f"{len(split['test'])} held-out examples",
        observed,
        {"logit_error_atol": tol},
        low - tol <= row["max_abs_logit_error"] <= high + tol,
    ), observed
