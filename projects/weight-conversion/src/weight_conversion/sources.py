"""The source models: the architecture of `config.Arch` in PyTorch (NCHW) and
in Keras 3 (NHWC), each with the per-layer taps that stage 2 compares.

PyTorch stores a Linear weight as (out, in), a conv kernel as OIHW, the three
attention projections packed in one `in_proj_weight` of shape (3C, C), and
BatchNorm's running statistics as buffers; `head.weight` *is*
`class_embed.weight` (tied), so a `state_dict` lists the same tensor twice.
Keras stores Dense kernels as (in, out), conv kernels as HWIO and the
attention projections per head, (C, heads, head_dim).

`LAYERS` (in `model.py`) names the tapped outputs in forward order; both
sources tap exactly those names.
"""

import os

import numpy as np
import torch
from torch import nn

from weight_conversion.config import Arch


class Tap(nn.Identity):
    """An identity module whose only job is to carry a forward hook: it marks
    an intermediate that is not the output of a module (a sum, a reshape)."""


class TorchDigitNet(nn.Module):
    """The PyTorch source model. Input `(n, 1, 8, 8)`, output logits `(n, 10)`."""

    def __init__(self, arch: Arch) -> None:
        super().__init__()
        c, side = arch.channels, arch.image_size
        self.arch = arch
        self.conv1 = nn.Conv2d(1, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c, eps=arch.bn_epsilon)
        self.act1 = nn.GELU(approximate="tanh" if arch.gelu_approximate else "none")
        self.pos = nn.Embedding(arch.tokens, c)
        self.embed = Tap()
        self.norm1 = nn.LayerNorm(c, eps=arch.ln_epsilon)
        self.attn = nn.MultiheadAttention(c, arch.heads, batch_first=True)
        self.block = Tap()
        self.conv2 = nn.Conv2d(c, arch.conv2_channels, 3, stride=2, padding=1)
        self.act2 = nn.GELU(approximate=self.act1.approximate)
        self.fc1 = nn.Linear(arch.flat_features, arch.hidden)
        self.act3 = nn.GELU(approximate=self.act1.approximate)
        self.fc2 = nn.Linear(arch.hidden, arch.hidden)
        self.act4 = nn.GELU(approximate=self.act1.approximate)
        self.class_embed = nn.Embedding(arch.num_classes, arch.hidden)
        self.head = nn.Linear(arch.hidden, arch.num_classes)
        # Tied weights: the classifier's rows are the class embeddings.
        self.head.weight = self.class_embed.weight
        self._side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, side = x.shape[0], self.arch.channels, self._side
        x = self.act1(self.bn1(self.conv1(x)))  # (n, c, 8, 8)
        tokens = x.flatten(2).transpose(1, 2)  # (n, 64, c), positions in raster order
        tokens = self.embed(tokens + self.pos.weight)
        h = self.norm1(tokens)
        attended, _ = self.attn(h, h, h, need_weights=False)
        tokens = tokens + attended
        x = self.block(tokens.transpose(1, 2).reshape(n, c, side, side))
        x = self.act2(self.conv2(x))  # (n, c2, 4, 4)
        x = x.flatten(1)  # NCHW flatten: index = c * 16 + h * 4 + w
        x = self.act3(self.fc1(x))
        x = self.act4(self.fc2(x))
        return self.head(x)


def torch_taps(model: TorchDigitNet, images_nchw: np.ndarray, names: list[str]) -> dict:
    """Runs `model` once and returns `{name: output}` for every tapped layer,
    captured with forward hooks, as float64 NumPy arrays in PyTorch layout."""
    captured: dict[str, np.ndarray] = {}
    handles = []
    for name in names:
        module = getattr(model, name)

        def hook(_module, _inputs, output, name=name):
            if isinstance(output, tuple):  # nn.MultiheadAttention: (output, weights)
                output = output[0]
            captured[name] = output.detach().to(torch.float64).numpy().copy()

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            dtype = next(model.parameters()).dtype
            model(torch.from_numpy(np.ascontiguousarray(images_nchw)).to(dtype))
    finally:
        for handle in handles:
            handle.remove()
    return captured


def torch_logits(model: TorchDigitNet, images_nchw: np.ndarray) -> np.ndarray:
    """Eval-mode logits as a NumPy array of the model's dtype."""
    model.eval()
    with torch.no_grad():
        dtype = next(model.parameters()).dtype
        out = model(torch.from_numpy(np.ascontiguousarray(images_nchw)).to(dtype))
    return out.numpy()


# --- KERAS -------------------------------------------------------------------


def keras_rank_promotion():
    """Keras's own layers broadcast ranks implicitly (EinsumDense's bias): allow
    it while Keras code runs, whatever strict mode the caller has set."""
    import jax

    return jax.numpy_rank_promotion("allow")


def keras_module():
    """Imports Keras 3 on the JAX backend (set before the first import)."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(
            f"Keras runs on the `{keras.backend.backend()}` backend; set KERAS_BACKEND=jax "
            "before Keras is first imported."
        )
    return keras


def keras_arch(arch: Arch) -> Arch:
    """The same network with Keras's default epsilons (1e-3 for both norms)."""
    import dataclasses

    return dataclasses.replace(arch, bn_epsilon=1e-3, ln_epsilon=1e-3)


def build_keras_model(arch: Arch, seed: int):
    """The Keras source model (NHWC), a subclassed `keras.Model` whose `call`
    can record the same taps as the PyTorch model."""
    keras = keras_module()
    layers = keras.layers
    keras.utils.set_random_seed(seed)
    c, side = arch.channels, arch.image_size
    gelu = "gelu"  # keras.activations.gelu: exact unless approximate=True

    class KerasDigitNet(keras.Model):
        def __init__(self):
            super().__init__(name="digit_net")
            self.conv1 = layers.Conv2D(c, 3, padding="same", name="conv1")
            # momentum 0.9 (PyTorch: 0.1 on the other side of the convention): the
            # running statistics settle within a brief training; the default 0.99 would not.
            self.bn1 = layers.BatchNormalization(epsilon=arch.bn_epsilon, momentum=0.9, name="bn1")
            self.pos = layers.Embedding(arch.tokens, c, name="pos")
            self.norm1 = layers.LayerNormalization(epsilon=arch.ln_epsilon, name="norm1")
            self.attn = layers.MultiHeadAttention(arch.heads, c // arch.heads, name="attn")
            # Keras "same" padding at stride 2 pads (0, 1); PyTorch's padding=1 pads
            # (1, 1). Explicit zero padding then "valid" gives PyTorch's windows.
            self.pad2 = layers.ZeroPadding2D(1, name="pad2")
            self.conv2 = layers.Conv2D(arch.conv2_channels, 3, strides=2, name="conv2")
            self.flatten = layers.Flatten(name="flatten")
            self.fc1 = layers.Dense(arch.hidden, name="fc1")
            self.fc2 = layers.Dense(arch.hidden, name="fc2")
            self.head = layers.Dense(arch.num_classes, name="head")

        def call(self, x, training=False, taps=None):
            ops = keras.ops

            def tap(name, value):
                if taps is not None:
                    taps[name] = np.asarray(value, dtype=np.float64)
                return value

            x = tap("conv1", self.conv1(x))
            x = tap("bn1", self.bn1(x, training=training))
            x = tap("act1", keras.activations.get(gelu)(x))
            n = ops.shape(x)[0]
            tokens = ops.reshape(x, (n, side * side, c))
            positions = self.pos(ops.arange(side * side))
            tokens = tap("embed", tokens + positions[None])
            h = tap("norm1", self.norm1(tokens))
            attended = tap("attn", self.attn(h, h, training=training))
            tokens = tokens + attended
            x = tap("block", ops.reshape(tokens, (n, side, side, c)))
            x = tap("conv2", self.conv2(self.pad2(x)))
            x = tap("act2", keras.activations.get(gelu)(x))
            x = self.flatten(x)
            x = tap("fc1", self.fc1(x))
            x = tap("act3", keras.activations.get(gelu)(x))
            x = tap("fc2", self.fc2(x))
            x = tap("act4", keras.activations.get(gelu)(x))
            return tap("head", self.head(x))

    model = KerasDigitNet()
    with keras_rank_promotion():
        model(np.zeros((1, side, side, 1), np.float32))  # builds every weight
    return model


def keras_weights(model) -> dict[str, np.ndarray]:
    """`{path: array}` of every Keras weight, trainable and not (BatchNorm's
    moving statistics included), e.g. `conv1/kernel`, `attn/query/kernel`."""
    out = {}
    for weight in model.weights:
        path = weight.path
        if path.startswith(model.name + "/"):
            path = path[len(model.name) + 1 :]
        if path in out:
            raise ValueError(f"Two Keras weights share the path `{path}`.")
        out[path] = np.array(weight.value)  # a JAX array on this backend; copied out
    return out


def keras_taps(model, images_nhwc: np.ndarray) -> dict[str, np.ndarray]:
    """`{name: output}` of every tapped layer, float64, Keras (NHWC) layout."""
    taps: dict[str, np.ndarray] = {}
    # `call` directly: `Model.__call__` would convert the `taps` dict into a copy.
    with keras_rank_promotion():
        model.call(keras_module().ops.convert_to_tensor(images_nhwc), training=False, taps=taps)
    return taps
