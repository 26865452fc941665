"""What a user mixes up gets an error that names the mistake and what to do; what converts
exactly (numpy integers, Python ints) is accepted."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import qmesh.jax as qj
from qmesh.jax.flax import DenseGeneral, make_dot_general_cls
from qmesh.jax.recipe import DelayedScaling, Float8CurrentScaling


def test_the_package_exports_the_layers_and_recipes():
    x, w = jnp.ones((4, 16)), jnp.ones((16, 16))
    r = qj.DelayedScaling(amax_history_len=4)
    assert qj.dense(x, w, None, qj.init_state(r), recipe=r).shape == (4, 16)
    assert qj.gemm(x, w, trans_b=False).shape == (4, 16)
    assert qj.layer_norm(x, jnp.ones(16), jnp.zeros(16)).shape == (4, 16)
    assert qj.Float8CurrentScaling is Float8CurrentScaling and qj.Format.HYBRID
    # The name an error message gives exists.
    with pytest.raises(ValueError, match="qmesh.jax.Epilogue") as e:
        qj.gemm(x, w, epilogue=7.5)
    assert "qmesh.jax.Epilogue" in str(e.value) and qj.Epilogue.BIAS


def test_the_modules_named_like_their_function_are_both():
    assert set(qj.stats()) >= {"fallbacks", "invalid_scales", "unthreaded_states"}
    assert qj.stats() == qj.stats.stats()
    assert qj.gemm.Epilogue is qj.Epilogue and callable(qj.gemm.gelu)
    assert qj.dense.init_state is qj.init_state


def test_dot_general_and_dot_general_cls_mixed_up():
    cls = make_dot_general_cls(DelayedScaling())
    x = jnp.ones((4, 16))
    with pytest.raises(TypeError, match=r"class was passed as dot_general="):
        nn.Dense(16, dot_general=cls).init(jax.random.key(0), x)
    with pytest.raises(TypeError, match=r"instance was passed as dot_general_cls="):
        nn.Dense(16, dot_general_cls=cls()).init(jax.random.key(0), x)


def test_a_missing_state_key_is_named():
    r = DelayedScaling(amax_history_len=4)
    state = qj.init_state(r)
    del state["kernel_scale"]
    with pytest.raises(ValueError, match=r"lacks \['kernel_scale'\]"):
        qj.dense(jnp.ones((4, 16)), jnp.ones((16, 16)), None, state, recipe=r)


def test_recipe_fields_take_numbers_not_booleans_or_strings():
    assert DelayedScaling(amax_history_len=np.int64(8), margin=np.int32(1)).amax_history_len == 8
    assert (
        Float8CurrentScaling(power_of_two_scales=np.bool_(True), amax_epsilon=0).amax_epsilon == 0
    )
    for kw in (
        dict(amax_history_len=True),
        dict(amax_history_len=8.0),
        dict(margin="1"),
        dict(margin=False),
    ):
        with pytest.raises(TypeError, match=next(iter(kw))):
            DelayedScaling(**kw)
    for kw in (
        dict(power_of_two_scales="no"),
        dict(power_of_two_scales=1),
        dict(amax_epsilon=True),
    ):
        with pytest.raises(TypeError, match=next(iter(kw))):
            Float8CurrentScaling(**kw)


def test_dense_general_axis_out_of_range():
    x = jnp.ones((2, 4, 16))
    for axis in (5, -4, (1, 1)):
        with pytest.raises(ValueError, match="axis"):
            DenseGeneral(8, axis=axis, recipe=DelayedScaling()).init(jax.random.key(0), x)


def test_grouped_quantize_without_groups_for_rows():
    with pytest.raises(ValueError, match="no groups for 4 rows"):
        qj.grouped_quantize(
            jnp.ones((4, 16)), jnp.zeros((0,), jnp.int32), jnp.zeros((0,), jnp.float32)
        )
    empty = qj.grouped_quantize(
        jnp.ones((0, 16)), jnp.zeros((0,), jnp.int32), jnp.zeros((0,), jnp.float32)
    )
    assert empty.q.shape == (0, 16)


@pytest.mark.parametrize(
    "recipe",
    [
        qj.MXFP8BlockScaling(emulate=True),
        qj.NVFP4BlockScaling(emulate=True, disable_stochastic_rounding=True),
        Float8CurrentScaling(),
    ],
    ids=lambda r: type(r).__name__,
)
def test_dense_refuses_a_bad_out_dtype_or_fallback_under_every_recipe(recipe):
    x, k = jnp.ones((32, 32)), jnp.ones((32, 32))
    with pytest.raises(TypeError, match="out_dtype must be a floating dtype"):
        qj.dense(x, k, recipe=recipe, out_dtype=jnp.int32)
    with pytest.raises(ValueError, match="fallback must be None or 'bf16'"):
        qj.dense(x, k, recipe=recipe, fallback="fp4")
