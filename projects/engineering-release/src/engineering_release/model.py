"""The released model: a one-hidden-layer perceptron in Flax NNX.

`Linear(64 -> hidden) -> relu -> Linear(hidden -> 10)`. Inputs are raw pixel
intensities 0..16, scaled to [0, 1] inside the model, so a server passes what
a client sends. `forward_numpy` is the same function in NumPy float64: the
independent reference the tests compare the JAX logits with.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from engineering_release.data import NUM_CLASSES, NUM_FEATURES, PIXEL_MAX


class MLP(nnx.Module):
    """The classifier. `hidden_size`: width of the hidden layer; `rngs`: an
    `nnx.Rngs` whose `params` stream initialises the weights."""

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(NUM_FEATURES, hidden_size, rngs=rngs)
        self.head = nnx.Linear(hidden_size, NUM_CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`x`: float32 `(batch, 64)` raw pixels -> logits float32 `(batch, 10)`."""
        return self.head(nnx.relu(self.hidden(x / jnp.float32(PIXEL_MAX))))


def architecture(hidden_size: int) -> dict:
    """What it takes to rebuild the graph; stored with every model artifact."""
    return {"kind": "mlp", "in": NUM_FEATURES, "hidden": hidden_size, "out": NUM_CLASSES}


def forward_numpy(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The logits in NumPy float64 from the flat parameter dict (`hidden/kernel`, ...).
    Raises `ValueError` naming the input or parameter that does not fit."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] != NUM_FEATURES or x.dtype.kind not in "fiu":
        raise ValueError(
            f"`x` must be a non-empty numeric (n, {NUM_FEATURES}) array, not "
            f"{x.dtype}{list(x.shape)}."
        )
    if not np.all(np.isfinite(x)):
        raise ValueError("`x` holds NaN or infinite values.")
    for name in ("hidden/kernel", "hidden/bias", "head/kernel", "head/bias"):
        if name not in params:
            raise ValueError(f"The parameters lack `{name}`.")
    hidden = np.shape(params["hidden/kernel"])
    shapes = {
        "hidden/kernel": (NUM_FEATURES, hidden[-1] if hidden else 0),
        "hidden/bias": (hidden[-1] if hidden else 0,),
        "head/kernel": (hidden[-1] if hidden else 0, NUM_CLASSES),
        "head/bias": (NUM_CLASSES,),
    }
    for name, shape in shapes.items():
        if np.shape(params[name]) != shape or not np.all(np.isfinite(params[name])):
            raise ValueError(
                f"Parameter `{name}` is {list(np.shape(params[name]))}, not {list(shape)} of "
                f"finite values."
            )
    h = np.asarray(x, np.float64) / PIXEL_MAX
    h = h @ params["hidden/kernel"].astype(np.float64) + params["hidden/bias"].astype(np.float64)
    h = np.maximum(h, 0.0)
    return h @ params["head/kernel"].astype(np.float64) + params["head/bias"].astype(np.float64)
