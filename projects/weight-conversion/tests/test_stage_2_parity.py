"""Stage 2: layer-by-layer parity and the first disagreement.

Independent check of the tolerance: float32 dot products of length K,
computed against float64, stay under eps * K * scale (the bound the locator
uses) for K from 16 to 4096. The locator on the clean conversion finds no
disagreement; each injected fault is located at the layer where it was
introduced, every earlier layer agreeing; a transposed square weight,
which every name, shape and dtype check of the conversion accepts, is
refused at fc2. Changed conditions: float64 on both sides (the clean model
agrees to about 1e-12), and the Keras source.

The locator's tolerance is float32 roundoff with faithful elementwise functions
(a CPU's). Every tapped layer from the first GELU on runs through the backend's
GELU, softmax and normalisations, so the float32 checks against PyTorch and
Keras judge a layer against `elementwise_excess` x its tolerance: the running
backend's measured excess over faithful functions (floored at 1, 1.0 to a few
tenths above it on a CPU). Each also checks that the report's own
`first_disagreement` is the first row beyond 1 x its tolerance.

The float64 run is judged the same way, against `float64_excess`: the backend's
float64 softmax, exact GELU and normalisation error over NumPy's float64 error
of the same formulas (both against a 40-digit mpmath evaluation), floored at 1.
A CPU's float64 functions are faithful (about 1); a TPU emulates float64 in
software, and its `rsqrt` is less exact, so its BatchNorm output can sit a few
float64 roundings beyond eps64 x 10 x scale while the logits still agree to
about 1e-13.
"""

import dataclasses
import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weight_conversion import checkpoint, data, model, sources
from weight_conversion.config import Arch
from weight_conversion.model import Layer
from weight_conversion.parity import FAULTS, compare, tolerance, torch_parity
from weight_conversion.weight_map import convert, keras_map, torch_map

N_IMAGES = 96  # held-out images per parity run
OTHER = Arch(channels=8, heads=4, conv2_channels=4, hidden=32)


@pytest.mark.claims("dtype-reduction-tolerance", "tolerance-formula")
@pytest.mark.parametrize("k", [16, 256, 4096])
def test_tolerance_bounds_float32_rounding(evidence, k):
    """float32 matmul errors against float64 stay under eps x K x scale, for K = 16 to 4096."""
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


@pytest.mark.claims("dtype-reduction-tolerance", "tolerance-formula", "tolerance-scale-floor")
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 7, 4096])
@pytest.mark.parametrize("scale", [0.0, 1e-300, 0.5, 37.25])
def test_tolerance_is_eps_times_length_times_scale(dtype, k, scale):
    """tolerance is eps(dtype) x length x scale, the scale floored at the smallest normal.

    eps of the compared dtype (not float64's), times the running reduction
    length, times the scale; a zero (or denormal) scale is floored at the
    dtype's smallest normal number, so an all-zero layer still gets a bound > 0."""
    info = np.finfo(dtype)
    want = float(info.eps) * k * max(scale, float(info.tiny))
    assert tolerance(np.dtype(dtype), k, scale) == pytest.approx(want, rel=1e-12)
    assert tolerance(np.dtype(dtype), k, scale) > 0


@pytest.mark.claims("dtype-reduction-tolerance")
def test_reduction_lengths_and_layouts_follow_the_torch_modules(torch_source):
    """Each layer's reduction length, layout and order match the PyTorch modules and hooks.

    Each tapped layer's reduction length, counted from the PyTorch module's
    own sizes (kernel area x input channels, normalised width, in_features,
    head width + two sums over the tokens + the output projection), its layout
    from the rank of PyTorch's output, its place from the order the forward
    hooks fire; both architectures."""
    for arch, net in ((Arch(), torch_source.model), (OTHER, sources.TorchDigitNet(OTHER))):
        net = net.eval()
        layer_list = model.layers(arch)
        taps = sources.torch_taps(
            net, data.nchw(np.zeros((2, 8, 8), np.float32)), [x.name for x in layer_list]
        )
        attn = net.attn
        expected = {
            "conv1": net.conv1.in_channels * net.conv1.kernel_size[0] * net.conv1.kernel_size[1],
            "norm1": net.norm1.normalized_shape[0],
            "attn": attn.embed_dim // attn.num_heads + 2 * net.pos.num_embeddings + attn.embed_dim,
            "conv2": net.conv2.in_channels * net.conv2.kernel_size[0] * net.conv2.kernel_size[1],
            "fc1": net.fc1.in_features,
            "fc2": net.fc2.in_features,
            "head": net.head.in_features,
        }
        rank_layout = {4: "map", 3: "tokens", 2: "vector"}
        assert [x.name for x in layer_list] == list(taps)  # forward order
        for layer in layer_list:
            assert layer.reduction == expected.get(layer.name, 1), (arch, layer)
            assert layer.layout == rank_layout[taps[layer.name].ndim], layer


def first_beyond(report, excess: float) -> str | None:
    """The first layer (forward order) whose error exceeds `excess` x its tolerance, or None."""
    return next((r.name for r in report.layers if r.ratio > excess), None)


def consistent(report) -> bool:
    """The report names as first disagreement the first row beyond its own tolerance."""
    return report.first_disagreement == first_beyond(report, 1.0)


SHAPES = {"map": (2, 3, 4, 5), "tokens": (2, 3, 5), "vector": (2, 5)}  # NNX layouts


def _synthetic_taps(rng, layouts, scales, factors, reductions, dtype, source_layout):
    """Source and target taps whose error is `factor` x the tolerance a Python
    reference computes for each layer (on an element that is zero in the
    reference, so the error is exact)."""
    eps, tiny = float(np.finfo(dtype).eps), float(np.finfo(dtype).tiny)
    src, tgt, expected, cumulative = {}, {}, [], 0
    for i, (layout, scale, factor, k) in enumerate(
        zip(layouts, scales, factors, reductions, strict=True)
    ):
        name = f"layer{i}"
        ref = rng.uniform(-1.0, 1.0, SHAPES[layout]) * scale
        ref.flat[0], ref.flat[-1] = -scale, 0.0
        cumulative += k
        tol = eps * cumulative * max(scale, tiny)
        out = ref.copy()
        out.flat[-1] = factor * tol
        tgt[name] = out
        src[name] = (
            ref.transpose(0, 3, 1, 2) if layout == "map" and source_layout == "torch" else ref
        )
        expected.append((name, factor * tol, scale, cumulative, tol))
    return src, tgt, expected


@pytest.mark.claims("compare-cumulative-reduction", "compare-aligns-torch-maps")
@pytest.mark.claims("compare-error-and-scale", "compare-first-disagreement-only")
@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(
    layouts=st.lists(st.sampled_from(sorted(SHAPES)), min_size=1, max_size=5),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    source_layout=st.sampled_from(["torch", "keras"]),
    data=st.data(),
)
def test_compare_against_a_python_reference(layouts, dtype, source_layout, data):
    """compare's per-layer figures and first disagreement equal a Python reference's.

    Every layer's error, scale, running reduction length and tolerance as a
    Python reference computes them; the first layer beyond its tolerance named
    (none when all agree), whatever disagrees after it. PyTorch maps (NCHW)
    are brought to NHWC, Keras taps compared as they are."""
    n = len(layouts)
    scales = data.draw(st.lists(st.sampled_from([0.0, 1e-3, 1.0, 37.5]), min_size=n, max_size=n))
    factors = data.draw(st.lists(st.sampled_from([0.0, 0.5, 3.0, 1e4]), min_size=n, max_size=n))
    reductions = data.draw(st.lists(st.integers(1, 5000), min_size=n, max_size=n))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    src, tgt, expected = _synthetic_taps(
        rng, layouts, scales, factors, reductions, dtype, source_layout
    )
    layer_list = [
        Layer(f"layer{i}", k, x) for i, (k, x) in enumerate(zip(reductions, layouts, strict=True))
    ]
    report = compare(src, tgt, layer_list, np.dtype(dtype), source_layout=source_layout)
    assert report.dtype == np.dtype(dtype).name
    first = next((f"layer{i}" for i, f in enumerate(factors) if f > 1), None)
    assert report.first_disagreement == first
    assert len(report.layers) == n
    for row, (name, error, scale, cumulative, tol), factor in zip(
        report.layers, expected, factors, strict=True
    ):
        assert (row.name, row.cumulative_reduction) == (name, cumulative)
        assert row.max_abs_reference == scale
        assert row.tolerance == pytest.approx(tol, rel=1e-12)
        assert row.max_abs_error == pytest.approx(error, rel=1e-12, abs=0.0)
        assert row.ratio == pytest.approx(factor, rel=1e-9, abs=0.0)
        assert row.agrees == (factor <= 1)
    assert report.to_dict()["first_disagreement"] == first


@pytest.mark.claims("compare-boundary-agrees")
@pytest.mark.parametrize("over", [False, True], ids=["at-the-tolerance", "one-ulp-beyond"])
def test_an_error_equal_to_the_tolerance_agrees(over):
    """The boundary itself: an error exactly at the tolerance agrees, the next
    float above it is a disagreement."""
    tol = float(np.finfo(np.float32).eps) * 3 * 1.0
    ref = np.zeros((2, 5))
    ref[0, 0] = 1.0
    out = ref.copy()
    out[1, 4] = np.nextafter(tol, np.inf) if over else tol
    layer_list = [Layer("only", 3, "vector")]
    report = compare({"only": ref}, {"only": out}, layer_list, np.float32)
    (row,) = report.layers
    assert row.tolerance == tol
    assert row.agrees is (not over)
    assert report.first_disagreement == ("only" if over else None)
    assert (row.ratio > 1.0) is over


@pytest.mark.claims("compare-refuses-shape-mismatch")
def test_compare_refuses_taps_of_different_shapes():
    """compare refuses taps whose shapes differ after NCHW-to-NHWC alignment, naming both, and
    accepts equal ones."""
    layer_list = [Layer("conv", 9, "map")]
    src = {"conv": np.zeros((1, 5, 3, 4))}  # NCHW -> NHWC (1, 3, 4, 5)
    with pytest.raises(ValueError, match=r"Layer `conv`: source output \(1, 3, 4, 5\) vs target"):
        compare(src, {"conv": np.zeros((1, 5, 3, 4))}, layer_list, np.float32)
    report = compare(src, {"conv": np.zeros((1, 3, 4, 5))}, layer_list, np.float32)
    assert report.first_disagreement is None


@pytest.mark.claims("first-disagreement-named")
def test_clean_conversion_agrees_at_every_layer(evidence, torch_source, split, elementwise_excess):
    """The clean float32 conversion is within tolerance (x the backend's elementwise excess) of
    PyTorch at every tapped layer on held-out images."""
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
        {"ratio_at_most": elementwise_excess},
        first_beyond(report, elementwise_excess) is None and consistent(report),
    )


@pytest.mark.claims("first-disagreement-named", "injected-faults-located")
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_is_located_at_its_layer(evidence, torch_source, split, fault, elementwise_excess):
    """Each injected conversion fault is located at the layer it was introduced in, every earlier
    layer agreeing (tolerances x the backend's elementwise excess)."""
    report = torch_parity(
        torch_source.model, Arch(), split.test_images[:N_IMAGES], np.float32, fault=fault
    )
    names = [r.name for r in report.layers]
    expected = FAULTS[fault].layer
    at = names.index(expected)
    located = first_beyond(report, elementwise_excess)
    before_ok = all(r.ratio <= elementwise_excess for r in report.layers[:at])
    row = report.layers[at]
    assert evidence.record(
        f"fault located: {FAULTS[fault].description}",
        fault,
        {
            "located": located,
            "ratio_at_layer": row.ratio,
            "max_abs_error": row.max_abs_error,
        },
        {
            "tolerance": row.tolerance,
            "ratio_beyond": elementwise_excess,
            "expected_layer": expected,
        },
        located == expected and before_ok and consistent(report),
    )


@pytest.mark.claims("first-disagreement-named")
def test_parity_refuses_a_transposed_square_weight(
    evidence, torch_source, split, elementwise_excess
):
    """Parity refuses at fc2 an untransposed square weight that every name and shape check accepts.

    fc2 is square (64 x 64): a map that copies PyTorch's (out, in) weight
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
    located = first_beyond(report, elementwise_excess)
    assert evidence.record(
        "transposed square weight: shapes accepted, parity refuses it at fc2",
        "fc2.weight copied untransposed (64 x 64)",
        {"located": located, "ratio_at_fc2": row.ratio},
        {"tolerance": row.tolerance, "ratio_at_least": 100.0 * elementwise_excess},
        located == "fc2"
        and all(r.ratio <= elementwise_excess for r in report.layers[:at])
        and row.ratio > 100.0 * elementwise_excess
        and consistent(report),
    )


_MP_DIGITS = 40


def _exact(fn, sample: np.ndarray) -> np.ndarray:
    """`fn` of each row of `sample` in mpmath at 40 digits, rounded to float64 at the end."""
    import mpmath

    with mpmath.workdps(_MP_DIGITS):
        rows = [fn([mpmath.mpf(float(v)) for v in row]) for row in sample.reshape(len(sample), -1)]
    return np.array([[float(v) for v in row] for row in rows]).reshape(sample.shape)


def _mp_softmax(row):
    import mpmath

    top = max(row)
    e = [mpmath.exp(v - top) for v in row]
    total = mpmath.fsum(e)
    return [v / total for v in e]


def _mp_gelu(row):
    import mpmath

    return [v / 2 * mpmath.erfc(-v / mpmath.sqrt(2)) for v in row]


def _mp_layer_norm(row):
    import mpmath

    mean = mpmath.fsum(row) / len(row)
    var = mpmath.fsum((v - mean) ** 2 for v in row) / len(row)
    return [(v - mean) / mpmath.sqrt(var + mpmath.mpf("1e-5")) for v in row]


def _np_softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _np_gelu(x):
    from scipy.special import erfc

    return 0.5 * x * erfc(-x * math.sqrt(0.5))


def _np_layer_norm(x):
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + 1e-5)


def _jax_layer_norm(x):
    centred = x - x.mean(axis=-1, keepdims=True)
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred * jax.lax.rsqrt(var + 1e-5)  # as flax's LayerNorm and BatchNorm


def measure_float64_excess() -> dict[str, float]:
    """Per nonlinearity of the network, the running backend's float64 error over NumPy's
    float64 error on a fixed sample (as `conftest.measure_elementwise_excess` for float32),
    both against mpmath at 40 digits: softmax of 64 rows of 64 logits of scale 3, exact
    GELU of 4,096 values of scale 3, layer normalisation of 256 rows of 16 channels."""
    rng = np.random.default_rng(0)
    samples = {
        "softmax": (rng.standard_normal((64, 64)) * 3, _mp_softmax, _np_softmax),
        "gelu": (rng.standard_normal((64, 64)) * 3, _mp_gelu, _np_gelu),
        "layer_norm": (rng.standard_normal((256, 16)) * 2 + 1, _mp_layer_norm, _np_layer_norm),
    }
    backend_fns = {
        "softmax": lambda a: jax.nn.softmax(a, axis=-1),
        "gelu": lambda a: jax.nn.gelu(a, approximate=False),
        "layer_norm": _jax_layer_norm,
    }
    out = {}
    with jax.enable_x64(True):
        for name, (sample, mp_fn, np_fn) in samples.items():
            exact = _exact(mp_fn, sample)
            backend = np.asarray(jax.jit(backend_fns[name])(sample), np.float64)
            faithful = np_fn(sample)
            out[name] = float(np.abs(backend - exact).max() / np.abs(faithful - exact).max())
    return out


@pytest.fixture(scope="module")
def float64_excess(evidence) -> float:
    """How many times the running backend's float64 nonlinearities err more than NumPy's
    float64 evaluation (the largest of `measure_float64_excess()`, at least 1)."""
    measured = measure_float64_excess()
    evidence.record(
        "backend float64 elementwise error over NumPy float64's", "float64", measured, None, True
    )
    return max(1.0, *measured.values())


@pytest.mark.ieee_float64
def test_float64_brings_the_clean_model_to_about_1e_12(
    evidence, torch_source, split, float64_excess
):
    """In float64 on both sides the clean logits agree to under 1e-11 and no layer is beyond its
    float64 tolerance (x the backend's float64 elementwise excess); a BatchNorm-epsilon fault is
    still located at bn1, every earlier layer agreeing."""
    import copy

    net = copy.deepcopy(torch_source.model)
    images = split.test_images[:N_IMAGES]
    report = torch_parity(net, Arch(), images, np.float64)
    logits = report.layers[-1]
    worst = max(report.layers, key=lambda r: r.ratio)
    assert evidence.record(
        "float64 both sides: logits error, every layer within excess x tolerance",
        "float64",
        {
            "max_abs_error": logits.max_abs_error,
            "ratio": logits.ratio,
            "worst_layer": worst.name,
            "worst_ratio": worst.ratio,
            "first_disagreement": report.first_disagreement,
        },
        {
            "about": 1e-12,
            "logits_below": 1e-11,
            "tolerance": logits.tolerance,
            "ratio_at_most": float64_excess,
        },
        first_beyond(report, float64_excess) is None
        and consistent(report)
        and logits.max_abs_error < 1e-11,
    )
    # and float64 still locates a fault (the tolerance shrank with eps)
    faulty = torch_parity(net, Arch(), images, np.float64, fault="bn-epsilon")
    at = [r.name for r in faulty.layers].index("bn1")
    assert evidence.record(
        "float64 both sides: bn-epsilon fault located at bn1",
        "float64, bn-epsilon",
        {"located": first_beyond(faulty, float64_excess), "ratio_at_bn1": faulty.layers[at].ratio},
        {"ratio_beyond": float64_excess},
        first_beyond(faulty, float64_excess) == "bn1"
        and all(r.ratio <= float64_excess for r in faulty.layers[:at])
        and consistent(faulty),
    )


def test_forward_pass_declares_float32_products(monkeypatch, torch_source, split):
    """The NNX forward pass (taps and logits) runs its products at `highest` precision whatever
    the caller's default (a TPU's default rounds float32 operands to bfloat16)."""
    from weight_conversion import checkpoint as ckpt

    seen = []
    real = model._forward

    def spy(*args):
        seen.append(jax.config.jax_default_matmul_precision)
        return real(*args)

    monkeypatch.setattr(model, "_forward", spy)
    target = model.abstract_model(Arch())
    spec = ckpt.target_spec(target)
    ckpt.fill(target, convert(torch_map(Arch()), torch_source.model.state_dict(), Arch(), spec))
    images = data.nhwc(split.test_images[:8])
    with jax.default_matmul_precision("bfloat16"):
        taps = model.taps(target, images)
        logits = model.logits(target, images)
    assert seen == ["highest", "highest"]
    assert set(taps) == {x.name for x in model.layers(Arch())}
    assert logits.shape == taps["head"].shape == (8, 10)


@pytest.mark.claims("first-disagreement-named")
def test_keras_source_agrees_at_every_layer(evidence, keras_source, split, elementwise_excess):
    """The Keras conversion agrees at every layer (tolerances x the backend's elementwise excess);
    built with PyTorch's BatchNorm epsilon it disagrees first at bn1."""
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
        {"ratio_at_most": elementwise_excess},
        first_beyond(report, elementwise_excess) is None and consistent(report),
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
    assert first_beyond(report, elementwise_excess) == "bn1" and consistent(report)
