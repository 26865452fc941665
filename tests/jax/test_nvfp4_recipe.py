"""The NVFP4BlockScaling recipe in JAX (docs/design/nvfp4.md "The recipe in JAX"): dense
forward and backward against float64 products of the dequantized operands (the recipe's
casts: 1x16 input and gradient blocks, 16x16 weight tiles, RHT on the wgrad operands,
stochastic rounding of the gradient), the transform cancelling in wgrad, stochastic rounding
reproducible from the key (sr_key, the Flax rng stream sr_rng), the errors without emulation
and without a key, mlp as two dense layers, the drop-ins (experts over ep_resource), and a
Flax module that trains."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax import microscaled_gemm
from qmesh.jax import stats as qstats
from qmesh.jax.collective_gemm import CollectiveGemm
from qmesh.jax.flax import (
    DenseGeneral,
    LayerNormMLP,
    logical_axis_rules,
    make_dot_general_cls,
    make_einsum_cls,
)
from qmesh.jax.mlp import mlp
from qmesh.jax.nvfp4_dense import cast, split_key
from qmesh.jax.recipe import NVFP4BlockScaling, check_recipe

RECIPE = NVFP4BlockScaling(emulate=True)
SR = {"sr_rng": jax.random.key(5)}


def deq(copy):
    """One NVFP4 copy (data, scale, scale_inv) dequantized, in float64."""
    return np.asarray(qj.nvfp4_dequantize(*copy), np.float64)


def rel(a, want):
    a = np.asarray(a, np.float64)
    return np.linalg.norm(a - want) / np.linalg.norm(want)


def operands(seed, m=32, k=64, n=48):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / 8).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal((m, n)).astype(np.float32)
    return x, w, b, g


def test_recipe_fields_and_acceptance():
    r = NVFP4BlockScaling()
    assert not (r.disable_rht or r.disable_stochastic_rounding or r.disable_2d_quantization)
    assert not r.emulate
    check_recipe(r)
    with pytest.raises(TypeError, match="disable_rht must be True or False"):
        NVFP4BlockScaling(disable_rht=1)
    with pytest.raises(ValueError, match="fp8_mha must be False"):
        NVFP4BlockScaling(fp8_mha=True)


@pytest.mark.parametrize(
    "recipe",
    [RECIPE, NVFP4BlockScaling(True, True, True, emulate=True)],
    ids=["default", "all_disabled"],
)
def test_dense_matches_float64_of_the_dequantized_operands(recipe):
    x, w, b, g = operands(1)
    key = jax.random.key(3)
    qstats.reset_stats()
    f = jax.jit(lambda x, w, b: qj.dense(x, w, b, recipe=recipe, sr_key=key))
    y, vjp = jax.vjp(f, x, w, b)
    dx, dw, db = vjp(g)
    assert qstats.stats()["emulated_gemms"] >= 3
    x_row, x_col = cast(x, recipe, "x")
    w_row, w_col = cast(w, recipe, "kernel")
    g_row, g_col = cast(g, recipe, "grad", jax.random.key_data(key))
    assert rel(y, deq(x_row) @ deq(w_col).T + b) < 1e-6
    assert rel(dx, deq(g_row) @ deq(w_row).T) < 1e-6
    assert rel(dw, deq(x_col) @ deq(g_col).T) < 1e-6
    assert rel(db, g.astype(np.float64).sum(0)) < 1e-6
    # The transform of both wgrad operands cancels: dw is x^T g up to FP4's error.
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, g))
    assert 0.01 < rel(dw, x64.T @ g64) < 0.3
    assert 0.01 < rel(y, x64 @ w64 + b) < 0.3 and 0.01 < rel(dx, g64 @ w64.T) < 0.3


def test_a_nan_reaches_the_outputs_and_gradients():
    """E2M1 holds no NaN: a copy whose amax is NaN stores a NaN per-tensor decode scale, so a
    NaN in x or in the output gradient makes what it feeds NaN instead of finite garbage."""
    x, w, b, g = operands(4)
    f = jax.jit(lambda x, w, b: qj.dense(x, w, b, recipe=RECIPE, sr_key=jax.random.key(0)))
    x[3, 5] = np.nan
    y, vjp = jax.vjp(f, x, w, b)
    assert np.isnan(np.asarray(y)).all() and np.isnan(np.asarray(vjp(g)[1])).all()
    x[3, 5] = 1.0
    g[7, 2] = np.nan
    _, vjp = jax.vjp(f, x, w, b)
    dx, dw, _ = vjp(g)
    assert np.isnan(np.asarray(dx)).all() and np.isnan(np.asarray(dw)).all()


def test_the_recipe_rules_of_each_operand():
    x, w, _, g = operands(2)
    key = jax.random.key_data(jax.random.key(0))
    w_row, _ = cast(w, RECIPE, "kernel")  # 16x16 tiles: a scale repeats down 16 rows
    scale = np.asarray(w_row[1]).view(np.uint8)
    np.testing.assert_array_equal(scale, np.repeat(scale[::16], 16, axis=0))
    _, x_col = cast(x, RECIPE, "x")  # RHT on the columnwise copy: not x^T's plain cast
    plain = qj.nvfp4_quantize(x, columnwise=True)
    assert not np.array_equal(np.asarray(x_col[0]), np.asarray(plain[3]))
    near = cast(g, NVFP4BlockScaling(disable_stochastic_rounding=True), "grad")
    assert not np.array_equal(
        np.asarray(cast(g, RECIPE, "grad", key)[0][0]), np.asarray(near[0][0])
    )


def test_stochastic_rounding_is_reproducible_from_the_key():
    x, w, _, g = operands(3)

    @jax.jit
    def grads(key):
        f = lambda x, w: jnp.sum(qj.dense(x, w, recipe=RECIPE, sr_key=key) * g)  # noqa: E731
        return jax.grad(f, (0, 1))(x, w)

    a, b, c = (grads(jax.random.key(s)) for s in (1, 1, 2))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    assert all(not np.array_equal(u, v) for u, v in zip(a, c))
    # The Flax stream: same sr_rng, same bits; another, other bits.
    model = nn.Dense(48, dot_general_cls=make_dot_general_cls(RECIPE))
    v = model.init({"params": jax.random.key(0), "sr_rng": jax.random.key(0)}, x)

    @jax.jit
    def flax_grad(key):
        loss = lambda v: jnp.sum(model.apply(v, x, rngs={"sr_rng": key}) * g)  # noqa: E731
        return jax.grad(loss)(v)["params"]["kernel"]

    a, b, c = (np.asarray(flax_grad(jax.random.key(s))) for s in (7, 7, 8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_errors_without_emulation_and_without_a_key():
    x, w, _, _ = operands(4)
    with pytest.raises(ValueError, match=r"CPU backend has no native NVFP4 GEMM.*emulate=True"):
        qj.dense(x, w, recipe=NVFP4BlockScaling(), sr_key=jax.random.key(0))
    with pytest.raises(ValueError, match="needs a key: pass sr_key="):
        qj.dense(x, w, recipe=RECIPE)
    qj.dense(x, w, recipe=NVFP4BlockScaling(disable_stochastic_rounding=True, emulate=True))
    with pytest.raises(ValueError, match="multiples of 16"):
        qj.dense(x[:, :40], w[:40], recipe=RECIPE, sr_key=jax.random.key(0))
    model = nn.Dense(48, dot_general_cls=make_dot_general_cls(RECIPE))
    with pytest.raises(ValueError, match=r"rngs=\{'sr_rng': jax.random.key\(0\)\}"):
        model.init(jax.random.key(0), x)
    with qj.autocast(recipe=RECIPE):  # a module without a recipe takes the autocast's
        with pytest.raises(ValueError, match="DenseGeneral: NVFP4BlockScaling rounds"):
            DenseGeneral(features=48).init(jax.random.key(0), x)
    ring = CollectiveGemm("ring", "column")
    with pytest.raises(NotImplementedError, match="not NVFP4BlockScaling"):
        qj.dense(x, w, recipe=RECIPE, sr_key=jax.random.key(0), collective_gemm=ring)


def test_mlp_is_two_dense_layers_with_split_keys():
    x, w1, b1, _ = operands(5, 32, 64, 96)
    w2 = (np.random.default_rng(6).standard_normal((96, 64)) / 10).astype(np.float32)
    key = jax.random.key(9)

    def fused(x, w1, w2):
        return jnp.sum(mlp(x, (w1, w2), (b1, None), recipe=RECIPE, sr_key=key) ** 2)

    def composed(x, w1, w2):
        k1, k2 = split_key(key, 2)
        h = qj.dense(x, w1, b1, recipe=RECIPE, activation="gelu", sr_key=k1)
        return jnp.sum(qj.dense(h, w2, recipe=RECIPE, sr_key=k2) ** 2)

    for a, b in zip(
        jax.grad(fused, (0, 1, 2))(x, w1, w2), jax.grad(composed, (0, 1, 2))(x, w1, w2)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_drop_ins_run_near_the_exact_product():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((2, 16, 32)), jnp.float32)
    model = nn.Dense(48, dot_general_cls=make_dot_general_cls(RECIPE))
    v = model.init({"params": jax.random.key(0), **SR}, x)
    y = jax.jit(lambda v, x: model.apply(v, x, rngs=SR))(v, x)
    want = np.asarray(x, np.float64) @ np.asarray(v["params"]["kernel"], np.float64)
    assert 0.01 < rel(y, want) < 0.3
    w = jnp.asarray(rng.standard_normal((2, 32, 16)) / 6, jnp.float32)
    einsum = make_einsum_cls(RECIPE)()
    # The second equation has a batch index: one GEMM (and one key) per batch element.
    for eqn, kernel, back in (
        ("btd,dh->bth", w[0], "bth,dh->btd"),
        ("btd,bdh->bth", w, "bth,bdh->btd"),
    ):

        def run(x):
            y, vjp = jax.vjp(lambda a: einsum.apply({}, eqn, a, kernel, rngs=SR), x)
            return y, vjp(jnp.ones_like(y))[0]

        y, dx = jax.jit(run)(x)
        exact = np.einsum(eqn, np.asarray(x, np.float64), np.asarray(kernel, np.float64))
        assert 0.01 < rel(y, exact) < 0.3
        want = np.einsum(back, np.ones(y.shape), np.asarray(kernel, np.float64))
        assert 0.01 < rel(dx, want) < 0.3


def test_a_flax_module_trains_with_the_sr_rng_stream():
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.standard_normal((4, 16, 32)), jnp.float32)
    t = jnp.tanh(x @ jnp.asarray(rng.standard_normal((32, 32)) / 6, jnp.float32))
    model = LayerNormMLP(intermediate_dim=64, recipe=RECIPE)
    params = model.init({"params": jax.random.key(0), "sr_rng": jax.random.key(1)}, x)
    tx = optax.adam(1e-2)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, key):
        def loss(p):
            return jnp.mean((model.apply(p, x, rngs={"sr_rng": key})[0] - t) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt)
        return optax.apply_updates(params, updates), opt, value

    losses = []
    for s in range(6):
        params, opt, value = step(params, opt, jax.random.fold_in(jax.random.key(2), s))
        losses.append(float(value))
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0]


def test_experts_over_ep_round_as_unsharded():
    """A batched einsum gives each expert its own key: split over ep_resource, each device
    rounds its experts' gradients with their keys, to the unsharded bits."""
    mesh = make_mesh((2, 2), ("ep", "tp"))
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.standard_normal((4, 16, 32)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((4, 32, 16)) / 6, jnp.float32)
    eqn, einsum = "ecd,edf->ecf", make_einsum_cls(RECIPE)()

    def f(x, w):
        loss = lambda x, w: jnp.sum(einsum.apply({}, eqn, x, w, rngs=SR) ** 2)  # noqa: E731
        return einsum.apply({}, eqn, x, w, rngs=SR), jax.grad(loss, (0, 1))(x, w)

    want = jax.jit(f)(x, w)
    xs, ws = (jax.device_put(a, NamedSharding(mesh, P("ep"))) for a in (x, w))
    with jax.set_mesh(mesh), qj.autocast(mesh_resource=qj.MeshResource(ep_resource="ep")):
        got = jax.jit(f)(xs, ws)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert got[0].sharding.spec[0] == "ep"


def test_mlp_over_dp_rounds_as_unsharded(monkeypatch):
    """Tokens over dp, weights replicated, the GEMMs through the handler (partitioned over
    their rows): every cast of x, h and the gradients is partitioned (stochastic rounding and
    RHT included, each shard at its place in the whole), nothing of them is gathered in float32,
    and the gradients are the unsharded bits (the loss, a sum over shards, within rounding)."""
    monkeypatch.setattr(microscaled_gemm, "_HANDLER_ON_CPU", True)
    mesh = make_mesh((2, 2), ("dp", "tp"))
    x, w1, b1, _ = operands(3, 64, 64, 96)
    w2 = (np.random.default_rng(4).standard_normal((96, 64)) / 10).astype(np.float32)
    key = jax.random.key(2)

    def loss(x, w1, w2):
        return jnp.sum(mlp(x, (w1, w2), (b1, None), recipe=RECIPE, sr_key=key) ** 2)

    step = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))
    xs = jax.device_put(x, NamedSharding(mesh, P("dp")))
    (got, got_grads), (want, want_grads) = step(xs, w1, w2), step(x, w1, w2)
    jax.tree.map(np.testing.assert_array_equal, got_grads, want_grads)
    assert abs(got - want) <= 1e-6 * abs(want)
    hlo = step.lower(xs, w1, w2).compile().as_text()
    calls = [line for line in hlo.splitlines() if "qmesh_nvfp4_quantize" in line]
    assert sum("whole_rows = 64" in line for line in calls) == 4  # x, h, and their gradients
    assert not [line for line in hlo.splitlines() if "f32[" in line and "all-gather(" in line]


def test_sequence_parallel_module_rounds_as_well_as_unsharded():
    """LayerNormMLP over tpsp (dp=2 x tp=2): the forward equals the unsharded one within
    float32 rounding; the weight gradients are another NVFP4 rounding (the columnwise blocks
    of 16 tokens hold other tokens in the sequence-parallel order, docs/flax.md), exactly as
    far from the float32 module's gradients as the unsharded run's."""
    mesh = make_mesh((2, 2))
    resource = qj.MeshResource(dp_resource="dp", tp_resource="tp", tpsp_resource="tp")
    x = jnp.asarray(np.random.default_rng(10).standard_normal((4, 32, 64)), jnp.float32)
    model = LayerNormMLP(intermediate_dim=128, recipe=RECIPE)
    boxed = model.init({"params": jax.random.key(0), **SR}, x)
    params = nn.unbox(boxed)

    def grads(model, params, x):
        loss = lambda p: jnp.mean(model.apply(p, x, rngs=SR)[0] ** 2)  # noqa: E731
        return jax.jit(jax.value_and_grad(loss))(params)

    exact = grads(LayerNormMLP(intermediate_dim=128), params, x)[1]["params"]
    loss, want = grads(model, params, x)
    shardings = nn.logical_to_mesh_sharding(
        nn.get_partition_spec(boxed), mesh, logical_axis_rules(resource)
    )
    with jax.set_mesh(mesh), qj.global_shard_guard(resource):
        got_loss, got = grads(
            model,
            jax.tree.map(jax.device_put, params, shardings),
            jax.device_put(x, NamedSharding(mesh, P("dp", "tp", None))),
        )
    np.testing.assert_allclose(got_loss, loss, rtol=1e-5)
    for name in ("wi_kernel", "wo_kernel"):
        error = rel(want["params"][name], np.asarray(exact[name], np.float64))
        got_error = rel(got["params"][name], np.asarray(exact[name], np.float64))
        assert 0.02 < error < 0.35 and abs(got_error - error) < 0.2 * error, (
            name,
            error,
            got_error,
        )
