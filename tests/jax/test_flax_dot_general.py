"""qmesh.jax.flax.make_dot_general_cls: the drop-in in nn.Dense against the unquantised model
and Flax's own FP8 path (flax.linen.fp8_ops.Fp8DotGeneral), the state in
_overwrite_with_gradient through TrainState, sharded == unsharded, the remat policy, training
a small model with optax, and bad input."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference as ref
from flax.linen import fp8_ops
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax.checkpoint_policies import checkpoint_dots_and_qmesh_gemms
from qmesh.jax.flax import make_dot_general_cls
from qmesh.jax.recipe import DelayedScaling, Float8BlockScaling, Float8CurrentScaling

OWG = fp8_ops.OVERWRITE_WITH_GRADIENT


class MLP(nn.Module):
    """Two Dense layers; `dot` is the dot_general_cls of both (None: plain)."""

    hidden: int = 64
    out: int = 16
    dot: object = None

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(self.hidden, dot_general_cls=self.dot)(x)
        x = nn.gelu(x)
        return nn.Dense(self.out, dot_general_cls=self.dot)(x)


def batch(rng, n=32, d=32):
    return jnp.asarray(rng.standard_normal((n, d)).astype(np.float32))


def test_no_parameters_state_in_the_collection(rng):
    cls = make_dot_general_cls(DelayedScaling(amax_history_len=8))
    x = batch(rng)
    plain = MLP().init(jax.random.key(0), x)
    fp8 = MLP(dot=cls).init(jax.random.key(0), x)
    # The same parameters (names, shapes, values); the state in its own collection.
    assert jax.tree.structure(plain["params"]) == jax.tree.structure(fp8["params"])
    for a, b in zip(jax.tree.leaves(plain["params"]), jax.tree.leaves(fp8["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    state = fp8[OWG]["Dense_0"]["QmeshDotGeneral_0"]
    assert set(state) == {
        f"{o}_{k}" for o in ("input", "kernel", "output_grad") for k in ("amax_history", "scale")
    }
    assert state["input_amax_history"].shape == (8,) and float(state["kernel_scale"]) == 1.0
    current = MLP(dot=make_dot_general_cls(Float8CurrentScaling())).init(jax.random.key(0), x)
    assert set(current) == {"params"}
    # The instance form works too.
    inst = nn.Dense(16, dot_general=cls()).init(jax.random.key(0), x)
    assert OWG in inst


def errors(model, variables, plain_params, x, r):
    """(forward, gradient) relative errors of `model` vs the unquantised MLP, same params."""

    def loss(m, v):
        return jnp.sum(m.apply(v, x) * r)

    y = model.apply(variables, x)
    y0 = MLP().apply({"params": plain_params}, x)
    g = jax.grad(loss, argnums=1)(model, variables)["params"]
    g0 = jax.grad(loss, argnums=1)(MLP(), {"params": plain_params})["params"]
    ge = max(ref.rel_err(a, b) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)))
    return ref.rel_err(y, y0), ge


def test_errors_no_worse_than_flax_fp8_and_state_threads_through_train_state(rng):
    x, r = batch(rng), jnp.asarray(rng.standard_normal((32, 16)).astype(np.float32))
    ours = MLP(dot=make_dot_general_cls(DelayedScaling(amax_history_len=16)))
    flax_fp8 = MLP(dot=fp8_ops.Fp8DotGeneral)
    tx = optax.sgd(0.05)
    states = {}
    for name, model in (("qmesh", ours), ("flax", flax_fp8)):
        v = model.init(jax.random.key(0), x)
        states[name] = train_state.TrainState.create(apply_fn=model.apply, params=v, tx=tx)

    for step in range(4):
        errs = {}
        for name, model in (("qmesh", ours), ("flax", flax_fp8)):
            ts = states[name]
            errs[name] = errors(model, ts.params, ts.params["params"], x * (1 + step), r)
            grads = jax.grad(lambda v: jnp.mean((model.apply(v, x * (1 + step)) - r) ** 2))(
                ts.params
            )
            states[name] = ts.apply_gradients(grads=grads)
        for i in range(2):
            assert errs["qmesh"][i] <= 1.25 * errs["flax"][i] + 1e-6, (step, errs)
        if step == 0:  # later steps saturate (the input grows faster than the history)
            assert errs["qmesh"][0] < 0.1 and errs["qmesh"][1] < 0.2  # scale 1: coarse
    # The state changed across steps and follows the delayed-scaling formula.
    st = states["qmesh"].params[OWG]["Dense_0"]["QmeshDotGeneral_0"]
    hist = np.asarray(st["input_amax_history"])
    assert np.count_nonzero(hist) == 4
    # The scale the last step used: from the amaxes of the steps before it (row 0 the newest).
    assert float(st["input_scale"]) == np.float32(448.0) / np.float32(hist[1:].max())
    assert float(st["output_grad_scale"]) != 1.0


def teacher(rng, n=256, d=32):
    x = rng.standard_normal((n, d)).astype(np.float32)
    w1 = rng.standard_normal((d, 64)).astype(np.float32) / np.sqrt(d)
    w2 = rng.standard_normal((64, 16)).astype(np.float32) / 8
    return jnp.asarray(x), jnp.asarray(np.tanh(x @ w1) @ w2)


def train(dot, x, y, steps=60):
    model = MLP(dot=dot)
    v = model.init(jax.random.key(1), x[:8])
    ts = train_state.TrainState.create(apply_fn=model.apply, params=v, tx=optax.adam(1e-2))

    @jax.jit
    def step(ts):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((ts.apply_fn(p, x) - y) ** 2))(
            ts.params
        )
        return ts.apply_gradients(grads=grads), loss

    losses = []
    for _ in range(steps):
        ts, loss = step(ts)
        losses.append(float(loss))
    return losses


def test_training_with_optax_tracks_the_plain_model(rng):
    x, y = teacher(rng)
    base = train(None, x, y)
    assert base[-1] < 0.2 * base[0]
    for recipe in (
        DelayedScaling(amax_history_len=16),
        Float8CurrentScaling(),
        Float8BlockScaling(),
    ):
        fp8 = train(make_dot_general_cls(recipe), x, y)
        assert fp8[-1] < 0.2 * fp8[0]
        assert abs(fp8[-1] - base[-1]) <= 0.05 * base[0], (recipe, fp8[-1], base[-1])


@pytest.mark.parametrize(
    "recipe",
    [DelayedScaling(amax_history_len=4), Float8CurrentScaling()],
    ids=["delayed", "current"],
)
def test_sharded_equals_unsharded(mesh, rng, recipe):
    x = jnp.asarray(rng.standard_normal((8, 4, 32)).astype(np.float32))
    model = nn.Dense(64, dot_general_cls=make_dot_general_cls(recipe))
    v = model.init(jax.random.key(0), x)

    def f(v, x):
        y = model.apply(v, x)
        return y, jax.grad(lambda v_: jnp.sum(model.apply(v_, x) ** 2))(v)

    want = jax.jit(f)(v, x)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    vs = jax.tree.map_with_path(
        lambda path, a: put(
            a,
            P(None, "tp")
            if path[-1].key == "kernel"
            else P("tp")
            if path[-1].key == "bias"
            else P(),
        ),
        v,
    )
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        got = jax.jit(f)(vs, put(x, P("dp", None, None)))
    assert got[0].sharding.spec[0] == "dp"
    ref.assert_trees_close(got, want)


def test_remat_policy_saves_gemms_and_quantization(rng):
    x = batch(rng)
    model = MLP(dot=make_dot_general_cls(DelayedScaling(amax_history_len=4)))
    v = model.init(jax.random.key(0), x)

    def loss(v, policy):
        f = jax.checkpoint(lambda v_: jnp.sum(model.apply(v_, x) ** 2), policy=policy)
        return f(v)

    def quantizes(policy):
        text = str(jax.make_jaxpr(jax.grad(lambda v_: loss(v_, policy)))(v))
        return text.count("qmesh_quantize["), text.count("qmesh_gemm[")

    saved = quantizes(checkpoint_dots_and_qmesh_gemms)
    nothing = quantizes(jax.checkpoint_policies.nothing_saveable)
    # x, kernel and the output gradient of each of the two layers: 6 quantizations, 2 forward
    # and 4 backward GEMMs, none run twice; without saving, forward's run again in backward.
    assert saved == (6, 6), saved
    assert nothing[0] > 6 and nothing[1] > 6, nothing
    g1 = jax.grad(loss)(v, checkpoint_dots_and_qmesh_gemms)
    g2 = jax.grad(lambda v_: jnp.sum(model.apply(v_, x) ** 2))(v)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):  # XLA fuses gelu' differently
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-6)


def test_bad_input_raises(rng):
    with pytest.raises(TypeError, match="recipe"):
        make_dot_general_cls("delayed")
    with pytest.raises(ValueError, match="fallback"):
        make_dot_general_cls(DelayedScaling(), fallback="fp16")
    cls = make_dot_general_cls(Float8CurrentScaling())
    with pytest.raises(ValueError, match="contracts no dimension"):
        cls().init(jax.random.key(0), jnp.ones((2, 4)), jnp.ones((2, 8)), (((), ()), ((), ())))


def test_batch_dimensions_map_over_one_gemm_each(rng):
    """A batched dot_general (the batch not leading) against each batch element's own
    dense call: the same FP8 GEMMs, each element scaled on its own (current scaling)."""
    recipe = Float8CurrentScaling()
    lhs = jnp.asarray(rng.standard_normal((4, 3, 32)).astype(np.float32))  # [M, B, K]
    rhs = jnp.asarray(rng.standard_normal((3, 32, 16)).astype(np.float32))  # [B, K, N]
    dims = (((2,), (1,)), ((1,), (0,)))
    cls = make_dot_general_cls(recipe)
    y = cls().apply({}, lhs, rhs, dims)
    want = jnp.stack([qj.dense(lhs[:, b], rhs[b], recipe=recipe) for b in range(3)])
    assert y.shape == (3, 4, 16)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
