"""qmesh.jax.flax.LayerNorm: LayerNorm and RMSNorm (zero-centred gamma or not, float32 and
bfloat16 inputs) against float64 numpy forward and backward references, its parameters and
their logical axes, sharded == unsharded, bad input."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax.flax import LayerNorm, logical_axis_rules

EPS = 1e-5


def norm64(x, gamma, beta, rms):
    """(y, backward(g) -> (dx, dgamma, dbeta)) of LayerNorm / RMSNorm over the last
    dimension in float64 (the gradients written out by hand)."""
    x = np.asarray(x, np.float64)
    gamma = np.asarray(gamma, np.float64)
    if rms:
        r = 1 / np.sqrt(np.mean(x * x, -1, keepdims=True) + EPS)
        xhat = x * r
    else:
        mu = x.mean(-1, keepdims=True)
        r = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS)
        xhat = (x - mu) * r
    y = xhat * gamma + (0 if rms else np.asarray(beta, np.float64))

    def backward(g):
        g = np.asarray(g, np.float64)
        gg = g * gamma
        dx = r * (gg - np.mean(gg * xhat, -1, keepdims=True) * xhat)
        if not rms:
            dx -= r * np.mean(gg, -1, keepdims=True)
        rows = tuple(range(x.ndim - 1))
        return dx, (g * xhat).sum(rows), None if rms else g.sum(rows)

    return y, backward


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zc"])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_forward_and_gradients_match_float64(rng, kind, zero_centered, dtype):
    x = jnp.asarray((rng.standard_normal((4, 6, 64)) * 2 + 0.5).astype(np.float32)).astype(dtype)
    g = jnp.asarray(rng.standard_normal((4, 6, 64)).astype(np.float32)).astype(dtype)
    module = LayerNorm(epsilon=EPS, layernorm_type=kind, zero_centered_gamma=zero_centered)
    v = module.init(jax.random.key(0), x)
    params = v["params"]
    assert set(params) == ({"scale"} if kind == "rmsnorm" else {"scale", "ln_bias"})
    init = 0.0 if zero_centered else 1.0
    np.testing.assert_array_equal(np.asarray(params["scale"].value), np.full(64, init))
    # Non-trivial parameters.
    scale = jnp.asarray(rng.uniform(-0.5, 0.5, 64).astype(np.float32)) + (1 - init)
    v = {
        "params": {
            k: p.replace_boxed(scale if k == "scale" else p.value + 0.3) for k, p in params.items()
        }
    }
    gamma = np.asarray(scale, np.float64) + (1.0 if zero_centered else 0.0)
    beta = None if kind == "rmsnorm" else np.full(64, 0.3)
    y, vjp = jax.vjp(lambda v_, x_: module.apply(v_, x_), v, x)
    dv, dx = vjp(g)
    want, backward = norm64(np.asarray(x, np.float32), gamma, beta, kind == "rmsnorm")
    assert y.dtype == dtype and y.shape == x.shape
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    assert ref.rel_err(np.asarray(y, np.float32), want) < tol
    want_dx, want_dgamma, want_dbeta = backward(np.asarray(g, np.float32))
    assert ref.rel_err(np.asarray(dx, np.float32), want_dx) < tol
    assert ref.rel_err(dv["params"]["scale"].value, want_dgamma) < tol
    if kind == "layernorm":
        assert ref.rel_err(dv["params"]["ln_bias"].value, want_dbeta) < tol


def test_initialisers_and_logical_axes():
    x = jnp.ones((2, 8, 32))
    module = LayerNorm(
        scale_init=nn.initializers.constant(2.0),
        bias_init=nn.initializers.constant(-1.0),
        scale_axes=("mlp",),
        bias_axes=("embed",),
        dtype=jnp.bfloat16,
    )
    v = module.init(jax.random.key(0), x)
    assert v["params"]["scale"].value.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(v["params"]["scale"].value, np.float32), 2.0)
    specs = nn.get_partition_spec(v)["params"]
    assert specs["scale"] == P("mlp") and specs["ln_bias"] == P("embed")
    # A constant row normalises to beta.
    np.testing.assert_array_equal(np.asarray(module.apply(v, x)), -1.0)
    rules = logical_axis_rules(qj.MeshResource(tp_resource="tp"))
    assert nn.logical_to_mesh_axes(("mlp",), rules) == P("tp")


def test_sharded_equals_unsharded(mesh, rng):
    x = jnp.asarray(rng.standard_normal((8, 4, 64)).astype(np.float32))
    for kind in ("layernorm", "rmsnorm"):
        module = LayerNorm(layernorm_type=kind)
        v = module.init(jax.random.key(0), x)

        def f(v, x):
            y, vjp = jax.vjp(module.apply, v, x)
            return y, vjp(jnp.sin(y))

        want = jax.jit(f)(v, x)
        xs = jax.device_put(x, NamedSharding(mesh, P("dp", "tp", None)))
        with qj.autocast(mesh_resource=qj.MeshResource(dp_resource="dp", tp_resource="tp")):
            got = jax.jit(f)(v, xs)
        assert got[0].sharding.spec[:2] == ("dp", "tp")
        ref.assert_trees_close(got, want)


def test_bad_input_raises():
    x = jnp.ones((2, 32))
    with pytest.raises(ValueError, match="layernorm_type must be one of"):
        LayerNorm(layernorm_type="batchnorm").init(jax.random.key(0), x)
    for kind in ("layernorm", "rmsnorm"):
        with pytest.raises(ValueError, match="epsilon must be > 0"):
            LayerNorm(layernorm_type=kind, epsilon=0.0).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="2 logical axes"):
        LayerNorm(scale_axes=("embed", "mlp")).init(jax.random.key(0), x)
