"""Layer-by-layer parity: both models run on the same images, every tapped
output is compared in forward order, and the first layer whose outputs
disagree beyond a tolerance is named.

The tolerance comes from the dtype and the reduction length, not from a
guess. A float sum of K products carries a rounding error of at most about
K * eps relative to the magnitude of the terms (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., section 3.1, gamma_K). Errors
made upstream travel with the activations, so layer l is allowed the
running total of the reductions along the path up to it:

    tol_l = eps(dtype) * (K_1 + ... + K_l) * max|reference_l|

Both sides round differently (other summation orders, fused kernels), so a
clean conversion sits well under that bound, in float32 and in float64 alike,
and each fault in `FAULTS` lands orders of magnitude above it at the layer
where it was introduced.
"""

import dataclasses
from collections.abc import Callable

import numpy as np

from weight_conversion.config import Arch
from weight_conversion.model import DigitNet, Layer


@dataclasses.dataclass(frozen=True)
class LayerResult:
    name: str
    max_abs_error: float
    max_abs_reference: float
    cumulative_reduction: int
    tolerance: float

    @property
    def ratio(self) -> float:
        """Error over tolerance: above 1 is a disagreement."""
        return self.max_abs_error / self.tolerance

    @property
    def agrees(self) -> bool:
        return self.max_abs_error <= self.tolerance


@dataclasses.dataclass(frozen=True)
class ParityReport:
    dtype: str
    layers: list[LayerResult]
    first_disagreement: str | None  # name of the first layer beyond tolerance, or None

    def to_dict(self) -> dict:
        return {
            "dtype": self.dtype,
            "first_disagreement": self.first_disagreement,
            "layers": [dict(dataclasses.asdict(r), ratio=r.ratio) for r in self.layers],
        }


def tolerance(dtype: np.dtype, cumulative_reduction: int, scale: float) -> float:
    """The largest |target - source| allowed for an output of magnitude `scale`
    produced through `cumulative_reduction` summed terms in `dtype`.

    `eps(dtype) * cumulative_reduction * max(scale, tiny(dtype))`: eps of the
    compared dtype (float16, float32 or float64, never float64's for all)
    [claim:tolerance-formula], and a
    zero or denormal scale floored at the dtype's smallest normal number, so an
    all-zero layer still gets a bound above 0. [claim:tolerance-scale-floor]
    """
    # --- exercise stage 2: eps(dtype) times the reduction length times the scale. ---
    eps = float(np.finfo(np.dtype(dtype)).eps)
    return eps * cumulative_reduction * max(scale, float(np.finfo(np.dtype(dtype)).tiny))
    # --- end exercise ---


def to_target_layout(array: np.ndarray, layer: Layer) -> np.ndarray:
    """A PyTorch tap in the NNX layout: NCHW maps become NHWC."""
    if layer.layout == "map":
        return array.transpose(0, 2, 3, 1)
    return array


def compare(
    source_taps: dict[str, np.ndarray],
    target_taps: dict[str, np.ndarray],
    layer_list: list[Layer],
    dtype: np.dtype,
    source_layout: str = "torch",
) -> ParityReport:
    """Every layer in forward order against its tolerance; the first one beyond
    it is `first_disagreement`. `source_layout` is `torch` (NCHW maps) or
    `keras` (already NHWC).

    Cases, per layer in `layer_list` order:
        reduction -> CUMULATIVE: the sum of `layer.reduction` over this layer and
            every one before it (errors compound through the network)
            [claim:compare-cumulative-reduction]
        a `torch` source tap of a `map` layer -> NCHW transposed to NHWC first
            [claim:compare-aligns-torch-maps]
        shapes still differ -> `ValueError("Layer `<name>`: source output <shape> vs
            target <shape>.")` [claim:compare-refuses-shape-mismatch]
        error = max |target - source|, scale = max |source|, each a Python float
            [claim:compare-error-and-scale]
        error == tolerance -> agrees (`<=`) [claim:compare-boundary-agrees]; only the first
            layer beyond it is named, later layers are still measured and reported
            [claim:compare-first-disagreement-only]
    """
    results: list[LayerResult] = []
    first = None
    # --- exercise stage 2: In order: align layouts, measure, bound, name the first beyond. ---
    cumulative = 0
    for layer in layer_list:
        cumulative += layer.reduction
        ref = source_taps[layer.name]
        if source_layout == "torch":
            ref = to_target_layout(ref, layer)
        out = target_taps[layer.name]
        if ref.shape != out.shape:
            raise ValueError(
                f"Layer `{layer.name}`: source output {ref.shape} vs target {out.shape}."
            )
        error = float(np.max(np.abs(out - ref)))
        scale = float(np.max(np.abs(ref)))
        result = LayerResult(
            layer.name, error, scale, cumulative, tolerance(dtype, cumulative, scale)
        )
        results.append(result)
        if first is None and not result.agrees:
            first = layer.name
    # --- end exercise ---
    return ParityReport(str(np.dtype(dtype)), results, first)


# --- FAULTS: plausible conversion mistakes, each with the layer it must be found at ---


@dataclasses.dataclass(frozen=True)
class Fault:
    description: str
    layer: str  # where the locator must find it
    inject: Callable[[DigitNet, dict[str, np.ndarray], Arch], None]


def _untransposed_square_kernel(model: DigitNet, sd: dict, arch: Arch) -> None:
    del arch
    model.fc2.kernel[...] = np.asarray(sd["fc2.weight"])  # In-place update.


def _nchw_flatten(model: DigitNet, sd: dict, arch: Arch) -> None:
    del arch
    model.fc1.kernel[...] = np.asarray(sd["fc1.weight"]).T  # In-place update.


def _bn_epsilon(model: DigitNet, sd: dict, arch: Arch) -> None:
    del sd
    model.bn1.epsilon = 1e-3 if arch.bn_epsilon != 1e-3 else 1e-5


def _train_mode_bn(model: DigitNet, sd: dict, arch: Arch) -> None:
    del sd, arch
    model.bn1.use_running_average = False


def _tanh_gelu(model: DigitNet, sd: dict, arch: Arch) -> None:
    del sd
    model.gelu_approximate = not arch.gelu_approximate


FAULTS: dict[str, Fault] = {
    "untransposed-square-kernel": Fault(
        "fc2 (64x64) loaded as (out, in): shapes agree, values do not",
        "fc2",
        _untransposed_square_kernel,
    ),
    "nchw-flatten": Fault(
        "fc1 transposed but its rows left in PyTorch's (c, h, w) flatten order",
        "fc1",
        _nchw_flatten,
    ),
    "bn-epsilon": Fault(
        "BatchNorm epsilon 1e-3 (the Keras default) instead of PyTorch's 1e-5",
        "bn1",
        _bn_epsilon,
    ),
    "train-mode-batchnorm": Fault(
        "BatchNorm normalises with the batch statistics instead of the running ones",
        "bn1",
        _train_mode_bn,
    ),
    "tanh-gelu": Fault(
        "GELU's tanh approximation (jax.nn.gelu's default) instead of the exact form",
        "act1",
        _tanh_gelu,
    ),
}


# --- ONE PARITY RUN --------------------------------------------------------------


def torch_parity(
    net, arch: Arch, images: np.ndarray, dtype=np.float32, fault: str | None = None
) -> ParityReport:
    """Converts the PyTorch `net` (in memory, through `weight_map.torch_map`)
    into an NNX model of `dtype`, optionally injects a fault, runs both on
    `images` (`(n, 8, 8)`) and compares every layer. float64 runs both
    sides in float64 (`jax.enable_x64` only inside this call)."""
    import contextlib

    import jax
    import torch

    from weight_conversion import checkpoint, data, model, sources, weight_map

    dtype = np.dtype(dtype)
    torch_dtype = torch.float64 if dtype == np.float64 else torch.float32
    net = net.to(torch_dtype).eval()
    ctx = jax.enable_x64(True) if dtype == np.float64 else contextlib.nullcontext()
    with ctx:
        target = model.abstract_model(arch, dtype=dtype.type)
        state = net.state_dict()
        arrays = weight_map.convert(
            weight_map.torch_map(arch), state, arch, checkpoint.target_spec(target)
        )
        checkpoint.fill(target, arrays)
        if fault is not None:
            numpy_state = {k: v.detach().numpy() for k, v in state.items()}
            FAULTS[fault].inject(target, numpy_state, arch)
        layer_list = model.layers(arch)
        source_taps = sources.torch_taps(net, data.nchw(images), [x.name for x in layer_list])
        target_taps = model.taps(target, data.nhwc(images))
    return compare(source_taps, target_taps, layer_list, dtype)
