"""The model: a multilayer perceptron in Flax NNX, and the same network as a
pure function of a plain parameter tree (what gets exported and quantized).

Parameter tree (`Params`): `{"layers": [{"kernel": (d_in, d_out), "bias":
(d_out,)}, ...]}`, float32, input side first; hidden layers use relu, the
last layer gives the logits. The NNX module is the training-time source; the
pure `apply` is checked against it (stage 1) and is what `jax.export` lowers.
"""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Params = dict[str, list[dict[str, jax.Array]]]


class MLP(nnx.Module):
    """Maps normalized pixels, float32 `(batch, in_features)`, to logits `(batch, classes)`.

    Args:
      in_features: width of one input row (64).
      hidden_sizes: width of each hidden layer, in order.
      num_classes: number of output logits.
      rngs: `nnx.Rngs` with a `params` stream for the weight init.
    """

    def __init__(
        self, in_features: int, hidden_sizes: Sequence[int], num_classes: int, *, rngs: nnx.Rngs
    ):
        widths = [in_features, *hidden_sizes, num_classes]
        self.layers = nnx.List(
            [nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-1], widths[1:], strict=True)]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = nnx.relu(layer(x))
        return self.layers[-1](x)


def params_of(model: MLP) -> Params:
    """The model's weights as a plain `Params` tree (the arrays are shared, not copied)."""
    return {
        "layers": [{"kernel": layer.kernel[...], "bias": layer.bias[...]} for layer in model.layers]
    }


def normalize(x: jax.Array, mean: jax.Array, scale: jax.Array) -> jax.Array:
    """The preprocessing of `data.preprocessing_spec`: `(x - mean) * scale`, per pixel."""
    return (x - mean[None, :]) * scale[None, :]


def apply(params: Params, x: jax.Array) -> jax.Array:
    """Logits for normalized inputs `x`, float32 `(batch, 64)`: the pure twin of `MLP`.

    Cases:
        one layer (no hidden ones) -> `x @ kernel + bias`, no relu [claim:apply-one-layer-no-relu]
        k layers -> relu after each of the first k-1 affines, none after the last
            [claim:apply-relu-between-layers]
    Under the tests' `jax_numpy_rank_promotion = "raise"`, adding a `(d,)` bias to a
    `(batch, d)` product raises: broadcast it explicitly, `bias[None, :]`
    [claim:apply-explicit-bias-broadcast].
    """
    # --- exercise stage 1: Affine then relu per hidden layer; the last layer is the logits. ---
    layers = params["layers"]
    for layer in layers[:-1]:
        x = jax.nn.relu(x @ layer["kernel"] + layer["bias"][None, :])
    return x @ layers[-1]["kernel"] + layers[-1]["bias"][None, :]
    # --- end exercise ---


def logits_from_raw(params: Params, mean: Any, scale: Any, x_raw: jax.Array) -> jax.Array:
    """The deployed function: raw pixels float32 `(batch, 64)` -> logits `(batch, 10)`."""
    return apply(params, normalize(x_raw, jnp.asarray(mean), jnp.asarray(scale)))
