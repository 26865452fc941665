"""qmesh.jax quantization primitives: bit-exact against numpy/ml_dtypes references, sharded
== unsharded, the collectives in the HLO, transformations and bad input."""

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
from qmesh.jax import _ffi

FP8 = [(jnp.float8_e4m3fn, ml_dtypes.float8_e4m3fn), (jnp.float8_e5m2, ml_dtypes.float8_e5m2)]
WIDE = [jnp.float32, jnp.bfloat16, jnp.float16]
SHAPES = [(1,), (7,), (3, 5), (17, 33), (64, 128), (2, 3, 16)]


def special_values(rng, shape, dtype):
    """Random values over many magnitudes with NaN, +-inf, -0, huge and tiny entries."""
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, shape)).astype(np.float32)
    flat = x.reshape(-1)
    specials = [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1e30,
        -1e30,
        1e-30,
        448.0,
        460.0,
        57344.0,
        1e-39,
        -3e-41,
    ]  # the last two are float32 denormals
    for i, v in enumerate(specials[: flat.size]):
        flat[(i * 7919) % flat.size] = v
    return jnp.asarray(x).astype(dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("in_dtype", WIDE)
@pytest.mark.parametrize("fp8,ml", FP8)
def test_quantize_matches_reference(rng, shape, in_dtype, fp8, ml):
    x = special_values(rng, shape, in_dtype)
    scale = np.float32(0.37) if in_dtype != jnp.float32 else np.float32(3e37)  # denormals count
    r = qj.quantize(x, scale, fp8, columnwise=len(shape) == 2)
    expected = ref.quantize(np.asarray(x.astype(jnp.float32)), scale, ml)
    assert r.q.dtype == fp8 and r.q.shape == x.shape
    assert ref.codes_equal(r.q, expected, ml)
    if len(shape) == 2:
        assert ref.codes_equal(r.q_t, expected.T, ml)
    else:
        assert r.q_t.shape == (0,)
    assert np.array_equal(r.amax, ref.amax(x.astype(jnp.float32)), equal_nan=True)
    assert r.scale_inv == np.float32(1) / scale


@pytest.mark.parametrize("fp8,ml", FP8)
def test_amax_and_saturation_without_nan(rng, fp8, ml):
    x = jnp.asarray(rng.standard_normal((33, 65)).astype(np.float32) * 1e5)
    r = qj.quantize(x, np.float32(1.0), fp8)
    assert r.amax == ref.amax(x)
    assert qj.amax(x) == ref.amax(x)
    assert ref.codes_equal(r.q, ref.quantize(np.asarray(x), 1.0, ml), ml)
    assert np.abs(np.asarray(r.q.astype(jnp.float32))).max() == ref.FP8_MAX[ml]  # saturated


def test_negative_zero_and_empty():
    r = qj.quantize(jnp.array([-0.0, 0.0], jnp.float32), np.float32(1.0))
    assert list(np.asarray(r.q).view(np.uint8)) == [0x80, 0x00]
    e = qj.quantize(jnp.zeros((0, 4), jnp.float32), np.float32(2.0), columnwise=True)
    assert e.q.shape == (0, 4) and e.q_t.shape == (4, 0) and e.amax == 0 and e.scale_inv == 0.5
    assert qj.amax(jnp.zeros((0,), jnp.bfloat16)) == 0
    assert qj.dequantize(e.q, e.scale_inv).shape == (0, 4)


@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("epsilon", [0.0, 1e3])
@pytest.mark.parametrize("fp8,ml", FP8)
def test_current_scaling(rng, power_of_two, epsilon, fp8, ml):
    x = jnp.asarray(rng.standard_normal((48, 40)).astype(np.float32) * 7)
    r = qj.quantize_current(
        x, fp8, columnwise=True, power_of_two_scales=power_of_two, amax_epsilon=epsilon
    )
    s = ref.current_scale(ref.amax(x), ml, power_of_two, epsilon)
    assert r.scale == s and r.amax == ref.amax(x)
    assert ref.codes_equal(r.q, ref.quantize(np.asarray(x), s, ml), ml)
    assert ref.codes_equal(r.q_t, ref.quantize(np.asarray(x), s, ml).T, ml)
    for a in [0.0, np.inf, np.nan, 1e-40, 3.0]:
        got = qj.current_scale(
            np.float32(a), fp8, power_of_two_scales=power_of_two, amax_epsilon=epsilon
        )
        assert got == ref.current_scale(np.float32(a), ml, power_of_two, epsilon)


@pytest.mark.parametrize("out_dtype", WIDE)
@pytest.mark.parametrize("fp8,ml", FP8)
def test_dequantize(rng, out_dtype, fp8, ml):
    codes = rng.integers(0, 256, (19, 23)).astype(np.uint8)
    q = jnp.asarray(codes.view(ml))
    scale_inv = np.float32(0.0123)
    got = qj.dequantize(q, scale_inv, out_dtype)
    want = (codes.view(ml).astype(np.float32) * scale_inv).astype(jnp.dtype(out_dtype))
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("shape", [(5, 3), (64, 48), (3, 7, 16)])
def test_dbias_quantize(rng, shape):
    g = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
    (r, dbias) = qj.dbias_quantize(g, np.float32(8.0), jnp.float8_e5m2, columnwise=len(shape) == 2)
    gd = np.asarray(g, np.float64).reshape(-1, shape[-1])
    np.testing.assert_allclose(np.asarray(dbias), gd.sum(0), rtol=1e-5, atol=1e-5)
    assert ref.codes_equal(
        r.q, ref.quantize(np.asarray(g), 8.0, ml_dtypes.float8_e5m2), ml_dtypes.float8_e5m2
    )
    assert r.amax == ref.amax(g)


@pytest.mark.parametrize("columnwise", [False, True])
def test_grouped_quantize_with_an_empty_group(rng, columnwise):
    sizes = np.array([3, 0, 5, 8], np.int32)
    x = jnp.asarray(rng.standard_normal((16, 24)).astype(np.float32) * 50)
    scales = np.array([1.0, 2.0, 0.5, 4.0], np.float32)
    r = qj.grouped_quantize(x, sizes, scales, columnwise=columnwise)
    start = 0
    for g, rows in enumerate(sizes):
        part = np.asarray(x)[start : start + rows]
        want = ref.quantize(part, scales[g], ml_dtypes.float8_e4m3fn)
        assert ref.codes_equal(np.asarray(r.q)[start : start + rows], want, ml_dtypes.float8_e4m3fn)
        if columnwise:
            block = np.asarray(r.q_t)[start * 24 : (start + rows) * 24].reshape(24, rows)
            assert ref.codes_equal(block, want.T, ml_dtypes.float8_e4m3fn)
        assert r.amax[g] == (ref.amax(part) if rows else 0)
        start += rows
    with pytest.raises(Exception, match="add up to"):
        qj.grouped_quantize(x, np.array([3, 4], np.int32), scales[:2])


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0.0, 2.0])
@pytest.mark.parametrize("length", [1, 4, 16])
def test_delayed_scaling_update_rules(rng, algo, margin, length):
    from qmesh.jax.scaling import update_delayed_scaling

    recipe = qj.recipe.DelayedScaling(
        margin=margin, amax_history_len=length, amax_compute_algo=algo
    )
    n = 9
    dtypes = [jnp.float8_e4m3fn, jnp.float8_e5m2] * 4 + [jnp.float8_e4m3fn]
    maxima = [448.0 if d == jnp.float8_e4m3fn else 57344.0 for d in dtypes]
    history = np.zeros((length, n), np.float32)
    scale = np.ones(n, np.float32)
    specials = [0.0, np.nan, np.inf, 1e-42, 3e38, 1.0]
    for step in range(6):
        current = np.abs(rng.standard_normal(n)).astype(np.float32) * 10.0 ** rng.integers(-3, 3, n)
        current[step % n] = specials[step]
        history[0] = current
        want_h, want_s = ref.delayed_update(history, scale, maxima, margin, algo)
        got_h, got_s = update_delayed_scaling(history, scale, dtypes, recipe)
        np.testing.assert_array_equal(np.asarray(got_h), want_h)
        np.testing.assert_array_equal(np.asarray(got_s), want_s)
        history, scale = np.array(got_h), np.array(got_s)


SPECS = [P("dp", None), P(None, "tp"), P(("dp", "tp"), None)]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_sharded_equals_unsharded(mesh, rng, spec):
    x = rng.standard_normal((64, 32)).astype(np.float32) * 3
    x[5, 7] = 900.0  # the global amax lives on one shard only
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    ops = {
        "delayed": lambda v: tuple(qj.quantize(v, np.float32(0.5), columnwise=True)),
        "current": lambda v: tuple(qj.quantize_current(v, columnwise=True)),
        "amax": lambda v: (qj.amax(v),),
        "dequantize": lambda v: (
            qj.dequantize(qj.quantize(v, np.float32(0.5)).q, np.float32(2.0)),
        ),
    }
    for name, fn in ops.items():
        got = jax.jit(fn)(xs)
        want = fn(jnp.asarray(x))
        for g, w in zip(got, want):
            assert np.asarray(g).tobytes() == np.asarray(w).tobytes(), name
        for scalar in got[2:] if name != "dequantize" else ():
            values = {float(s.data) for s in scalar.addressable_shards}
            assert len(values) == 1, f"{name}: devices disagree on a scalar: {values}"
    # dbias: the row sums are summed over the row-sharding axes (another summation order).
    got_q, got_db = jax.jit(lambda v: qj.dbias_quantize(v, np.float32(1.0)))(xs)
    want_q, want_db = qj.dbias_quantize(jnp.asarray(x), np.float32(1.0))
    np.testing.assert_allclose(np.asarray(got_db), np.asarray(want_db), rtol=1e-5, atol=1e-4)
    assert np.array_equal(np.asarray(got_q.q).view(np.uint8), np.asarray(want_q.q).view(np.uint8))


def count(hlo, op):
    return hlo.count(f" {op}(") + hlo.count(f" {op}-start(")


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_hlo_has_one_amax_all_reduce_and_no_gather(spec):
    mesh = make_mesh((2, 4))
    xs = jax.device_put(np.ones((64, 32), np.float32), NamedSharding(mesh, spec))
    for fn in (
        lambda v: qj.quantize(v, np.float32(1.0), columnwise=True),
        lambda v: qj.quantize_current(v, columnwise=True),
    ):
        f = jax.jit(fn)
        hlo = f.lower(xs).compile().as_text()
        assert count(hlo, "all-reduce") == 1, hlo
        assert count(hlo, "all-gather") == 0 and count(hlo, "reduce-scatter") == 0
        out = f(xs)
        assert out.q.sharding.is_equivalent_to(NamedSharding(mesh, spec), 2)


def test_pipeline_axis_is_not_reduced():
    mesh = make_mesh((2, 4), ("pp", "tp"))
    x = np.ones((8, 32), np.float32)
    x[0, 0] = 100.0  # pipeline stage 0 only
    xs = jax.device_put(x, NamedSharding(mesh, P("pp", "tp")))
    with qj.global_shard_guard(qj.MeshResource(tp_resource="tp", pp_resource="pp")):
        amax = jax.jit(qj.amax)(xs)
    # Each pipeline stage keeps its own amax: one replicated result cannot say which, so
    # look at the per-device values.
    values = sorted({float(s.data) for s in amax.addressable_shards})
    assert values == [1.0, 100.0]


def test_inside_shard_map():
    mesh = make_mesh((2, 4))
    x = jnp.asarray(np.arange(64 * 32, dtype=np.float32).reshape(64, 32))

    @jax.jit
    def f(v):
        return jax.shard_map(
            lambda s: qj.quantize(s, np.float32(0.01)).q,
            mesh=mesh,
            in_specs=P("dp", "tp"),
            out_specs=P("dp", "tp"),
        )(v)

    assert np.array_equal(
        np.asarray(f(x)).view(np.uint8),
        np.asarray(qj.quantize(x, np.float32(0.01)).q).view(np.uint8),
    )


def test_vmap_gives_each_element_its_own_amax(rng):
    x = jnp.asarray(
        rng.standard_normal((3, 16, 8)).astype(np.float32) * np.array([1, 10, 100])[:, None, None]
    )
    scales = jnp.asarray([1.0, 0.5, 0.25], jnp.float32)
    r = jax.vmap(lambda v, s: tuple(qj.quantize(v, s, columnwise=True)))(x, scales)
    for i in range(3):
        one = qj.quantize(x[i], scales[i], columnwise=True)
        assert np.array_equal(np.asarray(r[0][i]).view(np.uint8), np.asarray(one.q).view(np.uint8))
        assert np.array_equal(
            np.asarray(r[1][i]).view(np.uint8), np.asarray(one.q_t).view(np.uint8)
        )
        assert r[2][i] == one.amax


def test_jit_with_donation():
    from qmesh.jax.scaling import update_delayed_scaling

    recipe = qj.recipe.DelayedScaling(amax_history_len=4)
    step = jax.jit(
        lambda h, s: update_delayed_scaling(h, s, [jnp.float8_e4m3fn] * 2, recipe),
        donate_argnums=(0, 1),
    )
    h = jnp.zeros((4, 2), jnp.float32).at[0].set(jnp.array([2.0, 4.0]))
    h2, s2 = step(h, jnp.ones(2, jnp.float32))
    assert list(np.asarray(s2)) == [224.0, 112.0] and float(h2[3, 0]) == 2.0


def test_bad_input_raises_and_the_process_survives():
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        qj.quantize(jnp.ones((4, 4), jnp.int32), np.float32(1.0))
    with pytest.raises(TypeError, match="float32 scalar"):
        qj.quantize(jnp.ones((4, 4)), jnp.ones((2,), jnp.float32))
    with pytest.raises(ValueError, match="2-D input"):
        qj.quantize(jnp.ones((2, 4, 4)), np.float32(1.0), columnwise=True)
    with pytest.raises(TypeError, match="float8_e4m3fn or float8_e5m2"):
        qj.quantize(jnp.ones((4, 4)), np.float32(1.0), jnp.bfloat16)
    with pytest.raises(TypeError, match="recipe"):
        qj.recipe.check_recipe("delayed")
    with pytest.raises(ValueError, match="amax_history_len"):
        qj.recipe.DelayedScaling(amax_history_len=0)
    mesh = make_mesh((2, 4))
    xs = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P("dp", None)))
    with pytest.raises(Exception, match="'fsdp'"):
        with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", fsdp_resource="fsdp")):
            jax.jit(qj.amax)(xs)
    explicit = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    xe = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(explicit, P("dp", None)))
    with pytest.raises(ValueError, match="AxisType.Auto"):
        qj.quantize(xe, np.float32(1.0))
    assert qj.amax(jnp.array([1.0, -3.0])) == 3.0  # still alive


def test_handler_error_comes_back_as_an_exception():
    # group sizes are runtime values: only the handler can see that they do not add up.
    with pytest.raises(Exception, match="qmesh_grouped_quantize|QmeshGroupedQuantize|add up"):
        qj.grouped_quantize(jnp.ones((4, 8)), np.array([1, 1], np.int32), np.ones(2, np.float32))
    assert qj.amax(jnp.array([2.0])) == 2.0


def test_version_mismatch_names_both_versions():
    _ffi.check_versions("0.10.2", "0.10.0")
    with pytest.raises(ImportError, match=r"0\.10\.2.*0\.11\.1"):
        _ffi.check_versions("0.10.2", "0.11.1")
    assert _ffi.built_with_jaxlib.split(".")[:2] == jax.__version__.split(".")[:2]


def test_host_threads_are_capped_per_device():
    import os

    qj.amax(jnp.ones(3))
    jax.jit(qj.amax)(jnp.ones(3))
    assert _ffi.library.qmesh_jax_set_cpu_thread_limit(-1) == -1  # refused, nothing thrown
    assert _ffi.cap_cpu_threads() == max(1, (os.cpu_count() or 1) // 8)
