"""qmesh.jax.dense: the FP8 dense layer against float64 references (on the quantized operands:
tight; on the exact operands: FP8 tolerances), gradients against jax.grad of a plain-JAX
layer, the delayed-scaling state update, sharded == unsharded, the collectives in the HLO of
a sharded step, the bf16 fallback and bad input."""

import re

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
from qmesh.jax import dense as dense_module
from qmesh.jax import stats as qstats
from qmesh.jax.dense import dense, init_state
from qmesh.jax.layernorm_dense import layernorm_dense
from qmesh.jax.recipe import DelayedScaling, Float8CurrentScaling

B, S, K, N = 8, 4, 32, 64
E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


def gelu64(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def dgelu64(x):
    t = np.tanh(0.7978845608028654 * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x)


def qdq(x, scale, dtype):
    """float64 value of x's FP8 codes with `scale` (the reference quantizer)."""
    return ref.quantize(x, scale, dtype).view(dtype).astype(np.float64) / np.float64(
        np.float32(scale)
    )


def data(rng):
    x = rng.standard_normal((B, S, K)).astype(np.float32)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    r = rng.standard_normal((B, S, N)).astype(np.float32)  # the output gradient
    return x, w, b, r


def plain_layer(x, w, b, activation):
    y = x @ w + (0 if b is None else b)
    return qj.gemm.gelu(y) if activation == "gelu" else y


def step(recipe, activation, with_bias):
    """(y, grads) of sum(dense(...) * r), jitted."""

    def loss(x, w, b, state, r):
        return jnp.sum(dense(x, w, b, state, recipe=recipe, activation=activation) * r)

    def f(x, w, b, state, r):
        y = dense(x, w, b, state, recipe=recipe, activation=activation)
        grads = jax.grad(loss, argnums=(0, 1, 2, 3))(x, w, b, state, r)
        return y, grads

    return jax.jit(f)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize(
    "recipe",
    [DelayedScaling(amax_history_len=4), Float8CurrentScaling()],
    ids=["delayed", "current"],
)
def test_forward_and_gradients_match_references(rng, recipe, activation, with_bias):
    x, w, b, r = data(rng)
    b = b if with_bias else None
    state = init_state(recipe)
    y, (dx, dw, db, new_state) = step(recipe, activation, with_bias)(x, w, b, state, r)
    delayed = isinstance(recipe, DelayedScaling)
    # The scales the layer used: the state's (1) or each tensor's current scale.
    sx = np.float32(1) if not delayed else np.float32(state["input_scale"])
    sw = np.float32(1) if not delayed else np.float32(state["kernel_scale"])
    if not delayed:
        sx, sw = ref.current_scale(ref.amax(x), E4M3), ref.current_scale(ref.amax(w), E4M3)
    xq, wq = qdq(x.reshape(-1, K), sx, E4M3), qdq(w, sw, E4M3)
    pre = xq @ wq + (0 if b is None else b.astype(np.float64))
    want = gelu64(pre) if activation else pre
    assert y.shape == (B, S, N) and y.dtype == jnp.float32
    assert ref.rel_err(y.reshape(-1, N), want) < 1e-5
    # Against the exact operands: FP8 (E4M3) error.
    exact = plain_layer(x.astype(np.float64), w.astype(np.float64), b, None).reshape(-1, N)
    exact = gelu64(exact) if activation else exact
    assert ref.rel_err(y.reshape(-1, N), exact) < 0.06
    # Backward, on the quantized residuals and the E5M2 output gradient.
    g = r.reshape(-1, N).astype(np.float64)
    if activation:
        g = (g * dgelu64(np.asarray(pre, np.float32).astype(np.float64))).astype(np.float32)
    g = np.asarray(g, np.float32)
    sg = np.float32(1) if delayed else ref.current_scale(ref.amax(g), E5M2)
    gq = qdq(g, sg, E5M2)
    assert ref.rel_err(dx.reshape(-1, K), gq @ wq.T) < 1e-5
    assert ref.rel_err(dw, xq.T @ gq) < 1e-5
    if with_bias:
        assert ref.rel_err(db, g.astype(np.float64).sum(axis=0)) < 1e-5
    else:
        assert db is None
    # Against jax.grad of the plain float32 layer: FP8 (E4M3 x E5M2) error.
    loss = lambda x_, w_, b_: jnp.sum(plain_layer(x_, w_, b_, activation) * r)  # noqa: E731
    want_grads = jax.grad(loss, argnums=(0, 1) + ((2,) if with_bias else ()))(x, w, b)
    for got, want_g in zip((dx, dw, db), want_grads):
        assert ref.rel_err(got, want_g) < 0.15
    if delayed:
        assert set(new_state) == set(state)
    else:
        assert new_state is None and state is None


def test_delayed_state_follows_the_recipe_step_by_step(rng):
    recipe = DelayedScaling(amax_history_len=3, margin=1.0)
    x, w, b, r = data(rng)
    f = step(recipe, None, True)
    state = init_state(recipe)
    history = np.zeros((3, 3), np.float32)
    scale = np.ones(3, np.float32)
    maxima = [448.0, 448.0, 57344.0]
    grad_scales = []
    for i in range(4):
        xi, ri = x * (i + 1), r * (10.0**i)
        _, (_, _, _, new) = f(xi, w, b, state, ri)
        # This step's scales come from the amaxes of the earlier steps (row 0 the newest);
        # then the step's amaxes (the output gradient's is max|r|: no activation) fill row 0.
        history, scale = ref.delayed_update(history, scale, maxima, recipe.margin, "max")
        history[0] = [ref.amax(xi), ref.amax(w), ref.amax(ri)]
        for j, name in enumerate(("input", "kernel", "output_grad")):
            np.testing.assert_array_equal(np.asarray(new[f"{name}_amax_history"]), history[:, j])
            assert np.float32(new[f"{name}_scale"]) == scale[j], (i, name)
        state = new  # what TrainState.apply_gradients does with _overwrite_with_gradient
        grad_scales.append(scale[2])
    assert grad_scales[1] > grad_scales[2] > grad_scales[3]  # followed the growing amax


def test_next_step_quantizes_with_the_updated_scale(rng):
    recipe = DelayedScaling(amax_history_len=2)
    x, w, b, r = data(rng)
    x = x * 300.0  # saturates E4M3 with scale 1
    f = step(recipe, None, True)
    y1, (_, _, _, state) = f(x, w, b, init_state(recipe), r)
    y2, (_, _, _, state2) = f(x, w, b, state, r)
    exact = x.reshape(-1, K).astype(np.float64) @ w + b
    assert ref.rel_err(y2.reshape(-1, N), exact) < 0.06 < ref.rel_err(y1.reshape(-1, N), exact)
    # The state keeps the scales each step used: 1 in step 1, then 448 / amax of step 1.
    assert np.float32(state["input_scale"]) == 1.0
    sx, sw = np.float32(448.0) / ref.amax(x), np.float32(448.0) / ref.amax(w)
    assert np.float32(state2["input_scale"]) == sx and np.float32(state2["kernel_scale"]) == sw
    want = qdq(x.reshape(-1, K), sx, E4M3) @ qdq(w, sw, E4M3) + b
    assert ref.rel_err(y2.reshape(-1, N), want) < 1e-5


LAYOUTS = [  # (x spec, kernel spec, bias spec): column parallel, row parallel, data parallel
    (P("dp", None, None), P(None, "tp"), P("tp")),
    (P("dp", None, "tp"), P("tp", None), P(None)),
    (P(("dp", "tp"), None, None), P(None, None), P(None)),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["column", "row", "dp"])
@pytest.mark.parametrize(
    "recipe",
    [DelayedScaling(amax_history_len=4), Float8CurrentScaling()],
    ids=["delayed", "current"],
)
def test_sharded_equals_unsharded(mesh, rng, recipe, layout):
    x, w, b, r = data(rng)
    x[1, 2, 3] = 40.0  # one device's shard holds the global amax
    xs, ws, bs = layout
    put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))  # noqa: E731
    f = step(recipe, "gelu", True)
    state = init_state(recipe)
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        got = f(put(x, xs), put(w, ws), put(b, bs), state, put(r, xs))
    want = f(x, w, b, state, r)
    for g, wv in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == wv.shape and g.dtype == wv.dtype
        if np.any(np.asarray(wv)):
            assert ref.rel_err(g, wv) < 1e-5
        else:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(wv))
    if state is not None:
        new = got[1][3]
        for leaf in jax.tree.leaves(new):  # every device holds the same global amaxes
            assert len({np.asarray(s.data).tobytes() for s in leaf.addressable_shards}) == 1
        assert float(np.max(new["input_amax_history"])) == 40.0


def count(hlo, op):
    return hlo.count(f" {op}(") + hlo.count(f" {op}-start(")


def all_reduces(hlo):
    """The all-reduce instructions as (result shape text, reduction computation name)."""
    out = []
    for line in hlo.splitlines():
        if " all-reduce(" in line or " all-reduce-start(" in line:
            shape = line.split("=", 1)[1].split(" all-reduce")[0].strip()
            out.append((shape, line.split("to_apply=")[1].split(",")[0]))
    return out


def test_hlo_of_a_sharded_step_has_the_promised_collectives(rng):
    mesh = make_mesh((2, 4))
    x, w, b, r = data(rng)
    put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))  # noqa: E731
    recipe = DelayedScaling(amax_history_len=4)
    args = (
        put(x, P("dp", None, None)),
        put(w, P(None, "tp")),
        put(b, P("tp")),
        init_state(recipe),
        put(r, P("dp", None, "tp")),
    )
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        hlo = step(recipe, None, True).lower(*args).compile().as_text()
    assert count(hlo, "all-gather") == 0, hlo  # the kernel stays sharded
    assert count(hlo, "reduce-scatter") == 0 and count(hlo, "all-to-all") == 0, hlo
    reduces = all_reduces(hlo)
    comps = {c: hlo.split(f"\n{c} (")[1].split("\n}")[0] for _, c in reduces}
    maxes = [s for s, c in reduces if "maximum" in comps[c]]
    sums = [s for s, c in reduces if "add" in comps[c]]
    # One all-reduce (max) for the step's three amaxes (input, kernel, output gradient).
    assert len(maxes) == 1 and maxes[0].count("f32[]") == 3, reduces
    # Sums: dgrad over tp (the contracting dimension N is tp-sharded), wgrad and the bias
    # gradient over dp (the tokens); nothing else.
    assert len(sums) + len(maxes) == len(reduces) and 1 <= len(sums) <= 3, reduces
    assert sum(s.count("f32[") for s in sums) == 3, reduces


def test_fallback_is_opt_in_and_counted(rng, monkeypatch):
    x, w, b, r = data(rng)
    x, w, b = x[..., :24], w[:24, :40], b[:40]  # K=24, N=40: not multiples of 16
    monkeypatch.setattr(dense_module, "backend_platform", lambda: "cuda")
    recipe = DelayedScaling(amax_history_len=4)
    state = init_state(recipe)
    with pytest.raises(ValueError, match="multiples of 16.*fallback='bf16'"):
        dense(x, w, b, state, recipe=recipe)
    qstats.reset_stats()
    loss = lambda x_, w_, s_: jnp.sum(dense(x_, w_, b, s_, recipe=recipe, fallback="bf16"))  # noqa: E731
    y = dense(x, w, b, state, recipe=recipe, fallback="bf16")
    _, _, new_state = jax.grad(loss, argnums=(0, 1, 2))(x, w, state)
    counted = qstats.stats()
    assert counted["fallbacks"] >= 2 and all(
        "multiples of 16" in k for k in counted["fallback_reasons"]
    )
    want = x.reshape(-1, 24).astype(np.float64) @ w + b
    assert ref.rel_err(y.reshape(-1, 40), want) < 0.01
    for k in state:  # the FP8 state passes through unchanged
        np.testing.assert_array_equal(np.asarray(new_state[k]), np.asarray(state[k]))


def test_bad_input_raises():
    x, w = jnp.ones((4, 32)), jnp.ones((32, 16))
    recipe = DelayedScaling(amax_history_len=4)
    with pytest.raises(TypeError, match="recipe"):
        dense(x, w, recipe="fp8")
    with pytest.raises(ValueError, match="same K"):
        dense(x, jnp.ones((16, 16)), state=init_state(recipe), recipe=recipe)
    with pytest.raises(ValueError, match="bias must be"):
        dense(x, w, jnp.ones(8), init_state(recipe), recipe=recipe)
    with pytest.raises(ValueError, match="init_state"):
        dense(x, w, recipe=recipe)
    with pytest.raises(ValueError, match=r"amax_history must be \[4\]"):
        dense(x, w, state=init_state(DelayedScaling(amax_history_len=8)), recipe=recipe)
    with pytest.raises(ValueError, match="keeps no state"):
        dense(x, w, state=init_state(recipe), recipe=Float8CurrentScaling())
    with pytest.raises(ValueError, match="activation"):
        dense(x, w, state=init_state(recipe), recipe=recipe, activation="swish")
    for fallback in (None, "bf16"):  # integers are refused even with the fallback
        with pytest.raises(TypeError, match="x must be a floating dtype"):
            dense(
                jnp.ones((4, 32), jnp.int32),
                w,
                state=init_state(recipe),
                recipe=recipe,
                fallback=fallback,
            )
    for out_dtype in (jnp.float8_e4m3fn, jnp.int8):  # would saturate or wrap silently
        with pytest.raises(TypeError, match="out_dtype must be a floating dtype wider than FP8"):
            dense(x, w, jnp.ones(16), init_state(recipe), recipe=recipe, out_dtype=out_dtype)


@pytest.mark.parametrize("policy", ["everything_saveable", "nothing_saveable", "qmesh"])
def test_remat_keeps_fp8_residuals_exact(rng, policy):
    # E4M3 codes >= 256 and subnormals: jax.checkpoint's reduce_precision on float residuals
    # would turn them into NaN and 0; dense keeps its residuals as uint8.
    from qmesh.jax.checkpoint_policies import checkpoint_dots_and_qmesh_gemms

    pol = (
        checkpoint_dots_and_qmesh_gemms
        if policy == "qmesh"
        else getattr(jax.checkpoint_policies, policy)
    )
    x, w, b, r = data(rng)
    x[0, 0, :4] = [400.0, -300.0, 0.004, -0.003]
    recipe = Float8CurrentScaling()
    loss = lambda x_, w_: jnp.sum(dense(x_, w_, b, None, recipe=recipe) * r)  # noqa: E731
    want = jax.value_and_grad(loss, argnums=(0, 1))(x, w)
    got = jax.jit(jax.value_and_grad(jax.checkpoint(loss, policy=pol), argnums=(0, 1)))(x, w)
    for g, wv in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.all(np.isfinite(np.asarray(g)))
        np.testing.assert_allclose(np.asarray(g), np.asarray(wv), rtol=1e-6, atol=1e-6)


def _equations(jaxpr):
    """Every equation of `jaxpr` and of the jaxprs in its equations' parameters."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from _equations(sub)


FP8_OR_BITS = (*qj.common.FP8_DTYPES, jnp.dtype(jnp.uint8))


def _layers(rng):
    """(name, loss of the parameters) for the FP8 entry points, both recipes."""
    x, w, b, r = data(rng)
    gamma, beta = jnp.ones((K,)), jnp.zeros((K,))
    cases = []
    for recipe in (DelayedScaling(amax_history_len=4), Float8CurrentScaling()):
        state = init_state(recipe)
        cases.append(
            (
                f"dense-{type(recipe).__name__}",
                lambda p, recipe=recipe: jnp.sum(
                    dense(x, *p, recipe=recipe, activation="gelu") * r
                ),
                (w, b, state),
            )
        )
    recipe = DelayedScaling(amax_history_len=4)  # the fused LayerNorm + cast
    cases.append(
        (
            "layernorm_dense",
            lambda p: jnp.sum(layernorm_dense(x, gamma, beta, *p, recipe=recipe)[0] * r),
            (w, b, init_state(recipe)),
        )
    )
    return cases


def test_fp8_operands_are_read_in_the_tn_form_without_transposes(rng):
    """Forward and backward read every FP8 operand from the copy contiguous along K (the fused
    casts' columnwise copies): every GEMM is in the TN form that CUDA's FP8 GEMM takes, and
    no FP8 data (nor its uint8 bits) is transposed, in the program or in XLA's optimized HLO."""
    for name, loss, params in _layers(rng):
        grad = jax.grad(loss)
        jaxpr = jax.make_jaxpr(grad)(params).jaxpr
        gemms = [e for e in _equations(jaxpr) if e.primitive.name == "qmesh_gemm"]
        assert len(gemms) == 3, name
        for e in gemms:
            assert (e.params["trans_a"], e.params["trans_b"]) == (False, True), (name, e)
        moved = [
            e
            for e in _equations(jaxpr)
            if e.primitive.name == "transpose" and e.invars[0].aval.dtype in FP8_OR_BITS
        ]
        assert not moved, (name, moved)
        hlo = jax.jit(grad).lower(params).compile().as_text()
        transposed = re.compile(r"= (f8e\w+|u8)\[[^\]]*\](\{[^}]*\})? transpose\(")
        assert not [line for line in hlo.splitlines() if transposed.search(line)], name
