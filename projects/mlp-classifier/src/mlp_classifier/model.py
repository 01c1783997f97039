"""The model: a multilayer perceptron written with Flax NNX.

Each hidden layer is `Linear -> relu -> Dropout`; a final `Linear` gives the
logits. Dropout is active in `model.train()` mode and off in `model.eval()`
mode; its random keys come from the `dropout` stream of the `nnx.Rngs` given
at construction, so the RNG state is part of the model's state (`nnx.state`).
"""

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx


class MLP(nnx.Module):
    """A multilayer perceptron classifier.

    Args:
      in_features: width of one input row (64 for the 8x8 digits).
      hidden_sizes: width of each hidden layer, in order; may be empty.
      num_classes: number of output logits.
      dropout_rate: probability of zeroing a hidden unit in train mode.
      rngs: `nnx.Rngs` with a `params` stream (weight init) and a `dropout`
        stream (dropout masks).
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: Sequence[int],
        num_classes: int,
        dropout_rate: float,
        *,
        rngs: nnx.Rngs,
    ):
        widths = [in_features, *hidden_sizes]
        # nnx.List makes the layers part of the graph, so `nnx.state` lists
        # them as `hidden/0/...`, `hidden/1/...`.
        self.hidden = nnx.List(
            [
                nnx.Linear(d_in, d_out, rngs=rngs)
                for d_in, d_out in zip(widths[:-1], widths[1:], strict=True)
            ]
        )
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        self.head = nnx.Linear(widths[-1], num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps `x`, float32 of shape `(batch, in_features)`, to logits of shape
        `(batch, num_classes)`. In train mode each call draws a fresh dropout
        key, which advances the model's RNG state (an in-place update).
        [claim:mlp-train-draws-a-fresh-key]

        Raises `ValueError` if the last axis of `x` is not `in_features` wide, or if
        a concrete (not traced) `x` holds NaN or infinite values.
        [claim:mlp-refuses-bad-input]

        Cases:
          no hidden layer (`hidden_sizes` empty) -> the head alone, `head(x)`.
            [claim:mlp-no-hidden-layer]
          `x` of shape `(..., in_features)`, any leading axes (none included) ->
            logits `(..., num_classes)`, row by row. [claim:mlp-leading-axes]
          eval mode -> dropout off: no key is drawn and two calls are bitwise equal.
            [claim:mlp-eval-deterministic]
          train mode -> dropout called exactly once per hidden layer, after its relu,
            never on the input or the logits (stage 2 counts one draw per hidden layer).
            [claim:mlp-dropout-once-per-hidden-layer]
          Logits match a float64 NumPy MLP to 1e-5 (rtol and atol). [claim:mlp-matches-numpy]
        """
        in_features = (self.hidden[0] if len(self.hidden) else self.head).in_features
        if x.shape[-1:] != (in_features,):
            raise ValueError(
                f"The MLP input `x` must have shape (batch, {in_features}), but it has shape "
                f"{tuple(x.shape)}."
            )
        if not isinstance(x, jax.core.Tracer) and not np.isfinite(np.asarray(x)).all():
            raise ValueError(
                "The MLP input `x` holds NaN or infinite values; inputs must be finite."
            )
        # --- exercise stage 1: Linear, relu, dropout per hidden layer; then the head. ---
        for layer in self.hidden:
            x = self.dropout(nnx.relu(layer(x)))
        return self.head(x)
        # --- end exercise ---
