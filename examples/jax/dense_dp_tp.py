"""One large Dense with qmesh's FP8 drop-in on a DP=2 x TP=2 mesh (MeshResource and
global_shard_guard), the sharding plan printed, its jitted forward+backward timed against the
unsharded run, and the results compared.

    python examples/jax/dense_dp_tp.py --tokens 2048 --hidden 1024 --features 4096

Runs on the host's devices (8 CPU devices are made when there is no accelerator).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import qmesh.jax as qj  # noqa: E402
from qmesh.jax.flax import make_dot_general_cls  # noqa: E402
from qmesh.jax.recipe import DelayedScaling  # noqa: E402


def timed(f, *args, repeat=5):
    jax.block_until_ready(f(*args))  # compile and warm up
    start = time.perf_counter()
    for _ in range(repeat):
        jax.block_until_ready(f(*args))
    return (time.perf_counter() - start) / repeat


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1024, help="batch x sequence (split 4 x rest)")
    p.add_argument("--hidden", type=int, default=512, help="input features")
    p.add_argument("--features", type=int, default=2048, help="output features (column parallel)")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    if len(jax.devices()) < 4:
        raise SystemExit(f"needs 4 devices, found {len(jax.devices())}")

    mesh = jax.make_mesh((2, 2), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices()[:4])
    resource = qj.MeshResource(dp_resource="dp", tp_resource="tp")
    model = nn.Dense(args.features, dot_general_cls=make_dot_general_cls(DelayedScaling()))
    x = jnp.asarray(np.random.default_rng(0).standard_normal(
        (4, args.tokens // 4, args.hidden)).astype(np.float32))
    v = model.init(jax.random.key(0), x)

    def step(v, x):
        loss = lambda v_: jnp.mean(model.apply(v_, x) ** 2)  # noqa: E731
        return jax.value_and_grad(loss)(v)

    plan = {"kernel": P(None, "tp"), "bias": P("tp")}
    vs = jax.tree.map_with_path(lambda path, a: jax.device_put(
        a, NamedSharding(mesh, plan.get(path[-1].key, P()))), v)
    xs = jax.device_put(x, NamedSharding(mesh, P("dp", None, None)))
    print(f"mesh {dict(mesh.shape)}, {resource}")
    print(f"  input  {tuple(x.shape)}: {xs.sharding.spec}")
    for path, a in jax.tree_util.tree_leaves_with_path(vs):
        print(f"  {jax.tree_util.keystr(path):70s} {str(tuple(a.shape)):14s} {a.sharding.spec}")
    f = jax.jit(step)
    with qj.global_shard_guard(resource):
        hlo = f.lower(vs, xs).compile().as_text()
        t_sharded = timed(f, vs, xs, repeat=args.repeat)
        got = f(vs, xs)
    counts = {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(")
              for op in ("all-reduce", "all-gather", "reduce-scatter")}
    print(f"  collectives in the compiled step: {counts}")
    t_single = timed(jax.jit(step), v, x, repeat=args.repeat)
    want = jax.jit(step)(v, x)
    err = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
              for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    print(f"forward+backward: {t_single * 1e3:8.2f} ms on one device, "
          f"{t_sharded * 1e3:8.2f} ms on DP=2 x TP=2 ({t_single / t_sharded:.2f}x); "
          f"max relative difference {err:.2e}")


if __name__ == "__main__":
    main()
