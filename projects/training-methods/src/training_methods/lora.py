"""Stage 4: low-rank adaptation (Hu et al. 2021).

A `LoRALinear` wraps a frozen `nnx.Linear` `W` (kernel `(d_in, d_out)`) and
adds `(alpha / rank) * x @ A @ B` with `A` `(d_in, rank)` drawn at random and
`B` `(rank, d_out)` zero: at step 0 the update is exactly zero and the
adapted model computes what the base computes. `A` and `B` are
`nnx.LoRAParam`s, so `nnx.split(model, nnx.LoRAParam, ...)` separates them:
only they are differentiated and only they have optimizer state.

`merge` folds the adapters into the kernels, `W' = W + (alpha / rank) A B`,
giving a plain model with the adapted outputs (up to float rounding).
"""

import jax
import jax.numpy as jnp
from flax import nnx

# The query and value projections, as in Hu et al. (2021), section 7.1.
TARGETS = ("q", "v")


class LoRALinear(nnx.Module):
    def __init__(self, base: nnx.Linear, rank: int, alpha: float, *, key: jax.Array):
        d_in, d_out = base.kernel[...].shape
        if not 1 <= rank <= min(d_in, d_out):
            raise ValueError(
                f"LoRA rank `{rank}` does not fit a layer of shape `({d_in}, {d_out})`; "
                f"choose a rank from 1 to `{min(d_in, d_out)}`."
            )
        dtype = base.kernel[...].dtype
        self.base = base
        self.rank = rank
        self.scale = alpha / rank
        # A: Kaiming-uniform-like scale as in the reference implementation; B: zeros.
        bound = 1.0 / jnp.sqrt(jnp.asarray(d_in, dtype))
        self.lora_a = nnx.LoRAParam(jax.random.uniform(key, (d_in, rank), dtype, -bound, bound))
        self.lora_b = nnx.LoRAParam(jnp.zeros((rank, d_out), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """The base output plus the scaled update `(alpha / rank) * x @ A @ B`
        [claim:lora-scaled-low-rank-update]; with `B` zero, as at step 0, exactly the
        base output [claim:lora-step-0-is-the-base]."""
        # --- exercise stage 4: Add the scaled low-rank update x @ A @ B to the base output. ---
        return self.base(x) + (x @ self.lora_a[...] @ self.lora_b[...]) * jnp.asarray(
            self.scale, x.dtype
        )
        # --- end exercise ---


def apply_lora(
    model: nnx.Module, rank: int, alpha: float, *, key: jax.Array, targets=TARGETS
) -> nnx.Module:
    """Wraps every `targets` Linear of every block in a `LoRALinear` (in place;
    returns `model`). Keys: one per adapted layer, split from `key`."""
    layers = [(block, name) for block in model.blocks for name in targets]
    keys = jax.random.split(key, len(layers))
    for (block, name), k in zip(layers, keys, strict=True):
        owner = block.attn if name in ("q", "k", "v", "o") else block
        setattr(
            owner, name, LoRALinear(getattr(owner, name), rank, alpha, key=k)
        )  # In-place update.
    return model


def merge(model: nnx.Module) -> nnx.Module:
    """A copy of `model` with every `LoRALinear` replaced by its merged `nnx.Linear`."""
    model = nnx.clone(model)
    for block in model.blocks:
        for owner in (block.attn, block):
            for name, layer in list(vars(owner).items()):
                if isinstance(layer, LoRALinear):
                    setattr(owner, name, merged_linear(layer))  # In-place update.
    return model


def merge_free_view(model: nnx.Module) -> nnx.Module:
    """A copy of `model` with every `LoRALinear` replaced by its BASE layer
    (adapters dropped): the frozen weights alone, in the base model's layout."""
    model = nnx.clone(model)
    for block in model.blocks:
        for owner in (block.attn, block):
            for name, layer in list(vars(owner).items()):
                if isinstance(layer, LoRALinear):
                    setattr(owner, name, layer.base)  # In-place update.
    return model


def merged_linear(layer: LoRALinear) -> nnx.Linear:
    """A copy of the base `nnx.Linear` with kernel `W + (alpha / rank) A @ B` and the
    bias kept; the layer's own base is left as it was [claim:lora-merge-folds-the-kernel]."""
    base = nnx.clone(layer.base)
    # --- exercise stage 4: Fold the scaled product A @ B into the base kernel. ---
    base.kernel[...] = base.kernel[...] + (layer.lora_a[...] @ layer.lora_b[...]) * jnp.asarray(
        layer.scale, base.kernel[...].dtype
    )
    # --- end exercise ---
    return base


def adapted_model(config, base: nnx.Module, rank: int, *, key: jax.Array) -> nnx.Module:
    """A LoRA copy of `base` (left unchanged) with adapters of `rank`."""
    return apply_lora(nnx.clone(base), rank, config.lora_alpha, key=key)


def count(tree) -> int:
    return sum(x.size for x in jax.tree.leaves(tree))


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "nbytes"))
