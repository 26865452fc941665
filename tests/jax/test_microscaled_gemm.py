"""The FFI handler of MXFP8 / NVFP4 GEMMs (qmesh_microscaled_gemm, microscaled_gemm.py) on host
buffers: equal to the Python emulation within float32 GEMM rounding (1e-6 relative) for the
dense layer's fprop, dgrad and wgrad GEMMs of both formats, through the dense layer with the
handler forced on the CPU (microscaled_gemm._HANDLER_ON_CPU) and called directly; its errors
for bad operands and without emulation; under vmap; the emulated-GEMM count; and sharded
operands (rows split, K gathered: the same bits as unsharded)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax import microscaled_gemm as mg
from qmesh.jax import mxfp8_dense, nvfp4_dense
from qmesh.jax import stats as qstats
from qmesh.jax.mxfp8 import mxfp8_quantize
from qmesh.jax.nvfp4 import nvfp4_quantize
from qmesh.jax.recipe import MXFP8BlockScaling, NVFP4BlockScaling

RECIPES = {
    "mxfp8": MXFP8BlockScaling(emulate=True),
    "nvfp4": NVFP4BlockScaling(emulate=True),
}


def rel(a, want):
    a, want = np.asarray(a, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(a - want) / np.linalg.norm(want)


def dense_and_grads(recipe, handler, monkeypatch):
    """y, dx, dk, db of a GELU dense layer, its GEMMs through the handler or not."""
    monkeypatch.setattr(mg, "_HANDLER_ON_CPU", handler)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    k = (rng.standard_normal((96, 32)) / 10).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    g = rng.standard_normal((64, 32)).astype(np.float32)
    key = jax.random.key(3)

    def f(x, k, b):
        return qj.dense(x, k, b, recipe=recipe, activation="gelu", sr_key=key)

    assert ("qmesh_microscaled_gemm" in jax.jit(f).lower(x, k, b).as_text()) == handler
    y, vjp = jax.vjp(jax.jit(f), x, k, b)
    return (y, *vjp(g))


@pytest.mark.parametrize("fmt", RECIPES)
def test_dense_through_the_handler_equals_the_python_emulation(fmt, monkeypatch):
    recipe = RECIPES[fmt]
    qstats.reset_stats()
    handler = dense_and_grads(recipe, True, monkeypatch)
    counted = qstats.stats()["emulated_gemms"]  # the host has no native GEMM: counted
    qstats.reset_stats()
    python = dense_and_grads(recipe, False, monkeypatch)
    assert counted == qstats.stats()["emulated_gemms"] >= 3
    for name, h, p in zip(("y", "dx", "dk", "db"), handler, python):
        assert rel(h, p) < 1e-6, name


# (M, N, K) of a dense layer's fprop [tokens, out, in], dgrad [tokens, in, out] and wgrad
# [in, out, tokens] GEMMs.
SHAPES = {"fprop": (64, 32, 96), "dgrad": (64, 96, 32), "wgrad": (96, 32, 64)}


def copies(fmt, m, n, k, seed=0):
    """The K-contiguous copies of A [M, K] and B [N, K] and the Python emulation's product."""
    rng = np.random.default_rng((seed, m, n, k))
    a = jnp.asarray(rng.standard_normal((m, k)) * 3, jnp.float32)
    b = jnp.asarray(rng.standard_normal((n, k)) / 5, jnp.float32)
    if fmt == "mxfp8":
        a_q, b_q = mxfp8_quantize(a)[:2], mxfp8_quantize(b, jnp.float8_e5m2)[:2]
        return a_q, b_q, mxfp8_dense.emulated_gemm(a_q, b_q)
    a_q, b_q = nvfp4_quantize(a)[:3], nvfp4_quantize(b, tiles_2d=True)[:3]
    return a_q, b_q, nvfp4_dense.emulated_gemm(a_q, b_q)


def call(fmt, a, b, emulate=True):
    a_si, b_si = (a[2], b[2]) if fmt == "nvfp4" else (None, None)
    return mg.handler_gemm(a[0], a[1], a_si, b[0], b[1], b_si, emulate=emulate)


@pytest.mark.parametrize("gemm", SHAPES)
@pytest.mark.parametrize("fmt", RECIPES)
def test_the_handler_equals_the_python_emulation(fmt, gemm):
    m, n, k = SHAPES[gemm]
    a, b, want = copies(fmt, m, n, k)
    got = call(fmt, a, b)
    assert got.shape == (m, n) and got.dtype == jnp.float32
    assert rel(got, want) < 1e-6


def test_the_handler_under_vmap_runs_each_element():
    pairs = [copies("nvfp4", 32, 16, 64, seed)[:2] for seed in (1, 2)]
    a, b = (jax.tree.map(lambda *xs: jnp.stack(xs), *side) for side in zip(*pairs))
    got = jax.vmap(lambda a, b: call("nvfp4", a, b))(a, b)
    for i, (a_i, b_i) in enumerate(pairs):
        np.testing.assert_array_equal(got[i], call("nvfp4", a_i, b_i))


def test_bad_operands_are_named():
    a, b, _ = copies("mxfp8", 32, 32, 64)
    a4, b4, _ = copies("nvfp4", 32, 32, 64)
    errors = jax.errors.JaxRuntimeError
    with pytest.raises(errors, match="operands pair only with"):
        mg.handler_gemm(a[0], a[1], None, b4[0], b4[1], b4[2], emulate=True)
    with pytest.raises(errors, match="must hold MXFP8 codes"):
        mg.handler_gemm(a[0].astype(jnp.float32), a[1], None, *b, None, emulate=True)
    with pytest.raises(errors, match="a scale must have shape"):
        mg.handler_gemm(a[0], a[1][:, :1], None, *b, None, emulate=True)
    with pytest.raises(errors, match="inner dimensions differ"):
        mg.handler_gemm(*a, None, b[0][:, :32], b[1][:, :1], None, emulate=True)
    with pytest.raises(errors, match="a scale_inv must have shape \\[1\\]"):
        mg.handler_gemm(*a4[:2], jnp.ones((2,), jnp.float32), *b4, emulate=True)


def test_without_emulation_the_cpp_error_names_the_device(monkeypatch):
    monkeypatch.delenv("QMESH_BLOCK_EMULATION", raising=False)
    a, b, _ = copies("mxfp8", 32, 32, 64)
    with pytest.raises(jax.errors.JaxRuntimeError, match="no native MXFP8 GEMM. Set MXFP8Block"):
        call("mxfp8", a, b, emulate=False)


# ---- sharding (a 2 x 2 mesh of host devices, the handler forced on the CPU) --------------------


def _put(mesh, v, *spec):
    return jax.device_put(v, NamedSharding(mesh, P(*spec)))


def _bits(x):
    return np.asarray(x).view(np.uint32 if np.asarray(x).dtype == np.float32 else np.uint8)


@pytest.mark.parametrize("fmt", RECIPES)
def test_sharded_dense_equals_unsharded(fmt, monkeypatch):
    """x over dp (rows), the kernel over tp (N): forward and backward as unsharded, bit for bit
    where only M splits (dx), within float32 rounding where N splits (the host BLAS sums in an
    order that depends on N); the forward GEMM runs on each device's rows of x and columns of
    the kernel: no all-gather (the casts are partitioned, NVFP4's with stochastic rounding and
    RHT too; nvfp4.py)."""
    monkeypatch.setattr(mg, "_HANDLER_ON_CPU", True)
    mesh = make_mesh((2, 2))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((128, 96)).astype(np.float32)
    k = (rng.standard_normal((96, 64)) / 10).astype(np.float32)
    g = rng.standard_normal((128, 64)).astype(np.float32)
    key = jax.random.key(5)

    def f(x, k):
        return qj.dense(x, k, None, recipe=RECIPES[fmt], activation="gelu", sr_key=key)

    def fwd_bwd(x, k):
        y, vjp = jax.vjp(f, x, k)
        return (y, *vjp(g))

    step = jax.jit(fwd_bwd)
    want = step(x, k)
    xs, ks = _put(mesh, x, "dp", None), _put(mesh, k, None, "tp")
    y, dx, dk = step(xs, ks)
    np.testing.assert_array_equal(_bits(dx), _bits(want[1]))
    assert rel(y, want[0]) < 1e-6 and rel(dk, want[2]) < 1e-6
    hlo = jax.jit(f).lower(xs, ks).compile().as_text()
    assert "qmesh_microscaled_gemm" in hlo
    assert "all-gather" not in hlo


@pytest.mark.parametrize("fmt", RECIPES)
def test_sharded_gemm_splits_rows_and_gathers_k(fmt, monkeypatch):
    """The rows of A over dp and of B over tp: each device multiplies its rows and nothing
    moves (bit for bit with only M split); K sharded, or rows that would cut a block: gathered,
    the same bits."""
    monkeypatch.setattr(mg, "_HANDLER_ON_CPU", True)
    mesh = make_mesh((2, 2))
    a, b, _ = copies(fmt, 64, 64, 128)
    want = call(fmt, a, b)
    f = jax.jit(lambda a, b: call(fmt, a, b))

    def rows(x, axis):
        return (_put(mesh, x[0], axis, None), _put(mesh, x[1], axis, None), *x[2:])

    got = f(rows(a, "dp"), rows(b, "tp"))
    assert got.sharding.spec == P("dp", "tp") and rel(got, want) < 1e-6
    hlo = f.lower(rows(a, "dp"), rows(b, "tp")).compile().as_text()
    assert not any(c in hlo for c in ("all-gather", "all-reduce", "all-to-all")), hlo
    np.testing.assert_array_equal(_bits(f(rows(a, "dp"), b)), _bits(want))
    a_k = (_put(mesh, a[0], None, "tp"), _put(mesh, a[1], None, "tp"), *a[2:])
    np.testing.assert_array_equal(_bits(f(a_k, b)), _bits(want))
    small_a, small_b, _ = copies(fmt, 64, 32, 96)  # 16-row shards of b: an MXFP8 block cut
    got = f(rows(small_a, ("dp", "tp")), rows(small_b, "tp"))
    assert rel(got, call(fmt, small_a, small_b)) < 1e-6
