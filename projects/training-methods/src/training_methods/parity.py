"""Stage 8: the same Transformer in PyTorch, mapped weights, layer-by-layer parity.

`TorchTransformer` mirrors `model.Transformer` op for op (pre-LayerNorm
blocks, explicit attention, GELU MLP), with the same four architectural
constants as arguments. `load_from_nnx` copies the NNX weights (a Flax
kernel `(in, out)` is a torch `Linear.weight` `(out, in)` transposed).

`compare` runs both on the same tokens, collects every layer's output in
order, and names the first layer whose max absolute difference exceeds its
tolerance. The tolerance of a layer is derived from the dtype and the
reduction length `K` of the op that produced it [claim:tolerance-formula]:

    tol = C * eps(dtype) * sqrt(K) * scale

with `eps` the dtype's machine epsilon, `K` the longest sum behind the
layer's output (`d_model` for LayerNorm and attention projections, `4 *
d_model` for the MLP, the vocabulary-free head width), `scale` the largest
magnitude of the reference output (at least 1) and `C = 16` for the
compounding of upstream layers (at most a few ops deep on this path).
`sqrt(K)` is the usual statistical model of rounding in a sum of `K` terms
(independent errors add like a random walk; Higham, "Accuracy and Stability
of Numerical Algorithms", section 3.1); the worst case `K` would hide a
tanh-vs-exact GELU difference in float32 (measured at 0.36 of that bound).
Float32 gives ~1.5e-5 at `K = 64`; float64 gives ~3e-14.
"""

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from flax import nnx


class TorchBlock(torch.nn.Module):
    def __init__(self, d, heads, *, ln_epsilon, gelu_approximate):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d, eps=ln_epsilon)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.ln2 = torch.nn.LayerNorm(d, eps=ln_epsilon)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)
        self.heads = heads
        self.gelu = "tanh" if gelu_approximate else "none"

    def forward(self, x, allowed, scale, taps, prefix):
        b, t, d = x.shape
        h = self.ln1(x)
        taps.append((f"{prefix}.ln1", h))
        q = self.q(h).view(b, t, self.heads, d // self.heads)
        k = self.k(h).view(b, t, self.heads, d // self.heads)
        v = self.v(h).view(b, t, self.heads, d // self.heads)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
        scores = torch.where(allowed[:, None], scores, torch.tensor(-1e9, dtype=x.dtype))
        a = self.o(torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, d))
        taps.append((f"{prefix}.attn", a))
        x = x + a
        h = self.ln2(x)
        taps.append((f"{prefix}.ln2", h))
        m = self.down(F.gelu(self.up(h), approximate=self.gelu))
        taps.append((f"{prefix}.mlp", m))
        x = x + m
        taps.append((f"{prefix}.out", x))
        return x


class TorchTransformer(torch.nn.Module):
    """PyTorch twin of `model.Transformer` (same arguments, same taps)."""

    def __init__(
        self,
        vocab,
        max_len,
        d_model=64,
        num_heads=4,
        num_layers=2,
        *,
        ln_epsilon=1e-5,
        gelu_approximate=False,
        attn_scale=None,
        mask_offset=0,
    ):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Embedding(max_len, d_model)
        self.blocks = torch.nn.ModuleList(
            [
                TorchBlock(
                    d_model, num_heads, ln_epsilon=ln_epsilon, gelu_approximate=gelu_approximate
                )
                for _ in range(num_layers)
            ]
        )
        self.ln_f = torch.nn.LayerNorm(d_model, eps=ln_epsilon)
        self.head = torch.nn.Linear(d_model, vocab)
        self.attn_scale = (
            attn_scale if attn_scale is not None else 1.0 / math.sqrt(d_model // num_heads)
        )
        self.mask_offset = mask_offset

    def forward(self, tokens, taps=None):
        """Logits of `tokens`; query `i` attends key `j` only when `j <= i + mask_offset`
        [claim:torch-causal-mask-offset] and `j` is not padding (token 0)
        [claim:torch-padding-keys-ignored]. `taps` collects every layer's output in
        order, the first (`embed`) the token plus position embedding
        [claim:torch-taps-in-order]."""
        taps = [] if taps is None else taps
        b, t = tokens.shape
        seg = (tokens != 0).long()
        allowed = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
        # --- exercise stage 8: Causal mask: query i sees keys j <= i + mask_offset. ---
        q = torch.arange(t)[:, None]
        k = torch.arange(t)[None, :]
        allowed = allowed & (k <= q + self.mask_offset)[None]
        # --- end exercise ---
        x = self.embed(tokens) + self.pos(torch.arange(t))[None]
        taps.append(("embed", x))
        for i, block in enumerate(self.blocks):
            x = block(x, allowed, self.attn_scale, taps, f"block{i}")
        x = self.ln_f(x)
        taps.append(("ln_f", x))
        logits = self.head(x)
        taps.append(("logits", logits))
        return logits


def load_from_nnx(torch_model: TorchTransformer, nnx_model: nnx.Module) -> TorchTransformer:
    """Copies the NNX weights into `torch_model` (in place; returns it)."""
    dtype = next(torch_model.parameters()).dtype

    def t(x):
        return torch.from_numpy(np.array(x[...], dtype=np.float64)).to(dtype)

    def linear(dst: torch.nn.Linear, src: nnx.Linear):
        """A Flax Linear into a torch Linear: the weight is the kernel transposed, the
        bias as it is [claim:torch-linear-weight-is-the-kernel-transposed]."""
        # --- exercise stage 8: Copy a Flax Linear: the torch weight is the kernel transposed. ---
        dst.weight.copy_(t(src.kernel).T)
        dst.bias.copy_(t(src.bias))
        # --- end exercise ---

    def norm(dst: torch.nn.LayerNorm, src: nnx.LayerNorm):
        dst.weight.copy_(t(src.scale))
        dst.bias.copy_(t(src.bias))

    with torch.no_grad():
        torch_model.embed.weight.copy_(t(nnx_model.embed.embedding))
        torch_model.pos.weight.copy_(t(nnx_model.pos.embedding))
        for tb, fb in zip(torch_model.blocks, nnx_model.blocks, strict=True):
            norm(tb.ln1, fb.ln1)
            norm(tb.ln2, fb.ln2)
            for name in ("q", "k", "v", "o"):
                linear(getattr(tb, name), getattr(fb.attn, name))
            linear(tb.up, fb.up)
            linear(tb.down, fb.down)
        norm(torch_model.ln_f, nnx_model.ln_f)
        linear(torch_model.head, nnx_model.head)
    return torch_model


def reduction_length(name: str, d_model: int, seq_len: int) -> int:
    """The longest sum behind a layer's output (see the module docstring)."""
    if name.endswith(".mlp"):
        return 4 * d_model
    if name.endswith(".attn"):
        return max(d_model, seq_len)
    return d_model


def tolerance(name: str, dtype, reference: np.ndarray, d_model: int, seq_len: int) -> float:
    eps = float(np.finfo(dtype).eps)
    scale = max(1.0, float(np.max(np.abs(reference))))
    return 16 * eps * math.sqrt(reduction_length(name, d_model, seq_len)) * scale


def compare(
    flax_taps: Sequence[tuple[str, object]],
    torch_taps: Sequence[tuple[str, torch.Tensor]],
    dtype,
    d_model: int,
    seq_len: int,
) -> dict:
    """Layer-by-layer report and the first layer beyond its tolerance (or None): a
    difference equal to the tolerance is within it [claim:compare-first-layer-beyond-tolerance].
    Raises `ValueError` when the two models tap different layers
    [claim:compare-refuses-different-taps]."""
    names = [n for n, _ in flax_taps]
    if names != [n for n, _ in torch_taps]:
        raise ValueError(
            f"The two models tap different layers: `{names}` vs `{[n for n, _ in torch_taps]}`."
        )
    layers, first = [], None
    for (name, fx), (_, tx) in zip(flax_taps, torch_taps, strict=True):
        ref = tx.detach().numpy().astype(np.float64)
        # --- exercise stage 8: Keep the first layer whose difference exceeds its tolerance. ---
        diff = float(np.max(np.abs(np.asarray(fx, np.float64) - ref)))
        tol = tolerance(name, dtype, ref, d_model, seq_len)
        if first is None and not diff <= tol:
            first = name
        # --- end exercise ---
        layers.append({"layer": name, "max_abs_diff": diff, "tolerance": tol})
    return {"layers": layers, "first_mismatch": first}


def run_parity(config, tokens: np.ndarray, dtype, *, key, **torch_overrides) -> dict:
    """Builds the Flax model in `dtype`, its torch twin with `torch_overrides`
    (an injected difference, or none), and compares them layer by layer."""
    import jax
    import jax.numpy as jnp

    from training_methods.data import check_token_ids, vocab_size
    from training_methods.model import build, layer_outputs, tap_names

    # The torch twin would raise an IndexError deep inside; refuse here instead.
    check_token_ids(tokens, vocab_size(config), "tokens")
    if np.ndim(tokens) != 2 or np.shape(tokens)[1] > config.seq_len:
        raise ValueError(
            f"`tokens` of shape `{np.shape(tokens)}`: sequence length `{np.shape(tokens)[-1]}` "
            f"must be at most the model's `max_len` `{config.seq_len}`, in `(B, T)` rows."
        )

    # Flax's LayerNorm mixes a float32 constant into float64 statistics, which
    # strict promotion refuses; standard promotion is exempted here only.
    with jax.enable_x64(dtype == np.float64), jax.numpy_dtype_promotion("standard"):
        flax_model = build(config, key=key, dtype=jnp.dtype(dtype).type)
        values = layer_outputs(flax_model, jnp.asarray(tokens))
        flax_taps = list(
            zip(tap_names(config.num_layers), [np.asarray(v) for v in values], strict=True)
        )
    torch_model = TorchTransformer(
        vocab_size(config),
        config.seq_len,
        config.d_model,
        config.num_heads,
        config.num_layers,
        **torch_overrides,
    ).to(torch.float64 if dtype == np.float64 else torch.float32)
    load_from_nnx(torch_model, flax_model)
    taps: list = []
    with torch.no_grad():
        torch_model(torch.from_numpy(np.asarray(tokens, np.int64)), taps)
    return compare(flax_taps, taps, dtype, config.d_model, config.seq_len)
