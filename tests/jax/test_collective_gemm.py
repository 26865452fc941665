"""Collective GEMMs from JAX (qmesh.jax.collective_gemm): the ring primitives against float64
math, the three overlap modes bit for bit, the layers' option against XLA's all-gather /
reduce-scatter path, the HLO without those collectives, and the refusals."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import reference as ref
from conftest import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sp_mlp import X_SPEC, place, place_layer, sp_layernorm_mlp

import qmesh.jax as qj
from qmesh.jax.block_quantize import block_dequantize, block_quantize
from qmesh.jax.collective_gemm import CollectiveGemm, all_gather_gemm, gemm_reduce_scatter
from qmesh.jax.dense import dense, init_state
from qmesh.jax.flax import DenseGeneral, LayerNormDenseGeneral, LayerNormMLP
from qmesh.jax.layernorm_dense import layernorm_dense

MODES = ("none", "ring", "bidir")
TPS = (2, 4, 8)
SP = qj.MeshResource(dp_resource="dp", tpsp_resource="tp", tp_resource="tp")


def mesh_for(tp):
    return make_mesh((8 // tp, tp))


def leaves_equal(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    return all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True) for x, y in zip(la, lb))


def ring(mesh, f, in_specs, out_specs):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def operands(rng, dtype, m, k, n):
    """(a, b, a_scale_inv, b_scale_inv, a64, b64): a [m, k], b [n, k] in `dtype` (FP8: codes
    with scale_inv 0.5 and 0.25) and the float64 values they stand for."""
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((n, k))
    if dtype == jnp.float8_e4m3fn:
        qa = (a / 0.5).astype(ml_dtypes.float8_e4m3fn)
        qb = (b / 0.25).astype(ml_dtypes.float8_e4m3fn)
        a64, b64 = qa.astype(np.float64) * 0.5, qb.astype(np.float64) * 0.25
        return jnp.asarray(qa), jnp.asarray(qb), jnp.float32(0.5), jnp.float32(0.25), a64, b64
    a, b = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a, b, jnp.float32(1), jnp.float32(1), a64, b64


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float8_e4m3fn])
def test_ring_primitives(rng, tp, dtype):
    """Per device in a shard_map: all_gather_gemm gathers the chunks in rank order (byte for
    byte) and multiplies; gemm_reduce_scatter sums the tp partial products and keeps this
    device's chunk; float64 math within rounding, the modes bit for bit."""
    mesh = mesh_for(tp)
    dp = 8 // tp
    a, b, sa, sb, a64, b64 = operands(rng, dtype, dp * tp * 8, 32, 24)
    got = {}
    for mode in MODES:
        ag = ring(
            mesh,
            lambda a, b, sa, sb: all_gather_gemm(a, b, sa, sb, axis="tp", overlap=mode),
            (P(("dp", "tp")), P(), P(), P()),
            (P("dp"), P("dp")),
        )
        rs = ring(
            mesh,
            lambda a, b, sa, sb: gemm_reduce_scatter(a, b, sa, sb, axis="tp", overlap=mode),
            (P("dp", "tp"), P(None, "tp"), P(), P()),
            P(("dp", "tp")),
        )
        got[mode] = (ag(a, b, sa, sb), rs(a, b, sa, sb))
    (d, gathered), reduced = got["none"]
    assert np.array_equal(np.asarray(gathered).view(np.uint8), np.asarray(a).view(np.uint8))
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    assert ref.rel_err(d, a64 @ b64.T) < tol
    assert ref.rel_err(reduced, a64 @ b64.T) < tol
    for mode in ("ring", "bidir"):
        assert leaves_equal(got[mode], got["none"]), mode


def test_block_ring_primitives(rng, tp=4):
    """1x128-block a and 128x128-tile b through both rings per device: all_gather_gemm's
    gathered codes and scales are bitwise the block cast of the whole input, both products
    match float64 math on the decoded operands, and the modes agree bit for bit."""
    mesh = mesh_for(tp)
    k = 128 * tp  # row parallel shards K into whole 128-blocks
    a = jnp.asarray(rng.standard_normal((8 * tp * 2, k)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((128, k)), jnp.float32)
    qa, sa = block_quantize(a, block=1)[:2]
    qb, sb = block_quantize(b, block=2)[:2]
    a64 = np.asarray(block_dequantize(qa, sa, block=1), np.float64)
    b64 = np.asarray(block_dequantize(qb, sb, block=2), np.float64)
    blocks = dict(axis="tp", a_block=1, b_block=2)
    got = {}
    for mode in MODES:
        ag = ring(
            mesh,
            lambda a, s, b, t: all_gather_gemm(a, b, s, t, overlap=mode, **blocks),
            (P(("dp", "tp")), P(("dp", "tp")), P(), P()),
            (P("dp"), P("dp"), P("dp")),
        )
        rs = ring(
            mesh,
            lambda a, s, b, t: gemm_reduce_scatter(a, b, s, t, overlap=mode, **blocks),
            (P("dp", "tp"), P("dp", "tp"), P(None, "tp"), P(None, "tp")),
            P(("dp", "tp")),
        )
        got[mode] = (ag(qa, sa, qb, sb), rs(qa, sa, qb, sb))
    (d, gathered, gathered_s), reduced = got["none"]
    assert np.array_equal(np.asarray(gathered).view(np.uint8), np.asarray(qa).view(np.uint8))
    assert np.array_equal(np.asarray(gathered_s), np.asarray(sa))
    assert ref.rel_err(d, a64 @ b64.T) < 1e-5
    assert ref.rel_err(reduced, a64 @ b64.T) < 1e-5
    for mode in ("ring", "bidir"):
        assert leaves_equal(got[mode], got["none"]), mode


def mlp_data(rng, b=2, s=32, h=64, f=128):
    x = rng.standard_normal((b, s, h)).astype(np.float32)
    kernels = (
        (rng.standard_normal((h, f)) / 8).astype(np.float32),
        (rng.standard_normal((f, h)) / 8).astype(np.float32),
    )
    biases = (rng.standard_normal(f).astype(np.float32), rng.standard_normal(h).astype(np.float32))
    gamma = (1 + rng.standard_normal(h) / 4).astype(np.float32)
    beta = rng.standard_normal(h).astype(np.float32) / 4
    r = rng.standard_normal((b, s, h)).astype(np.float32)
    return x, gamma, beta, kernels, biases, r


def mlp_step(cg, recipe=None):
    recipe = qj.DelayedScaling() if recipe is None else recipe

    def loss(x, gamma, beta, kernels, biases, states, r):
        y, ln = sp_layernorm_mlp(
            x, gamma, beta, kernels, biases, states, recipe=recipe, collective_gemm=cg
        )
        return jnp.sum(y * r) + jnp.sum(ln * r)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5)))


def sp_args(mesh, x, gamma, beta, kernels, biases, r):
    """The arguments placed sequence parallel (sp_mlp's placement)."""
    kernels, biases = place_layer(mesh, kernels, biases)
    return (place(mesh, x, X_SPEC), gamma, beta, kernels, biases), place(mesh, r, X_SPEC)


@pytest.mark.parametrize("tp", TPS)
def test_layernorm_mlp_modes_are_bitwise_equal(rng, tp):
    """Sequence-parallel LayerNormMLP forward and backward over three delayed-scaling steps:
    ring and bidir give the bits of "none" (the rings' unoverlapped schedule); XLA's
    all-gather / reduce-scatter path (collective_gemm=None) agrees within float32 rounding of
    the chunked GEMMs and the ring's summation order."""
    mesh = mesh_for(tp)
    x, gamma, beta, kernels, biases, r = mlp_data(rng, b=8 // tp)
    recipe = qj.DelayedScaling()
    with jax.set_mesh(mesh), qj.global_shard_guard(SP):
        args, r = sp_args(mesh, x, gamma, beta, kernels, biases, r)
        results = {}
        for cg in (None, *MODES):
            states, step = (init_state(recipe), init_state(recipe)), mlp_step(cg)
            for _ in range(3):
                out = step(*args, states, r)
                states = out[1][5]
            results[cg] = out
    for mode in ("ring", "bidir"):
        assert leaves_equal(results[mode], results["none"]), mode
    ref.assert_trees_close(results["none"], results[None], tol=1e-5)


@pytest.mark.parametrize("tp", (2, 4))
def test_block_scaling_layernorm_mlp(rng, tp):
    """Float8BlockScaling through the rings (1x128 token operands, 128x128 kernel tiles; the
    wgrad columnwise copies cast from the all-gathered high-precision tokens), fwd + bwd on a
    tp-device mesh: ring and bidir give the bits of "none", XLA's path (tokens replicated
    there: its columnwise cast would cut the shards' 128-blocks; on tp = 4) within FP8-GEMM
    rounding."""
    mesh = make_mesh((1, tp))
    x, gamma, beta, kernels, biases, r = mlp_data(rng, b=2, s=64, h=128, f=128 * tp)
    recipe = qj.Float8BlockScaling()
    results = {}
    with jax.set_mesh(mesh), qj.global_shard_guard(SP):
        for cg in (None, *MODES) if tp == 4 else MODES:
            args, placed_r = sp_args(mesh, x, gamma, beta, kernels, biases, r)
            if cg is None:
                args = (place(mesh, x, P()), *args[1:])
            results[cg] = mlp_step(cg, recipe)(*args, (None, None), placed_r)
    for mode in ("ring", "bidir"):
        assert leaves_equal(results[mode], results["none"]), mode
    if tp == 4:
        ref.assert_trees_close(results["none"], results[None], tol=1e-5)


def column_then_row(rng, mesh, recipe, dtype, modes):
    """{mode: (loss, grads)} of dense(gelu) column parallel then dense row parallel, tokens
    sequence parallel over (dp, tp) of `mesh`, for each collective_gemm mode (None: XLA's)."""
    x, _, _, (k1, k2), (b1, b2), r = mlp_data(rng)
    x, k1, k2, b1, b2, r = (jnp.asarray(v, dtype) for v in (x, k1, k2, b1, b2, r))

    def step(cg):
        def loss(x, k1, k2, b1, b2, states):
            col = None if cg is None else CollectiveGemm(cg, "column")
            row = None if cg is None else CollectiveGemm(cg, "row")
            h = dense(
                x,
                k1,
                b1,
                states[0],
                recipe=recipe,
                activation="gelu",
                row_axes=("dp",),
                collective_gemm=col,
            )
            y = dense(h, k2, b2, states[1], recipe=recipe, collective_gemm=row)
            return jnp.sum((y * r).astype(jnp.float32))

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5)))

    states = (init_state(recipe), init_state(recipe))
    put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))  # noqa: E731
    with jax.set_mesh(mesh), qj.global_shard_guard(SP):
        args = (
            put(x, P("dp", "tp", None)),
            put(k1, P(None, "tp")),
            put(k2, P("tp", None)),
            put(b1, P("tp")),
            b2,
            states,
        )
        r = put(r, P("dp", "tp", None))
        return {cg: jax.tree.map(np.asarray, step(cg)(*args)) for cg in modes}


@pytest.mark.parametrize(
    "recipe", [qj.DelayedScaling(), qj.Float8CurrentScaling()], ids=["delayed", "current"]
)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_column_then_row(rng, recipe, dtype):
    """dense(gelu) column parallel then dense row parallel, tp = 4: the modes bit for bit,
    XLA's path within FP8-GEMM rounding (bf16 outputs take the bias after the ring in
    float32, where the XLA path fuses it into a bf16 GEMM epilogue)."""
    results = column_then_row(rng, mesh_for(4), recipe, dtype, (None, *MODES))
    for mode in ("ring", "bidir"):
        assert leaves_equal(results[mode], results["none"]), mode
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    ref.assert_trees_close(results["none"], results[None], tol=tol)


def collectives_on(hlo: str) -> list[str]:
    """The all-gather / reduce-scatter instructions of a compiled module's text."""
    return [
        line.strip()
        for line in hlo.splitlines()
        if " all-gather(" in line or " all-gather-start(" in line or " reduce-scatter(" in line
    ]


def test_hlo_has_no_all_gather_or_reduce_scatter(rng):
    """The Flax LayerNormMLP, sequence parallel on a dp x tp mesh, fwd + bwd: with the option
    the compiled step has the ring calls and no all-gather or reduce-scatter; without it, XLA
    all-gathers and reduce-scatters."""
    mesh = mesh_for(4)
    x = jnp.asarray(rng.standard_normal((2, 32, 64)).astype(np.float32))
    with jax.set_mesh(mesh), qj.global_shard_guard(SP):
        x = jax.device_put(x, NamedSharding(mesh, P("dp", "tp", None)))
        texts = {}
        for cg in (None, "ring"):
            m = LayerNormMLP(intermediate_dim=128, recipe=qj.DelayedScaling(), collective_gemm=cg)
            v = m.init(jax.random.key(0), x)
            step = jax.jit(jax.grad(lambda v_, x_: jnp.sum(m.apply(v_, x_)[0] ** 2), (0, 1)))
            texts[cg] = step.lower(v, x).compile().as_text()
    assert collectives_on(texts[None])
    assert collectives_on(texts["ring"]) == []
    assert texts["ring"].count('custom_call_target="qmesh_all_gather_gemm"') == 2
    assert texts["ring"].count('custom_call_target="qmesh_gemm_reduce_scatter"') == 2


def test_autocast_sets_the_collective_gemm(rng):
    """autocast(collective_gemm=...): the layers given none lower to the ring calls inside the
    block (mlp: fc1 all-gather + GEMM, fc2 GEMM + reduce-scatter; the Flax modules in their own
    roles), inner blocks inherit it or turn it off (False), an explicit argument wins, and
    outside (and after) the block there are none."""
    mesh = make_mesh((2, 2))
    x, gamma, beta, kernels, biases, _ = mlp_data(rng, b=2)
    recipe = qj.Float8CurrentScaling()

    def rings(text):
        return (
            text.count("@qmesh_all_gather_gemm("),
            text.count("@qmesh_gemm_reduce_scatter("),
        )

    def mlp(cg=None):
        return jax.jit(
            lambda x, k, b: sp_layernorm_mlp(
                x, gamma, beta, k, b, (None, None), recipe=recipe, collective_gemm=cg
            )[0]
        )

    with jax.set_mesh(mesh):
        args = (place(mesh, x, X_SPEC), *place_layer(mesh, kernels, biases))
        calls = lambda f: rings(f.lower(*args).as_text())  # noqa: E731
        assert calls(mlp()) == (0, 0)
        with qj.autocast(recipe=recipe, mesh_resource=SP, collective_gemm="ring"):
            assert calls(mlp()) == (1, 1)
            assert calls(mlp(False)) == (0, 0)
            with qj.autocast(recipe=recipe):
                assert calls(mlp()) == (1, 1)
                with qj.autocast(recipe=recipe, collective_gemm=False):
                    assert calls(mlp()) == (0, 0)
                    assert calls(mlp("bidir")) == (1, 1)
            assert calls(mlp()) == (1, 1)
            h = jnp.zeros((2, 32, 128))
            row = DenseGeneral(
                features=64,
                kernel_axes=("mlp", "embed"),
                input_axes=("batch", None, "mlp"),
                output_axes=("batch", "seq", "embed"),
            )
            v = row.init(jax.random.key(0), h)
            assert rings(jax.jit(row.apply).lower(v, h).as_text()) == (0, 1)
        with qj.global_shard_guard(SP):
            assert calls(mlp()) == (0, 0)
    with pytest.raises(ValueError, match="overlap must be one of"):
        with qj.autocast(collective_gemm="rings"):
            pass


def test_flax_modules_modes_are_bitwise_equal(rng, tp=4):
    """LayerNormDenseGeneral (column) then DenseGeneral (row, sequence-sharded output) and
    LayerNormMLP, fwd + bwd on tp = 4 (2, 4 and 8 are covered by the functional tests): ring
    and bidir give the bits of "none", and XLA's path within rounding."""
    mesh = mesh_for(tp)
    x = jnp.asarray(rng.standard_normal((8 // tp, 32, 64)).astype(np.float32))
    recipe = qj.Float8CurrentScaling()

    def model(cg):
        qkv = LayerNormDenseGeneral(
            features=128,
            kernel_axes=("embed", "mlp"),
            use_bias=True,
            bias_axes=("mlp",),
            recipe=recipe,
            collective_gemm=cg,
        )
        out = DenseGeneral(
            features=64,
            kernel_axes=("mlp", "embed"),
            recipe=recipe,
            input_axes=("batch", None, "mlp"),
            output_axes=("batch", "seq", "embed"),
            collective_gemm=cg,
        )
        mlp = LayerNormMLP(intermediate_dim=128, recipe=recipe, collective_gemm=cg)
        return qkv, out, mlp

    results = {}
    with jax.set_mesh(mesh), qj.global_shard_guard(SP):
        x = jax.device_put(x, NamedSharding(mesh, P("dp", "tp", None)))
        for cg in (None, *MODES):
            qkv, out, mlp = model(cg)
            h, _ = qkv.init_with_output(jax.random.key(0), x)[0]
            params = (
                qkv.init(jax.random.key(0), x),
                out.init(jax.random.key(1), h),
                mlp.init(jax.random.key(2), x),
            )

            def loss(params, x):
                h = out.apply(params[1], qkv.apply(params[0], x)[0])
                return jnp.sum(mlp.apply(params[2], h + x)[0] ** 2)

            results[cg] = jax.jit(jax.value_and_grad(loss, (0, 1)))(params, x)
    for mode in ("ring", "bidir"):
        assert leaves_equal(results[mode], results["none"]), mode
    ref.assert_trees_close(results["none"], results[None], tol=1e-5)


def test_refusals(rng):
    mesh = mesh_for(4)
    x, gamma, beta, kernels, biases, r = mlp_data(rng, s=30)  # 60 tokens, 8 sequence shards
    states = (init_state(qj.DelayedScaling()), init_state(qj.DelayedScaling()))
    with jax.set_mesh(mesh), qj.global_shard_guard(SP):

        def mlp(cg):
            return sp_layernorm_mlp(
                x,
                gamma,
                beta,
                kernels,
                biases,
                states,
                recipe=qj.DelayedScaling(),
                collective_gemm=cg,
            )

        with pytest.raises(ValueError, match="do not split into 8 sequence shards"):
            mlp("ring")
        with pytest.raises(ValueError, match="overlap must be one of"):
            mlp("ringg")
        for recipe, match in (
            (qj.MXFP8BlockScaling(), "not MXFP8BlockScaling's microscaled"),
            (qj.Float8BlockScaling(x_block_scaling_dim=2, w_block_scaling_dim=1), "1x128"),
        ):
            with pytest.raises(NotImplementedError, match=match):
                dense(x, kernels[0], recipe=recipe, collective_gemm=CollectiveGemm("ring"))
        with pytest.raises(ValueError, match="whole 128-blocks"):  # 128 features over 4
            dense(
                x[:, :16],
                kernels[0],
                recipe=qj.Float8BlockScaling(),
                collective_gemm=CollectiveGemm("ring", "column"),
            )
    with pytest.raises(ValueError, match="needs a mesh in context"):
        layernorm_dense(
            x[:, :8],
            gamma,
            beta,
            kernels[0],
            recipe=qj.DelayedScaling(),
            state=init_state(qj.DelayedScaling()),
            collective_gemm=CollectiveGemm("ring", "column"),
        )
    with pytest.raises(ValueError, match="parallel must be one of"):
        CollectiveGemm("ring", "diagonal")
    with pytest.raises(ValueError, match="FP8 recipe"):
        LayerNormMLP(intermediate_dim=128, collective_gemm="ring").init(jax.random.key(0), x)


_MISSING_PEER = """
import jax, jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P
from conftest import make_mesh
from qmesh.jax.collective_gemm import all_gather_gemm

def body(a, b):
    join = lambda a: all_gather_gemm(a, b, axis="tp", timeout_s=0.5)[0]
    skip = lambda a: jnp.zeros((2 * a.shape[0], b.shape[0]), jnp.float32)
    return lax.cond(lax.axis_index("tp") == 0, skip, join, a)

f = jax.jit(jax.shard_map(body, mesh=make_mesh((4, 2)), in_specs=(P(("dp", "tp")), P()),
                          out_specs=P("dp")))
try:
    jax.block_until_ready(f(jnp.ones((16, 16)), jnp.ones((8, 16))))
except jax.errors.JaxRuntimeError as e:
    print("ERROR", e)
"""


def test_a_device_that_never_joins_is_a_timeout():
    """Device 0 of the axis skips the ring: the others' waits end at the communicator's
    timeout (0.5 s) with an error naming it, not a hang (in a process of its own: the failed
    call's runtime token fails again at exit)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [sys.executable, "-c", _MISSING_PEER],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The error states the time left of the ring's deadline when the wait began (<= 0.5 s).
    timed_out = re.search(r"timed out after 0\.\d+ s", run.stdout)
    assert "ERROR" in run.stdout and timed_out, run.stdout + run.stderr


def _checksums(cmd, env):
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {r["variant"]: [float.fromhex(v) for v in r["checksums"]] for r in lines}


def test_two_processes_of_two_devices():
    """jax.distributed with 2 processes x 2 CPU devices (dp across the processes, tp inside
    each): the modes give the bits of "none", and those of one process with 4 devices."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "collective_gemm_processes.py"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    two = _checksums(
        [
            os.path.join(root, "launch", "jaxrun"),
            "-n",
            "2",
            "--cpu-devices",
            "2",
            "--",
            sys.executable,
            script,
        ],
        env,
    )
    one = _checksums([sys.executable, script], env)
    assert set(two) == set(one) == {"None", *MODES}
    for mode in ("ring", "bidir"):
        assert two[mode] == two["none"], mode
    # Against one process: every checksum but the last, fc2's bias gradient, which XLA sums
    # with an all-reduce over (dp, tp) that gloo orders differently across processes.
    assert two["None"] == one["None"]
    for mode in MODES:
        assert two[mode][:-1] == one[mode][:-1], mode
        np.testing.assert_allclose(two[mode][-1], one[mode][-1], rtol=1e-6)
    np.testing.assert_allclose(two["none"], two["None"], rtol=1e-5)


def test_remat_and_independent_rings(rng):
    """jax.checkpoint around the layer recomputes the forward rings in backward with the same
    bits; two independent layers in one step (rings XLA may run side by side on a device)
    give the bits of each layer alone."""
    mesh = mesh_for(2)
    x, gamma, beta, kernels, biases, r = mlp_data(rng, b=4)
    recipe = qj.DelayedScaling()
    states = (init_state(recipe), init_state(recipe))

    def layer(x, kernels, biases):
        return sp_layernorm_mlp(
            x, gamma, beta, kernels, biases, states, recipe=recipe, collective_gemm="ring"
        )[0]

    def grads(f):
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

    with jax.set_mesh(mesh), qj.global_shard_guard(SP):
        (x, _, _, kernels, biases), r = sp_args(mesh, x, gamma, beta, kernels, biases, r)
        plain = grads(lambda x, k: jnp.sum(layer(x, k, biases) * r))(x, kernels)
        remat = grads(lambda x, k: jnp.sum(jax.checkpoint(layer)(x, k, biases) * r))(x, kernels)
        both = grads(lambda x, k: jnp.sum(layer(x, k, biases) * r) + jnp.sum(layer(-x, k, biases)))
        twice = both(x, kernels)
        other = grads(lambda x, k: jnp.sum(layer(-x, k, biases)))(x, kernels)
    assert leaves_equal(remat, plain)
    want = jax.tree_util.tree_map(lambda a, b: a + b, plain, other)
    ref.assert_trees_close(twice, want, tol=1e-6)
