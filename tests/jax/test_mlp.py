"""qmesh.jax.activation_quantize and qmesh.jax.mlp: the casts fused with GELU against float64
references, the fused MLP against the unfused composition dense(gelu) -> dense (the same
function: tight) over steps of the delayed-scaling state, layernorm_mlp against layernorm_dense
-> dense, sharded == unsharded, GELU computed nowhere but in the fused casts, the Flax module
taking the fused path, and bad input."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import reference as ref
from conftest import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax.activation_quantize import (
    dgelu_dbias_quantize,
    dgelu_dbias_quantize_current,
    gelu_quantize,
    gelu_quantize_current,
)
from qmesh.jax.dense import dense, init_state
from qmesh.jax.flax import LayerNormMLP
from qmesh.jax.layernorm_dense import layernorm_dense
from qmesh.jax.mlp import layernorm_mlp, mlp
from qmesh.jax.recipe import DelayedScaling, Float8CurrentScaling

B, S, H, F = 4, 8, 32, 64
E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
RECIPES = [DelayedScaling(amax_history_len=4), Float8CurrentScaling()]
RIDS = ["delayed", "current"]


def gelu64(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def dgelu64(x):
    t = np.tanh(0.7978845608028654 * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x)


def assert_codes_near(got, value64, scale, dtype):
    """The codes of float64 `value64` at `scale`: equal but for values within rounding of a
    code boundary (the op computes GELU in float32), which may land on the neighbouring code."""
    want = ref.quantize(value64.astype(np.float32), scale, dtype)
    got = np.asarray(got).view(np.uint8)
    differ = got != want
    assert differ.mean() < 0.01, differ.mean()
    steps = np.abs(got.view(dtype).astype(np.float64) - want.view(dtype).astype(np.float64))
    ulp = np.abs(want.view(dtype).astype(np.float64)) * 2.0 ** -(3 if dtype == E4M3 else 2)
    assert np.all(steps[differ] <= np.maximum(ulp[differ], 2.0**-9) * 1.01)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_activation_casts_match_float64(rng, dtype):
    pre = (rng.standard_normal((S * B, F)) * 2).astype(np.float32)
    dh = rng.standard_normal((S * B, F)).astype(np.float32)
    pre_j, dh_j = jnp.asarray(pre, dtype), jnp.asarray(dh, dtype)
    pre64, dh64 = np.asarray(pre_j, np.float64), np.asarray(dh_j, np.float64)
    h64, g64 = gelu64(pre64), dh64 * dgelu64(pre64)

    q = gelu_quantize(pre_j, 2.0, E4M3, columnwise=True)
    assert_codes_near(q.q, h64, 2.0, E4M3)
    np.testing.assert_array_equal(np.asarray(q.q_t).T, np.asarray(q.q))
    np.testing.assert_allclose(float(q.amax), np.abs(h64).max(), rtol=1e-6)
    c = gelu_quantize_current(pre_j, E4M3)
    assert float(c.scale) == ref.current_scale(c.amax, E4M3)
    np.testing.assert_allclose(float(c.amax), np.abs(h64).max(), rtol=1e-6)

    gq, dbias = dgelu_dbias_quantize(dh_j, pre_j, 8.0, E5M2, columnwise=True)
    assert_codes_near(gq.q, g64, 8.0, E5M2)
    np.testing.assert_array_equal(np.asarray(gq.q_t).T, np.asarray(gq.q))
    np.testing.assert_allclose(np.asarray(dbias), g64.sum(axis=0), rtol=1e-5, atol=1e-5)
    gc, dbias_c = dgelu_dbias_quantize_current(dh_j, pre_j, E5M2, power_of_two_scales=True)
    np.testing.assert_allclose(float(gc.amax), np.abs(g64).max(), rtol=1e-6)
    assert float(gc.scale) == ref.current_scale(gc.amax, E5M2, power_of_two=True)
    np.testing.assert_array_equal(np.asarray(dbias_c), np.asarray(dbias))


def data(rng, dtype=np.float32):
    x = rng.standard_normal((B, S, H)).astype(dtype)
    k1 = (rng.standard_normal((H, F)) / np.sqrt(H)).astype(dtype)
    b1 = (0.1 * rng.standard_normal(F)).astype(dtype)
    k2 = (rng.standard_normal((F, H)) / np.sqrt(F)).astype(dtype)
    b2 = (0.1 * rng.standard_normal(H)).astype(dtype)
    r = rng.standard_normal((B, S, H)).astype(np.float32)  # the output gradient
    return x, (k1, k2), (b1, b2), r


def fused_step(recipe, with_bias=True):
    def loss(x, kernels, biases, states, r):
        return jnp.sum(
            mlp(x, kernels, biases if with_bias else (None, None), states, recipe=recipe) * r
        )

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


def unfused_step(recipe, with_bias=True):
    def loss(x, kernels, biases, states, r):
        b1, b2 = biases if with_bias else (None, None)
        h = dense(x, kernels[0], b1, states[0], recipe=recipe, activation="gelu")
        return jnp.sum(dense(h, kernels[1], b2, states[1], recipe=recipe) * r)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


@pytest.mark.parametrize("recipe", RECIPES, ids=RIDS)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_mlp_equals_the_unfused_composition_over_steps(rng, recipe, with_bias):
    """The same codes, GEMMs and states as dense(gelu) -> dense (GELU computed by the fused
    casts instead of XLA: equal to float32 rounding), through three steps of the state."""
    x, kernels, biases, r = data(rng)
    states = (init_state(recipe), init_state(recipe))
    fused, unfused = fused_step(recipe, with_bias), unfused_step(recipe, with_bias)
    for step in range(3):
        got = fused(x, kernels, biases, states, r)
        want = unfused(x, kernels, biases, states, r)
        ref.assert_trees_close(got, want, tol=1e-5)
        if isinstance(recipe, DelayedScaling):
            states = got[1][3]  # row 0: this step's amaxes; the scales this step used
            assert float(states[1]["input_amax_history"][0]) > 0  # max|gelu(pre)|
            assert (float(states[1]["input_scale"]) == 1.0) == (step == 0)
    # The forward against float64 math (FP8 tolerance).
    x64 = np.asarray(x, np.float64)
    h64 = gelu64(x64 @ kernels[0] + (biases[0] if with_bias else 0))
    y64 = h64 @ kernels[1] + (biases[1] if with_bias else 0)
    y = mlp(x, kernels, biases if with_bias else (None, None), states, recipe=recipe)
    assert ref.rel_err(y, y64) < 0.06


def test_gelu_runs_only_in_the_fused_casts(rng):
    """The compiled step has no tanh (XLA computes no GELU or GELU derivative: the casts do),
    and one gelu cast and one dgelu + dbias cast."""
    x, kernels, biases, r = data(rng)
    for recipe in RECIPES:
        states = (init_state(recipe), init_state(recipe))
        hlo = fused_step(recipe).lower(x, kernels, biases, states, r).compile().as_text()
        assert " tanh(" not in hlo
        assert hlo.count('custom_call_target="qmesh_gelu_quantize"') == 1
        assert hlo.count('custom_call_target="qmesh_dgelu_dbias_quantize"') == 1


def test_layernorm_mlp_equals_layernorm_dense_then_dense(rng):
    x, kernels, biases, r = data(rng)
    gamma = (1 + 0.3 * rng.standard_normal(H)).astype(np.float32)
    beta = (0.2 * rng.standard_normal(H)).astype(np.float32)
    recipe = RECIPES[0]

    def fused(x, gamma, beta, kernels, biases, states):
        y, ln = layernorm_mlp(x, gamma, beta, kernels, biases, states, recipe=recipe)
        return jnp.sum(y * r) + jnp.sum(ln * ln)

    def unfused(x, gamma, beta, kernels, biases, states):
        h, ln = layernorm_dense(
            x, gamma, beta, kernels[0], biases[0], states[0], recipe=recipe, activation="gelu"
        )
        y = dense(h, kernels[1], biases[1], states[1], recipe=recipe)
        return jnp.sum(y * r) + jnp.sum(ln * ln)

    states = (init_state(recipe), init_state(recipe))
    grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=tuple(range(6))))  # noqa: E731
    for _ in range(2):
        got = grad(fused)(x, gamma, beta, kernels, biases, states)
        want = grad(unfused)(x, gamma, beta, kernels, biases, states)
        ref.assert_trees_close(got, want, tol=1e-5)
        states = got[1][5]


@pytest.mark.parametrize("recipe", RECIPES, ids=RIDS)
def test_sharded_equals_unsharded(rng, recipe):
    """dp x tp: fc1 column parallel, fc2 row parallel (its contracting dimension summed)."""
    mesh = make_mesh((2, 4))
    x, (k1, k2), (b1, b2), r = data(rng)
    x[1, 2, 3] = 30.0  # one device's shard holds the global amax
    put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))  # noqa: E731
    states = (init_state(recipe), init_state(recipe))
    f = fused_step(recipe)
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        got = f(
            put(x, P("dp", None, None)),
            (put(k1, P(None, "tp")), put(k2, P("tp", None))),
            (put(b1, P("tp")), put(b2, P())),
            states,
            put(r, P("dp", None, None)),
        )
    want = f(x, (k1, k2), (b1, b2), states, r)
    ref.assert_trees_close(got, want, tol=1e-5)


def test_flax_layernorm_mlp_takes_the_fused_path(rng):
    """LayerNormMLP with GELU runs the fused MLP (and, under DelayedScaling in float32, the
    fused LayerNorm): no tanh in its compiled step; the state advances as before."""
    x = jnp.asarray(rng.standard_normal((B, S, H)).astype(np.float32))
    for recipe in RECIPES:
        m = LayerNormMLP(intermediate_dim=F, recipe=recipe)
        v = m.init(jax.random.key(0), x)
        step = jax.jit(jax.grad(lambda v_: jnp.sum(m.apply(v_, x)[0] ** 2)))
        hlo = step.lower(v).compile().as_text()
        assert " tanh(" not in hlo and "qmesh_dgelu_dbias_quantize" in hlo, type(recipe)
        assert "qmesh_norm_forward" in hlo, type(recipe)  # the norm fused with fc1's cast


def test_bad_input_raises(rng):
    x, (k1, k2), (b1, b2), _ = data(rng)
    recipe = RECIPES[1]
    with pytest.raises(ValueError, match=r"kernels must be \[H, F\] and \[F, H\]"):
        mlp(x, (k1, k1), recipe=recipe)
    with pytest.raises(ValueError, match=r"bias_2 must be \[32\]"):
        mlp(x, (k1, k2), (b1, b1), recipe=recipe)
    with pytest.raises(ValueError, match="pairs"):
        mlp(x, (k1,), recipe=recipe)
    with pytest.raises(ValueError, match="keeps no state"):
        mlp(x, (k1, k2), states=(init_state(RECIPES[0]), None), recipe=recipe)
    with pytest.raises(TypeError, match="x must be float32 or bfloat16"):
        layernorm_mlp(x.astype(jnp.float16), np.ones(H), np.zeros(H), (k1, k2), recipe=recipe)
    with pytest.raises(ValueError, match="pre .the saved pre-activation. must have dh's shape"):
        dgelu_dbias_quantize(jnp.ones((4, 16)), jnp.ones((4, 8)), 1.0, E5M2)
