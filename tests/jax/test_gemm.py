"""qmesh.jax.gemm: every epilogue, layout and dtype against a float64 numpy reference on the
dequantized operands, sharded == unsharded (rows and the contracting dimension sharded), the
collectives in the HLO, jit / vmap, and bad input."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import reference as ref
from conftest import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from qmesh.jax import gemm as gemm_module
from qmesh.jax.gemm import Epilogue, gemm

M, K, N = 24, 48, 40

# Operand kinds: (a dtype, b dtype) as (jax dtype, numpy/ml_dtypes dtype).
KINDS = {
    "f32": (jnp.float32, jnp.float32),
    "bf16": (jnp.bfloat16, jnp.bfloat16),
    "f16": (jnp.float16, jnp.float16),
    "e4m3": (jnp.float8_e4m3fn, jnp.float8_e4m3fn),
    "e4m3xe5m2": (jnp.float8_e4m3fn, jnp.float8_e5m2),
    "e5m2xe4m3": (jnp.float8_e5m2, jnp.float8_e4m3fn),
}
FP8 = {
    jnp.dtype(jnp.float8_e4m3fn): ml_dtypes.float8_e4m3fn,
    jnp.dtype(jnp.float8_e5m2): ml_dtypes.float8_e5m2,
}


def operand(rng, shape, dtype, scale):
    """(array, scale_inv, float64 value it stands for): FP8 codes of x * scale with
    scale_inv = 1 / scale, or x rounded to a plain dtype."""
    x = rng.standard_normal(shape).astype(np.float32)
    dtype = jnp.dtype(dtype)
    if dtype in FP8:
        ml = FP8[dtype]
        codes = ref.quantize(x, scale, ml).view(ml)
        scale_inv = np.float32(1) / np.float32(scale)
        return jnp.asarray(codes), scale_inv, codes.astype(np.float64) * np.float64(scale_inv)
    arr = jnp.asarray(x).astype(dtype)
    return arr, None, np.asarray(arr.astype(jnp.float32), np.float64)


def gelu64(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def dgelu64(x):
    t = np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))
    du = np.sqrt(2.0 / np.pi) * (1.0 + 3.0 * 0.044715 * x * x)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du


def reference(a64, b64, trans_a, trans_b, epilogue, extra64, alpha):
    """(d, extra output) in float64."""
    opa = a64.T if trans_a else a64
    opb = b64.T if trans_b else b64
    r = alpha * (opa @ opb)
    if epilogue == Epilogue.BIAS:
        return r + extra64, None
    if epilogue == Epilogue.GELU:
        return gelu64(r), None
    if epilogue == Epilogue.BIAS_GELU_AUX:
        pre = r + extra64
        return gelu64(pre), pre
    if epilogue == Epilogue.DGELU:
        return r * dgelu64(extra64), None
    if epilogue == Epilogue.BIAS_GRAD:
        return r, opa.sum(axis=1)
    return r, None


def rel_err(got, want):
    got = np.asarray(jnp.asarray(got).astype(jnp.float32), np.float64)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def assert_rounded(got, want, dtype):
    """got is want rounded to a 16-bit dtype: within one unit in the last place (the float32
    result may round the other way near a tie)."""
    ulp = {jnp.dtype(jnp.bfloat16): 2.0**-7, jnp.dtype(jnp.float16): 2.0**-10}[jnp.dtype(dtype)]
    got = np.asarray(jnp.asarray(got).astype(jnp.float32), np.float64)
    bound = ulp * np.maximum(np.abs(want), 2.0**-14) + 1e-6 * np.abs(want).max()
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()


def problem(rng, kind, trans_a, trans_b, epilogue, m=M, k=K, n=N):
    """Operands, the epilogue operand, and their float64 values."""
    da, db = KINDS[kind]
    a, asi, a64 = operand(rng, (k, m) if trans_a else (m, k), da, 24.0)
    b, bsi, b64 = operand(rng, (n, k) if trans_b else (k, n), db, 40.0)
    extra = extra64 = None
    if epilogue in (Epilogue.BIAS, Epilogue.BIAS_GELU_AUX):
        extra = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    elif epilogue == Epilogue.DGELU:
        extra = jnp.asarray(rng.standard_normal((m, n)).astype(np.float32))
    if extra is not None:
        extra64 = np.asarray(extra, np.float64)
    return (a, b, asi, bsi, extra), (a64, b64, extra64)


def call(ops, trans_a, trans_b, epilogue, **kw):
    a, b, asi, bsi, extra = ops
    kw = dict(kw, trans_a=trans_a, trans_b=trans_b, epilogue=epilogue)
    if epilogue == Epilogue.DGELU:
        kw["aux"] = extra
    elif extra is not None:
        kw["bias"] = extra
    return gemm(a, b, asi, bsi, **kw)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("epilogue", list(Epilogue), ids=lambda e: e.name)
@pytest.mark.parametrize(
    "trans_a,trans_b",
    [(False, True), (False, False), (True, False), (True, True)],
    ids=["TN", "NN", "TT'", "NT'"],
)
@pytest.mark.parametrize("kind", ["f32", "e4m3", "e4m3xe5m2"])
def test_epilogues_and_layouts_match_float64(rng, kind, trans_a, trans_b, epilogue):
    ops, (a64, b64, extra64) = problem(rng, kind, trans_a, trans_b, epilogue)
    out = as_tuple(call(ops, trans_a, trans_b, epilogue, alpha=0.75))
    want, want_extra = reference(a64, b64, trans_a, trans_b, epilogue, extra64, 0.75)
    assert out[0].shape == (M, N) and out[0].dtype == jnp.float32
    assert rel_err(out[0], want) < 1e-5
    if want_extra is None:
        assert len(out) == 1
    else:
        assert len(out) == 2
        assert out[1].shape == want_extra.shape and out[1].dtype == jnp.float32
        assert rel_err(out[1], want_extra) < 1e-5


@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("kind", list(KINDS))
def test_operand_and_output_dtypes(rng, kind, out_dtype):
    ops, (a64, b64, extra64) = problem(rng, kind, False, True, Epilogue.BIAS)
    got = call(ops, False, True, Epilogue.BIAS, out_dtype=out_dtype)
    want, _ = reference(a64, b64, False, True, Epilogue.BIAS, extra64, 1.0)
    assert got.dtype == out_dtype
    if jnp.dtype(out_dtype) == jnp.float32:
        assert rel_err(got, want) < 1e-5
    else:
        assert_rounded(got, want, out_dtype)


def test_bias_grad_dtype_and_aux_dtype_follow_their_sources(rng):
    ops, (a64, b64, _) = problem(rng, "e4m3", True, False, Epilogue.BIAS_GRAD)
    d, dbias = call(
        ops, True, False, Epilogue.BIAS_GRAD, out_dtype=jnp.bfloat16, dbias_dtype=jnp.float32
    )
    assert d.dtype == jnp.bfloat16 and dbias.dtype == jnp.float32
    assert rel_err(dbias, a64.T.sum(axis=1)) < 1e-6
    a, b, asi, bsi, _ = ops
    bias = jnp.ones((N,), jnp.bfloat16)
    _, aux = gemm(a, b, asi, bsi, trans_a=True, trans_b=False, epilogue="bias_gelu_aux", bias=bias)
    assert aux.dtype == jnp.bfloat16


def test_empty_operands(rng):
    bias = jnp.arange(N, dtype=jnp.float32)
    d = gemm(jnp.zeros((M, 0)), jnp.zeros((N, 0)), epilogue=Epilogue.BIAS, bias=bias)
    np.testing.assert_array_equal(np.asarray(d), np.broadcast_to(np.asarray(bias), (M, N)))
    d, dbias = gemm(jnp.zeros((0, K)), jnp.ones((N, K)), epilogue=Epilogue.BIAS_GRAD)
    assert d.shape == (0, N) and dbias.shape == (0,)


def test_jit_equals_eager(rng):
    ops, _ = problem(rng, "e4m3", False, True, Epilogue.BIAS_GELU_AUX)
    eager = call(ops, False, True, Epilogue.BIAS_GELU_AUX)
    jitted = jax.jit(lambda *o: call(o, False, True, Epilogue.BIAS_GELU_AUX))(*ops)
    for e, j in zip(eager, jitted):
        np.testing.assert_array_equal(np.asarray(e), np.asarray(j))


def test_vmap(rng):
    a = jnp.asarray(rng.standard_normal((3, M, K)).astype(np.float32))
    b = jnp.asarray(rng.standard_normal((3, N, K)).astype(np.float32))
    bias = jnp.asarray(rng.standard_normal(N).astype(np.float32))
    got = jax.vmap(lambda x, w: gemm(x, w, epilogue=Epilogue.BIAS, bias=bias))(a, b)
    got_shared = jax.vmap(lambda x: gemm(x, b[0]), in_axes=1, out_axes=1)(a.transpose(1, 0, 2))
    for i in range(3):
        np.testing.assert_array_equal(
            np.asarray(got[i]), np.asarray(gemm(a[i], b[i], epilogue=Epilogue.BIAS, bias=bias))
        )
        np.testing.assert_array_equal(np.asarray(got_shared[:, i]), np.asarray(gemm(a[i], b[0])))


def test_fp8_in_another_layout_is_transposed_where_only_tn_is_offered(rng, monkeypatch):
    """CUDA's FP8 GEMM takes TN only; the primitive transposes other layouts there. Run that path
    on the CPU (declared TN-only for the test): same values, a transpose in the HLO."""
    ops, (a64, b64, _) = problem(rng, "e4m3", True, False, Epilogue.BIAS_GRAD)
    want = call(ops, True, False, Epilogue.BIAS_GRAD)
    monkeypatch.setattr(gemm_module, "TN_PLATFORMS", ("cuda", "cpu"))
    f = jax.jit(lambda *o: call(o, True, False, Epilogue.BIAS_GRAD))
    got = f(*ops)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
    assert "transpose" in f.lower(*ops).as_text()


def count(hlo, op):
    return hlo.count(f" {op}(") + hlo.count(f" {op}-start(")


# (trans_a, trans_b, a spec, b spec, whether K is sharded): the layer forward with rows
# sharded, the contracting dimension sharded (row-parallel layer), both, and the weight
# gradient dW = dy^T x whose contracting dimension (the tokens) is data-parallel.
SHARDED = [
    (False, True, P("dp", None), P(None, None), False),
    (False, True, P(None, "tp"), P(None, "tp"), True),
    (False, True, P("dp", "tp"), P(None, "tp"), True),
    (False, True, P("dp", None), P("tp", None), False),
    (True, False, P("dp", None), P("dp", None), True),
]


@pytest.mark.parametrize("epilogue", list(Epilogue), ids=lambda e: e.name)
@pytest.mark.parametrize("case", SHARDED, ids=lambda c: f"{c[2]}x{c[3]}{'T' if c[0] else ''}")
@pytest.mark.parametrize("kind", ["f32", "e4m3"])
def test_sharded_equals_unsharded(mesh, rng, kind, case, epilogue):
    trans_a, trans_b, a_spec, b_spec, k_sharded = case
    ops, _ = problem(rng, kind, trans_a, trans_b, epilogue)
    a, b, asi, bsi, extra = ops
    put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
    sharded = (put(a, a_spec), put(b, b_spec), asi, bsi, extra)
    f = jax.jit(lambda *o: as_tuple(call(o, trans_a, trans_b, epilogue)))
    got = f(*sharded)
    want = as_tuple(call(ops, trans_a, trans_b, epilogue))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w64 = np.asarray(w, np.float64)
        assert g.shape == w.shape and g.dtype == w.dtype
        assert rel_err(g, w64) < 1e-6
    hlo = f.lower(*sharded).compile().as_text()
    # Partial products are summed once (D and dbias in one all-reduce); nothing is gathered
    # for a row-sharded forward.
    assert count(hlo, "all-reduce") == (1 if k_sharded else 0), hlo
    if not k_sharded and b_spec == P(None, None):
        assert count(hlo, "all-gather") == 0
        assert got[0].sharding.spec[0] == "dp"


@pytest.mark.parametrize(
    "epilogue",
    [Epilogue.NONE, Epilogue.BIAS, Epilogue.BIAS_GELU_AUX, Epilogue.DGELU, Epilogue.BIAS_GRAD],
    ids=lambda e: e.name,
)
def test_sequence_parallel_k_is_reduce_scattered(rng, epilogue):
    """K sharded over the tpsp axis and the result wanted sequence-sharded: D (and aux, dbias)
    are reduce-scattered along M over that axis, with no all-reduce and no gather, and equal
    the unsharded GEMM."""
    import qmesh.jax as qj

    mesh = make_mesh((2, 4))
    ops, _ = problem(rng, "e4m3", False, True, epilogue)
    a, b, asi, bsi, extra = ops
    put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
    want = as_tuple(call(ops, False, True, epilogue))
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tpsp_resource="tp")):
        if extra is not None and extra.ndim == 2:  # DGELU's aux arrives sequence-sharded
            extra = put(extra, P(("dp", "tp"), None))
        sharded = (put(a, P("dp", "tp")), put(b, P(None, "tp")), asi, bsi, extra)
        seq = NamedSharding(mesh, P(("dp", "tp")))  # what the next sequence-parallel op wants
        f = jax.jit(
            lambda *o: tuple(
                jax.lax.with_sharding_constraint(r, seq)
                for r in as_tuple(call(o, False, True, epilogue))
            )
        )
        got = f(*sharded)
        hlo = f.lower(*sharded).compile().as_text()
    for g, w in zip(got, want):
        assert g.shape == w.shape and rel_err(g, np.asarray(w, np.float64)) < 1e-6
        assert g.sharding.spec[0] == ("dp", "tp"), g.sharding
    assert count(hlo, "reduce-scatter") >= 1, hlo
    assert count(hlo, "all-reduce") == 0 and count(hlo, "all-gather") == 0, hlo


def test_sharded_bf16_output_sums_in_float32(rng):
    mesh = make_mesh((2, 4))
    ops, (a64, b64, _) = problem(rng, "bf16", False, True, Epilogue.NONE)
    a, b = ops[:2]
    put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
    got = jax.jit(lambda x, w: gemm(x, w, out_dtype=jnp.bfloat16))(
        put(a, P(None, "tp")), put(b, P(None, "tp"))
    )
    assert got.dtype == jnp.bfloat16
    assert_rounded(got, a64 @ b64.T, jnp.bfloat16)


def test_inside_shard_map(rng):
    mesh = make_mesh((2, 4))
    ops, _ = problem(rng, "f32", False, True, Epilogue.NONE)
    a, b = ops[:2]

    @jax.jit
    def f(x, w):
        return jax.shard_map(
            lambda xs, ws: jax.lax.psum(gemm(xs, ws), "tp"),
            mesh=mesh,
            in_specs=(P("dp", "tp"), P(None, "tp")),
            out_specs=P("dp", None),
        )(x, w)

    np.testing.assert_allclose(np.asarray(f(a, b)), np.asarray(gemm(a, b)), rtol=1e-5, atol=1e-5)


def test_bad_input_raises_and_the_process_survives(rng):
    f32 = jnp.ones((4, 8), jnp.float32)
    e4 = jnp.ones((4, 8), jnp.float8_e4m3fn)
    e5 = jnp.ones((4, 8), jnp.float8_e5m2)
    one = np.float32(1.0)
    with pytest.raises(TypeError, match="same dtype"):
        gemm(jnp.ones((4, 8), jnp.int32), jnp.ones((4, 8), jnp.int32))
    with pytest.raises(TypeError, match="same dtype"):
        gemm(f32, f32.astype(jnp.bfloat16))
    with pytest.raises(TypeError, match="both be FP8 or both"):
        gemm(e4, f32, one, one)
    with pytest.raises(TypeError, match="e5m2 x float8_e5m2"):
        gemm(e5, e5, one, one)
    with pytest.raises(TypeError, match="need a_scale_inv and b_scale_inv"):
        gemm(e4, e4)
    with pytest.raises(TypeError, match="a_scale_inv must be a float32 scalar"):
        gemm(e4, e4, jnp.ones((2,)), one)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        gemm(f32, jnp.ones((4, 9)))
    with pytest.raises(ValueError, match="a must be 2-D"):
        gemm(jnp.ones((2, 4, 8)), f32)
    with pytest.raises(ValueError, match=r"bias of epilogue BIAS must be \[N\] = \[4\]"):
        gemm(f32, f32, epilogue=Epilogue.BIAS, bias=jnp.ones(5))
    with pytest.raises(ValueError, match="needs bias"):
        gemm(f32, f32, epilogue=Epilogue.BIAS_GELU_AUX)
    with pytest.raises(ValueError, match="does not use it"):
        gemm(f32, f32, bias=jnp.ones(4))
    with pytest.raises(ValueError, match=r"aux of epilogue DGELU must be \[M, N\]"):
        gemm(f32, f32, epilogue=Epilogue.DGELU, aux=jnp.ones((4, 5)))
    with pytest.raises(ValueError, match="unknown epilogue"):
        gemm(f32, f32, epilogue="relu")
    with pytest.raises(TypeError, match="out_dtype must be"):
        gemm(f32, f32, out_dtype=jnp.int8)
    with pytest.raises(TypeError, match="out_dtype must be"):
        jax.jit(lambda x: gemm(x, x, out_dtype=jnp.float8_e4m3fn))(f32)
    np.testing.assert_array_equal(np.asarray(gemm(f32, f32)), np.full((4, 4), 8.0))  # alive


def test_handler_errors_come_back_as_exceptions():
    """The handler checks its arguments too (a call that bypasses the primitive's checks)."""
    a = jnp.ones((4, 8), jnp.float32)
    one = jnp.ones((), jnp.float32)
    attrs = dict(trans_a=False, trans_b=True, split_accumulator=False, alpha=np.float32(1.0))

    def raw(out_shapes, *args, **kw):
        return jax.ffi.ffi_call("qmesh_gemm", out_shapes)(*args, **dict(attrs, **kw))

    d = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    with pytest.raises(
        Exception,
        match=r"epilogue kBias takes 1 operand\(s\) after a, b, "
        r"a_scale_inv, b_scale_inv \(bias \[N\]\), got 0",
    ):
        raw((d,), a, a, one, one, epilogue=np.int32(1))
    with pytest.raises(Exception, match=r"epilogue kBiasGrad gives 1 result\(s\) after d"):
        raw((d,), a, a, one, one, epilogue=np.int32(5))
    with pytest.raises(Exception, match="INVALID_ARGUMENT: .*epilogue must be a GemmEpilogue"):
        raw((d,), a, a, one, one, epilogue=np.int32(9))
    with pytest.raises(Exception, match=r"GemmArgs.d must be \[4, 4\]"):
        raw((jax.ShapeDtypeStruct((4, 5), jnp.float32),), a, a, one, one, epilogue=np.int32(0))
    with pytest.raises(Exception, match="d \\(the GEMM output\\) has dtype"):
        raw((jax.ShapeDtypeStruct((4, 4), jnp.int32),), a, a, one, one, epilogue=np.int32(0))
    e4 = a.astype(jnp.float8_e4m3fn)
    with pytest.raises(Exception, match="a_scale_inv .* must hold 1 element"):
        raw((d,), e4, e4, jnp.ones((2,)), one, epilogue=np.int32(0))
    # Each kind of qmesh error has its own FFI code: a combination without a GEMM is
    # unimplemented, not an invalid argument.
    e5 = a.astype(jnp.float8_e5m2)
    with pytest.raises(Exception, match="UNIMPLEMENTED: .*fp8e5m2 × fp8e5m2 are not supported"):
        raw((d,), e5, e5, one, one, epilogue=np.int32(0))
    np.testing.assert_array_equal(np.asarray(gemm(a, a)), np.full((4, 4), 8.0))  # alive
