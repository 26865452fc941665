"""qmesh.jax.flax.wrap_function_in_state_module: a function of two FP8 GEMMs as a
parameterless module, its delayed-scaling state per GEMM in _overwrite_with_gradient and
updated through the gradient, the recipe of autocast, and misuse."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT as OWG

import qmesh.jax as qj
from qmesh.jax.flax import wrap_function_in_state_module
from qmesh.jax.recipe import DelayedScaling, Float8CurrentScaling

DELAYED = DelayedScaling(amax_history_len=4)


def two_gemms(states, x, k1, k2):
    """x @ k1 @ k2 with a state per GEMM; returns (y, the recipe it ran with)."""
    h = qj.dense(x, k1, None, states("first_"), recipe=states.recipe)
    return qj.dense(h, k2, None, states("second_"), recipe=states.recipe), states.recipe


def operands(rng):
    x = jnp.asarray(rng.standard_normal((16, 32)).astype(np.float32))
    k1 = jnp.asarray((rng.standard_normal((32, 32)) / 6).astype(np.float32))
    k2 = jnp.asarray((rng.standard_normal((32, 16)) / 6).astype(np.float32))
    return x, k1, k2


def test_state_per_gemm_updated_through_the_gradient(rng):
    x, k1, k2 = operands(rng)
    cls = wrap_function_in_state_module(two_gemms, DELAYED, "TwoGemms")
    assert cls.__name__ == "TwoGemms" and cls.recipe == DELAYED
    module = cls()
    v = module.init(jax.random.key(0), x, k1, k2)
    assert set(v) == {OWG}  # no parameters
    assert set(v[OWG]) == {
        f"{g}_{o}_{k}"
        for g in ("first", "second")
        for o in ("input", "kernel", "output_grad")
        for k in ("amax_history", "scale")
    }
    y, recipe = module.apply(v, x, k1, k2)
    assert recipe == DELAYED
    s1 = {k[len("first_") :]: a for k, a in v[OWG].items() if k.startswith("first_")}
    s2 = {k[len("second_") :]: a for k, a in v[OWG].items() if k.startswith("second_")}
    want = qj.dense(qj.dense(x, k1, None, s1, recipe=DELAYED), k2, None, s2, recipe=DELAYED)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
    grads = jax.grad(lambda v_: jnp.sum(module.apply(v_, x, k1, k2)[0] ** 2))(v)[OWG]
    assert float(grads["first_input_amax_history"][0]) == float(ref.amax(x))
    assert float(grads["second_kernel_amax_history"][0]) == float(ref.amax(k2))


def test_recipe_of_autocast_and_inside_a_module(rng):
    x, k1, k2 = operands(rng)

    class Outer(nn.Module):
        @nn.compact
        def __call__(self, x):
            k1_ = self.param("k1", lambda *_: k1)
            return wrap_function_in_state_module(two_gemms, name="Inner")()(x, k1_, k2)

    model = Outer()
    v = model.init(jax.random.key(0), x)  # outside autocast: DelayedScaling()
    assert set(v) == {"params", OWG} and set(v[OWG]) == {"Inner_0"}
    with qj.autocast(recipe=Float8CurrentScaling()):
        y, recipe = model.apply({"params": v["params"]}, x)
        assert set(model.init(jax.random.key(0), x)) == {"params"}
    assert recipe == Float8CurrentScaling()
    want = qj.dense(qj.dense(x, k1, recipe=recipe), k2, recipe=recipe)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
    with qj.autocast(enabled=False):
        y, recipe = model.apply({"params": v["params"]}, x)
    assert recipe is None
    exact = np.asarray(x, np.float64) @ np.asarray(k1, np.float64) @ np.asarray(k2, np.float64)
    assert ref.rel_err(y, exact) < 1e-6


def test_misuse_raises(rng):
    with pytest.raises(TypeError, match="recipe"):
        wrap_function_in_state_module(two_gemms, "delayed")
    cls = wrap_function_in_state_module(two_gemms, DELAYED)
    assert cls.__name__ == "two_gemms"
    with pytest.raises(TypeError, match=r"create an instance \(two_gemms\(\)\)"):
        cls(*operands(rng))
