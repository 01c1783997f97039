"""The model: a one-hidden-layer perceptron written with Flax NNX.

`Linear -> relu -> dropout -> Linear`. Dropout draws its mask from a key the
caller passes in (`dropout_key`), so all training randomness flows from
explicit `jax.random` keys; with `dropout_key=None` (evaluation) nothing is
dropped and nothing random happens.
"""

import jax
import jax.numpy as jnp
from flax import nnx


class MLP(nnx.Module):
    """A small classifier.

    Args:
      in_features: width of one input row (64 for the 8x8 digits).
      hidden_size: width of the hidden layer.
      num_classes: number of output logits.
      rngs: `nnx.Rngs` whose `params` stream initialises the weights.
    """

    def __init__(self, in_features: int, hidden_size: int, num_classes: int, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(in_features, hidden_size, rngs=rngs)
        self.head = nnx.Linear(hidden_size, num_classes, rngs=rngs)

    def __call__(
        self, x: jax.Array, dropout_rate: jax.Array, dropout_key: jax.Array | None = None
    ) -> jax.Array:
        """Maps `x`, float32 `(batch, in_features)`, to logits `(batch, num_classes)`.

        `dropout_rate` is a float32 scalar; dropout applies only when a key is given.
        """
        h = nnx.relu(self.hidden(x))
        if dropout_key is not None:
            keep = 1.0 - dropout_rate
            mask = jax.random.bernoulli(dropout_key, keep, h.shape)
            h = jnp.where(mask, h / keep, jnp.zeros_like(h))
        return self.head(h)
