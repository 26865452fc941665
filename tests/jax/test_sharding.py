"""Sharding behaviour shared by the primitives: MeshResource roles, shard_map (local shards, no
hidden collectives), shards of uneven size, Explicit mesh axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax.layer_norm import layer_norm_fwd


def count(hlo, op):
    return hlo.count(f" {op}(") + hlo.count(f" {op}-start(")


def test_inside_shard_map_each_device_sees_its_own_shard():
    """No collective is emitted inside shard_map: the amax is the shard's own; a pmax written
    by the user makes it global."""
    mesh = make_mesh((2, 4))
    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)

    def local(s):
        return qj.quantize(s, np.float32(0.01)).amax[None, None]

    def reduced(s):
        return jax.lax.pmax(qj.amax(s), ("dp", "tp"))[None, None]

    f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp")))
    got = np.asarray(f(x))
    want = np.abs(x).reshape(2, 32, 4, 8).max(axis=(1, 3))
    assert np.array_equal(got, want)
    assert count(f.lower(x).compile().as_text(), "all-reduce") == 0
    g = jax.jit(jax.shard_map(reduced, mesh=mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp")))
    assert np.all(np.asarray(g(x)) == np.abs(x).max())


def test_uneven_shards_are_replicated_not_padded(rng):
    """A dimension the mesh axes do not divide (63 rows over 2 x 4 devices) is computed
    replicated: the result equals the unsharded one (padding would enter the sums/amax)."""
    mesh = make_mesh((2, 4))
    x = rng.standard_normal((63, 12)).astype(np.float32)
    x[62, 3] = -77.0  # in the last, partial shard
    xs = jax.device_put(x, NamedSharding(mesh, P(None, None)))
    fns = {
        "quantize": lambda v: qj.quantize_current(v).q,
        "amax": qj.amax,
        "dbias": lambda v: qj.dbias_quantize(v, np.float32(1.0))[1],
        "layer_norm": lambda v: layer_norm_fwd(v, jnp.ones(12), jnp.zeros(12))[0],
    }
    for name, fn in fns.items():
        constrained = jax.jit(
            lambda v, fn=fn: fn(
                jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P(("dp", "tp"), None)))
            )
        )
        got, want = constrained(xs), fn(jnp.asarray(x))
        if name == "dbias":  # a sum: the order may differ, the padded rows must not enter it
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-5)
        else:
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), name
    assert float(qj.amax(xs)) == 77.0


def test_a_slice_of_an_even_shard_does_not_read_the_padding():
    """The issue's reproducer: rows 6..15 of x are cut off inside jit, the 6 rows left do not
    divide over 4 devices, and XLA pads the shards; row 7 (100.0) must not be read."""
    from jax.sharding import AxisType

    mesh = jax.make_mesh((4,), ("dp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:4])
    x = jax.random.normal(jax.random.key(0), (16, 32)).at[7].set(100.0)
    xs = jax.device_put(x, NamedSharding(mesh, P("dp", None)))
    assert float(jax.jit(lambda v: qj.amax(v[:6]))(xs)) == float(jnp.max(jnp.abs(x[:6])))
    db = jax.jit(lambda v: qj.dbias_quantize(v[:6], jnp.float32(1))[1])(xs)
    np.testing.assert_allclose(
        np.asarray(db), np.asarray(jnp.sum(x[:6], axis=0)), rtol=1e-5, atol=1e-5
    )
    for fn in (lambda v: qj.quantize(v, jnp.float32(2)), qj.quantize_current):
        got = jax.jit(lambda v, fn=fn: fn(v[:6]))(xs)
        want = fn(x[:6])
        assert np.asarray(got.q).tobytes() == np.asarray(want.q).tobytes()
        assert float(got.amax) == float(want.amax) and float(got.scale) == float(want.scale)


def test_mesh_resource_roles():
    """A role naming a missing axis is an error that names it; global_shard_guard takes only a
    MeshResource and restores the previous one (the pipeline axis: test_quantize)."""
    mesh = make_mesh((2, 4), ("pp", "dp"))
    xs = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P("pp", "dp")))
    with pytest.raises(Exception, match="'tp'"):
        with qj.global_shard_guard(qj.MeshResource(tp_resource="tp")):
            jax.jit(qj.amax)(xs)
    with pytest.raises(TypeError, match="MeshResource"):
        with qj.global_shard_guard({"dp_resource": "dp"}):
            pass
    outer = qj.MeshResource(dp_resource="dp")
    with qj.global_shard_guard(outer):
        with qj.global_shard_guard(qj.MeshResource(pp_resource="pp")):
            assert qj.global_mesh_resource().pp_resource == "pp"
        assert qj.global_mesh_resource() == outer
    assert qj.global_mesh_resource() == qj.MeshResource()


def test_a_missing_axis_is_raised_in_python_and_a_corrected_guard_takes_effect():
    mesh = make_mesh((2, 4), ("pp", "dp"))
    x = np.ones((8, 8), np.float32)
    x[6, 0] = 5.0  # in the second pipeline stage's rows
    xs = jax.device_put(x, NamedSharding(mesh, P("pp", "dp")))
    f = jax.jit(qj.amax)
    with pytest.raises(ValueError, match=r"tp_resource is 'tp', but the mesh has only the axes"):
        with qj.global_shard_guard(qj.MeshResource(tp_resource="tp")):
            f(xs)
    with qj.global_shard_guard(qj.MeshResource(pp_resource="pp")):
        per_stage = f(xs)  # reduced within each pipeline stage only
    assert sorted({float(np.asarray(s.data)) for s in per_stage.addressable_shards}) == [1.0, 5.0]
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp")):  # corrected: over the mesh
        assert {float(np.asarray(s.data)) for s in f(xs).addressable_shards} == {5.0}


def test_an_input_created_before_set_mesh_is_computed_where_it_is():
    mesh = make_mesh((2, 4))
    x = jnp.arange(64.0).reshape(8, 8)
    with (
        jax.set_mesh(mesh),
        qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")),
    ):
        assert float(jax.jit(qj.amax)(x)) == 63.0
        assert float(jax.jit(lambda v: qj.quantize_current(v).amax)(x)) == 63.0


def test_explicit_axes_raise_with_what_to_do():
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    x = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P("dp", None)))
    for fn in (
        qj.amax,
        lambda v: qj.quantize(v, np.float32(1.0)),
        lambda v: layer_norm_fwd(v, jnp.ones(8), jnp.zeros(8)),
    ):
        with pytest.raises(ValueError, match=r"axis_types=\(jax.sharding.AxisType.Auto,\)"):
            fn(x)
    assert float(qj.amax(jnp.ones(3))) == 1.0
