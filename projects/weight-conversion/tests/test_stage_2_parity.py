"""Stage 2: layer-by-layer parity and the first disagreement.

Independent check of the tolerance: float32 dot products of length K,
computed against float64, stay under eps * K * scale (the bound the locator
uses) for K from 16 to 4096. The locator on the clean conversion finds no
disagreement; each injected fault is located at the layer where it was
introduced, every earlier layer agreeing; a transposed square weight,
which every name, shape and dtype check of the conversion accepts, is
refused at fc2. Changed conditions: float64 on both sides (the clean model
agrees to about 1e-12), and the Keras source.
"""

import dataclasses

import numpy as np
import pytest

from weight_conversion import checkpoint, data, model, sources
from weight_conversion.config import Arch
from weight_conversion.parity import FAULTS, compare, tolerance, torch_parity
from weight_conversion.weight_map import convert, keras_map, torch_map

N_IMAGES = 96  # held-out images per parity run


@pytest.mark.parametrize("k", [16, 256, 4096])
def test_tolerance_bounds_float32_rounding(evidence, k):
    rng = np.random.default_rng(k)
    a = rng.standard_normal((64, k)).astype(np.float32)
    b = rng.standard_normal((k, 32)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    ours = (a @ b).astype(np.float64)
    error = float(np.max(np.abs(ours - exact)))
    # the bound scales with the terms' magnitude: sum_i |a_i b_i|
    scale = float(np.max(np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))))
    bound = tolerance(np.float32, k, scale)
    assert bound == pytest.approx(np.finfo(np.float32).eps * k * scale)
    assert evidence.record(
        "float32 matmul error vs eps*K*scale",
        f"K={k}",
        {"max_abs_error": error, "ratio": error / bound},
        {"bound": bound},
        error <= bound,
    )


def test_clean_conversion_agrees_at_every_layer(evidence, torch_source, split):
    report = torch_parity(torch_source.model, Arch(), split.test_images[:N_IMAGES], np.float32)
    worst = max(report.layers, key=lambda r: r.ratio)
    assert evidence.record(
        "clean conversion: no layer beyond tolerance",
        "float32",
        {
            "worst_layer": worst.name,
            "worst_ratio": worst.ratio,
            "layers": [(r.name, r.max_abs_error, r.tolerance) for r in report.layers],
        },
        None,
        report.first_disagreement is None,
    )


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_is_located_at_its_layer(evidence, torch_source, split, fault):
    report = torch_parity(
        torch_source.model, Arch(), split.test_images[:N_IMAGES], np.float32, fault=fault
    )
    names = [r.name for r in report.layers]
    expected = FAULTS[fault].layer
    at = names.index(expected)
    before_ok = all(r.agrees for r in report.layers[:at])
    row = report.layers[at]
    assert evidence.record(
        f"fault located: {FAULTS[fault].description}",
        fault,
        {
            "located": report.first_disagreement,
            "ratio_at_layer": row.ratio,
            "max_abs_error": row.max_abs_error,
        },
        {"tolerance": row.tolerance, "expected_layer": expected},
        report.first_disagreement == expected and before_ok,
    )


def test_parity_refuses_a_transposed_square_weight(evidence, torch_source, split):
    """fc2 is square (64 x 64): a map that copies PyTorch's (out, in) weight
    straight into the (in, out) kernel passes every name, shape and dtype
    check of the conversion. The parity check is what refuses it, at fc2."""
    arch, net = Arch(), torch_source.model
    rules = [
        dataclasses.replace(r, transform="copy") if r.sources == ("fc2.weight",) else r
        for r in torch_map(arch)
    ]
    target = model.abstract_model(arch)
    arrays = convert(rules, net.state_dict(), arch, checkpoint.target_spec(target))
    weight = net.fc2.weight.detach().numpy()
    assert not np.allclose(weight, weight.T)  # a symmetric weight would hide the mistake
    assert np.array_equal(arrays["fc2.kernel"], weight)  # accepted: (out, in) as (in, out)
    checkpoint.fill(target, arrays)
    images, layer_list = split.test_images[:N_IMAGES], model.layers(arch)
    report = compare(
        sources.torch_taps(net, data.nchw(images), [x.name for x in layer_list]),
        model.taps(target, data.nhwc(images)),
        layer_list,
        np.float32,
    )
    names = [r.name for r in report.layers]
    at = names.index("fc2")
    row = report.layers[at]
    assert evidence.record(
        "transposed square weight: shapes accepted, parity refuses it at fc2",
        "fc2.weight copied untransposed (64 x 64)",
        {"located": report.first_disagreement, "ratio_at_fc2": row.ratio},
        {"tolerance": row.tolerance, "ratio_at_least": 100.0},
        report.first_disagreement == "fc2"
        and all(r.agrees for r in report.layers[:at])
        and row.ratio > 100.0,
    )


def test_float64_brings_the_clean_model_to_about_1e_12(evidence, torch_source, split):
    import copy

    net = copy.deepcopy(torch_source.model)
    report = torch_parity(net, Arch(), split.test_images[:N_IMAGES], np.float64)
    logits = report.layers[-1]
    worst = max(report.layers, key=lambda r: r.max_abs_error)
    assert evidence.record(
        "float64 both sides: logits error",
        "float64",
        {
            "max_abs_error": logits.max_abs_error,
            "ratio": logits.ratio,
            "worst_layer": worst.name,
            "worst_error": worst.max_abs_error,
        },
        {"about": 1e-12, "tolerance": logits.tolerance},
        report.first_disagreement is None and logits.max_abs_error < 1e-11,
    )
    # and float64 still locates a fault (the tolerance shrank with eps)
    located = torch_parity(
        net, Arch(), split.test_images[:N_IMAGES], np.float64, fault="bn-epsilon"
    ).first_disagreement
    assert located == "bn1"


def test_keras_source_agrees_at_every_layer(evidence, keras_source, split):
    arch = sources.keras_arch(Arch())
    target = model.abstract_model(arch)
    spec = checkpoint.target_spec(target)
    checkpoint.fill(
        target, convert(keras_map(arch), sources.keras_weights(keras_source.model), arch, spec)
    )
    images = data.nhwc(split.test_images[:N_IMAGES])
    report = compare(
        sources.keras_taps(keras_source.model, images),
        model.taps(target, images),
        model.layers(arch),
        np.float32,
        source_layout="keras",
    )
    worst = max(report.layers, key=lambda r: r.ratio)
    assert evidence.record(
        "Keras source: no layer beyond tolerance",
        "Keras, float32",
        {"worst_layer": worst.name, "worst_ratio": worst.ratio},
        None,
        report.first_disagreement is None,
    )
    # the Keras epsilons matter: built with PyTorch's 1e-5 the locator says bn1.
    wrong = model.abstract_model(Arch())
    checkpoint.fill(
        wrong,
        convert(
            keras_map(arch),
            sources.keras_weights(keras_source.model),
            arch,
            checkpoint.target_spec(wrong),
        ),
    )
    report = compare(
        sources.keras_taps(keras_source.model, images),
        model.taps(wrong, images),
        model.layers(arch),
        np.float32,
        source_layout="keras",
    )
    assert report.first_disagreement == "bn1"
