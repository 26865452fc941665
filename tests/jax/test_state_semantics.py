"""The delayed-scaling state through a step (docs/flax.md "State semantics"): a layer whose
output does not reach the loss, uses combined by maximum (vmap, sharing, microbatches, scan)
equal to one big batch, invalid scales and a state that is not threaded."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state
from jax import lax

import qmesh.jax as qj
from qmesh.jax import delayed_state
from qmesh.jax import stats as qstats
from qmesh.jax.dense import dense, init_state
from qmesh.jax.flax import TrainState as QmeshTrainState
from qmesh.jax.flax import make_dot_general_cls
from qmesh.jax.recipe import DelayedScaling

OWG = "_overwrite_with_gradient"
R = DelayedScaling(amax_history_len=4)


def assert_same(a, b):
    jax.tree.map(lambda u, v: np.testing.assert_array_equal(np.asarray(u), np.asarray(v)), a, b)


def test_a_layer_whose_output_is_unused_restarts_instead_of_giving_nan():
    # The issue's reproducer, verbatim: Dense_1's output does not reach the loss.
    fp8 = make_dot_general_cls(DelayedScaling(amax_history_len=4))

    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(8, dot_general_cls=fp8)(x), nn.Dense(8, dot_general_cls=fp8)(x)

    m, x = M(), jnp.ones((16, 32))
    ts = train_state.TrainState.create(
        apply_fn=m.apply, params=m.init(jax.random.key(0), x), tx=optax.adam(1e-3)
    )
    ts = ts.apply_gradients(grads=jax.grad(lambda v: jnp.mean(m.apply(v, x)[0] ** 2))(ts.params))
    # TrainState writes the untouched gradient 0; the layer restarts from a fresh state.
    unused = ts.params[OWG]["Dense_1"]["QmeshDotGeneral_0"]
    assert float(unused["input_scale"]) == 0.0
    y = m.apply(ts.params, x)[1]
    assert np.all(np.isfinite(np.asarray(y)))
    fresh = {**ts.params, OWG: {**ts.params[OWG], "Dense_1": {"QmeshDotGeneral_0": init_state(R)}}}
    np.testing.assert_array_equal(np.asarray(y), np.asarray(m.apply(fresh, x)[1]))
    # qmesh's TrainState keeps it, and so does keep_unused_state (the used layer's new state
    # is left alone).
    qs = QmeshTrainState.create(
        apply_fn=m.apply, params=m.init(jax.random.key(0), x), tx=optax.adam(1e-3)
    )
    qs = qs.apply_gradients(grads=jax.grad(lambda v: jnp.mean(m.apply(v, x)[0] ** 2))(qs.params))
    assert_same(qs.params[OWG]["Dense_1"], {"QmeshDotGeneral_0": init_state(R)})
    assert_same(qs.params[OWG]["Dense_0"], ts.params[OWG]["Dense_0"])
    v0 = m.init(jax.random.key(0), x)
    grads = jax.grad(lambda v: jnp.mean(m.apply(v, x)[0] ** 2))(v0)
    kept = delayed_state.keep_unused_state(grads[OWG], v0[OWG])
    assert_same(kept["Dense_1"], v0[OWG]["Dense_1"])
    assert_same(kept["Dense_0"], grads[OWG]["Dense_0"])
    assert float(grads[OWG]["Dense_0"]["QmeshDotGeneral_0"]["input_amax_history"][0]) == 1.0


def big_batch_grad(x, k, state=None, loss=jnp.sum):
    return jax.grad(lambda s: loss(dense(x, k, None, s, recipe=R) ** 2))(
        init_state(R) if state is None else state
    )


def data():
    x = jax.random.normal(jax.random.key(0), (4, 8, 32))
    k = jax.random.normal(jax.random.key(1), (32, 16)) * 0.1
    return x, k


def test_vmap_records_what_one_big_batch_records():
    # The reproducer, verbatim (it printed 561.5: four scales summed).
    r = DelayedScaling(amax_history_len=4)
    x = jax.random.normal(jax.random.key(0), (4, 8, 32))
    k = jax.random.normal(jax.random.key(1), (32, 16)) * 0.1
    s = jax.grad(lambda s: jnp.mean(jax.vmap(lambda xi: dense(xi, k, None, s, recipe=r))(x) ** 2))(
        init_state(r)
    )
    assert float(s["input_scale"]) == 1.0  # the scale this first step used
    assert_same(s, big_batch_grad(x, k, loss=jnp.mean))
    assert float(s["input_amax_history"][0]) == float(jnp.max(jnp.abs(x)))
    # The next step quantizes x with 448 / max|x| (114.4), as one big batch would.
    s2 = jax.grad(lambda s: jnp.mean(jax.vmap(lambda xi: dense(xi, k, None, s, recipe=r))(x) ** 2))(
        s
    )
    assert float(s2["input_scale"]) == np.float32(448.0) / np.float32(jnp.max(jnp.abs(x)))
    assert_same(s2, big_batch_grad(x, k, s, loss=jnp.mean))


def test_vmap_over_states_keeps_one_state_per_member():
    x, k = data()
    states = jax.tree.map(lambda a: jnp.stack([a] * 4), init_state(R))
    g = jax.grad(
        lambda ss: jnp.sum(jax.vmap(lambda xi, si: dense(xi, k, None, si, recipe=R))(x, ss) ** 2)
    )(states)
    for i in range(4):
        assert_same(jax.tree.map(lambda a: a[i], g), big_batch_grad(x[i], k))


def test_microbatches_combined_by_maximum_equal_one_big_batch():
    x, k = data()
    state = big_batch_grad(x, k)  # a state with a history
    parts = [big_batch_grad(x[i : i + 2], k, state) for i in (0, 2)]
    assert_same(delayed_state.combine_state_grads(*parts), big_batch_grad(x, k, state))


def test_scan_over_a_shared_state_equals_one_big_batch():
    x, k = data()
    state = big_batch_grad(x, k)

    def loss(s):
        def body(c, xs):
            xb, sb = xs
            return c + jnp.sum(dense(xb, k, None, sb, recipe=R) ** 2), None

        return lax.scan(body, 0.0, (x, delayed_state.share_state(s, 4)))[0]

    assert_same(jax.jit(jax.grad(loss))(state), big_batch_grad(x, k, state))
    a, b = delayed_state.split_state(state)  # two explicit uses
    two = jax.grad(
        lambda s: (
            lambda a, b: (
                jnp.sum(dense(x[:2], k, None, a, recipe=R) ** 2)
                + jnp.sum(dense(x[2:], k, None, b, recipe=R) ** 2)
            )
        )(*delayed_state.split_state(s))
    )(state)
    assert_same(two, big_batch_grad(x, k, state))
    del a, b


class Twice(nn.Module):
    @nn.compact
    def __call__(self, x):
        d = nn.Dense(16, dot_general_cls=make_dot_general_cls(R))
        return d(x[:2]), d(x[2:])


class Once(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(16, dot_general_cls=make_dot_general_cls(R))(x)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_layer_called_twice_equals_one_big_batch(jit):
    x, _ = data()
    v = Once().init(jax.random.key(1), x)
    v = {**v, OWG: jax.grad(lambda v: jnp.sum(Once().apply(v, x) ** 2))(v)[OWG]}  # a history
    twice = jax.grad(lambda v: sum(jnp.sum(y**2) for y in Twice().apply(v, x)))
    got = (jax.jit(twice) if jit else twice)(v)[OWG]
    assert_same(got, jax.grad(lambda v: jnp.sum(Once().apply(v, x) ** 2))(v)[OWG])


def test_one_drop_in_instance_shared_by_two_layers_combines_by_maximum():
    cls = make_dot_general_cls(R)

    class Shared(nn.Module):
        @nn.compact
        def __call__(self, x):
            dot = cls(name="shared_dot")
            return nn.Dense(16, dot_general=dot)(x), nn.Dense(16, dot_general=dot)(x * 3)

    x, _ = data()
    m = Shared()
    v = m.init(jax.random.key(0), x)
    assert list(v[OWG]) == ["shared_dot"]
    g = jax.grad(lambda v: sum(jnp.sum(y**2) for y in m.apply(v, x)))(v)[OWG]["shared_dot"]
    p = v["params"]
    alone = [big_batch_grad(xi, p[f"Dense_{i}"]["kernel"]) for i, xi in enumerate((x, x * 3))]
    # Each use alone, with the bias gradient of nn.Dense folded in: compare the histories'
    # newest rows (the amaxes) and the scales.
    for name in ("input", "kernel"):
        want = max(float(a[f"{name}_amax_history"][0]) for a in alone)
        assert float(g[f"{name}_amax_history"][0]) == want
    assert float(g["input_amax_history"][0]) == float(jnp.max(jnp.abs(x * 3)))


# ---- invalid scales -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0.0, 1e-40, -2.0, np.nan, np.inf])
def test_an_invalid_scale_is_refused_at_the_api(bad):
    from qmesh.jax import dbias_quantize, grouped_quantize, quantize

    x = jnp.ones((4, 16))
    with pytest.raises(ValueError, match="normal positive finite"):
        quantize(x, bad)
    with pytest.raises(ValueError, match="normal positive finite"):
        dbias_quantize(x, jnp.float32(bad))
    with pytest.raises(ValueError, match="normal positive finite"):
        grouped_quantize(x, jnp.array([4], jnp.int32), jnp.array([bad], jnp.float32))
    state = dict(init_state(R), kernel_scale=jnp.float32(bad), kernel_amax_history=jnp.ones(4))
    with pytest.raises(ValueError, match="kernel_scale"):
        dense(x, jnp.ones((16, 16)), None, state, recipe=R)


def test_python_and_numpy_numbers_are_scales_when_exact():
    from qmesh.jax import quantize

    x = jnp.ones((4, 16))
    for s in (2, np.int64(2), np.float64(2.0), 2.0):
        assert float(quantize(x, s).scale_inv) == 0.5
    with pytest.raises(ValueError, match="not exactly representable"):
        quantize(x, 2**24 + 1)
    q = quantize(x, 4)
    assert float(qj.dequantize(q.q, 1)[0, 0]) == 4.0 == float(qj.dequantize(q.q, np.int32(1))[0, 0])
    with pytest.raises(TypeError, match="boolean"):
        quantize(x, True)


@pytest.mark.parametrize("bad", [0.0, 1e-40, -2.0, np.nan, np.inf])
def test_an_invalid_scale_inside_a_step_is_never_used(bad):
    x, k = data()
    good = big_batch_grad(x, k)

    def loss(s):
        y = dense(x, k, None, s, recipe=R)
        return jnp.sum(y**2), y

    grad = jax.jit(jax.grad(loss, has_aux=True))
    step = lambda s: grad(s)[::-1]  # noqa: E731
    qstats.reset_stats()
    y, new = step(dict(good, input_scale=jnp.float32(bad)))
    jax.effects_barrier()
    assert np.all(np.isfinite(np.asarray(y)))
    # The history gives the scale again (448 / the recorded amax), and the replacement counts.
    y_good, new_good = step(good)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_good))
    assert_same(new, new_good)
    assert qstats.stats()["invalid_scales"] == 1
    # With no history the previous scale is unknown: 1, as a fresh state.
    y, _ = step(
        dict(init_state(R), input_scale=jnp.float32(bad), input_amax_history=jnp.full(4, np.nan))
    )
    jax.effects_barrier()
    assert np.all(np.isfinite(np.asarray(y)))
    assert qstats.stats()["invalid_scales"] == 2


# ---- a state that is not threaded ---------------------------------------------------------


def test_a_state_that_is_not_threaded_is_reported_once():
    x, k = data()
    state = init_state(R)
    step = jax.jit(jax.grad(lambda s, x: jnp.sum(dense(x, k, None, s, recipe=R) ** 2)))
    qstats.reset_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(delayed_state.UNTHREADED_AFTER + 4):
            step(state, x * (i + 1))  # the new state is dropped: the bug
        jax.effects_barrier()
    assert qstats.stats()["unthreaded_states"] == 1
    assert sum("not passed to the next step" in str(w.message) for w in caught) == 1
    # Threaded, nothing is reported.
    qstats.reset_stats()
    for i in range(delayed_state.UNTHREADED_AFTER + 4):
        state = step(state, x)
    jax.effects_barrier()
    assert qstats.stats()["unthreaded_states"] == 0


def test_reporting_is_one_condition_per_layer_and_can_be_switched_off():
    x, k = data()

    def traced():  # a new function: a traced one keeps what it was traced with
        return str(
            jax.make_jaxpr(jax.grad(lambda s: jnp.sum(dense(x, k, None, s, recipe=R) ** 2)))(
                init_state(R)
            )
        )

    on = traced()
    delayed_state.set_reporting(False)
    try:
        off = traced()
    finally:
        delayed_state.set_reporting(True)
    assert on.count("cond[") == 1 and on.count("debug_callback[") >= 1
    assert "cond[" not in off and "debug_callback" not in off
