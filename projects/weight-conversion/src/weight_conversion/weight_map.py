"""The weight map: a declarative list of rules from source tensor names to NNX
parameter paths, each with the layout transform that the two conventions
need, and the checks that make a conversion trustworthy.

A `Rule` consumes one or more source tensors and fills zero or more target
parameters. `torch_map(arch)` and `keras_map(arch)` are the two maps; they
are data, and `convert` is the one interpreter:

  1. names first, without touching data: every source tensor is consumed by
     exactly one rule, every target parameter is filled by exactly one rule;
     a missing, extra or renamed key is reported by name (with the closest
     expected name for a likely rename), all problems at once;
  2. then rule by rule: dtype supported, shape the one the target needs
     (`source_shapes`: a reshape that happens to fit cannot hide a wrong
     shape), every value finite, transform applied, result shape and dtype
     equal to the target's; a mismatch names the source tensor.

No check on names, shapes or dtypes can see a *square* weight that is
transposed (fc2 is 64 x 64): the parity check of stage 2 is what refuses it.

Layout conventions (PyTorch -> NNX):
  Linear weight (out, in)             -> kernel (in, out)             `linear`
  Conv2d weight OIHW                  -> kernel HWIO                  `conv`
  fc1 after an NCHW flatten (out, C*H*W) -> kernel (H*W*C, out)       `linear_from_nchw`
  MultiheadAttention in_proj (3C, C)  -> query/key/value (C, heads, C/heads)  `qkv_kernel`
  out_proj.weight (C, C)              -> out kernel (heads, C/heads, C)       `attn_out`
  tied head.weight / class_embed.weight -> one class_embed.embedding  `tied`
"""

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from weight_conversion.config import Arch

SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class MappingError(ValueError):
    """A source that does not fit the map; `problems` lists every finding, each
    naming the tensor it is about."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            f"{len(problems)} problem(s) mapping the weights:\n  - " + "\n  - ".join(problems)
        )

    def one_line(self, limit: int = 4) -> str:
        """The problems on one line (the first `limit`, then how many more)."""
        shown = "; ".join(self.problems[:limit])
        more = len(self.problems) - limit
        return shown + (f"; and {more} more problem(s)" if more > 0 else "")


@dataclasses.dataclass(frozen=True)
class Rule:
    """`sources` -> `transform` -> `targets` (paths in the NNX state, `.`-joined)."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    transform: str = "copy"
    why: str = ""


# --- TRANSFORMS: (arrays, arch) -> arrays --------------------------------------


def t_copy(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """Same layout on both sides."""
    del arch
    return [xs[0]]


def t_linear(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """PyTorch Linear weight (out, in) -> NNX kernel (in, out). [claim:t-linear-transpose]"""
    del arch
    # --- exercise stage 1: Linear weight (out, in) to kernel (in, out). ---
    return [xs[0].T]
    # --- end exercise ---


def t_conv(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """PyTorch Conv2d weight OIHW -> NNX Conv kernel HWIO. [claim:t-conv-oihw-to-hwio]"""
    del arch
    # --- exercise stage 1: Conv weight OIHW to kernel HWIO. ---
    return [xs[0].transpose(2, 3, 1, 0)]
    # --- end exercise ---


def t_linear_from_nchw(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """fc1 reads a flattened conv map. PyTorch flattens NCHW (input index
    c*H*W + h*W + w), NNX flattens NHWC ((h*W + w)*C + c): the kernel's rows
    must be permuted as well as transposed. [claim:t-fc1-nchw-rows]"""
    c, side = arch.conv2_channels, arch.pooled_size
    w = xs[0]
    # --- exercise stage 1: fc1: transpose, and rows from (c, h, w) to (h, w, c) order. ---
    out = w.shape[0]
    kernel = w.reshape(out, c, side, side).transpose(2, 3, 1, 0).reshape(side * side * c, out)
    return [kernel]
    # --- end exercise ---


def t_qkv_kernel(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """nn.MultiheadAttention packs W_q, W_k, W_v as rows of one (3C, C) weight
    (each (out, in)); NNX keeps three DenseGeneral kernels (C, heads, head_dim),
    the output feature j = head * head_dim + d, as PyTorch splits heads.
    [claim:t-qkv-kernel-split]"""
    c, heads = arch.channels, arch.heads
    # --- exercise stage 1: Split in_proj_weight (3C, C) into q, k, v kernels (C, heads, hd). ---
    w_q, w_k, w_v = np.split(xs[0], 3, axis=0)
    return [w.T.reshape(c, heads, c // heads) for w in (w_q, w_k, w_v)]
    # --- end exercise ---


def t_qkv_bias(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """The packed (3C,) in_proj_bias -> three (heads, head_dim) biases. [claim:t-qkv-bias-split]"""
    c, heads = arch.channels, arch.heads
    # --- exercise stage 1: Split in_proj_bias (3C,) into q, k, v biases (heads, C/heads). ---
    return [b.reshape(heads, c // heads) for b in np.split(xs[0], 3)]
    # --- end exercise ---


def t_attn_out(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """out_proj.weight (C, C) (out, in over concatenated heads) -> (heads, head_dim, C).
    [claim:t-attn-out-heads]"""
    c, heads = arch.channels, arch.heads
    # --- exercise stage 1: out_proj.weight (out, in) to kernel (heads, C/heads, C). ---
    return [xs[0].T.reshape(heads, c // heads, c)]
    # --- end exercise ---


def t_tied(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """Several names for one tensor (tied weights): every copy present must be
    bitwise equal; the target receives it once."""
    del arch
    first = xs[0]
    for other in xs[1:]:
        if other.shape != first.shape or not np.array_equal(other, first):
            raise ValueError("the tied copies differ")
    return [first]


def t_keras_head(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """Keras Dense kernel (in, out) of the classifier -> class embedding (out, in)."""
    del arch
    return [xs[0].T]


def t_drop(xs: list[np.ndarray], arch: Arch) -> list[np.ndarray]:
    """Consumed on purpose, no target (a training-time counter)."""
    del xs, arch
    return []


TRANSFORMS: dict[str, Callable[[list[np.ndarray], Arch], list[np.ndarray]]] = {
    "copy": t_copy,
    "linear": t_linear,
    "conv": t_conv,
    "linear_from_nchw": t_linear_from_nchw,
    "qkv_kernel": t_qkv_kernel,
    "qkv_bias": t_qkv_bias,
    "attn_out": t_attn_out,
    "tied": t_tied,
    "keras_head": t_keras_head,
    "drop": t_drop,
}

# --- WHAT EACH TRANSFORM READS: source shapes from the target shapes -----------

SOURCE_SHAPES: dict[str, Callable[[list[tuple[int, ...]], int], list[tuple[int, ...]]]] = {
    # (target shapes in rule order, number of sources) -> each source's shape
    "copy": lambda t, n: [t[0]],
    "linear": lambda t, n: [tuple(reversed(t[0]))],
    "conv": lambda t, n: [(t[0][3], t[0][2], t[0][0], t[0][1])] if len(t[0]) == 4 else [()],
    "linear_from_nchw": lambda t, n: [tuple(reversed(t[0]))],
    "qkv_kernel": lambda t, n: [(3 * t[0][1] * t[0][2], t[0][0])] if len(t[0]) == 3 else [()],
    "qkv_bias": lambda t, n: [(3 * t[0][0] * t[0][1],)] if len(t[0]) == 2 else [()],
    "attn_out": lambda t, n: [(t[0][2], t[0][0] * t[0][1])] if len(t[0]) == 3 else [()],
    "tied": lambda t, n: [t[0]] * n,
    "keras_head": lambda t, n: [tuple(reversed(t[0]))],
}


def source_shapes(
    rule: Rule, target_spec: Mapping[str, tuple[tuple[int, ...], np.dtype]]
) -> list[tuple[int, ...]] | None:
    """The shape each of `rule`'s source tensors must have for its targets, or
    None where the transform reads any shape (`drop`)."""
    if rule.transform not in SOURCE_SHAPES or not rule.targets:
        return None
    targets = [tuple(target_spec[path][0]) for path in rule.targets]
    return [tuple(s) for s in SOURCE_SHAPES[rule.transform](targets, len(rule.sources))]


def first_nonfinite(array: np.ndarray, chunk: int = 1 << 16) -> tuple[int, tuple[int, ...]] | None:
    """`(count, index of the first)` of the NaN or infinite values of a float
    array, or None when every value is finite. Scans in chunks, so a large
    tensor costs no second full-size buffer."""
    if not np.issubdtype(array.dtype, np.floating):
        return None
    flat = np.ravel(array)
    count, first = 0, None
    for start in range(0, flat.size, chunk):
        bad = ~np.isfinite(flat[start : start + chunk])
        if bad.any():
            if first is None:
                first = start + int(np.argmax(bad))
            count += int(bad.sum())
    if first is None:
        return None
    return count, tuple(int(i) for i in np.unravel_index(first, array.shape))


# Rules whose sources may be partly absent: a saver that deduplicates tied
# tensors (safetensors' `save_model`) keeps one of the names.
PARTIAL_OK = {"tied"}
# Rules that consume a non-float tensor on purpose.
ANY_DTYPE = {"drop"}


# --- THE TWO MAPS --------------------------------------------------------------


def torch_map(arch: Arch) -> list[Rule]:
    """PyTorch `TorchDigitNet.state_dict()` -> `DigitNet` state."""
    del arch
    return [
        Rule(("conv1.weight",), ("conv1.kernel",), "conv"),
        Rule(("conv1.bias",), ("conv1.bias",)),
        Rule(("bn1.weight",), ("bn1.scale",)),
        Rule(("bn1.bias",), ("bn1.bias",)),
        Rule(("bn1.running_mean",), ("bn1.mean",), why="eval statistics"),
        Rule(("bn1.running_var",), ("bn1.var",), why="eval statistics"),
        Rule(("bn1.num_batches_tracked",), (), "drop", why="training counter; NNX has none"),
        Rule(("pos.weight",), ("pos.embedding",)),
        Rule(("norm1.weight",), ("norm1.scale",)),
        Rule(("norm1.bias",), ("norm1.bias",)),
        Rule(
            ("attn.in_proj_weight",),
            ("attn.query.kernel", "attn.key.kernel", "attn.value.kernel"),
            "qkv_kernel",
        ),
        Rule(
            ("attn.in_proj_bias",),
            ("attn.query.bias", "attn.key.bias", "attn.value.bias"),
            "qkv_bias",
        ),
        Rule(("attn.out_proj.weight",), ("attn.out.kernel",), "attn_out"),
        Rule(("attn.out_proj.bias",), ("attn.out.bias",)),
        Rule(("conv2.weight",), ("conv2.kernel",), "conv"),
        Rule(("conv2.bias",), ("conv2.bias",)),
        Rule(("fc1.weight",), ("fc1.kernel",), "linear_from_nchw"),
        Rule(("fc1.bias",), ("fc1.bias",)),
        Rule(("fc2.weight",), ("fc2.kernel",), "linear"),
        Rule(("fc2.bias",), ("fc2.bias",)),
        Rule(("class_embed.weight", "head.weight"), ("class_embed.embedding",), "tied"),
        Rule(("head.bias",), ("head_bias",)),
    ]


def keras_map(arch: Arch) -> list[Rule]:
    """Keras `KerasDigitNet` weights (by path) -> `DigitNet` state. Keras is
    NHWC with (in, out) kernels already: only names change, and the classifier
    kernel becomes the class embedding."""
    del arch
    rules = [
        Rule(("conv1/kernel",), ("conv1.kernel",)),
        Rule(("conv1/bias",), ("conv1.bias",)),
        Rule(("bn1/gamma",), ("bn1.scale",)),
        Rule(("bn1/beta",), ("bn1.bias",)),
        Rule(("bn1/moving_mean",), ("bn1.mean",)),
        Rule(("bn1/moving_variance",), ("bn1.var",)),
        Rule(("pos/embeddings",), ("pos.embedding",)),
        Rule(("norm1/gamma",), ("norm1.scale",)),
        Rule(("norm1/beta",), ("norm1.bias",)),
    ]
    for part in ("query", "key", "value"):
        rules += [
            Rule((f"attn/{part}/kernel",), (f"attn.{part}.kernel",)),
            Rule((f"attn/{part}/bias",), (f"attn.{part}.bias",)),
        ]
    rules += [
        Rule(("attn/attention_output/kernel",), ("attn.out.kernel",)),
        Rule(("attn/attention_output/bias",), ("attn.out.bias",)),
        Rule(("conv2/kernel",), ("conv2.kernel",)),
        Rule(("conv2/bias",), ("conv2.bias",)),
        Rule(("fc1/kernel",), ("fc1.kernel",)),
        Rule(("fc1/bias",), ("fc1.bias",)),
        Rule(("fc2/kernel",), ("fc2.kernel",)),
        Rule(("fc2/bias",), ("fc2.bias",)),
        Rule(("head/kernel",), ("class_embed.embedding",), "keras_head"),
        Rule(("head/bias",), ("head_bias",)),
    ]
    return rules


# --- CHECKS AND THE INTERPRETER ------------------------------------------------


def check_names(
    rules: list[Rule], source_keys: Iterable[str], target_paths: Iterable[str]
) -> list[str]:
    """Every problem with the *names*, without reading any tensor: each source
    key consumed by exactly one rule, each target path filled exactly once.

    The problems, exactly in this order and wording [claim:check-names-order-and-wording]:
        1. per key two or more rules consume, in rule order: "map error: source key
           `<k>` is consumed by <n> rules" [claim:check-names-multiple-consumers]
        2. per rule, each of its keys absent from `source_keys`: "missing source tensor
           `<k>` (expected by the map)" [claim:check-names-missing-source]; a `tied` rule
           (`PARTIAL_OK`) with at least one of its names present reports none
           [claim:check-names-tie-needs-one-name]
        3. per source key no rule consumes, in `source_keys` order: "unexpected source
           tensor `<k>` (no rule consumes it)" [claim:check-names-unexpected-source], with
           "; renamed from `<e>`?" before the ")" when `difflib.get_close_matches` finds a
           close expected key that is MISSING [claim:check-names-rename-hint]
        4. per target path, in `target_paths` order, filled n != 1 times: "target
           parameter `<p>` is filled <n> times" [claim:check-names-fill-count]
        5. per filled path that is not a target: "map error: target `<p>` is not a
           parameter of the model" [claim:check-names-not-a-parameter]
    """
    source_keys, target_paths = list(source_keys), list(target_paths)
    problems: list[str] = []
    # --- exercise stage 1: Name each key not consumed once and each target not filled once. ---
    consumed: dict[str, int] = {}
    for rule in rules:
        for key in rule.sources:
            consumed[key] = consumed.get(key, 0) + 1
    for key, count in consumed.items():
        if count > 1:
            problems.append(f"map error: source key `{key}` is consumed by {count} rules")
    present = set(source_keys)
    for rule in rules:
        found = [k for k in rule.sources if k in present]
        missing = [k for k in rule.sources if k not in present]
        if missing and not (rule.transform in PARTIAL_OK and found):
            for key in missing:
                problems.append(f"missing source tensor `{key}` (expected by the map)")
    expected = list(consumed)
    for key in source_keys:
        if key not in consumed:
            close = difflib.get_close_matches(key, [k for k in expected if k not in present], 1)
            hint = f"; renamed from `{close[0]}`?" if close else ""
            problems.append(f"unexpected source tensor `{key}` (no rule consumes it{hint})")
    filled: dict[str, int] = {}
    for rule in rules:
        for path in rule.targets:
            filled[path] = filled.get(path, 0) + 1
    for path in target_paths:
        if filled.get(path, 0) != 1:
            problems.append(f"target parameter `{path}` is filled {filled.get(path, 0)} times")
    for path in filled:
        if path not in set(target_paths):
            problems.append(f"map error: target `{path}` is not a parameter of the model")
    # --- end exercise ---
    return problems


def as_numpy(name: str, value) -> np.ndarray:
    """A source tensor (NumPy array or torch.Tensor) as NumPy, without copying
    where possible; a dtype NumPy cannot hold is refused by name."""
    if hasattr(value, "detach"):  # torch.Tensor
        try:
            value = value.detach().cpu().numpy()
        except TypeError as err:
            raise MappingError(
                [
                    f"source tensor `{name}` has dtype `{value.dtype}`, which NumPy cannot "
                    f"hold ({err}); cast it to float32 first"
                ]
            ) from None
    return np.asarray(value)


def apply_rule(
    rule: Rule,
    named: Mapping[str, np.ndarray],
    arch: Arch,
    target_spec: Mapping[str, tuple[tuple[int, ...], np.dtype]],
) -> dict[str, np.ndarray]:
    """One rule on its source tensors `{name: array}` (those present): dtype
    checks, the transform, shape checks; the results cast to the target dtype.
    Raises `MappingError` naming the source tensor."""
    names = [k for k in rule.sources if k in named]
    arrays = [as_numpy(k, named[k]) for k in names]
    if rule.transform not in ANY_DTYPE:
        for name, array in zip(names, arrays, strict=True):
            if array.dtype not in SUPPORTED_DTYPES:
                raise MappingError(
                    [
                        f"source tensor `{name}` has dtype `{array.dtype}`; the target supports "
                        f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}"
                    ]
                )
    expected = source_shapes(rule, target_spec)
    if expected is not None:
        for name, array in zip(names, arrays, strict=True):
            shape = expected[rule.sources.index(name)]
            if tuple(array.shape) != shape:
                raise MappingError(
                    [
                        f"source tensor `{name}` {tuple(array.shape)} has the wrong shape: "
                        f"target `{rule.targets[0]}` {tuple(target_spec[rule.targets[0]][0])} "
                        f"needs {shape}"
                    ]
                )
    for name, array in zip(names, arrays, strict=True):
        bad = first_nonfinite(array)
        if bad is not None:
            raise MappingError(
                [
                    f"source tensor `{name}` holds {bad[0]} non-finite value(s) (NaN or inf), "
                    f"the first at index {bad[1]}"
                ]
            )
    try:
        outputs = TRANSFORMS[rule.transform](arrays, arch)
    except ValueError as err:  # a reshape that cannot fit, tied copies that differ
        shapes = ", ".join(f"`{n}` {tuple(a.shape)}" for n, a in zip(names, arrays, strict=True))
        raise MappingError(
            [f"source tensor {shapes} cannot take the `{rule.transform}` transform: {err}"]
        ) from None
    result = {}
    for path, out in zip(rule.targets, outputs, strict=True):
        shape, dtype = target_spec[path]
        if tuple(out.shape) != tuple(shape):
            raise MappingError(
                [
                    f"source tensor `{names[0]}` {tuple(arrays[0].shape)} becomes "
                    f"{tuple(out.shape)} after `{rule.transform}`, but target `{path}` "
                    f"has shape {tuple(shape)}"
                ]
            )
        result[path] = np.ascontiguousarray(out, dtype=dtype)
    return result


def convert(
    rules: list[Rule],
    source: Mapping[str, object],
    arch: Arch,
    target_spec: Mapping[str, tuple[tuple[int, ...], np.dtype]],
) -> dict[str, np.ndarray]:
    """The whole source in memory -> `{target path: array}` in the target's
    layout and dtype. Raises `MappingError` listing every name problem first."""
    problems = check_names(rules, source.keys(), target_spec.keys())
    if problems:
        raise MappingError(problems)
    out: dict[str, np.ndarray] = {}
    for rule in rules:
        named = {k: source[k] for k in rule.sources if k in source}
        out.update(apply_rule(rule, named, arch, target_spec))
    return out
