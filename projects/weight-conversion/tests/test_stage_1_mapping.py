"""Stage 1: the weight map.

Independent checks: each layout transform is checked by running the layer
both ways, PyTorch's own op on NCHW data against a JAX op (or NumPy einsum)
on the converted weights in NNX layout; the whole converted model against
the PyTorch model's logits. Repeated under changed conditions: a second
architecture (other widths, 4 heads), the Keras source (another naming and
layout convention), the tie deduplicated by the safetensors saver. Bad
sources (names, shapes, dtypes, NaN or infinite values) are refused with
the tensor named.
"""

import importlib.util
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from weight_conversion import checkpoint, data, model, sources
from weight_conversion.config import Arch
from weight_conversion.weight_map import (
    TRANSFORMS,
    MappingError,
    Rule,
    apply_rule,
    check_names,
    convert,
    first_nonfinite,
    keras_map,
    source_shapes,
    torch_map,
)

OTHER = Arch(channels=8, heads=4, conv2_channels=4, hidden=32)


def converted(net, arch):
    target = model.abstract_model(arch)
    spec = checkpoint.target_spec(target)
    arrays = convert(torch_map(arch), net.state_dict(), arch, spec)
    return target, spec, arrays


def untrained(arch, seed=1):
    torch.manual_seed(seed)
    net = sources.TorchDigitNet(arch).eval()
    with torch.no_grad():  # running statistics away from (0, 1), as after training
        net.bn1.running_mean.uniform_(-0.5, 0.5)
        net.bn1.running_var.uniform_(0.5, 2.0)
    return net


@pytest.mark.claims("weight-map-is-data")
@pytest.mark.parametrize("which", ["trained", "other-arch"])
def test_every_source_consumed_once_every_target_filled(evidence, torch_source, which):
    """The map consumes every state_dict key once and fills every NNX parameter in shape and dtype,
    2 archs."""
    net, arch = (torch_source.model, Arch()) if which == "trained" else (untrained(OTHER), OTHER)
    target, spec, arrays = converted(net, arch)
    problems = check_names(torch_map(arch), net.state_dict().keys(), spec.keys())
    consumed = sorted(k for r in torch_map(arch) for k in r.sources)
    shapes_ok = all(arrays[p].shape == spec[p][0] and arrays[p].dtype == spec[p][1] for p in spec)
    ok = (
        not problems
        and sorted(arrays) == sorted(spec)
        and shapes_ok
        and consumed == sorted(net.state_dict().keys())
    )
    assert evidence.record(
        "names: each source key consumed once, each target filled once, shapes and dtypes agree",
        which,
        {"problems": problems, "source_keys": len(net.state_dict()), "targets": len(spec)},
        None,
        ok,
    ), problems


@pytest.mark.claims("layout-transforms", "t-linear-transpose", "t-conv-oihw-to-hwio")
@pytest.mark.claims("t-fc1-nchw-rows", "t-qkv-kernel-split", "t-qkv-bias-split", "t-attn-out-heads")
@pytest.mark.parametrize("arch", [Arch(), OTHER], ids=["default", "other-arch"])
def test_layout_transforms_match_torch_ops(evidence, arch):
    """Each converted layer, applied by einsum, matches PyTorch's own op within 1e-5, for 2
    architectures."""
    net = untrained(arch)
    _, _, w = converted(net, arch)
    rng = np.random.default_rng(0)
    c = arch.channels
    checks = {}
    # conv1: torch conv2d (NCHW, OIHW) vs einsum over 3x3 patches with the HWIO kernel.
    x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    ref = F.conv2d(torch.from_numpy(x), net.conv1.weight, net.conv1.bias, padding=1).detach()
    padded = np.pad(x.transpose(0, 2, 3, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    patches = np.stack([padded[:, i : i + 8, j : j + 8, :] for i in range(3) for j in range(3)], 3)
    kernel = w["conv1.kernel"].reshape(9, 1, c)
    ours = np.einsum("nhwki,kio->nhwo", patches, kernel) + w["conv1.bias"]
    checks["conv1 (OIHW->HWIO)"] = (ours, ref.numpy().transpose(0, 2, 3, 1))
    # attention projections: the packed in_proj vs the three split kernels.
    t = rng.standard_normal((2, 5, c)).astype(np.float32)
    packed = F.linear(torch.from_numpy(t), net.attn.in_proj_weight, net.attn.in_proj_bias)
    for i, part in enumerate(("query", "key", "value")):
        ours = np.einsum("nlc,chd->nlhd", t, w[f"attn.{part}.kernel"]) + w[f"attn.{part}.bias"]
        ref = packed.detach().numpy()[..., i * c : (i + 1) * c].reshape(ours.shape)
        checks[f"attn {part} (packed QKV split)"] = (ours, ref)
    heads = rng.standard_normal((2, 5, arch.heads, c // arch.heads)).astype(np.float32)
    ref = net.attn.out_proj(torch.from_numpy(heads.reshape(2, 5, c))).detach().numpy()
    ours = np.einsum("nlhd,hdc->nlc", heads, w["attn.out.kernel"]) + w["attn.out.bias"]
    checks["attn out (heads, head_dim, C)"] = (ours, ref)
    # fc1 after the flatten: PyTorch flattens NCHW, NNX flattens NHWC.
    fmap = rng.standard_normal((3, arch.conv2_channels, 4, 4)).astype(np.float32)
    ref = net.fc1(torch.from_numpy(fmap).flatten(1)).detach().numpy()
    ours = fmap.transpose(0, 2, 3, 1).reshape(3, -1) @ w["fc1.kernel"] + w["fc1.bias"]
    checks["fc1 (NCHW flatten rows)"] = (ours, ref)
    v = rng.standard_normal((3, arch.hidden)).astype(np.float32)
    checks["fc2 (out, in)->(in, out)"] = (
        v @ w["fc2.kernel"] + w["fc2.bias"],
        net.fc2(torch.from_numpy(v)).detach().numpy(),
    )
    checks["head (tied class embedding)"] = (
        v @ w["class_embed.embedding"].T + w["head_bias"],
        net.head(torch.from_numpy(v)).detach().numpy(),
    )
    results = [
        evidence.allclose(name, f"arch={arch}", ours, ref, rtol=1e-5, atol=1e-5)
        for name, (ours, ref) in checks.items()
    ]
    assert all(results), [n for n, r in zip(checks, results, strict=True) if not r]


# Logits of the converted model against the source framework's, float32: 1e-4 (rtol and
# atol) with faithful elementwise functions, the CPU's. The path runs through GELU,
# softmax and the normalisations, so the bound is scaled by `elementwise_excess`, the
# running backend's measured excess over faithful float32 functions (1 on a CPU).
LOGIT_TOLERANCE = 1e-4


@pytest.mark.claims("weight-map-is-data", "layout-transforms")
def test_converted_model_reproduces_torch_logits(evidence, torch_source, split, elementwise_excess):
    """The converted NNX model's held-out logits are within 1e-4 (x the backend's elementwise
    excess) of PyTorch's, with identical predictions."""
    target, _, arrays = converted(torch_source.model, Arch())
    checkpoint.fill(target, arrays)
    ref = sources.torch_logits(torch_source.model, data.nchw(split.test_images))
    ours = model.logits(target, data.nhwc(split.test_images))
    same = int(np.sum(ref.argmax(1) == ours.argmax(1)))
    tol = LOGIT_TOLERANCE * elementwise_excess
    assert evidence.allclose(
        "NNX logits vs PyTorch logits",
        f"held-out split, float32, elementwise excess {elementwise_excess:.3g}",
        ours,
        ref,
        rtol=tol,
        atol=tol,
    )
    assert evidence.record(
        "identical predictions",
        "held-out split",
        {"same": same, "of": len(ref)},
        None,
        same == len(ref),
    )


@pytest.mark.claims("tied-weights-once")
def test_tied_weights_consumed_once_with_or_without_the_alias(evidence, torch_source, tmp_path):
    """The tied head becomes one class embedding with or without its alias; differing copies are
    refused."""
    from safetensors import safe_open
    from safetensors.torch import save_model

    net = torch_source.model
    state = net.state_dict()
    assert state["head.weight"].data_ptr() == state["class_embed.weight"].data_ptr()
    save_model(net, str(tmp_path / "src.safetensors"))
    with safe_open(str(tmp_path / "src.safetensors"), framework="numpy") as f:
        deduplicated = {k: f.get_tensor(k) for k in f.keys()}
    arch = Arch()
    spec = checkpoint.target_spec(model.abstract_model(arch))
    both = convert(torch_map(arch), state, arch, spec)["class_embed.embedding"]
    one = convert(torch_map(arch), deduplicated, arch, spec)["class_embed.embedding"]
    ok = np.array_equal(both, one) and np.array_equal(both, state["head.weight"].numpy())
    assert evidence.record(
        "tied weights -> one class embedding",
        "alias present / deduplicated",
        {"keys_in_file": len(deduplicated), "keys_in_state": len(state)},
        None,
        ok,
    )
    differing = dict(state)
    differing["head.weight"] = state["head.weight"] + 1.0
    with pytest.raises(MappingError, match=r"`class_embed.weight`.*`head.weight`.*tied copies"):
        convert(torch_map(arch), differing, arch, spec)


@pytest.mark.claims("tied-weights-once")
@pytest.mark.parametrize(
    ("which", "copy", "where", "direction"),
    [
        ("trained", "head.weight", "first", np.inf),
        ("other-arch", "class_embed.weight", "last", -np.inf),
    ],
    ids=["head-one-ulp-up", "class-embed-one-ulp-down"],
)
def test_tied_copies_one_ulp_apart_are_refused(
    evidence, torch_source, which, copy, where, direction
):
    """Tied copies one ulp apart are refused, naming both copies: equality is bitwise, no tolerance.

    Rule (`t_tied`): "Several names for one tensor (tied weights): every copy
    present must be bitwise equal; the target receives it once." One element
    of one copy is moved a single float32 ulp (np.nextafter), which any
    closeness test (np.allclose) would accept; the conversion must refuse it.
    Changed conditions: head.weight one ulp up at its first element (trained
    source, default arch); class_embed.weight one ulp down at its last element
    (untrained source, another architecture)."""
    net, arch = (torch_source.model, Arch()) if which == "trained" else (untrained(OTHER), OTHER)
    spec = checkpoint.target_spec(model.abstract_model(arch))
    state = dict(net.state_dict())
    moved = state[copy].detach().numpy().copy()
    index = (0, 0) if where == "first" else tuple(n - 1 for n in moved.shape)
    old = moved[index]
    moved[index] = np.nextafter(old, np.float32(direction), dtype=np.float32)
    # the change is one ulp, in the stated direction, and within any usual tolerance
    assert moved.dtype == np.float32
    assert (moved[index] > old) == (direction > 0) and moved[index] != old
    assert np.nextafter(moved[index], old, dtype=np.float32) == old  # no float32 between
    assert np.allclose(moved, state[copy].numpy())
    state[copy] = torch.from_numpy(moved)
    with pytest.raises(
        MappingError, match=r"`class_embed.weight`.*`head.weight`.*tied copies"
    ) as info:
        convert(torch_map(arch), state, arch, spec)
    assert evidence.record(
        "tied copies one ulp apart refused (bitwise equality)",
        f"{which}: {copy}{list(index)} one ulp {'up' if direction > 0 else 'down'}",
        {"problems": info.value.problems},
        None,
        True,
    )


@pytest.mark.claims("names-checked-before-data")
def test_bad_names_are_reported_by_name(evidence, torch_source):
    """A renamed, missing or extra tensor, or another architecture's state_dict, is refused naming
    every bad key."""
    arch = Arch()
    spec = checkpoint.target_spec(model.abstract_model(arch))
    state = dict(torch_source.model.state_dict())
    renamed = {("fc_1.weight" if k == "fc1.weight" else k): v for k, v in state.items()}
    missing = {k: v for k, v in state.items() if k != "conv2.bias"}
    extra = dict(state, **{"fc3.weight": state["fc2.weight"]})
    found = {}
    for label, source, pattern in [
        ("renamed", renamed, r"unexpected source tensor `fc_1.weight`.*renamed from `fc1.weight`"),
        ("missing", missing, r"missing source tensor `conv2.bias`"),
        ("extra", extra, r"unexpected source tensor `fc3.weight`"),
    ]:
        with pytest.raises(MappingError, match=pattern) as info:
            convert(torch_map(arch), source, arch, spec)
        found[label] = info.value.problems
    # A state_dict from another architecture: every foreign name, all at once.
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    with pytest.raises(MappingError) as info:
        convert(torch_map(arch), mlp.state_dict(), arch, spec)
    text = str(info.value)
    assert "`0.weight`" in text and "`2.bias`" in text and "`attn.in_proj_weight`" in text
    found["other-architecture"] = info.value.problems
    assert evidence.record(
        "bad names reported by name",
        "renamed/missing/extra/other arch",
        {k: len(v) for k, v in found.items()},
        None,
        True,
    )


def test_bad_shapes_and_dtypes_name_the_tensor(torch_source):
    """Sources of another architecture's shapes, or of int32 or bfloat16 dtype, are refused naming
    the tensor."""
    arch = Arch()
    spec = checkpoint.target_spec(model.abstract_model(arch))
    other = untrained(OTHER).state_dict()  # same names, other shapes
    with pytest.raises(MappingError, match=r"`conv1.weight` \(8, 1, 3, 3\)"):
        convert(torch_map(arch), other, arch, spec)
    state = dict(torch_source.model.state_dict())
    state["fc2.weight"] = state["fc2.weight"].to(torch.int32)
    # The refusal lists every dtype the target accepts, so the learner sees what to cast to.
    supported = r"the target supports float16, float32, float64$"
    with pytest.raises(MappingError, match=r"`fc2.weight` has dtype `int32`; " + supported):
        convert(torch_map(arch), state, arch, spec)
    state["fc2.weight"] = torch_source.model.state_dict()["fc2.weight"].to(torch.bfloat16)
    with pytest.raises(MappingError, match=r"`fc2.weight` has dtype `torch.bfloat16`"):
        convert(torch_map(arch), state, arch, spec)


@pytest.mark.parametrize(
    ("tensor", "index", "value"),
    [("fc2.weight", (3, 5), float("nan")), ("conv1.bias", (0,), float("-inf"))],
    ids=["nan-in-fc2", "inf-in-conv1-bias"],
)
def test_non_finite_weights_are_refused_by_name(evidence, torch_source, tensor, index, value):
    """A NaN or infinite source weight is refused naming the tensor, the count and the index of the
    value."""
    arch = Arch()
    spec = checkpoint.target_spec(model.abstract_model(arch))
    state = {k: v.clone() for k, v in torch_source.model.state_dict().items()}
    state[tensor][index] = value
    with pytest.raises(MappingError, match=rf"`{tensor}` holds 1 non-finite value") as info:
        convert(torch_map(arch), state, arch, spec)
    # the message points at the value: its index in the source tensor
    assert f"at index {index}" in str(info.value)
    assert evidence.record(
        "non-finite source weight refused, tensor named",
        f"{tensor}{list(index)} = {value}",
        {"problems": info.value.problems},
        None,
        True,
    )


def test_conversion_is_deterministic(evidence, torch_source):
    """Two conversions of the same source give bit-equal arrays."""
    _, _, a = converted(torch_source.model, Arch())
    _, _, b = converted(torch_source.model, Arch())
    same = all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert evidence.record(
        "same source, same bits", "two conversions", {"tensors": len(a)}, None, same
    )


@pytest.mark.claims("weight-map-is-data")
def test_keras_map(evidence, keras_source, split, elementwise_excess):
    """The Keras map names check clean, and the converted model's logits are within 1e-4 (x the
    backend's elementwise excess) of Keras's own."""
    weights = sources.keras_weights(keras_source.model)
    arch = sources.keras_arch(Arch())
    target = model.abstract_model(arch)
    spec = checkpoint.target_spec(target)
    assert check_names(keras_map(arch), weights.keys(), spec.keys()) == []
    checkpoint.fill(target, convert(keras_map(arch), weights, arch, spec))
    images = data.nhwc(split.test_images)
    ref = sources.keras_taps(keras_source.model, images)["head"]
    tol = LOGIT_TOLERANCE * elementwise_excess
    assert evidence.allclose(
        "NNX logits vs Keras logits",
        f"Keras source, epsilons 1e-3, elementwise excess {elementwise_excess:.3g}",
        model.logits(target, images),
        ref,
        rtol=tol,
        atol=tol,
    )


@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="TensorFlow is not installed; the SavedModel input is optional",
)
def test_tensorflow_savedmodel_input(keras_source, tmp_path):
    """A TensorFlow SavedModel export of the Keras model holds the tensors the Keras map consumes.

    Optional input: the Keras model exported as a TensorFlow SavedModel holds
    the same tensors (matched by shape and value) that the Keras map consumes."""
    import tensorflow as tf

    path = tmp_path / "saved_model"
    keras_source.model.export(str(path), format="tf_saved_model")
    loaded = [np.asarray(v.numpy()) for v in tf.saved_model.load(str(path)).variables]
    expected = list(sources.keras_weights(keras_source.model).values())
    assert len(loaded) == len(expected)
    for array in expected:
        assert any(x.shape == array.shape and np.array_equal(x, array) for x in loaded)


@pytest.mark.claims("names-checked-before-data", "check-names-order-and-wording")
@pytest.mark.claims("check-names-multiple-consumers", "check-names-missing-source")
@pytest.mark.claims("check-names-unexpected-source", "check-names-rename-hint")
@pytest.mark.claims("check-names-fill-count", "check-names-not-a-parameter")
def test_map_errors_are_named_one_by_one(torch_source):
    """check_names names each map and source name error, word for word and in order, nothing else.

    The name check judges the map as well as the source: a key two rules
    consume, a parameter filled twice or never, a target the model lacks; each
    named, and nothing else reported."""
    arch = Arch()
    spec = checkpoint.target_spec(model.abstract_model(arch))
    keys = list(torch_source.model.state_dict().keys())
    rules = torch_map(arch)
    assert check_names(rules, keys, spec.keys()) == []
    twice = [*rules, Rule(("fc2.bias",), ("fc2.bias",))]
    assert check_names(twice, keys, spec.keys()) == [
        "map error: source key `fc2.bias` is consumed by 2 rules",
        "target parameter `fc2.bias` is filled 2 times",
    ]
    thrice = [*twice, Rule(("fc2.bias",), ())]
    assert check_names(thrice, keys, spec.keys())[0] == (
        "map error: source key `fc2.bias` is consumed by 3 rules"
    )
    dropped = [r for r in rules if r.sources != ("fc2.bias",)]
    assert check_names(dropped, keys, spec.keys()) == [
        "unexpected source tensor `fc2.bias` (no rule consumes it)",
        "target parameter `fc2.bias` is filled 0 times",
    ]
    foreign = [*rules, Rule(("extra.weight",), ("extra.kernel",))]
    assert check_names(foreign, [*keys, "extra.weight"], spec.keys()) == [
        "map error: target `extra.kernel` is not a parameter of the model"
    ]
    renamed = [("fc_1.weight" if k == "fc1.weight" else k) for k in keys]
    assert check_names(rules, renamed, spec.keys()) == [
        "missing source tensor `fc1.weight` (expected by the map)",
        "unexpected source tensor `fc_1.weight` (no rule consumes it; renamed from `fc1.weight`?)",
    ]
    # A foreign key with no close expected name: no hint. (Every expected key
    # present: a rename hint may only point at a key that is missing.)
    assert check_names(rules, [*keys, "fc1.weights"], spec.keys()) == [
        "unexpected source tensor `fc1.weights` (no rule consumes it)"
    ]
    # Several unexpected keys: each named once, in the source's order (a report that
    # follows a set's order would change from one process to the next).
    extra = [f"{name}.extra" for name in "zeta alpha mid omega beta kappa delta theta".split()]
    assert check_names(rules, [*keys, *extra], spec.keys()) == [
        f"unexpected source tensor `{k}` (no rule consumes it)" for k in extra
    ]


@pytest.mark.claims("tied-weights-once", "check-names-tie-needs-one-name")
@pytest.mark.claims("check-names-missing-source")
@pytest.mark.parametrize(
    "kept",
    [("class_embed.weight", "head.weight"), ("class_embed.weight",), ("head.weight",), ()],
    ids=["both", "class-embed-only", "head-only", "neither"],
)
def test_a_tie_needs_one_of_its_names(torch_source, kept):
    """A tied pair converts from either name or both; with neither, both are reported missing.

    A tied pair may be stored under either name (a deduplicating saver keeps
    one); with neither present both are missing. Any other rule needs every source."""
    arch = Arch()
    spec = checkpoint.target_spec(model.abstract_model(arch))
    state = torch_source.model.state_dict()
    tied = ("class_embed.weight", "head.weight")
    source = {k: v for k, v in state.items() if k not in tied or k in kept}
    problems = check_names(torch_map(arch), source.keys(), spec.keys())
    if kept:
        assert problems == []
        out = convert(torch_map(arch), source, arch, spec)["class_embed.embedding"]
        assert np.array_equal(out, state["head.weight"].numpy())
    else:
        assert problems == [f"missing source tensor `{k}` (expected by the map)" for k in tied]
    one_missing = {k: v for k, v in state.items() if k != "attn.out_proj.bias"}
    assert check_names(torch_map(arch), one_missing.keys(), spec.keys()) == [
        "missing source tensor `attn.out_proj.bias` (expected by the map)"
    ]


def _python_first_nonfinite(values: list[float], shape: tuple[int, ...]):
    """The reference: (count, row-major index of the first) by plain Python."""
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if not bad:
        return None
    index, rest = [], bad[0]
    for dim in reversed(shape):
        rest, i = divmod(rest, dim)
        index.append(i)
    return len(bad), tuple(reversed(index))


NON_FINITE = (float("nan"), float("inf"), float("-inf"))


def _non_finite_placement(size: int, count: int, seed: int) -> dict[int, float]:
    """`count` distinct positions of `range(size)`, each with NaN, inf or -inf, drawn by
    NumPy from `seed`: one Hypothesis draw for the count and one for the seed per example,
    instead of one per position and kind (whose per-draw cost made generation slow)."""
    rng = np.random.default_rng(seed)
    positions = rng.permutation(size)[:count]
    kinds = rng.integers(0, len(NON_FINITE), size=count)
    return {int(p): NON_FINITE[k] for p, k in zip(positions, kinds, strict=True)}


@settings(max_examples=120, derandomize=True, deadline=None, database=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    chunk=st.integers(1, 9),
    data=st.data(),
)
def test_first_nonfinite_counts_and_locates_against_python(shape, dtype, chunk, data):
    """first_nonfinite gives the count and first row-major index of non-finite values, as a Python
    loop does."""
    size = math.prod(shape)
    count = data.draw(st.integers(0, size))  # none, some or every value non-finite
    placement = _non_finite_placement(size, count, data.draw(st.integers(0, 2**32 - 1)))
    values = [float(i) - size / 2 for i in range(size)]
    for p, value in placement.items():
        values[p] = value
    array = np.array(values, dtype=dtype).reshape(shape)
    expected = _python_first_nonfinite(values, shape)
    assert first_nonfinite(array, chunk=chunk) == expected
    assert first_nonfinite(array) == expected  # the default chunk
    assert first_nonfinite(np.arange(size).reshape(shape)) is None  # integers: always finite


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("source_dtype", [torch.float16, torch.float32, torch.float64])
def test_every_supported_dtype_converts_to_the_target_dtype(torch_source, dtype, source_dtype):
    """Every float16, float32 or float64 source converts to exactly its cast, in the target dtype.

    Sources in float16, float32 or float64; targets in float16 or float64:
    each result holds the target's dtype and the source values cast to it."""
    arch = Arch()
    spec = {
        k: (s, np.dtype(dtype))
        for k, (s, _) in checkpoint.target_spec(model.abstract_model(arch)).items()
    }
    state = {
        k: (v.to(source_dtype) if v.is_floating_point() else v)
        for k, v in torch_source.model.state_dict().items()
    }
    out = convert(torch_map(arch), state, arch, spec)
    for path, (shape, want) in spec.items():
        assert out[path].dtype == want and out[path].shape == shape, path
        assert out[path].flags["C_CONTIGUOUS"], path
    weight = state["fc2.weight"].numpy()
    assert np.array_equal(out["fc2.kernel"], weight.T.astype(dtype))
    assert np.array_equal(out["bn1.var"], state["bn1.running_var"].numpy().astype(dtype))


def test_a_transform_that_misses_its_target_shape_is_named(torch_source, monkeypatch):
    """A transform output or a source of the wrong shape is refused, naming source and target.

    A rule whose transform returns the wrong shape (here one row short) is
    refused after the transform, naming the source tensor and the target."""
    arch = Arch()
    spec = checkpoint.target_spec(model.abstract_model(arch))
    monkeypatch.setitem(TRANSFORMS, "short", lambda xs, arch: [xs[0][:-1]])
    rule = Rule(("fc2.bias", "conv1.bias"), ("fc2.bias",), "short")  # two sources, two shapes
    state = torch_source.model.state_dict()
    bias = state["fc2.bias"].numpy()
    with pytest.raises(MappingError) as info:
        apply_rule(rule, {"fc2.bias": bias, "conv1.bias": state["conv1.bias"].numpy()}, arch, spec)
    assert info.value.problems == [
        "source tensor `fc2.bias` (64,) becomes (63,) after `short`, but target `fc2.bias` "
        "has shape (64,)"
    ]
    # a source of the wrong shape is refused before any transform runs
    with pytest.raises(MappingError) as info:
        apply_rule(Rule(("fc2.bias",), ("fc2.bias",)), {"fc2.bias": bias[:-1]}, arch, spec)
    assert info.value.problems == [
        "source tensor `fc2.bias` (63,) has the wrong shape: target `fc2.bias` (64,) needs (64,)"
    ]


def test_source_shapes_are_the_sources_own(torch_source, keras_source):
    """source_shapes equals the shapes the PyTorch and Keras sources really hold, per rule.

    The shape each rule demands of its sources, derived from the target
    model, is the shape the PyTorch state_dict and the Keras model really hold
    (both architectures for PyTorch); a rule without targets demands none."""
    for arch in (Arch(), OTHER):
        net = torch_source.model if arch == Arch() else untrained(OTHER)
        state = net.state_dict()
        spec = checkpoint.target_spec(model.abstract_model(arch))
        for rule in torch_map(arch):
            want = source_shapes(rule, spec)
            if rule.transform == "drop":
                assert want is None
            else:
                assert want == [tuple(state[k].shape) for k in rule.sources], rule
    weights = sources.keras_weights(keras_source.model)
    arch = sources.keras_arch(Arch())
    spec = checkpoint.target_spec(model.abstract_model(arch))
    for rule in keras_map(arch):
        assert source_shapes(rule, spec) == [tuple(weights[k].shape) for k in rule.sources], rule
    assert source_shapes(Rule(("fc2.bias",), (), "copy"), spec) is None
