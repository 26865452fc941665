"""A Flax transformer layer (LayerNorm, QKV dense, causal attention, projection, MLP) as a
plain model and with qmesh's FP8 drop-in on every Dense (`dot_general_cls=
make_dot_general_cls(recipe)`), on the same parameters: the jitted forward+backward of both
timed, the outputs compared, and the extra FP8 state printed.

    python examples/jax/transformer_layer.py --batch 4 --seq 128 --hidden 256 --heads 4
"""

from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from qmesh.jax.flax import fp8_meta, make_dot_general_cls
from qmesh.jax.recipe import DelayedScaling, Float8CurrentScaling


class TransformerLayer(nn.Module):
    hidden: int
    heads: int
    ffn: int
    dot: object = None  # dot_general_cls of every Dense (None: plain)

    @nn.compact
    def __call__(self, x):
        b, s, h = x.shape
        d = h // self.heads
        y = nn.LayerNorm()(x)
        qkv = nn.Dense(3 * h, dot_general_cls=self.dot, name="qkv")(y)
        q, k, v = jnp.split(qkv.reshape(b, s, 3, self.heads, d), 3, axis=2)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q[:, :, 0], k[:, :, 0]) / np.sqrt(d)
        logits = jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -1e30)
        a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v[:, :, 0])
        x = x + nn.Dense(h, dot_general_cls=self.dot, name="proj")(a.reshape(b, s, h))
        y = nn.LayerNorm()(x)
        y = nn.Dense(self.ffn, dot_general_cls=self.dot, name="fc1")(y)
        return x + nn.Dense(h, dot_general_cls=self.dot, name="fc2")(nn.gelu(y))


def timed(f, *args, repeat):
    jax.block_until_ready(f(*args))
    start = time.perf_counter()
    for _ in range(repeat):
        jax.block_until_ready(f(*args))
    return (time.perf_counter() - start) / repeat


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--recipe", choices=["delayed", "current"], default="delayed")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    recipe = DelayedScaling(amax_history_len=16) if args.recipe == "delayed" else Float8CurrentScaling()
    x = jnp.asarray(np.random.default_rng(0).standard_normal(
        (args.batch, args.seq, args.hidden)).astype(np.float32))
    plain = TransformerLayer(args.hidden, args.heads, args.ffn)
    fp8 = TransformerLayer(args.hidden, args.heads, args.ffn, dot=make_dot_general_cls(recipe))
    params = plain.init(jax.random.key(0), x)["params"]
    variables = fp8.init(jax.random.key(0), x)
    variables = {**variables, "params": params}  # the same parameters; FP8 adds only state

    def step(model):
        return jax.jit(lambda v, x: jax.value_and_grad(lambda v_: jnp.mean(model.apply(v_, x) ** 2))(v))

    t_plain = timed(step(plain), {"params": params}, x, repeat=args.repeat)
    t_fp8 = timed(step(fp8), variables, x, repeat=args.repeat)
    (l0, _), (l1, g1) = step(plain)({"params": params}, x), step(fp8)(variables, x)
    y0, y1 = plain.apply({"params": params}, x), fp8.apply(variables, x)
    rel = float(jnp.linalg.norm(y1 - y0) / jnp.linalg.norm(y0))
    print(f"forward+backward ({jax.default_backend()}): plain {t_plain * 1e3:.1f} ms, "
          f"qmesh FP8 ({args.recipe}) {t_fp8 * 1e3:.1f} ms ({t_plain / t_fp8:.2f}x)")
    print(f"output relative difference FP8 vs plain: {rel:.3e}; loss {float(l0):.5f} vs {float(l1):.5f}")
    extra = {k: c for k, c in variables.items() if k != "params"}
    n = sum(a.size for a in jax.tree.leaves(extra))
    print(f"extra FP8 state: {list(extra) or 'none'} ({n} floats)")
    for layer, ops in fp8_meta(g1).items():  # the state after this step (its 'gradient')
        for op, m in ops.items():
            print(f"  {layer}/{op}: amax {m['amax']:.4g}  scale {m['scale']:.4g}")


if __name__ == "__main__":
    main()
