"""qmesh.jax.layernorm_dense: LayerNorm or RMSNorm fused with the FP8 cast, then the FP8 dense
layer, against the unfused composition dense(norm(x)) (the same codes: the same bits, for every
recipe, float32 and bfloat16), a float64 reference (FP8 tolerances), the state update, sharded
== unsharded, the Flax modules taking the fused path, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
from conftest import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax.dense import dense, init_state
from qmesh.jax.flax import LayerNormDenseGeneral, LayerNormMLP
from qmesh.jax.layer_norm import layer_norm, rms_norm
from qmesh.jax.layernorm_dense import layernorm_dense
from qmesh.jax.recipe import DelayedScaling, Float8BlockScaling, Float8CurrentScaling

B, S, H, N = 4, 8, 32, 48
EPS = 1e-6
RECIPE = DelayedScaling(amax_history_len=4)


def data(rng):
    x = (rng.standard_normal((B, S, H)) * 3 + 1).astype(np.float32)
    g = (1 + 0.3 * rng.standard_normal(H)).astype(np.float32)
    be = (0.2 * rng.standard_normal(H)).astype(np.float32)
    w = (rng.standard_normal((H, N)) / np.sqrt(H)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    r = rng.standard_normal((B, S, N)).astype(np.float32)  # output gradient
    r_ln = rng.standard_normal((B, S, H)).astype(np.float32)  # the norm output's cotangent
    state = init_state(RECIPE)
    state["input_scale"] = jnp.float32(60.0)  # a scale that saturates nothing
    return x, g, be, w, b, state, r, r_ln


def fused_step(activation):
    def loss(x, g, be, w, b, state, r, r_ln):
        y, ln = layernorm_dense(
            x, g, be, w, b, state, recipe=RECIPE, eps=EPS, activation=activation
        )
        return jnp.sum(y * r) + jnp.sum(ln * r_ln), (y, ln)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5), has_aux=True))


def unfused_step(activation):
    def loss(x, g, be, w, b, state, r, r_ln):
        ln = layer_norm(x, g, be, EPS)
        y = dense(ln, w, b, state, recipe=RECIPE, activation=activation)
        return jnp.sum(y * r) + jnp.sum(ln * r_ln), (y, ln)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5), has_aux=True))


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_equals_the_unfused_composition_and_float64(rng, activation):
    args = data(rng)
    got = fused_step(activation)(*args)
    want = unfused_step(activation)(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(np.abs(b).max(), 1e-30))
    # against float64 math on the exact operands: FP8 tolerances
    x, g, be, w, b = (np.asarray(a, np.float64) for a in args[:5])
    n = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + EPS) * g + be
    z = n @ w + b
    if activation == "gelu":
        z = 0.5 * z * (1 + np.tanh(0.7978845608028654 * (z + 0.044715 * z**3)))
    (_, (y, ln)), grads = got
    assert ref.rel_err(ln, n) < 1e-5 and ref.rel_err(y, z) < 0.06
    new_state = grads[5]  # this step's input amax is the norm output's global amax
    assert float(np.max(new_state["input_amax_history"])) == pytest.approx(
        np.abs(n).max(), rel=1e-5
    )


def test_sharded_equals_unsharded(rng):
    mesh = make_mesh((2, 4))
    args = data(rng)
    want = fused_step("gelu")(*args)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    x, g, be, w, b, state, r, r_ln = args
    sharded = (
        put(x, P("dp", None, None)),
        g,
        be,
        put(w, P(None, "tp")),
        put(b, P("tp")),
        state,
        put(r, P("dp", None, "tp")),
        put(r_ln, P("dp", None, None)),
    )
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        got = fused_step("gelu")(*sharded)
    for a, b_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(
            np.asarray(a),
            np.asarray(b_),
            rtol=1e-5,
            atol=1e-5 * max(float(np.abs(np.asarray(b_)).max()), 1e-30),
        )


def composition_steps(recipe, norm, dtype):
    """(fused, unfused) jitted value_and_grad of layernorm_dense and of dense(norm(x)) with
    `recipe`, LayerNorm or RMSNorm, x and the GEMM operands in `dtype`."""

    def norm_of(x, g, be):
        xf = x.astype(jnp.float32)
        y = layer_norm(xf, g, be, EPS) if norm == "layernorm" else rms_norm(xf, g, EPS)
        return y.astype(x.dtype)

    def fused(x, g, be, w, b, state, r, r_ln):
        be = be if norm == "layernorm" else None
        y, ln = layernorm_dense(x, g, be, w, b, state, recipe=recipe, eps=EPS)
        return jnp.sum(y.astype(jnp.float32) * r) + jnp.sum(ln.astype(jnp.float32) * r_ln), (
            y,
            ln,
        )

    def unfused(x, g, be, w, b, state, r, r_ln):
        ln = norm_of(x, g, be)
        y = dense(ln, w, b, state, recipe=recipe)
        return jnp.sum(y.astype(jnp.float32) * r) + jnp.sum(ln.astype(jnp.float32) * r_ln), (
            y,
            ln,
        )

    step = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4, 5), has_aux=True))
    return step(fused), step(unfused)


RECIPES = [RECIPE, Float8CurrentScaling(), Float8BlockScaling()]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_every_recipe_and_norm_equals_the_unfused_composition(rng, recipe, norm, dtype):
    x, g, be, w, b, state, r, r_ln = data(rng)
    x, w, b = (jnp.asarray(a, dtype) for a in (x, w, b))
    state = state if isinstance(recipe, DelayedScaling) else None
    fused, unfused = composition_steps(recipe, norm, dtype)
    (loss, (y, ln)), grads = fused(x, g, be, w, b, state, r, r_ln)
    (loss2, (y2, ln2)), grads2 = unfused(x, g, be, w, b, state, r, r_ln)
    # forward: the same codes, so the same bits
    for a, b_ in ((ln, ln2), (y, y2), (loss, loss2)):
        assert a.dtype == b_.dtype and np.asarray(a).tobytes() == np.asarray(b_).tobytes()
    # backward: the same math; a bfloat16 norm output's two cotangents are summed in float32
    # by the fused path and in bfloat16 by autodiff of the composition
    tol = 1e-2 if dtype == jnp.bfloat16 else 1e-6
    for a, b_ in zip(jax.tree.leaves(grads), jax.tree.leaves(grads2)):
        a, b_ = np.asarray(a, np.float64), np.asarray(b_, np.float64)
        np.testing.assert_allclose(a, b_, rtol=tol, atol=tol * max(np.abs(b_).max(), 1e-30))


def test_sharded_current_scaling_rms_norm_equals_unsharded(rng):
    mesh = make_mesh((2, 4))
    x, g, be, w, b, _, r, r_ln = data(rng)
    step = composition_steps(Float8CurrentScaling(), "rmsnorm", jnp.float32)[0]
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    x[1, 3, 5] = 40.0  # the global amax lives on one shard only
    want = step(x, g, be, w, b, None, r, r_ln)
    sharded = (put(x, P("dp", None, None)), g, be, put(w, P(None, "tp")), put(b, P("tp")))
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        got = step(*sharded, None, put(r, P("dp", None, "tp")), put(r_ln, P("dp", None, None)))
    for a, b_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(
            np.asarray(a),
            np.asarray(b_),
            rtol=1e-5,
            atol=1e-5 * max(float(np.abs(np.asarray(b_)).max()), 1e-30),
        )


def compiled(m, x):
    v = m.init(jax.random.key(0), x)
    return jax.jit(jax.grad(lambda v_: jnp.sum(m.apply(v_, x)[0] ** 2))).lower(v).as_text()


@pytest.mark.parametrize(
    "make",
    [
        lambda **k: LayerNormMLP(intermediate_dim=64, **k),
        lambda **k: LayerNormDenseGeneral(64, **k),
    ],
    ids=["mlp", "ln_dense"],
)
def test_modules_fuse_where_it_fits(rng, make):
    x = jnp.asarray(rng.standard_normal((B, S, H)).astype(np.float32))
    fused = "qmesh_norm_forward"  # the fused handler
    assert fused in compiled(make(recipe=RECIPE), x)
    assert fused in compiled(make(recipe=Float8CurrentScaling()), x)
    assert fused in compiled(make(recipe=RECIPE, layernorm_type="rmsnorm"), x)
    assert fused in compiled(make(recipe=RECIPE, dtype=jnp.bfloat16), x.astype(jnp.bfloat16))
    assert fused not in compiled(make(recipe=RECIPE, dtype=jnp.bfloat16), x)  # x not in dtype
    assert fused not in compiled(make(recipe=None), x)


def test_bad_input_raises(rng):
    x, g, be, w, b, state, _, _ = data(rng)
    with pytest.raises(ValueError, match="keeps no state"):
        layernorm_dense(x, g, be, w, b, state, recipe=Float8CurrentScaling())
    with pytest.raises(TypeError, match="x must be float32 or bfloat16"):
        layernorm_dense(x.astype(jnp.float16), g, be, w, b, state, recipe=RECIPE)
    with pytest.raises(ValueError, match="same H"):
        layernorm_dense(x, g, be, w[:16], b, state, recipe=RECIPE)
    with pytest.raises(ValueError, match="activation"):
        layernorm_dense(x, g, be, w, b, state, recipe=RECIPE, activation="relu")
    with pytest.raises(ValueError, match="state"):
        layernorm_dense(x, g, be, w, b, None, recipe=RECIPE)
