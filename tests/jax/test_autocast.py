"""qmesh.jax.autocast: the recipe and MeshResource of layers given none (dense, layernorm_dense,
mlp, layernorm_mlp, the Flax modules and drop-ins), high precision when disabled, nesting and
restoring on exit and on exceptions, retracing of jitted functions, bad input."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT as OWG

import qmesh.jax as qj
from qmesh.jax.autocast import recipe_in_force
from qmesh.jax.flax import DenseGeneral, LayerNormMLP, make_dot_general_cls
from qmesh.jax.layernorm_dense import layernorm_dense
from qmesh.jax.mlp import layernorm_mlp, mlp
from qmesh.jax.recipe import DelayedScaling, Float8BlockScaling, Float8CurrentScaling

CURRENT, DELAYED = Float8CurrentScaling(), DelayedScaling(amax_history_len=4)
DEFAULT = object()  # the layer's own default, returned outside every autocast


def operands(rng, m=16, k=32, n=48):
    x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    w = jnp.asarray((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
    b = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    return x, w, b


def test_blocks_nest_and_restore_on_exit_and_on_exceptions():
    mr = qj.MeshResource(dp_resource="dp", tp_resource="tp")
    assert recipe_in_force(None, DEFAULT) is DEFAULT
    with qj.autocast(recipe=CURRENT):
        assert recipe_in_force(None, DEFAULT) == CURRENT
        assert recipe_in_force(DELAYED, DEFAULT) == DELAYED  # an explicit recipe wins
        with qj.autocast(enabled=False, recipe=DELAYED):  # the recipe is ignored: off
            assert recipe_in_force(None, DEFAULT) is None
            with qj.autocast(mesh_resource=mr):
                assert recipe_in_force(None, DEFAULT) == DelayedScaling()  # the default
                assert qj.global_mesh_resource() == mr
            assert recipe_in_force(None, DEFAULT) is None
            assert qj.global_mesh_resource() == qj.MeshResource()
        with pytest.raises(RuntimeError, match="inside"):
            with qj.autocast(recipe=Float8BlockScaling(), mesh_resource=mr):
                assert recipe_in_force(None, DEFAULT) == Float8BlockScaling()
                raise RuntimeError("inside")
        assert recipe_in_force(None, DEFAULT) == CURRENT
        assert qj.global_mesh_resource() == qj.MeshResource()
    assert recipe_in_force(None, DEFAULT) is DEFAULT


def test_bad_input_raises():
    with pytest.raises(TypeError, match="recipe must be"):
        with qj.autocast(recipe="delayed"):
            pass
    with pytest.raises(TypeError, match="enabled must be True or False"):
        with qj.autocast(enabled=1):
            pass
    with pytest.raises(TypeError, match="MeshResource"):
        with qj.autocast(mesh_resource={"dp_resource": "dp"}):
            pass
    assert recipe_in_force(None, DEFAULT) is DEFAULT


def test_dense_takes_the_recipe_of_the_block(rng):
    x, w, b = operands(rng)
    want = qj.dense(x, w, b, recipe=CURRENT)
    with qj.autocast(recipe=CURRENT):
        got = qj.dense(x, w, b)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Outside: dense's own default, DelayedScaling, which needs its state.
    with pytest.raises(ValueError, match="DelayedScaling needs the state"):
        qj.dense(x, w, b)


def test_disabled_is_high_precision_and_passes_the_state_through(rng):
    x, w, b = operands(rng)
    r = jnp.asarray(rng.standard_normal((16, 48)).astype(np.float32))
    state = qj.init_state(DELAYED)
    state["input_scale"] = jnp.float32(3.0)  # any state passes unchanged
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(b, np.float64)

    def loss(x, w, b, state):
        return jnp.sum(qj.dense(x, w, b, state) * r)

    with qj.autocast(enabled=False):
        y = qj.dense(x, w, b, state)
        dx, dw, db, dstate = jax.grad(loss, argnums=(0, 1, 2, 3))(x, w, b, state)
    assert ref.rel_err(y, exact) < 1e-6
    r64 = np.asarray(r, np.float64)
    assert ref.rel_err(dx, r64 @ np.asarray(w, np.float64).T) < 1e-6
    assert ref.rel_err(dw, np.asarray(x, np.float64).T @ r64) < 1e-6
    assert ref.rel_err(db, r64.sum(axis=0)) < 1e-6
    for name in state:
        np.testing.assert_array_equal(np.asarray(dstate[name]), np.asarray(state[name]))
    # An explicit recipe still quantizes.
    with qj.autocast(enabled=False):
        fp8 = qj.dense(x, w, b, recipe=CURRENT)
    assert ref.rel_err(fp8, exact) > 1e-4


def test_fused_functions_run_unquantised_when_disabled(rng):
    x, w, b = operands(rng, k=32, n=32)
    w2 = jnp.asarray((rng.standard_normal((32, 32)) / 6).astype(np.float32))
    gamma = jnp.asarray(rng.uniform(0.5, 1.5, 32).astype(np.float32))
    beta = jnp.asarray(rng.standard_normal(32).astype(np.float32))
    x64 = np.asarray(x, np.float64)
    ln = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-6)
    ln = ln * np.asarray(gamma, np.float64) + np.asarray(beta, np.float64)
    gelu = lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3)))  # noqa: E731
    h = gelu(x64 @ np.asarray(w, np.float64) + np.asarray(b, np.float64))
    with qj.autocast(enabled=False):
        y, ln_out = layernorm_dense(x, gamma, beta, w, b, eps=1e-6)
        y_mlp = mlp(x, (w, w2), (b, None))
        y_lnmlp, _ = layernorm_mlp(x, gamma, beta, (w, w2), (b, None), eps=1e-6)
    assert ref.rel_err(ln_out, ln) < 1e-5
    assert ref.rel_err(y, ln @ np.asarray(w, np.float64) + np.asarray(b, np.float64)) < 1e-5
    assert ref.rel_err(y_mlp, h @ np.asarray(w2, np.float64)) < 1e-5
    h_ln = gelu(ln @ np.asarray(w, np.float64) + np.asarray(b, np.float64))
    assert ref.rel_err(y_lnmlp, h_ln @ np.asarray(w2, np.float64)) < 1e-5


def test_flax_modules_and_drop_in_take_the_recipe_of_the_block(rng):
    x = jnp.asarray(rng.standard_normal((2, 8, 32)).astype(np.float32))
    dense = DenseGeneral(64, recipe=None)
    v = dense.init(jax.random.key(0), x)
    baseline = dense.apply(v, x)
    with qj.autocast(recipe=CURRENT):
        got = dense.apply(v, x)
    want = DenseGeneral(64, recipe=CURRENT).apply(v, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert ref.rel_err(got, baseline) > 1e-4  # quantized
    # DelayedScaling: its state exists where the block was in force at init.
    mlp_module = LayerNormMLP(intermediate_dim=64)
    with qj.autocast(recipe=DELAYED):
        v = mlp_module.init(jax.random.key(0), x)
        mlp_module.apply(v, x)
    assert set(v[OWG]) == {
        f"{p}{o}_{k}"
        for p in ("wi_", "wo_")
        for o in ("input", "kernel", "output_grad")
        for k in ("amax_history", "scale")
    }
    assert OWG not in mlp_module.init(jax.random.key(0), x)  # outside: unquantised
    # The drop-in without a recipe: the block's; high precision when disabled.
    layer = nn.Dense(64, dot_general_cls=make_dot_general_cls())
    v = layer.init(jax.random.key(0), x[0])
    assert OWG in v  # DelayedScaling() outside autocast
    with qj.autocast(enabled=False):
        off = layer.apply(v, x[0])
    plain = nn.Dense(64).apply({"params": v["params"]}, x[0])
    np.testing.assert_allclose(np.asarray(off), np.asarray(plain), rtol=1e-6, atol=1e-6)
    with qj.autocast(recipe=CURRENT):
        cur = layer.apply(v, x[0])
    want = nn.Dense(64, dot_general_cls=make_dot_general_cls(CURRENT)).apply(v, x[0])
    np.testing.assert_array_equal(np.asarray(cur), np.asarray(want))


def test_a_jitted_function_is_traced_again_under_another_block(rng):
    x, w, b = operands(rng)
    f = jax.jit(lambda x, w, b: qj.dense(x, w, b))
    with qj.autocast(enabled=False):
        off = f(x, w, b)
    with qj.autocast(recipe=CURRENT):
        on = f(x, w, b)
    with qj.autocast(enabled=False):
        off_again = f(x, w, b)
    np.testing.assert_array_equal(np.asarray(on), np.asarray(qj.dense(x, w, b, recipe=CURRENT)))
    np.testing.assert_array_equal(np.asarray(off), np.asarray(off_again))
    assert ref.rel_err(on, off) > 1e-4
