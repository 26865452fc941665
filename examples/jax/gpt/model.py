"""A decoder-only transformer (GPT) built from qmesh's Flax modules.

Per block: LayerNormDenseGeneral computes Q, K and V from the normalised input (one column-
parallel GEMM, kernel [hidden, heads, 3, head_dim]); causal attention with
jax.nn.dot_product_attention (attention_impl "xla", or "cudnn" on a GPU with bfloat16 q/k/v);
DenseGeneral projects the heads back (row parallel); LayerNormMLP is the feed-forward part.
Both sub-layers add to a float32 residual stream. The byte embedding, the learned position
embedding and the output head (LayerNorm + dense to the 256 byte logits) stay unquantised in
float32 in every recipe, so runs differ only in the blocks' GEMMs.

recipe None runs the blocks' GEMMs in `gemm_dtype` (bfloat16: the BF16 baseline); with an FP8
recipe (qmesh.jax.recipe) they run in FP8 from float32 activations.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from qmesh.jax.flax import DenseGeneral, LayerNormDenseGeneral, LayerNormMLP

from corpus import VOCAB


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """The settings every block shares: heads, the MLP's width, the recipe (None: GEMMs in
    gemm_dtype), the attention's q/k/v dtype and implementation ("xla" or "cudnn")."""

    heads: int
    ffn: int
    recipe: Any = None
    gemm_dtype: Any = jnp.float32
    attention_dtype: Any = jnp.float32
    attention_impl: str = "xla"


class Block(nn.Module):
    """x + attention(x), then + mlp(.); x [batch, seq, hidden] float32."""

    config: BlockConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        b, s, h = x.shape
        if h % c.heads:
            raise ValueError(f"hidden ({h}) must be divisible by heads ({c.heads})")
        d = h // c.heads
        # heads major in the fused kernel, so that tp shards the flattened columns in blocks
        qkv, _ = LayerNormDenseGeneral((c.heads, 3, d), kernel_axes=("embed", "heads", "act", "kv"),
                                       recipe=c.recipe, dtype=c.gemm_dtype, name="qkv")(x)
        q, k, v = (qkv[..., i, :].astype(c.attention_dtype) for i in range(3))
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True,        # [b, s, heads, d]
                                        implementation=c.attention_impl)
        y = DenseGeneral(h, axis=(-2, -1), kernel_axes=("heads", "kv", "embed"),
                         input_axes=("batch", None, "heads", "kv"),
                         output_axes=("batch", "seq", "embed"), recipe=c.recipe,
                         dtype=c.gemm_dtype, name="out")(a.astype(c.gemm_dtype))
        x = x + y.astype(jnp.float32)
        y, _ = LayerNormMLP(c.ffn, activations=("gelu",), recipe=c.recipe, dtype=c.gemm_dtype,
                            name="mlp")(x)
        return x + y.astype(jnp.float32)


class GPT(nn.Module):
    """Byte logits [batch, seq, 256] (float32) of tokens [batch, seq] (int32)."""

    layers: int
    hidden: int
    max_seq: int
    block: BlockConfig

    @nn.compact
    def __call__(self, tokens):
        s = tokens.shape[1]
        if s > self.max_seq:
            raise ValueError(f"sequence of {s} tokens, the model has positions for {self.max_seq}")
        init = nn.initializers.normal(0.02)
        x = nn.Embed(VOCAB, self.hidden, embedding_init=init, name="embed")(tokens)
        x = x + self.param("position", init, (self.max_seq, self.hidden))[:s]
        for i in range(self.layers):
            x = Block(self.block, name=f"block{i}")(x)
        logits, _ = LayerNormDenseGeneral(VOCAB, kernel_axes=("embed", "vocab"), use_bias=True,
                                          bias_axes=("vocab",), name="head")(x)
        return logits
