"""qmesh.jax.flax.make_einsum_cls: equations mapped onto one GEMM (checked unquantised against
jnp.einsum), the FP8 result against the float64 quantize-dequantize reference, gradients
against dense on the mapped operands and jax.grad of jnp.einsum, the delayed-scaling state,
every recipe, jit, sharded == unsharded on a mesh, ellipses as their spelled-out equations,
experts split over MeshResource.ep_resource (bit-equal to unsharded, no all-gather in the
HLO), and refused equations."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import reference as ref
from conftest import make_mesh
from experts import expert_step
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT as OWG
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax.flax import make_einsum_cls
from qmesh.jax.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
)

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
SIZES = dict(b=2, t=4, d=32, h=16, n=2, e=3, c=4, m=32, k=32)
# (equation, the kernel's letters in [K..., N...] order as dense sees it, batch letters)
EQUATIONS = [
    "btd,dh->bth",  # a Dense
    "btd,dnh->btnh",  # attention's QKV projection
    "btnh,nhd->btd",  # the output projection: two contracted indices
    "bd,hd->hb",  # a transposed kernel and output
    "ecm,emh->ech",  # MoE experts: a batch index
    "cem,hme->hec",  # the batch index elsewhere in every term
]


def operand(rng, term, scale=1.0):
    return jnp.asarray((rng.standard_normal([SIZES[c] for c in term]) * scale).astype(np.float32))


def split(eqn):
    ins, out = eqn.split("->")
    lhs, rhs = ins.split(",")
    return lhs, rhs, out


def as_gemm(eqn, x, w):
    """x as [batch, M, K] and w as [batch, K, N] (numpy float64), with the batch, M and N
    letters: the mapping an equation should get, written independently of the module."""
    lhs, rhs, out = split(eqn)
    batch = [c for c in lhs if c in rhs and c in out]
    k = [c for c in lhs if c in rhs and c not in out]
    m = [c for c in lhs if c not in rhs]
    n = [c for c in rhs if c not in lhs]
    size = lambda cs: int(np.prod([SIZES[c] for c in cs]))  # noqa: E731
    x2 = np.einsum(f"{lhs}->{''.join(batch + m + k)}", np.asarray(x, np.float64))
    w2 = np.einsum(f"{rhs}->{''.join(batch + k + n)}", np.asarray(w, np.float64))
    shape = (size(batch),)
    return x2.reshape(*shape, size(m), size(k)), w2.reshape(*shape, size(k), size(n)), batch + m + n


def from_gemm(y, letters, out):
    """y [batch, M, N] back to the equation's output."""
    y = np.asarray(y).reshape([SIZES[c] for c in letters])
    return np.einsum(f"{''.join(letters)}->{out}", y)


def qdq(x, dtype):
    """x's float64 value after current-scaling quantization (the reference quantizer)."""
    s = ref.current_scale(ref.amax(x), dtype)
    return ref.quantize(x, s, dtype).view(dtype).astype(np.float64) / np.float64(s)


@pytest.mark.parametrize("eqn", EQUATIONS)
def test_unquantised_mapping_equals_jnp_einsum(rng, eqn):
    lhs, rhs, _ = split(eqn)
    x, w = operand(rng, lhs), operand(rng, rhs)
    einsum = make_einsum_cls()()
    with qj.autocast(enabled=False):
        got = einsum.apply({}, eqn, x, w)
    want = np.einsum(eqn, np.asarray(x, np.float64), np.asarray(w, np.float64))
    assert got.shape == want.shape
    assert ref.rel_err(got, want) < 1e-6


@pytest.mark.parametrize("eqn", EQUATIONS)
def test_current_scaling_matches_the_quantized_reference(rng, eqn):
    lhs, rhs, out = split(eqn)
    x, w = operand(rng, lhs), operand(rng, rhs, 0.2)
    r = operand(rng, out)  # the output gradient
    einsum = make_einsum_cls(Float8CurrentScaling())()

    def loss(x, w):
        return jnp.sum(einsum.apply({}, eqn, x, w) * r)

    y = jax.jit(lambda x, w: einsum.apply({}, eqn, x, w))(x, w)
    dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    x2, w2, letters = as_gemm(eqn, x, w)
    # Forward: each batch element's operands quantized with their own current scale.
    want = np.stack([qdq(a, E4M3) @ qdq(b, E4M3) for a, b in zip(x2, w2)])
    assert ref.rel_err(y, from_gemm(want, letters, out)) < 1e-5
    exact = np.einsum(eqn, np.asarray(x, np.float64), np.asarray(w, np.float64))
    assert ref.rel_err(y, exact) < 0.08
    # Backward against jax.grad of the plain einsum: FP8 (E4M3 x E5M2) error.
    want_dx, want_dw = jax.grad(lambda a, b: jnp.sum(jnp.einsum(eqn, a, b) * r), (0, 1))(x, w)
    assert dx.shape == x.shape and dw.shape == w.shape
    assert ref.rel_err(dx, want_dx) < 0.15 and ref.rel_err(dw, want_dw) < 0.15


@pytest.mark.parametrize(
    "recipe",
    [DelayedScaling(amax_history_len=4), Float8CurrentScaling(), Float8BlockScaling()],
    ids=["delayed", "current", "block"],
)
@pytest.mark.parametrize("eqn", ["btnh,nhd->btd", "bd,hd->hb"])
def test_every_recipe_runs_the_gemms_dense_runs_on_the_mapped_operands(rng, recipe, eqn):
    lhs, rhs, out = split(eqn)
    x, w = operand(rng, lhs), operand(rng, rhs, 0.2)
    r = operand(rng, out)
    einsum = make_einsum_cls(recipe)()
    v = einsum.init(jax.random.key(0), eqn, x, w)
    delayed = isinstance(recipe, DelayedScaling)
    assert (OWG in v) == delayed

    def loss(v, x, w):
        return jnp.sum(einsum.apply(v, eqn, x, w) * r)

    y = jax.jit(lambda v, x, w: einsum.apply(v, eqn, x, w))(v, x, w)
    dv, dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(v, x, w)
    # The same layer by hand: x as [M, K], the kernel as [K, N], then dense.
    x2, w2, letters = as_gemm(eqn, x, w)
    x2, w2 = jnp.asarray(x2[0], jnp.float32), jnp.asarray(w2[0], jnp.float32)
    r2 = jnp.asarray(np.einsum(f"{out}->{''.join(letters)}", r).reshape(x2.shape[0], -1))
    state = v[OWG] if delayed else None

    def by_hand(x2, w2, state):
        return jnp.sum(qj.dense(x2, w2, None, state, recipe=recipe) * r2)

    want = qj.dense(x2, w2, None, state, recipe=recipe)
    np.testing.assert_array_equal(np.asarray(y), from_gemm(want, letters, out))
    dx2, dw2, dstate = jax.jit(jax.grad(by_hand, argnums=(0, 1, 2)))(x2, w2, state)
    m = [c for c in lhs if c not in rhs]
    k = [c for c in lhs if c in rhs]
    n = [c for c in rhs if c not in lhs]
    back = lambda a, cs, term: np.einsum(  # noqa: E731
        f"{''.join(cs)}->{term}", np.asarray(a).reshape([SIZES[c] for c in cs])
    )
    np.testing.assert_array_equal(np.asarray(dx), back(dx2, m + k, lhs))
    np.testing.assert_array_equal(np.asarray(dw), back(dw2, k + n, rhs))
    # Against the exact operands: FP8 error.
    exact = np.einsum(eqn, np.asarray(x, np.float64), np.asarray(w, np.float64))
    assert ref.rel_err(y, exact) < 0.08
    want_dx, want_dw = jax.grad(lambda a, b: jnp.sum(jnp.einsum(eqn, a, b) * r), (0, 1))(x, w)
    assert ref.rel_err(dx, want_dx) < 0.15 and ref.rel_err(dw, want_dw) < 0.15
    if delayed:  # the new state, with this step's amaxes in row 0 of the histories
        for name in dstate:
            np.testing.assert_array_equal(np.asarray(dv[OWG][name]), np.asarray(dstate[name]))
        assert float(dv[OWG]["input_amax_history"][0]) == float(ref.amax(x))
        assert float(dv[OWG]["kernel_amax_history"][0]) == float(ref.amax(w))


# (an equation with '...', the same equation spelled out: the operands' shapes come from it)
ELLIPSES = [
    ("...d,dh->...h", "btd,dh->bth"),  # a Dense on any leading dimensions
    ("...nh,nhd->...d", "btnh,nhd->btd"),  # the output projection
    ("e...m,emh->e...h", "ecbm,emh->ecbh"),  # experts with two token dimensions
    ("...cm,...mh->...ch", "ecm,emh->ech"),  # an ellipsis in both operands: batch indices
]


@pytest.mark.parametrize(
    "recipe",
    [DelayedScaling(amax_history_len=4), Float8CurrentScaling()],
    ids=["delayed", "current"],
)
@pytest.mark.parametrize("eqn, spelled", ELLIPSES, ids=[e for e, _ in ELLIPSES])
def test_ellipsis_maps_as_the_spelled_out_equation(rng, recipe, eqn, spelled):
    lhs, rhs, _ = split(spelled)
    x, w = operand(rng, lhs), operand(rng, rhs, 0.2)
    einsum = make_einsum_cls(recipe)()
    v = einsum.init(jax.random.key(0), eqn, x, w)
    # The same dot_general as the spelled-out equation (so the same gradients), bit for bit;
    # a batch index (e: 3) as one GEMM call in a loop, not one per batch element (XLA may
    # merge the two equations' identical calls).
    compiled = jax.jit(lambda: [einsum.apply(v, e, x, w) for e in (eqn, spelled)]).lower().compile()
    got, want = compiled()
    assert 1 <= compiled.as_text().count('custom_call_target="qmesh_gemm"') <= 2
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    exact = np.einsum(eqn, np.asarray(x, np.float64), np.asarray(w, np.float64))
    assert got.shape == exact.shape and ref.rel_err(got, exact) < 0.08


@pytest.mark.parametrize(
    "recipe", [Float8BlockScaling(), MXFP8BlockScaling(emulate=True)], ids=["block", "mxfp8"]
)
def test_block_recipes_run_experts_with_an_ellipsis(rng, recipe):
    x = jnp.asarray(rng.standard_normal((2, 2, 16, 128)).astype(np.float32))
    w = jnp.asarray((rng.standard_normal((2, 128, 32)) * 0.2).astype(np.float32))
    einsum = make_einsum_cls(recipe)()
    y = jax.jit(lambda x, w: einsum.apply({}, "e...m,emh->e...h", x, w))(x, w)
    exact = np.einsum("e...m,emh->e...h", np.asarray(x, np.float64), np.asarray(w, np.float64))
    assert y.shape == exact.shape and 0 < ref.rel_err(y, exact) < 0.08


class Attention(nn.Module):
    """Projections written with an injected einsum (jnp.einsum by default), as Flax's FP8
    guide injects Fp8Einsum: one instance (one state) per projection."""

    einsum: object = None

    @nn.compact
    def __call__(self, x):
        q_einsum, o_einsum = (self.einsum() if self.einsum else jnp.einsum for _ in "qo")
        wq = self.param("wq", nn.initializers.normal(0.2), (32, 2, 16))
        wo = self.param("wo", nn.initializers.normal(0.2), (2, 16, 32))
        return o_einsum("btnh,nhd->btd", q_einsum("btd,dnh->btnh", x, wq), wo)


def test_injected_into_a_module_keeps_a_state_per_instance(rng):
    x = operand(rng, "btd")
    fp8 = Attention(einsum=make_einsum_cls(DelayedScaling(amax_history_len=4)))
    v = fp8.init(jax.random.key(0), x)
    plain = Attention().init(jax.random.key(0), x)
    assert jax.tree.structure(v["params"]) == jax.tree.structure(plain["params"])
    assert set(v[OWG]) == {"QmeshEinsum_0", "QmeshEinsum_1"}
    y = jax.jit(fp8.apply)(v, x)
    assert ref.rel_err(y, Attention().apply(plain, x)) < 0.1
    grads = jax.grad(lambda v_: jnp.sum(fp8.apply(v_, x) ** 2))(v)
    first = grads[OWG]["QmeshEinsum_0"]
    assert float(first["input_amax_history"][0]) == float(ref.amax(x))


@pytest.mark.parametrize(
    "eqn, shapes, match",
    [
        ("..d,dh->..h", ((2, 32), (32, 16)), "one '...' at most"),
        ("......d,dh->...h", ((2, 32), (32, 16)), "one '...' at most"),
        ("...btd,dh->...bth", ((4, 32), (32, 16)), "names 3 dimensions of a 2-D input"),
        ("...d,dh->h", ((2, 32), (32, 16)), r"read as Ad,dh->h\).*'A' is summed within one"),
        ("...d,...dh->...h", ((3, 32), (2, 32, 16)), "differ in size"),
        ("btd,dh", ((2, 4, 32), (32, 16)), "output explicitly"),
        ("bd,dh,hk->bk", ((2, 32), (32, 16)), "3 operands"),
        ("bdd,dh->bh", ((2, 32, 32), (32, 16)), "repeats within 'bdd'"),
        ("bd,dh->bhh", ((2, 32), (32, 16)), "repeats within 'bhh'"),
        ("bd,dh->bx", ((2, 32), (32, 16)), "'x' is in neither operand"),
        ("btd,dh->bh", ((2, 4, 32), (32, 16)), "'t' is summed within one operand"),
        ("bd,h->bdh", ((2, 32), (16,)), "no index is contracted"),
        ("btd,dh->bth", ((2, 32), (32, 16)), "names 3 dimensions of a 2-D input"),
        ("b1,1h->bh", ((2, 32), (32, 16)), "letters"),
        ("bd,dh->bh", ((2, 32), (16, 16)), "differ in size"),
    ],
)
def test_equations_it_cannot_map_are_refused(eqn, shapes, match):
    einsum = make_einsum_cls(Float8CurrentScaling())()
    with pytest.raises(ValueError, match=match):
        einsum.init(jax.random.key(0), eqn, *(jnp.ones(s) for s in shapes))
    with qj.autocast(enabled=False), pytest.raises(ValueError, match=match):  # also unquantised
        einsum.init(jax.random.key(0), eqn, *(jnp.ones(s) for s in shapes))


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="recipe"):
        make_einsum_cls("current")
    with pytest.raises(ValueError, match="fallback"):
        make_einsum_cls(fallback="fp16")
    einsum = make_einsum_cls(Float8CurrentScaling())()
    with pytest.raises(TypeError, match="must be a str"):
        einsum.init(jax.random.key(0), 3, jnp.ones((2, 32)), jnp.ones((32, 16)))
    with pytest.raises(TypeError, match="create an instance"):
        make_einsum_cls(Float8CurrentScaling())("bd,dh->bh", jnp.ones((2, 32)), jnp.ones((32, 16)))


@pytest.mark.parametrize(
    "recipe",
    [DelayedScaling(amax_history_len=4), Float8CurrentScaling()],
    ids=["delayed", "current"],
)
@pytest.mark.parametrize(
    "eqn, x_shape, w_shape, x_spec, w_spec, y_lead",
    [
        ("btd,dnh->btnh", (8, 4, 32), (32, 4, 16), P("dp", None, None), P(None, "tp", None), "dp"),
    ],
    ids=["projection"],
)
def test_sharded_equals_unsharded(mesh, rng, recipe, eqn, x_shape, w_shape, x_spec, w_spec, y_lead):
    x = jnp.asarray(rng.standard_normal(x_shape).astype(np.float32))
    w = jnp.asarray((rng.standard_normal(w_shape) / 6).astype(np.float32))
    einsum = make_einsum_cls(recipe)()
    v = einsum.init(jax.random.key(0), eqn, x, w)

    def f(v, x, w):
        loss = lambda v_, x_, w_: jnp.sum(einsum.apply(v_, eqn, x_, w_) ** 2)  # noqa: E731
        return einsum.apply(v, eqn, x, w), jax.grad(loss, argnums=(0, 1, 2))(v, x, w)

    want = jax.jit(f)(v, x, w)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    resource = qj.MeshResource(dp_resource="dp", tp_resource="tp")
    with qj.autocast(recipe=recipe, mesh_resource=resource):
        got = jax.jit(f)(v, put(x, x_spec), put(w, w_spec))
    assert got[0].sharding.spec[0] == y_lead
    ref.assert_trees_close(got, want)


@pytest.mark.parametrize(
    "recipe, eqn, x_shape",
    [
        (DelayedScaling(amax_history_len=4), "ecd,edf->ecf", (4, 8, 32)),
        (Float8CurrentScaling(), "e...d,edf->e...f", (4, 2, 4, 32)),
    ],
    ids=["delayed", "current"],
)
def test_experts_split_over_ep_equal_unsharded_and_gather_nothing(rng, recipe, eqn, x_shape):
    mesh = make_mesh((2, 2), ("ep", "tp"))
    x, w, v, f = expert_step(rng, recipe, eqn, x_shape)
    want = jax.jit(f)(v, x, w)  # unsharded: a loop over all experts on one device
    xs, ws = (jax.device_put(a, NamedSharding(mesh, P("ep"))) for a in (x, w))
    resource = qj.MeshResource(ep_resource="ep")
    with jax.set_mesh(mesh), qj.autocast(recipe=recipe, mesh_resource=resource):
        compiled = jax.jit(f).lower(v, xs, ws).compile()
        got = compiled(v, xs, ws)
    # Each device multiplies its own experts: the same bits, nothing gathered (without
    # ep_resource the loop gathers x and w whole), y and the gradients of x and w sharded
    # along the experts.
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert "all-gather" not in compiled.as_text()
    y, (_, dx, dw) = got
    assert y.sharding.spec[0] == dx.sharding.spec[0] == dw.sharding.spec[0] == "ep"


def test_experts_over_ep_need_the_mesh_and_a_multiple_of_its_size():
    mesh = make_mesh((2, 2), ("ep", "tp"))
    einsum = make_einsum_cls(Float8CurrentScaling())()
    x, w = jnp.ones((3, 4, 32)), jnp.ones((3, 32, 16))
    with qj.autocast(mesh_resource=qj.MeshResource(ep_resource="ep")):
        with pytest.raises(ValueError, match=r"needs the mesh in context \(with jax.set_mesh"):
            einsum.init(jax.random.key(0), "ecd,edf->ecf", x, w)
        with jax.set_mesh(mesh), pytest.raises(ValueError, match="3.*not a multiple.*'ep'.*2"):
            einsum.init(jax.random.key(0), "ecd,edf->ecf", x, w)
