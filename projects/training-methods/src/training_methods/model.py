"""The model: a small pre-LayerNorm Transformer written with Flax NNX.

    tokens -> embed (+ learned positions)
           -> [ln1 -> attention -> +residual -> ln2 -> MLP (GELU) -> +residual] x L
           -> final LayerNorm -> logits (tied to nothing; a separate head)

Attention is explicit (einsum, mask, softmax) so that every lab can see it:
`segment_ids` (0 = padding) keep packed examples apart, `causal` switches
between the decoder (SFT, DPO) and the encoder (masked LM, contrastive).

The architectural constants that PyTorch and Flax often disagree on are
arguments (`ln_epsilon`, `gelu_approximate`, `attn_scale`, `mask_offset`),
and `__call__(..., taps=[])` appends every layer's output in order, so that
stage 8 can compare the two frameworks layer by layer.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from training_methods.data import check_token_ids

NEG_INF = -1e9  # finite, so a fully masked (padding) row stays finite


class Attention(nnx.Module):
    def __init__(self, d_model: int, num_heads: int, *, dtype, rngs: nnx.Rngs):
        kw = dict(param_dtype=dtype, dtype=dtype, rngs=rngs)
        self.num_heads = num_heads
        self.q = nnx.Linear(d_model, d_model, **kw)
        self.k = nnx.Linear(d_model, d_model, **kw)
        self.v = nnx.Linear(d_model, d_model, **kw)
        self.o = nnx.Linear(d_model, d_model, **kw)

    def __call__(self, x, allowed, scale):
        """`x` `(B, T, D)`, `allowed` bool `(B, T, T)` (query, key)."""
        b, t, d = x.shape
        h = self.num_heads
        q = self.q(x).reshape(b, t, h, d // h)
        k = self.k(x).reshape(b, t, h, d // h)
        v = self.v(x).reshape(b, t, h, d // h)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * jnp.asarray(scale, x.dtype)
        scores = jnp.where(allowed[:, None, :, :], scores, jnp.asarray(NEG_INF, x.dtype))
        weights = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.o(out)


class Block(nnx.Module):
    def __init__(self, d_model, num_heads, d_ff, *, ln_epsilon, gelu_approximate, dtype, rngs):
        kw = dict(param_dtype=dtype, dtype=dtype, rngs=rngs)
        self.ln1 = nnx.LayerNorm(d_model, epsilon=ln_epsilon, **kw)
        self.attn = Attention(d_model, num_heads, dtype=dtype, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d_model, epsilon=ln_epsilon, **kw)
        self.up = nnx.Linear(d_model, d_ff, **kw)
        self.down = nnx.Linear(d_ff, d_model, **kw)
        self.gelu_approximate = gelu_approximate

    def __call__(self, x, allowed, scale, taps, prefix):
        h = self.ln1(x)
        _tap(taps, f"{prefix}.ln1", h)
        a = self.attn(h, allowed, scale)
        _tap(taps, f"{prefix}.attn", a)
        x = x + a
        h = self.ln2(x)
        _tap(taps, f"{prefix}.ln2", h)
        m = self.down(jax.nn.gelu(self.up(h), approximate=self.gelu_approximate))
        _tap(taps, f"{prefix}.mlp", m)
        x = x + m
        _tap(taps, f"{prefix}.out", x)
        return x


def _tap(taps, name, value):
    if taps is not None:
        taps.append((name, value))


class Transformer(nnx.Module):
    """A token model.

    Args:
      vocab: vocabulary size. max_len: longest sequence (learned positions).
      d_model, num_heads, num_layers: width, heads, blocks; `d_ff = 4 * d_model`.
      ln_epsilon: LayerNorm epsilon (PyTorch's default 1e-5; Flax's is 1e-6).
      gelu_approximate: tanh GELU if True, exact erf GELU if False.
      attn_scale: multiplier of q.k; None means `1 / sqrt(head_dim)`.
      mask_offset: causal masks let query `i` see keys `j <= i + mask_offset`.
      dtype: parameter and computation dtype (float64 needs `jax_enable_x64`).
      rngs: `nnx.Rngs` with a `params` stream.
    """

    def __init__(
        self,
        vocab: int,
        max_len: int,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        *,
        ln_epsilon: float = 1e-5,
        gelu_approximate: bool = False,
        attn_scale: float | None = None,
        mask_offset: int = 0,
        dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        # Small embeddings (GPT-2's 0.02) keep LayerNorm inputs small, which is
        # also where an epsilon mismatch shows.
        init = nnx.initializers.normal(0.02)
        self.embed = nnx.Embed(
            vocab, d_model, embedding_init=init, param_dtype=dtype, dtype=dtype, rngs=rngs
        )
        self.pos = nnx.Embed(
            max_len, d_model, embedding_init=init, param_dtype=dtype, dtype=dtype, rngs=rngs
        )
        self.blocks = nnx.List(
            [
                Block(
                    d_model,
                    num_heads,
                    4 * d_model,
                    ln_epsilon=ln_epsilon,
                    gelu_approximate=gelu_approximate,
                    dtype=dtype,
                    rngs=rngs,
                )
                for _ in range(num_layers)
            ]
        )
        self.ln_f = nnx.LayerNorm(
            d_model, epsilon=ln_epsilon, param_dtype=dtype, dtype=dtype, rngs=rngs
        )
        self.head = nnx.Linear(d_model, vocab, param_dtype=dtype, dtype=dtype, rngs=rngs)
        self.attn_scale = (
            attn_scale if attn_scale is not None else 1.0 / math.sqrt(d_model // num_heads)
        )
        self.mask_offset = mask_offset
        self.vocab = vocab
        self.max_len = max_len

    def _check_inputs(self, tokens, segment_ids, positions) -> None:
        """Refuses what would index past an embedding table (NaN logits otherwise).

        Shapes are static, so the length check (default positions) runs at
        trace time and costs nothing in a compiled call; token and explicit
        position values are checked when they are concrete (an eager call),
        not under `jit`.
        """
        if tokens.ndim != 2:
            raise ValueError(f"`tokens` must be `(B, T)`, got shape `{tuple(tokens.shape)}`.")
        t = tokens.shape[1]
        # Default positions are 0 .. T-1; explicit ones (packed rows restart them
        # per example) may serve a longer row, and are checked below when concrete.
        if positions is None and t > self.max_len:
            raise ValueError(
                f"Sequence length `{t}` exceeds the model's `max_len` `{self.max_len}` "
                f"(learned positions 0 to {self.max_len - 1}); `tokens` has shape "
                f"`{tuple(tokens.shape)}`."
            )
        for name, arr in (("segment_ids", segment_ids), ("positions", positions)):
            if arr is not None and tuple(arr.shape) != tuple(tokens.shape):
                raise ValueError(
                    f"`{name}` has shape `{tuple(arr.shape)}` but `tokens` has "
                    f"`{tuple(tokens.shape)}`."
                )
        if not isinstance(tokens, jax.core.Tracer):
            check_token_ids(tokens, self.vocab, "tokens")
        if positions is not None and not isinstance(positions, jax.core.Tracer):
            p = np.asarray(positions)
            bad = (p < 0) | (p >= self.max_len)
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ValueError(
                    f"Position `{int(p[where])}` at `positions{list(where)}` is outside the "
                    f"model's `max_len` `{self.max_len}` (positions 0 to {self.max_len - 1})."
                )

    def hidden(self, tokens, *, segment_ids=None, positions=None, causal=True, taps=None):
        """Final-LayerNorm hidden states `(B, T, D)` of int32 `tokens` `(B, T)`.

        `segment_ids` int32 `(B, T)`: attention stays inside one segment and
        never reaches segment 0 (padding); default: one segment of every
        non-PAD token. `positions` int32 `(B, T)`: default `0..T-1`.
        """
        self._check_inputs(tokens, segment_ids, positions)
        b, t = tokens.shape
        if segment_ids is None:
            segment_ids = (tokens != 0).astype(jnp.int32)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        allowed = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (
            segment_ids[:, None, :] != 0
        )
        if causal:
            q = jnp.arange(t)[:, None]
            k = jnp.arange(t)[None, :]
            allowed = allowed & (k <= q + self.mask_offset)[None]
        x = self.embed(tokens) + self.pos(positions)
        _tap(taps, "embed", x)
        for i, block in enumerate(self.blocks):
            x = block(x, allowed, self.attn_scale, taps, f"block{i}")
        x = self.ln_f(x)
        _tap(taps, "ln_f", x)
        return x

    def __call__(self, tokens, *, segment_ids=None, positions=None, causal=True, taps=None):
        """Logits `(B, T, vocab)`; see `hidden` for the arguments."""
        logits = self.head(
            self.hidden(
                tokens, segment_ids=segment_ids, positions=positions, causal=causal, taps=taps
            )
        )
        _tap(taps, "logits", logits)
        return logits


def build(config, *, key: jax.Array, **overrides) -> Transformer:
    """The config's Transformer, initialised from `key`.

    Initialisation runs as one compiled program (`nnx.jit`) rather than op by
    op: on a CPU, eager initialisation compiles every small op separately.
    """
    from training_methods.data import vocab_size

    args = (vocab_size(config), config.seq_len, config.d_model, config.num_heads, config.num_layers)
    return _create(args, tuple(sorted(overrides.items())), key)


@nnx.jit(static_argnums=(0, 1))
def _create(args, overrides, key):
    return Transformer(*args, rngs=nnx.Rngs(params=key), **dict(overrides))


def tap_names(num_layers: int) -> list[str]:
    """The names `__call__(..., taps=...)` records, in order."""
    block = ("ln1", "attn", "ln2", "mlp", "out")
    return ["embed", *(f"block{i}.{b}" for i in range(num_layers) for b in block), "ln_f", "logits"]


@nnx.jit
def layer_outputs(model: Transformer, tokens: jax.Array) -> list[jax.Array]:
    """Every tapped layer output (order of `tap_names`), as one compiled program."""
    taps: list = []
    model(tokens, taps=taps)
    return [value for _, value in taps]
