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
    """The logits in NumPy float64 from the flat parameter dict (`hidden/kernel`, ...)."""
    h = np.asarray(x, np.float64) / PIXEL_MAX
    h = h @ params["hidden/kernel"].astype(np.float64) + params["hidden/bias"].astype(np.float64)
    h = np.maximum(h, 0.0)
    return h @ params["head/kernel"].astype(np.float64) + params["head/bias"].astype(np.float64)
