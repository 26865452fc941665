"""The handlers give bit for bit what qmesh's C++ library gives on the same data when called
directly (tests/jax/reference_ops.cpp, loaded with ctypes): nothing is lost between XLA's
buffers and the ops (dtypes, layouts, scalars)."""

import ctypes
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from test_quantize import special_values

import qmesh.jax as qj
from qmesh.jax.block_quantize import layout_shape, to_layout
from qmesh.jax.gemm import gemm

path = os.environ.get("QMESH_JAX_REFERENCE_LIBRARY")
if not path:
    pytest.skip("QMESH_JAX_REFERENCE_LIBRARY is not set (ctest sets it)", allow_module_level=True)
lib = ctypes.CDLL(path)

DTYPE = {
    np.dtype(np.float32): 0,
    np.dtype(np.float16): 1,
    np.dtype(ml_dtypes.bfloat16): 2,
    np.dtype(ml_dtypes.float8_e4m3fn): 3,
    np.dtype(ml_dtypes.float8_e5m2): 4,
}
FP8 = [(jnp.float8_e4m3fn, ml_dtypes.float8_e4m3fn), (jnp.float8_e5m2, ml_dtypes.float8_e5m2)]


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def cpp_quantize(x, scale, fp8, columnwise):
    x = np.ascontiguousarray(x)
    rows, cols = (1, x.size) if x.ndim == 1 else (int(np.prod(x.shape[:-1])), x.shape[-1])
    q = np.zeros(x.shape, fp8)
    q_t = np.zeros((cols, rows), fp8) if columnwise else None
    s = np.array([scale], np.float32)
    amax, scale_inv = np.zeros(1, np.float32), np.zeros(1, np.float32)
    rc = lib.qmesh_ref_quantize(
        ptr(x),
        DTYPE[x.dtype],
        ctypes.c_int64(rows),
        ctypes.c_int64(cols),
        ptr(s),
        DTYPE[np.dtype(fp8)],
        ptr(q),
        ptr(q_t) if columnwise else None,
        ptr(amax),
        ptr(scale_inv),
    )
    assert rc == 0
    return q, q_t, amax[0], scale_inv[0]


@pytest.mark.parametrize("in_dtype", [jnp.float32, jnp.bfloat16, jnp.float16], ids=str)
@pytest.mark.parametrize("fp8,ml", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize(
    "shape,columnwise", [((257,), False), ((33, 65), True), ((4, 6, 10), False)]
)
def test_quantize_equals_the_library(rng, in_dtype, fp8, ml, shape, columnwise):
    x = special_values(rng, shape, in_dtype)
    scale = np.float32(3.5)
    got = qj.quantize(x, scale, fp8, columnwise=columnwise)
    q, q_t, amax, scale_inv = cpp_quantize(np.asarray(x), scale, ml, columnwise)
    assert np.asarray(got.q).view(np.uint8).tobytes() == q.view(np.uint8).tobytes()
    if columnwise:
        assert np.asarray(got.q_t).view(np.uint8).tobytes() == q_t.view(np.uint8).tobytes()
    assert np.asarray(got.amax).tobytes() == amax.tobytes()
    assert np.asarray(got.scale_inv).tobytes() == scale_inv.tobytes()


@pytest.mark.parametrize(
    "a_fp8,b_fp8", [(0, 0), (0, 1), (1, 0)], ids=["e4m3xe4m3", "e4m3xe5m2", "e5m2xe4m3"]
)
def test_fp8_gemm_equals_the_library(rng, a_fp8, b_fp8):
    m, n, k = 48, 40, 96
    (ja, ma), (jb, mb) = FP8[a_fp8], FP8[b_fp8]
    a = np.asarray(
        qj.quantize(rng.standard_normal((m, k)).astype(np.float32), np.float32(30), ja).q
    )
    b = np.asarray(
        qj.quantize(rng.standard_normal((n, k)).astype(np.float32), np.float32(20), jb).q
    )
    asi, bsi = np.array([1 / 30], np.float32), np.array([1 / 20], np.float32)
    got = np.asarray(gemm(a, b, asi[0], bsi[0]))
    d = np.zeros((m, n), np.float32)
    assert (
        lib.qmesh_ref_gemm_fp8_tn(
            ptr(a),
            DTYPE[np.dtype(ma)],
            ptr(asi),
            ptr(b),
            DTYPE[np.dtype(mb)],
            ptr(bsi),
            ctypes.c_int64(m),
            ctypes.c_int64(n),
            ctypes.c_int64(k),
            ptr(d),
        )
        == 0
    )
    assert got.tobytes() == d.tobytes()


def cpp_block_quantize(x, fp8, block, power_2):
    x = np.ascontiguousarray(x)
    rows, cols = x.shape
    q, q_t = np.zeros((rows, cols), fp8), np.zeros((cols, rows), fp8)
    s = np.zeros(layout_shape(rows, cols, block), np.float32)
    s_t = np.zeros(layout_shape(cols, rows, block), np.float32)
    rc = lib.qmesh_ref_block_quantize(
        ptr(x),
        DTYPE[x.dtype],
        ctypes.c_int64(rows),
        ctypes.c_int64(cols),
        DTYPE[np.dtype(fp8)],
        ctypes.c_int(block),
        ctypes.c_bool(power_2),
        ctypes.c_float(0.0),
        ptr(q),
        ptr(s),
        ptr(q_t),
        ptr(s_t),
    )
    assert rc == 0
    return q, s, q_t, s_t


@pytest.mark.parametrize("in_dtype", [jnp.float32, jnp.bfloat16], ids=str)
@pytest.mark.parametrize("fp8,ml", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("block", [1, 2])
@pytest.mark.parametrize("power_2", [True, False])
def test_block_quantize_equals_the_library(rng, in_dtype, fp8, ml, block, power_2):
    x = special_values(rng, (130, 260), in_dtype)
    got = qj.block_quantize(x, fp8, block=block, columnwise=True, power_2_scale=power_2)
    want = cpp_block_quantize(np.asarray(x), ml, block, power_2)
    # The library's scales are JAX's (one per block) in the C++ layout, padding zero.
    got = (got[0], to_layout(got[1], block), got[2], to_layout(got[3], block))
    for g, w in zip(got, want):
        assert np.asarray(g).tobytes() == w.tobytes()
