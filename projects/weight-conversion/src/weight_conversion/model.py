"""The conversion target: the network of `config.Arch` in Flax NNX (NHWC).

`DigitNet.__call__` sows every output that stage 2 compares under the names
of `layers(arch)` (an `nnx.Intermediate` each); `taps(model, x)` collects
them with `nnx.capture`, inside one jitted forward pass. The parameter
tree (`nnx.state(model, nnx.Param)` plus BatchNorm's `nnx.BatchStat`) is
what the weight map fills:

    conv1.kernel (3, 3, 1, C)        conv1.bias (C,)
    bn1.scale, bn1.bias (C,)         bn1.mean, bn1.var (C,)   BatchStat
    pos.embedding (64, C)            norm1.scale, norm1.bias (C,)
    attn.{query,key,value}.kernel (C, heads, C/heads)  .bias (heads, C/heads)
    attn.out.kernel (heads, C/heads, C)                attn.out.bias (C,)
    conv2.kernel (3, 3, C, C2)       conv2.bias (C2,)
    fc1.kernel (16*C2, H) rows in (h, w, c) order      fc1.bias (H,)
    fc2.kernel (H, H)                fc2.bias (H,)
    class_embed.embedding (10, H)    head_bias (10,)

The classifier has no kernel of its own: logits = `class_embed.attend(x)` +
`head_bias`, the NNX form of tied input/output embeddings.
"""

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn.attention import dot_product_attention_weights

from weight_conversion.config import Arch


@dataclasses.dataclass(frozen=True)
class Layer:
    """One tapped output, in forward order.

    `reduction`: the length of the longest sum that produces one output value
    from the layer's input (a 3x3 conv over C channels sums 9*C products); the
    parity tolerance grows with the running total along the path.
    `layout`: how the PyTorch tensor is laid out relative to the NNX one:
    `map` (NCHW vs NHWC), `tokens` (n, L, C) or `vector` (n, F), both the same.
    """

    name: str
    reduction: int
    layout: Literal["map", "tokens", "vector"]


def layers(arch: Arch) -> list[Layer]:
    """The tapped outputs of the network, in forward order."""
    c, t = arch.channels, arch.tokens
    return [
        Layer("conv1", 9, "map"),
        Layer("bn1", 1, "map"),
        Layer("act1", 1, "map"),
        Layer("embed", 1, "tokens"),
        Layer("norm1", c, "tokens"),
        # q.k over head_dim, softmax over t, weights.v over t, out proj over c.
        Layer("attn", c // arch.heads + 2 * t + c, "tokens"),
        Layer("block", 1, "map"),
        Layer("conv2", 9 * c, "map"),
        Layer("act2", 1, "map"),
        Layer("fc1", arch.flat_features, "vector"),
        Layer("act3", 1, "vector"),
        Layer("fc2", arch.hidden, "vector"),
        Layer("act4", 1, "vector"),
        Layer("head", arch.hidden, "vector"),
    ]


def attention_in_input_dtype(query, key, value, bias=None, mask=None, **kwargs):
    """Scaled dot-product attention computed in the inputs' dtype.

    Flax's default `attention_fn` calls `jax.nn.dot_product_attention`, whose
    XLA path forms the logits and the softmax in float32 whatever the input
    dtype: a float64 comparison would then disagree at the attention layer by
    about 1e-8. This is the unfused form (weights, then a weighted sum of the
    values), the same as Flax's own path when dropout is on."""
    del kwargs  # dropout, precision, module: not used (deterministic, no dropout)
    weights = dot_product_attention_weights(query, key, bias, mask, dtype=query.dtype)
    return jnp.einsum("...hqk,...khd->...qhd", weights, value)


class DigitNet(nnx.Module):
    """Input `(n, 8, 8, 1)` NHWC, output logits `(n, num_classes)`."""

    def __init__(self, arch: Arch, *, rngs: nnx.Rngs, dtype=jnp.float32) -> None:
        c, pad = arch.channels, ((1, 1), (1, 1))
        kw = {"dtype": dtype, "param_dtype": dtype, "rngs": rngs}
        self.arch = arch
        self.gelu_approximate = arch.gelu_approximate
        self.record_taps = False  # set by `taps` for the graph it compiles
        # Explicit (1, 1) padding: "SAME" at stride 2 would pad (0, 1), not PyTorch's (1, 1).
        self.conv1 = nnx.Conv(1, c, (3, 3), padding=pad, **kw)
        self.bn1 = nnx.BatchNorm(c, epsilon=arch.bn_epsilon, use_running_average=True, **kw)
        # nnx.BatchNorm keeps its statistics in float32 whatever param_dtype says.
        self.bn1.mean = nnx.BatchStat(jnp.zeros((c,), dtype))
        self.bn1.var = nnx.BatchStat(jnp.ones((c,), dtype))
        self.pos = nnx.Embed(arch.tokens, c, **kw)
        self.norm1 = nnx.LayerNorm(c, epsilon=arch.ln_epsilon, **kw)
        self.attn = nnx.MultiHeadAttention(
            arch.heads,
            c,
            decode=False,
            deterministic=True,
            attention_fn=attention_in_input_dtype,
            **kw,
        )
        self.conv2 = nnx.Conv(c, arch.conv2_channels, (3, 3), strides=2, padding=pad, **kw)
        self.fc1 = nnx.Linear(arch.flat_features, arch.hidden, **kw)
        self.fc2 = nnx.Linear(arch.hidden, arch.hidden, **kw)
        self.class_embed = nnx.Embed(arch.num_classes, arch.hidden, **kw)
        self.head_bias = nnx.Param(jnp.zeros((arch.num_classes,), dtype))

    def _gelu(self, x: jax.Array) -> jax.Array:
        return jax.nn.gelu(x, approximate=self.gelu_approximate)

    def _tap(self, name: str, x: jax.Array) -> jax.Array:
        # Sown as `<name>_out`: a bare `conv1` would collide with the submodule.
        if self.record_taps:
            self.sow(nnx.Intermediate, f"{name}_out", x)
        return x

    def __call__(self, x: jax.Array) -> jax.Array:
        n, side, c = x.shape[0], self.arch.image_size, self.arch.channels
        x = self._tap("conv1", self.conv1(x))
        x = self._tap("bn1", self.bn1(x))
        x = self._tap("act1", self._gelu(x))
        tokens = x.reshape(n, side * side, c)  # raster order, as PyTorch's flatten(2)
        tokens = self._tap("embed", tokens + self.pos.embedding[...][None])
        h = self._tap("norm1", self.norm1(tokens))
        tokens = tokens + self._tap("attn", self.attn(h))
        x = self._tap("block", tokens.reshape(n, side, side, c))
        x = self._tap("conv2", self.conv2(x))
        x = self._tap("act2", self._gelu(x))
        x = x.reshape(n, -1)  # NHWC flatten: index = (h * 4 + w) * C2 + c
        x = self._tap("fc1", self.fc1(x))
        x = self._tap("act3", self._gelu(x))
        x = self._tap("fc2", self.fc2(x))
        x = self._tap("act4", self._gelu(x))
        logits = self.class_embed.attend(x) + self.head_bias[...][None]
        return self._tap("head", logits)


def create_model(arch: Arch, seed: int = 0, dtype=jnp.float32) -> DigitNet:
    """A randomly initialised target (its values are overwritten by the map)."""
    return DigitNet(arch, rngs=nnx.Rngs(seed), dtype=dtype)


def abstract_model(arch: Arch, dtype=jnp.float32) -> DigitNet:
    """The target's structure with shapes and dtypes only (no initialisation
    runs): enough for `checkpoint.target_spec`, and filled by `checkpoint.fill`."""
    return nnx.eval_shape(lambda: create_model(arch, dtype=dtype))


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, x: jax.Array):
    """One compiled forward pass of the model `nnx.merge(graphdef, state)`: the logits and
    every sown intermediate (`{"<name>_out": value}`, empty unless `record_taps`)."""

    @nnx.capture(nnx.Intermediate)
    def forward(m, x):
        return m(x)

    out, captured = forward(nnx.merge(graphdef, state), x)
    values = {}
    for name, value in captured.items():
        value = value.get_value() if hasattr(value, "get_value") else value
        values[str(name)] = value[-1] if isinstance(value, tuple) else value
    return out, values


def _run(model: DigitNet, images_nhwc: np.ndarray, record_taps: bool):
    """The model's forward pass as one jitted program (a program per architecture, dtype,
    batch shape and static setting such as a fault's epsilon), not op by op: on an
    accelerator each eager op is a dispatch, and the first of each a compile. The model
    itself is not changed (a train-mode BatchNorm's statistics updates are dropped).

    Matrix products and convolutions run at `highest` precision, whatever the caller's
    default: every claim about this model (parity, the reload bound) is about arithmetic
    in the model's dtype, and a TPU would otherwise round float32 operands to bfloat16."""
    dtype = model.fc1.kernel[...].dtype
    model.record_taps = record_taps
    try:
        graphdef, state = nnx.split(model)
    finally:
        model.record_taps = False
    with jax.default_matmul_precision("highest"):
        return _forward(graphdef, state, jnp.asarray(images_nhwc, dtype))


def taps(model: DigitNet, images_nhwc: np.ndarray) -> dict[str, np.ndarray]:
    """Runs `model` once and returns `{layer name: output}` as float64 NumPy."""
    _, captured = _run(model, images_nhwc, record_taps=True)
    out = {}
    for name, value in captured.items():
        out[name.removesuffix("_out")] = np.asarray(value, dtype=np.float64)
    return out


def logits(model: DigitNet, images_nhwc: np.ndarray) -> np.ndarray:
    """Eval-mode logits as a NumPy array of the model's dtype."""
    return np.asarray(_run(model, images_nhwc, record_taps=False)[0])
