"""qmesh.jax LayerNorm and RMSNorm: forward, backward and the norm fused with the FP8 cast
against float64 references and against the unfused composition (the norm alone, then the
cast: the same bits), sharded == unsharded, the collectives in the HLO, transformations and
bad input."""

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
from qmesh.jax.layer_norm import (
    layer_norm,
    layer_norm_bwd,
    layer_norm_fwd,
    norm_fwd_amax,
    norm_fwd_quantize,
    rms_norm,
)
from qmesh.jax.quantize import quantize

EPS = 1e-5


def ln64(x, gamma, beta, eps=EPS):
    """LayerNorm over the last dimension in float64."""
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - mean) * rstd * gamma + beta, mean[..., 0], rstd[..., 0]


def ln64_backward(dy, x, gamma, eps=EPS):
    """(dx, dgamma, dbeta) of LayerNorm in float64, from the closed form."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    _, mean, rstd = ln64(x, gamma, np.zeros_like(gamma), eps)
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dy * gamma
    dx = rstd[..., None] * (
        g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)
    )
    rows = tuple(range(x.ndim - 1))
    return dx, (dy * xhat).sum(rows), dy.sum(rows)


def inputs(rng, shape):
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    gamma = (rng.standard_normal(shape[-1]) * 0.5 + 1).astype(np.float32)
    beta = (rng.standard_normal(shape[-1]) * 0.1).astype(np.float32)
    return x, gamma, beta


def close(got, want, rtol=2e-5, atol=2e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (16, 64), (2, 5, 33)])
def test_forward_and_backward_match_float64(rng, shape):
    x, gamma, beta = inputs(rng, shape)
    y, mean, rstd = layer_norm_fwd(x, gamma, beta, EPS)
    want_y, want_mean, want_rstd = ln64(x, gamma, beta)
    close(y, want_y)
    close(mean, want_mean)
    close(rstd, want_rstd, rtol=1e-5)
    dy = rng.standard_normal(shape).astype(np.float32)
    dx, dgamma, dbeta = layer_norm_bwd(dy, x, gamma, mean, rstd)
    want = ln64_backward(dy, x, gamma)
    close(dx, want[0], rtol=1e-4, atol=1e-4)
    close(dgamma, want[1], rtol=1e-4, atol=1e-4)
    close(dbeta, want[2], rtol=1e-5, atol=1e-4)


def test_grad_of_the_custom_vjp_equals_the_float64_backward(rng):
    x, gamma, beta = inputs(rng, (8, 32))
    dy = rng.standard_normal((8, 32)).astype(np.float32)
    loss = lambda x, g, b: jnp.sum(layer_norm(x, g, b, EPS) * dy)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, gamma, beta)
    for got, want in zip(grads, ln64_backward(dy, x, gamma)):
        close(got, want, rtol=1e-4, atol=1e-4)


def rms64(x, gamma, eps=EPS):
    """(y, rstd) of RMSNorm over the last dimension in float64."""
    x = np.asarray(x, np.float64)
    rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x * rstd * gamma, rstd[..., 0]


def test_rms_norm_and_its_gradient_match_float64(rng):
    x, gamma, _ = inputs(rng, (6, 37))
    dy = rng.standard_normal((6, 37)).astype(np.float32)
    y, rstd = rms64(x, gamma)
    close(rms_norm(x, gamma, EPS), y)
    close(norm_fwd_amax(x, gamma, None, eps=EPS)[3], rstd, rtol=1e-5)
    dx, dgamma = jax.jit(jax.grad(lambda v, g: jnp.sum(rms_norm(v, g, EPS) * dy), (0, 1)))(x, gamma)
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    g = dy64 * gamma
    want_dx = rstd[:, None] * (g - x64 * rstd[:, None] ** 2 * (g * x64).mean(-1, keepdims=True))
    close(dx, want_dx, rtol=1e-4, atol=1e-4)
    close(dgamma, (dy64 * x64 * rstd[:, None]).sum(0), rtol=1e-4, atol=1e-4)


NORMS = ["layernorm", "rmsnorm"]


@pytest.mark.parametrize(
    "fp8,ml",
    [(jnp.float8_e4m3fn, ml_dtypes.float8_e4m3fn), (jnp.float8_e5m2, ml_dtypes.float8_e5m2)],
)
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fused_quantize_equals_the_norm_then_quantize(rng, fp8, ml, columnwise, norm, dtype):
    x, gamma, beta = inputs(rng, (24, 300))
    x = jnp.asarray(x, dtype)
    beta = beta if norm == "layernorm" else None
    scale = np.float32(37.0)  # saturates part of the e4m3 range
    y, q, mean, rstd = norm_fwd_quantize(x, gamma, beta, scale, fp8, eps=EPS, columnwise=columnwise)
    y2, amax2, mean2, rstd2 = norm_fwd_amax(x, gamma, beta, eps=EPS)
    assert y.dtype == dtype and np.asarray(y).tobytes() == np.asarray(y2).tobytes()
    assert np.asarray(rstd).tobytes() == np.asarray(rstd2).tobytes()
    if norm == "layernorm":
        assert np.asarray(mean).tobytes() == np.asarray(mean2).tobytes()
        if dtype == jnp.float32:  # the float32 LayerNorm op gives the same bits
            assert (
                np.asarray(y).tobytes()
                == np.asarray(layer_norm_fwd(x, gamma, beta, EPS)[0]).tobytes()
            )
    else:
        assert mean is None and mean2 is None
    unfused = quantize(y2, scale, fp8, columnwise=columnwise)
    for a, b in ((q.q, unfused.q), (q.q_t, unfused.q_t), (q.amax, amax2), (q.amax, unfused.amax)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    y32 = np.asarray(y, np.float32)
    assert ref.codes_equal(q.q, ref.quantize(y32, scale, ml), ml)
    if columnwise:
        assert ref.codes_equal(q.q_t, ref.quantize(y32.T, scale, ml), ml)
    assert float(q.amax) == float(ref.amax(y32))
    assert float(q.scale_inv) == float(np.float32(1) / scale)
    want = ln64(x, gamma, beta)[0] if norm == "layernorm" else rms64(x, gamma)[0]
    close(
        y32,
        want,
        rtol=1e-2 if dtype == jnp.bfloat16 else 2e-5,
        atol=1e-2 if dtype == jnp.bfloat16 else 2e-5,
    )


def test_nan_rows_stay_in_their_rows(rng):
    x, gamma, beta = inputs(rng, (4, 16))
    x[2, 3] = np.nan
    y, q, _, _ = norm_fwd_quantize(x, gamma, beta, np.float32(1.0))
    y = np.asarray(y)
    assert np.isnan(y[2]).all() and np.isfinite(np.delete(y, 2, axis=0)).all()
    assert np.isnan(float(q.amax))


def test_empty_rows():
    x = jnp.zeros((0, 8), jnp.float32)
    y, mean, rstd = layer_norm_fwd(x, jnp.ones(8), jnp.zeros(8))
    assert y.shape == (0, 8) and mean.shape == (0,) and rstd.shape == (0,)
    for beta in (jnp.zeros(8), None):
        y, q, _, rstd = norm_fwd_quantize(x, jnp.ones(8), beta, np.float32(2.0), columnwise=True)
        assert y.shape == (0, 8) and q.q_t.shape == (8, 0) and rstd.shape == (0,)
        assert float(q.amax) == 0.0 and float(q.scale_inv) == 0.5


SPECS = [P("dp", None), P(("dp", "tp"), None)]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_sharded_equals_unsharded(mesh, rng, spec):
    x, gamma, beta = inputs(rng, (32, 16))
    x[3, 5] = 50.0  # the global amax lives on one shard only
    dy = rng.standard_normal((32, 16)).astype(np.float32)
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    fwd = lambda v: layer_norm_fwd(v, gamma, beta, EPS)
    for got, want in zip(jax.jit(fwd)(xs), fwd(jnp.asarray(x))):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    loss = lambda v, g, b: jnp.sum(layer_norm(v, g, b, EPS) * dy)
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(xs, gamma, beta)
    want = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(x), gamma, beta)
    assert np.asarray(got[0]).tobytes() == np.asarray(want[0]).tobytes()
    for g, w in zip(got[1:], want[1:]):  # summed over the shards: another order
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    quant = lambda v: norm_fwd_quantize(v, gamma, beta, np.float32(4.0), eps=EPS)[1]
    got_q, want_q = jax.jit(quant)(xs), quant(jnp.asarray(x))
    assert np.asarray(got_q.q).tobytes() == np.asarray(want_q.q).tobytes()
    assert {float(s.data) for s in got_q.amax.addressable_shards} == {float(want_q.amax)}


def count(hlo, op):
    return hlo.count(f" {op}(") + hlo.count(f" {op}-start(")


def test_hlo_of_sharded_rows():
    mesh = make_mesh((2, 4))
    xs = jax.device_put(np.ones((32, 16), np.float32), NamedSharding(mesh, P(("dp", "tp"), None)))
    g, b = np.ones(16, np.float32), np.zeros(16, np.float32)
    fwd = jax.jit(lambda v: layer_norm_fwd(v, g, b)[0]).lower(xs).compile().as_text()
    assert count(fwd, "all-reduce") == 0 and count(fwd, "all-gather") == 0
    quant = jax.jit(lambda v: tuple(norm_fwd_quantize(v, g, b, np.float32(1.0))[1][:3]))
    assert count(quant.lower(xs).compile().as_text(), "all-reduce") == 1  # the amax
    grad = jax.jit(jax.grad(lambda v, g: jnp.sum(layer_norm(v, g, b)), argnums=(0, 1)))
    hlo = grad.lower(xs, g).compile().as_text()
    assert count(hlo, "all-gather") == 0  # dgamma/dbeta are summed, never gathered


def test_vmap_equals_a_loop(rng):
    x, gamma, beta = inputs(rng, (3, 4, 8))
    got = jax.vmap(lambda v: layer_norm_fwd(v, gamma, beta)[0])(x)
    for i in range(3):
        want = layer_norm_fwd(x[i], gamma, beta)[0]
        assert np.asarray(got[i]).tobytes() == np.asarray(want).tobytes()
    # the fused norm, RMSNorm (an empty beta) included: each element gets its own amax
    for b in (beta, None):
        got = jax.vmap(lambda v: norm_fwd_quantize(v, gamma, b, 2.0)[1][:3:2])(x)
        for i in range(3):
            want = norm_fwd_quantize(x[i], gamma, b, 2.0)[1][:3:2]
            for a, w in zip(got, want):
                assert np.asarray(a[i]).tobytes() == np.asarray(w).tobytes()


def test_bad_input_raises_and_the_process_survives():
    x = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(TypeError, match="float32"):
        layer_norm_fwd(x.astype(jnp.bfloat16), jnp.ones(8), jnp.zeros(8))
    with pytest.raises(ValueError, match="gamma must be \\[8\\]"):
        layer_norm_fwd(x, jnp.ones(7), jnp.zeros(8))
    with pytest.raises(ValueError, match="eps must be > 0"):
        layer_norm_fwd(x, jnp.ones(8), jnp.zeros(8), 0.0)
    with pytest.raises(ValueError, match="mean must have shape"):
        layer_norm_bwd(x, x, jnp.ones(8), jnp.zeros(3), jnp.ones(4))
    with pytest.raises(TypeError, match="float8_e4m3fn or float8_e5m2"):
        norm_fwd_quantize(x, jnp.ones(8), jnp.zeros(8), np.float32(1), jnp.bfloat16)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        norm_fwd_quantize(x.astype(jnp.float16), jnp.ones(8), None, np.float32(1))
    assert float(qj.amax(jnp.array([1.0, -3.0]))) == 3.0  # still alive
