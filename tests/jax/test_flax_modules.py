"""qmesh.jax.flax modules: DenseGeneral, LayerNormDenseGeneral, LayerNormMLP and Softmax
against float64 numpy references (unquantised: tight; FP8: FP8 tolerances), LoRA, sharded ==
unsharded with the logical axis rules, the FP8 state helpers, and bad input."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax.flax import (
    DenseGeneral,
    LayerNormDenseGeneral,
    LayerNormMLP,
    Softmax,
    fp8_meta,
    logical_axis_rules,
    saturation,
)
from qmesh.jax.recipe import DelayedScaling, Float8BlockScaling, Float8CurrentScaling

H, I = 32, 64
RECIPES = [None, DelayedScaling(amax_history_len=4), Float8CurrentScaling()]
RIDS = ["plain", "delayed", "current"]
# Unsharded tests also run the block recipe (its sharded tests, with whole 128-blocks a shard,
# are in test_block_scaling.py: these layers are too narrow to shard into 128-blocks).
ALL_RECIPES, ALL_RIDS = [*RECIPES, Float8BlockScaling()], [*RIDS, "block"]


def tol(recipe):
    return 1e-5 if recipe is None else 0.06


def gelu64(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


ACTS64 = {
    "gelu": gelu64,
    "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "linear": lambda x: x,
}


def norm64(x, p, kind, eps=1e-6):
    x = np.asarray(x, np.float64)
    g = np.asarray(p["scale"], np.float64)
    if kind == "layernorm":
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * g + np.asarray(p["ln_bias"])
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def f64(a):
    return np.asarray(a, np.float64)


@pytest.fixture
def x(rng):
    return jnp.asarray(rng.standard_normal((8, 4, H)).astype(np.float32))


@pytest.mark.parametrize("recipe", ALL_RECIPES, ids=ALL_RIDS)
def test_dense_general(x, recipe):
    m = DenseGeneral((4, 16), axis=(-2, -1), recipe=recipe)
    v = nn.unbox(m.init(jax.random.key(0), x))
    y = m.apply(v, x)
    p = v["params"]
    want = np.einsum("bsh,shfg->bfg", f64(x), f64(p["kernel"])) + f64(p["bias"])
    assert y.shape == (8, 4, 16) and ref.rel_err(y, want) < tol(recipe)
    plain = nn.DenseGeneral((4, 16), axis=(-2, -1)).apply({"params": p}, x)
    assert ref.rel_err(y, plain) < tol(recipe)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("recipe", ALL_RECIPES, ids=ALL_RIDS)
def test_layernorm_dense_general(x, recipe, kind):
    m = LayerNormDenseGeneral(
        48,
        layernorm_type=kind,
        use_bias=True,
        recipe=recipe,
        return_layernorm_output=True,
        bias_init=nn.initializers.normal(1.0),
    )
    v = nn.unbox(m.init(jax.random.key(0), x))
    y, ln = m.apply(v, x)
    p = v["params"]
    n = norm64(x, p, kind)
    assert ref.rel_err(ln, n) < 1e-5
    assert ref.rel_err(y, n @ f64(p["kernel"]) + f64(p["bias"])) < tol(recipe)
    # grads flow to every parameter
    g = jax.grad(lambda v_: jnp.sum(m.apply(v_, x)[0] ** 2))(v)["params"]
    assert all(np.any(np.asarray(a)) for a in jax.tree.leaves(g))


@pytest.mark.parametrize(
    "acts",
    [("gelu",), ("relu",), ("silu",), ("silu", "linear")],
    ids=["gelu", "relu", "silu", "swiglu"],
)
@pytest.mark.parametrize("recipe", ALL_RECIPES, ids=ALL_RIDS)
def test_layernorm_mlp(x, recipe, acts):
    m = LayerNormMLP(
        intermediate_dim=I, activations=acts, recipe=recipe, bias_init=nn.initializers.normal(0.5)
    )
    v = nn.unbox(m.init(jax.random.key(0), x))
    y, ln = m.apply(v, x)
    assert ln is None
    p = v["params"]
    n = norm64(x, p, "layernorm")
    z = np.einsum("bsh,hai->bsai", n, f64(p["wi_kernel"])) + f64(p["wi_bias"])
    h = ACTS64[acts[0]](z[..., 0, :]) * (ACTS64[acts[1]](z[..., 1, :]) if len(acts) == 2 else 1)
    want = h @ f64(p["wo_kernel"]) + f64(p["wo_bias"])
    assert y.shape == x.shape and ref.rel_err(y, want) < (1e-5 if recipe is None else 0.08)
    if isinstance(recipe, DelayedScaling):
        g = jax.grad(lambda v_: jnp.sum(m.apply(v_, x)[0] ** 2))(v)
        meta = fp8_meta(g)
        assert set(meta[""]) == {
            f"{p}{o}" for p in ("wi_", "wo_") for o in ("input", "kernel", "output_grad")
        }
        assert meta[""]["wi_input"]["last_amax"] == pytest.approx(float(np.abs(n).max()), rel=1e-5)
        assert meta[""]["wi_input"]["scale"] == 1.0  # the scale this first step used
        owg = "_overwrite_with_gradient"
        g2 = jax.grad(lambda v_: jnp.sum(m.apply(v_, x)[0] ** 2))({**v, owg: g[owg]})
        assert fp8_meta(g2)[""]["wi_input"]["scale"] == pytest.approx(
            448.0 / float(np.abs(n).max()), rel=1e-5
        )  # the next step's, from that amax


@pytest.mark.parametrize("kind", ["scaled", "scaled_masked", "scaled_upper_triang_masked"])
def test_softmax(rng, kind):
    s = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    mask = rng.random((2, 1, 5, 5)) < 0.3
    mask[0, 0, 1] = True  # a fully masked row gives zeros
    y = Softmax(scale_factor=0.5, softmax_type=kind).apply(
        {}, jnp.asarray(s), mask=jnp.asarray(mask)
    )
    z = 0.5 * f64(s)
    if kind == "scaled_masked":
        z = np.where(mask, -np.inf, z)
    elif kind == "scaled_upper_triang_masked":
        z = np.where(np.triu(np.ones((5, 5), bool), 1), -np.inf, z)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - np.max(z, -1, keepdims=True))
        want = np.nan_to_num(e / e.sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(y), want, atol=1e-6)


@pytest.mark.parametrize("recipe", RECIPES[:2], ids=RIDS[:2])
def test_lora_zero_adapter_is_exact_and_only_the_adapter_learns(x, recipe):
    base = DenseGeneral(48, recipe=recipe)
    lora = DenseGeneral(
        48,
        recipe=recipe,
        enable_low_rank_adaptation=True,
        low_rank_adaptation_dim=4,
        low_rank_adaptation_alpha=8.0,
    )
    v = nn.unbox(lora.init(jax.random.key(0), x))
    vb = {
        k: ({n: a for n, a in c.items() if not n.startswith("lora")} if k == "params" else c)
        for k, c in v.items()
    }
    np.testing.assert_array_equal(np.asarray(lora.apply(v, x)), np.asarray(base.apply(vb, x)))
    g = jax.grad(lambda v_: jnp.sum(lora.apply(v_, x) ** 2))(v)["params"]
    assert not np.any(np.asarray(g["kernel"])) and not np.any(np.asarray(g["bias"]))
    assert np.any(np.asarray(g["lora_b_kernel"]))
    # With B != 0 the adapter adds (x A) B * alpha / r.
    v["params"]["lora_b_kernel"] = jnp.ones_like(v["params"]["lora_b_kernel"])
    want = (
        f64(base.apply(vb, x))
        + (f64(x) @ f64(v["params"]["lora_a_kernel"])) @ np.ones((4, 48)) * 2.0
    )
    assert ref.rel_err(lora.apply(v, x), want) < 1e-5


def shard_variables(v, mesh, rules):
    specs = nn.get_partition_spec(v)
    shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
    return jax.tree.map(lambda a, s: jax.device_put(a, s), nn.unbox(v), shardings)


MODULES = {
    "dense": lambda r: DenseGeneral(I, kernel_axes=("embed", "mlp"), bias_axes=("mlp",), recipe=r),
    "ln_dense": lambda r: LayerNormDenseGeneral(I, kernel_axes=("embed", "joined_kv"), recipe=r),
    "mlp": lambda r: LayerNormMLP(intermediate_dim=I, recipe=r),
    "swiglu": lambda r: LayerNormMLP(intermediate_dim=I, activations=("silu", "linear"), recipe=r),
}


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("recipe", RECIPES[1:], ids=RIDS[1:])
def test_sharded_equals_unsharded(mesh, x, recipe, name):
    m = MODULES[name](recipe)
    v = m.init(jax.random.key(0), x)

    def out(y):
        return y[0] if isinstance(y, tuple) else y

    def f(v, x):
        return out(m.apply(v, x)), jax.grad(lambda v_: jnp.sum(out(m.apply(v_, x)) ** 2))(v)

    want = jax.jit(f)(nn.unbox(v), x)
    resource = qj.MeshResource(dp_resource="dp", tp_resource="tp")
    vs = shard_variables(v, mesh, logical_axis_rules(resource))
    xs = jax.device_put(x, NamedSharding(mesh, P("dp", None, None)))
    with qj.global_shard_guard(resource):
        got = jax.jit(f)(vs, xs)
    ref.assert_trees_close(got, want)


def test_saturation_counts_both_ends():
    x = jnp.asarray([0.0, 1.0, 500.0, -1000.0, 1e-4, 2e-3])
    s = saturation(x, 1.0)
    assert s["saturated"] == pytest.approx(2 / 6) and s["flushed"] == pytest.approx(1 / 6)


def test_bad_input_raises(x):
    with pytest.raises(ValueError, match="activations"):
        LayerNormMLP(intermediate_dim=I, activations=("swish",)).init(jax.random.key(0), x)
    with pytest.raises(TypeError, match="recipe"):
        DenseGeneral(8, recipe="fp8").init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="layernorm_type"):
        LayerNormDenseGeneral(8, layernorm_type="batchnorm").init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="softmax_type"):
        Softmax(softmax_type="masked").apply({}, x)
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh), qj.global_shard_guard(qj.MeshResource("dp", "tp")):
        with pytest.raises(ValueError, match="not divisible by the tensor-parallel size 4"):
            LayerNormMLP(intermediate_dim=6).init(jax.random.key(0), x)


# ---- activation sharding and sequence parallelism (a mesh in context: jax.set_mesh) --------

SP_MODULES = {
    "mlp": lambda r: LayerNormMLP(
        intermediate_dim=I,
        recipe=r,
        return_layernorm_output=True,
        bias_init=nn.initializers.normal(0.5),
    ),
    "swiglu": lambda r: LayerNormMLP(intermediate_dim=I, activations=("silu", "linear"), recipe=r),
    "ln_dense": lambda r: LayerNormDenseGeneral(
        (4, I // 4), kernel_axes=("embed", "heads", "kv"), recipe=r, return_layernorm_output=True
    ),
}
RESOURCES = {
    "tp": qj.MeshResource(dp_resource="dp", tp_resource="tp"),
    "tpsp": qj.MeshResource(dp_resource="dp", tp_resource="tp", tpsp_resource="tp"),
}


def sp_step(m):
    def f(v, x):
        def loss(v_, x_):
            y, ln = m.apply(v_, x_)
            return jnp.sum(y**2) + (0.0 if ln is None else jnp.sum(ln * x_)), (y, ln)

        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(v, x)
        return out, grads

    return f


@pytest.mark.parametrize("res", list(RESOURCES))
@pytest.mark.parametrize("name", list(SP_MODULES))
@pytest.mark.parametrize("recipe", RECIPES, ids=RIDS)
def test_activation_sharding_equals_unsharded(mesh, rng, recipe, name, res):
    """With the mesh in context the modules constrain their activations (sequence-sharded
    over tpsp around the norm, gathered before fc1, hidden over tp); the results, the state
    and every gradient equal the unsharded step's."""
    x = jnp.asarray(rng.standard_normal((4, 8, H)).astype(np.float32))
    m = SP_MODULES[name](recipe)
    v = m.init(jax.random.key(0), x)
    want = jax.jit(sp_step(m))(nn.unbox(v), x)
    resource = RESOURCES[res]
    vs = shard_variables(v, mesh, logical_axis_rules(resource))
    seq = P("dp", "tp", None) if res == "tpsp" else P("dp", None, None)
    xs = jax.device_put(x, NamedSharding(mesh, seq))
    with jax.set_mesh(mesh), qj.global_shard_guard(resource):
        got = jax.jit(sp_step(m))(vs, xs)
    (y, ln), _ = got
    lead = lambda a: (tuple(a.sharding.spec) + (None, None))[:2]  # noqa: E731
    if name != "ln_dense":  # y and the norm's output come back sequence-sharded
        assert lead(y) == tuple(seq[:2]), y.sharding
    if ln is not None:
        assert lead(ln) == tuple(seq[:2]), ln.sharding
    ref.assert_trees_close(got, want)


def collectives(hlo, op):
    """(result shape text, reduction computation name) of each `op` instruction."""
    out = []
    for line in hlo.splitlines():
        if f" {op}(" in line or f" {op}-start(" in line:
            shape = line.split("=", 1)[1].split(f" {op}")[0].strip()
            out.append(
                (shape, line.split("to_apply=")[1].split(",")[0] if "to_apply=" in line else "")
            )
    return out


@pytest.mark.parametrize("recipe", RECIPES[1:], ids=RIDS[1:])
def test_sequence_parallel_hlo_gathers_and_reduce_scatters(rng, recipe):
    """SP LayerNormMLP forward+backward on dp=2 x tp=4 (tpsp=tp): the FP8 activations are
    all-gathered before fc1 (and fc2's output gradient before its GEMMs), fc2's product and
    fc1's dgrad are reduce-scattered, and the only all-reduces are the amax maxima (scalars;
    one merged all-reduce with delayed scaling) and the parameter-gradient sums: none carries
    a token dimension."""
    import re

    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    x = jnp.asarray(rng.standard_normal((4, 20, H)).astype(np.float32))  # 80 tokens
    m = LayerNormMLP(intermediate_dim=I, recipe=recipe)
    resource = RESOURCES["tpsp"]
    v = m.init(jax.random.key(0), x)
    vs = shard_variables(v, mesh, logical_axis_rules(resource))
    xs = jax.device_put(x, NamedSharding(mesh, P("dp", "tp", None)))
    loss = lambda v_, x_: jnp.sum(m.apply(v_, x_)[0] ** 2)  # noqa: E731
    with jax.set_mesh(mesh), qj.global_shard_guard(resource):
        hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(vs, xs).compile().as_text()
    gathers, scatters = collectives(hlo, "all-gather"), collectives(hlo, "reduce-scatter")
    # x's codes before fc1 and the output gradient's codes before fc2's backward GEMMs: the
    # 40 tokens of a dp shard (XLA's CPU backend widens FP8 to f16 for the collective).
    assert len(gathers) == 2 and all("[40,32]" in s for s, _ in gathers), gathers
    # fc2's forward product and fc1's dgrad: back to the 10 tokens of a device.
    assert len(scatters) == 2 and all("[10,32]" in s for s, _ in scatters), scatters
    reduces = collectives(hlo, "all-reduce")
    comps = {c: hlo.split(f"\n{c} (")[1].split("\n}")[0] for _, c in reduces}
    maxes = [s for s, c in reduces if "maximum" in comps[c]]
    sums = [s for s, c in reduces if "add" in comps[c]]
    assert len(maxes) + len(sums) == len(reduces), reduces
    assert all(
        re.fullmatch(r"\(?(f32\[\],? ?)+\)?", s.replace("/*index=5*/", "")) for s in maxes
    ), maxes
    if isinstance(recipe, DelayedScaling):
        assert len(maxes) == 1, maxes
    param_dims = {H, I, I // 4, 1}  # local parameter-gradient dimensions (I over tp=4)
    for s in sums:
        for dims in re.findall(r"f32\[([\d,]*)\]", s):
            assert {int(d) for d in dims.split(",") if d} <= param_dims, (s, reduces)


def test_sequence_parallel_bad_shapes_raise(x):
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh), qj.global_shard_guard(RESOURCES["tpsp"]):
        with pytest.raises(ValueError, match=r"sequence \(6\) by 4"):
            LayerNormMLP(intermediate_dim=I).init(jax.random.key(0), jnp.ones((8, 6, H)))
        with pytest.raises(ValueError, match="dot_1_input_axes: 2 logical axes"):
            LayerNormMLP(intermediate_dim=I, dot_1_input_axes=("batch", "embed")).init(
                jax.random.key(0), x
            )
    with jax.set_mesh(mesh), qj.global_shard_guard(qj.MeshResource(tp_resource="model")):
        with pytest.raises(ValueError, match="tp_resource is 'model'"):
            LayerNormMLP(intermediate_dim=I).init(jax.random.key(0), x)


@pytest.mark.parametrize("recipe", RECIPES, ids=RIDS)
def test_row_parallel_dense_general_reduce_scatters_to_sequence_shards(mesh, rng, recipe):
    """The projection after attention under sequence parallelism: input [batch, seq, heads,
    kv] heads over tp, output sequence-sharded; equal to the unsharded step, and the product
    is reduce-scattered (FP8), never all-reduced."""
    import re

    x = jnp.asarray(rng.standard_normal((2, 12, 4, 8)).astype(np.float32))  # 24 tokens
    m = DenseGeneral(
        H,
        axis=(-2, -1),
        kernel_axes=("heads", "kv", "embed"),
        recipe=recipe,
        input_axes=("batch", None, "heads", "kv"),
        output_axes=("batch", "seq", "embed"),
    )

    def f(v, x_):
        y = m.apply(v, x_)
        return y, jax.grad(lambda v__, x__: jnp.sum(m.apply(v__, x__) ** 2), argnums=(0, 1))(v, x_)

    v = m.init(jax.random.key(0), x)
    want = jax.jit(f)(nn.unbox(v), x)
    resource = RESOURCES["tpsp"]
    vs = shard_variables(v, mesh, logical_axis_rules(resource))
    xs = jax.device_put(x, NamedSharding(mesh, P("dp", None, "tp", None)))
    with jax.set_mesh(mesh), qj.global_shard_guard(resource):
        got = jax.jit(f)(vs, xs)
        hlo = jax.jit(f).lower(vs, xs).compile().as_text()
    assert (tuple(got[0].sharding.spec) + (None,))[:2] == ("dp", "tp"), got[0].sharding
    ref.assert_trees_close(got, want)
    if recipe is not None:
        assert collectives(hlo, "reduce-scatter"), hlo
        for shape, _ in collectives(hlo, "all-reduce"):  # amaxes and the weight/bias sums
            for dims in re.findall(r"f32\[([\d,]*)\]", shape):  # wgrad [K / tp, H], dbias [H]
                assert {int(d) for d in dims.split(",") if d} <= {H, 32 // mesh.shape["tp"]}, shape


def test_inside_shard_map_nothing_is_constrained(rng):
    """Under shard_map (manual axes) the modules set no activation constraints: each device
    runs the layer on its rows, as without a mesh."""
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    x = jnp.asarray(rng.standard_normal((8, 4, H)).astype(np.float32))
    m = LayerNormMLP(intermediate_dim=I, recipe=DelayedScaling(amax_history_len=4))
    v = nn.unbox(m.init(jax.random.key(0), x))
    want = m.apply(v, x)[0]  # delayed scaling: the forward uses the state's scales
    with jax.set_mesh(mesh), qj.global_shard_guard(RESOURCES["tpsp"]):
        got = jax.jit(
            jax.shard_map(
                lambda v_, x_: m.apply(v_, x_)[0],
                mesh=mesh,
                in_specs=(P(), P(("dp", "tp"))),
                out_specs=P(("dp", "tp")),
            )
        )(v, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
