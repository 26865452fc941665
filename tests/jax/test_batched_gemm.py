"""The batch of GEMMs: 3-D operands run as one strided-batched GEMM call, bit-equal to one 2-D
GEMM per element; vmap of the GEMM gives that one call where a and b are batched and their
scales are not (delayed scaling, plain dtypes), and a loop otherwise (current scaling); the
einsum drop-in's batch index ("ecd,edf->ecf") under delayed scaling, forward and backward, with
and without expert parallelism."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import make_mesh
from experts import expert_step
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT as OWG
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax import _ffi
from qmesh.jax.gemm import Epilogue, gemm
from qmesh.jax.recipe import DelayedScaling, Float8CurrentScaling

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
B, M, K, N = 3, 8, 32, 16


def fp8(rng, shape, dtype):
    """FP8 codes of values in [-4, 4] (one scale_inv for the whole batch)."""
    return jnp.asarray(rng.uniform(-4, 4, shape).astype(dtype))


def gemm_lines(compiled_text):
    """The compiled HLO's qmesh GEMM calls."""
    return [ln for ln in compiled_text.splitlines() if 'custom_call_target="qmesh_gemm"' in ln]


@pytest.mark.parametrize(
    "dtype, trans_a, trans_b, epilogue",
    [
        (jnp.float32, False, True, Epilogue.NONE),
        (jnp.bfloat16, True, False, Epilogue.BIAS),
        (E4M3, False, True, Epilogue.GELU),
        (E5M2, True, True, Epilogue.NONE),  # e5m2 x e4m3
    ],
)
def test_three_d_operands_equal_one_gemm_per_element(rng, dtype, trans_a, trans_b, epilogue):
    a_shape = (B, K, M) if trans_a else (B, M, K)
    b_shape = (B, N, K) if trans_b else (B, K, N)
    if dtype in (E4M3, E5M2):
        a, b = fp8(rng, a_shape, dtype), fp8(rng, b_shape, E4M3)
        scales = (jnp.float32(0.5), jnp.float32(0.25))
    else:
        a = jnp.asarray(rng.standard_normal(a_shape), dtype)
        b = jnp.asarray(rng.standard_normal(b_shape), dtype)
        scales = (None, None)
    bias = jnp.asarray(rng.standard_normal(N), jnp.bfloat16) if epilogue == Epilogue.BIAS else None
    kw = dict(trans_a=trans_a, trans_b=trans_b, epilogue=epilogue, bias=bias)
    kw["out_dtype"] = jnp.bfloat16
    got = jax.jit(lambda a, b: gemm(a, b, *scales, **kw))(a, b)
    assert got.shape == (B, M, N)
    for i in range(B):
        np.testing.assert_array_equal(
            np.asarray(got[i]), np.asarray(gemm(a[i], b[i], *scales, **kw))
        )
    # And against float64: the product of the decoded operands, rounded once to bf16.
    s = [1.0 if x is None else float(x) for x in scales]
    a64 = np.asarray(a.astype(jnp.float32), np.float64) * s[0]
    b64 = np.asarray(b.astype(jnp.float32), np.float64) * s[1]
    want = np.swapaxes(a64, 1, 2) if trans_a else a64
    want = want @ (np.swapaxes(b64, 1, 2) if trans_b else b64)
    if bias is not None:
        want = want + np.asarray(bias.astype(jnp.float32), np.float64)
    if epilogue == Epilogue.GELU:
        want = 0.5 * want * (1 + np.tanh(np.sqrt(2 / np.pi) * (want + 0.044715 * want**3)))
    err = np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want)
    assert err < 2.0**-8 + 1e-5


def test_vmap_with_shared_scales_is_one_call_and_with_batched_scales_a_loop(rng):
    a, b = fp8(rng, (B, M, K), E4M3), fp8(rng, (B, N, K), E4M3)
    scale = jnp.float32(0.5)
    shared = jax.jit(jax.vmap(lambda a, b: gemm(a, b, scale, scale)))
    lines = gemm_lines(shared.lower(a, b).compile().as_text())
    assert len(lines) == 1 and "while/body" not in lines[0] and f"[{B},{M},{N}]" in lines[0]
    scales = jnp.asarray([0.5, 0.25, 2.0], jnp.float32)
    per_element = jax.jit(jax.vmap(lambda a, b, s: gemm(a, b, s, scale)))
    lines = gemm_lines(per_element.lower(a, b, scales).compile().as_text())
    assert len(lines) == 1 and "while/body" in lines[0]
    got, looped = shared(a, b), per_element(a, b, jnp.full((B,), 0.5, jnp.float32))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(looped))


def test_batched_epilogues_and_blocks_are_refused(rng):
    a, b = jnp.ones((B, M, K)), jnp.ones((B, N, K))
    with pytest.raises(ValueError, match="takes epilogue NONE, BIAS or GELU, not BIAS_GRAD"):
        gemm(a, b, epilogue=Epilogue.BIAS_GRAD)
    codes, s = jnp.ones((B, M, 128), E4M3), jnp.ones((1, 1), jnp.float32)
    with pytest.raises(ValueError, match="per-tensor FP8 or plain operands, not block-scaled"):
        gemm(codes, codes, s, s, a_block=1, b_block=1)
    with pytest.raises(ValueError, match="batches of different sizes"):
        gemm(a, jnp.ones((B + 1, N, K)))
    with pytest.raises(ValueError, match="must be 2-D"):
        gemm(a, b[0])
    # vmap of an epilogue with per-element results keeps the loop, and stays exact.
    got = jax.vmap(lambda a, b: gemm(a, b, epilogue=Epilogue.BIAS_GRAD))(a, b)
    np.testing.assert_array_equal(np.asarray(got[1]), np.full((B, M), K, np.float32))


def test_cuda_lowering_of_a_batch_keeps_the_workspace_result():
    a, b = jnp.ones((B, M, K), jnp.bfloat16), jnp.ones((B, N, K), jnp.bfloat16)
    f = jax.jit(lambda a, b: gemm(a, b))
    size = _ffi.library.qmesh_jax_gemm_workspace_bytes()
    text = f.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    lines = [ln for ln in text.splitlines() if "custom_call @qmesh_gemm" in ln]
    assert len(lines) == 1 and f"tensor<{size}xui8>" in lines[0]
    assert f"tensor<{B}x{M}x{N}xf32>" in lines[0]


def test_delayed_experts_are_one_batched_gemm_each_way_equal_to_dense_per_expert(rng):
    recipe = DelayedScaling(amax_history_len=4)
    x, w, v, f = expert_step(rng, recipe)
    compiled = jax.jit(f).lower(v, x, w).compile()
    lines = gemm_lines(compiled.as_text())
    # forward, dgrad, wgrad (and the forward again inside grad): none in a loop, all batched
    assert len(lines) >= 3 and all("while/body" not in ln and "[4," in ln for ln in lines), lines
    y, (_, dx, dw) = compiled(v, x, w)
    # The reference: qmesh's 2-D dense per expert with the one state (the step's scales come
    # from the state, not from this batch's amaxes), its vjp with y's cotangent 2 y.
    state = v[OWG]
    for i in range(x.shape[0]):
        dense = lambda a, b: qj.dense(a, b, None, state, recipe=recipe)  # noqa: E731
        yi, vjp = jax.vjp(dense, x[i], w[i])
        dxi, dwi = vjp(2 * yi)
        np.testing.assert_array_equal(np.asarray(y[i]), np.asarray(yi))
        np.testing.assert_array_equal(np.asarray(dx[i]), np.asarray(dxi))
        np.testing.assert_array_equal(np.asarray(dw[i]), np.asarray(dwi))


def test_current_scaling_experts_keep_the_loop(rng):
    x, w, v, f = expert_step(rng, Float8CurrentScaling())
    lines = gemm_lines(jax.jit(f).lower(v, x, w).compile().as_text())
    assert lines and all("while/body" in ln for ln in lines)


def test_delayed_experts_over_ep_run_one_batched_gemm_per_device(rng):
    mesh = make_mesh((2,), ("ep",))
    x, w, v, f = expert_step(rng, DelayedScaling(amax_history_len=4))
    want = jax.jit(f)(v, x, w)
    xs, ws = (jax.device_put(a, NamedSharding(mesh, P("ep"))) for a in (x, w))
    with jax.set_mesh(mesh), qj.autocast(mesh_resource=qj.MeshResource(ep_resource="ep")):
        compiled = jax.jit(f).lower(v, xs, ws).compile()
        got = compiled(v, xs, ws)
    lines = gemm_lines(compiled.as_text())
    # each device's two experts: one call [2, ...] per GEMM, no loop, nothing gathered
    assert lines and all("while/body" not in ln and "[2," in ln for ln in lines), lines
    assert "all-gather" not in compiled.as_text()
    jax.tree.map(np.testing.assert_array_equal, got, want)


@pytest.mark.parametrize(
    "spec, tp_role, out_spec",
    [
        (P("dp", None, None), "tp_resource", P("dp")),
        (P("dp", None, "tp"), "tp_resource", P("dp")),  # K summed over tp
        (P("dp", None, "tp"), "tpsp_resource", P("dp", "tp")),  # reduce-scattered along M
    ],
    ids=["batch", "batch-and-k", "batch-and-k-sequence-parallel"],
)
def test_sharded_batch_equals_unsharded(rng, spec, tp_role, out_spec):
    mesh = make_mesh((2, 2))
    a, b = fp8(rng, (4, M, K), E4M3), fp8(rng, (4, N, K), E4M3)
    scale = jnp.float32(0.5)
    batched = jax.vmap(lambda a, b: gemm(a, b, scale, scale, epilogue=Epilogue.GELU))
    want = jax.jit(batched)(a, b)
    put = lambda x: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
    f = jax.jit(batched, out_shardings=NamedSharding(mesh, out_spec))
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", **{tp_role: "tp"})):
        compiled = f.lower(put(a), put(b)).compile()
    got = compiled(put(a), put(b))
    # the batch stays split over dp (nothing gathered); a split K is summed (or, sequence
    # parallel, reduce-scattered) over tp
    text = compiled.as_text()
    assert "all-gather" not in text
    assert ("all-reduce" in text) == (tp_role == "tp_resource" and spec[2] == "tp")
    assert ("reduce-scatter" in text) == (tp_role == "tpsp_resource")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
