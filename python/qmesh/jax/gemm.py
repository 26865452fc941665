"""The quantized GEMM: D = epilogue(alpha * op(A) @ op(B)) on qmesh's GEMM (OpenBLAS on the
CPU backend, cuBLASLt on CUDA), as one JAX primitive.

Layouts (row-major, as include/qmesh/ops/gemm.h): op(A) is [M, K], op(B) is [K, N], D is
[M, N]. trans_a=False: A is stored [M, K]; trans_a=True: [K, M]. trans_b=False: B is stored
[K, N]; trans_b=True: [N, K]. The default (trans_a=False, trans_b=True) is the canonical "TN"
form D = A @ B.T, the layer forward x @ W.T with W stored [out, in].

Operands are both FP8 (float8_e4m3fn / float8_e5m2, not e5m2 x e5m2), each contributing
code * scale_inv, or both one plain dtype (float32, bfloat16, float16). Products accumulate in
float32; then alpha, the epilogue, and the rounding to `out_dtype`.

Epilogues (`Epilogue`), with their extra operand and extra result (the table EPILOGUES; the
one primitive takes an empty placeholder where an epilogue has no operand):
  NONE           -                 -
  BIAS           bias [N]          -                  r + bias
  GELU           -                 -                  gelu(r) (tanh approximation)
  BIAS_GELU_AUX  bias [N]          aux [M, N]         aux = r + bias; gelu(aux)
  DGELU          aux [M, N]        -                  r * gelu'(aux)
  BIAS_GRAD      -                 dbias [M]          dbias = row sums of op(A) (no alpha)

Sharding (Shardy rule "m k, n k -> m n" for TN): M and N keep the shardings of A's rows and
B's columns (N is replicated if it would reuse an axis of M). When K (the contracting
dimension) is sharded, every device multiplies its K-slices into a float32 partial D (and
partial dbias), `psum`s them over K's mesh axes, then applies the epilogue and rounds to
out_dtype; D comes back sharded along M and N only. Sequence parallelism: when one of K's
axes is the MeshResource's `tpsp_resource` (and it divides M), the partial products are
reduce-scattered over that axis along M (`psum_scatter`) instead, so D, aux and dbias come
back with M sharded over the M axes and then the tpsp axis. Where the consumer wants that
sharding (a sequence-parallel LayerNorm, or a sharding constraint) nothing else moves; if it
wants D unsharded, XLA gathers it afterwards. A dimension whose size its mesh axes do
not divide is replicated instead.

On CUDA the FP8 GEMM takes the TN form only: FP8 operands in another layout are transposed
there (on the host the GEMM reads any layout).

A batch of GEMMs: a and b both 3-D, [batch, ...] with each element stored as above, give D
[batch, M, N] from one strided-batched GEMM call (one cuBLASLt launch on CUDA; on the host one
2-D GEMM per element, the same bits). Every element shares the scalar scale_inv of a and of b,
alpha and the bias [N]; the epilogue is NONE, BIAS or GELU (BATCHED_EPILOGUES), the operands
per-tensor FP8 or plain. jax.vmap of gemm() emits that call where a and b are both batched and
nothing else is (delayed scaling's one scale per operand, plain dtypes); where a scale_inv is
batched too (current scaling: a scale per element), or one operand, block scales or another
epilogue, it keeps a loop of 2-D GEMMs (lax.map). The batch dimension keeps a's sharding (its
mesh axes then shard none of M, N, K); the Shardy rule gives it the factor e.

Block-scaled operands (the Float8BlockScaling recipe; a_block / b_block = 1 for 1x128 blocks,
2 for 128x128 tiles, 0 for a per-tensor scalar scale_inv): both operands are then FP8 and
block-scaled, not both in 128x128 tiles, in the TN form (each stored contiguous along K: pass
the columnwise copies qmesh.jax.block_quantize makes), and each scale_inv is the operand's
scale tensor, one float32 per block in block_scale_shape of its stored shape
(qmesh.jax.block_quantize; the handler reads the C++ layout, converted on each device). Each
block is dequantized in float32 and the products accumulated in float32. The scales are
sharded with their operand (block_quantize.block_scale_spec); a sharded K (and the M or N of
a 128x128 operand) must give shards that are multiples of 128, and the partial products are
psum'd as above.
"""

from __future__ import annotations

import ctypes
import enum
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import mlir

from qmesh.jax import _ffi, primitive, sharding
from qmesh.jax.block_quantize import (
    Dim,
    block_scale_shape,
    block_scale_spec,
    check_block,
    check_scale_inv,
    expand_scales,
    from_layout,
    layout_shape,
    rule_dim,
    scale_rule,
    sized,
    to_layout,
)
from qmesh.jax.common import (
    F32,
    FP8_DTYPES,
    WIDE_DTYPES,
    axes_of,
    check_scalar,
    check_wide,
    divides,
    entry,
    named,
    spec_of,
)
from qmesh.jax.primitive import Op, register

# Platforms whose FP8 GEMM takes the TN form only (FP8 operands are transposed into it there).
TN_PLATFORMS = ("cuda",)


class Epilogue(enum.IntEnum):
    """What happens to the float32 product before it is stored (qmesh::GemmEpilogue)."""

    NONE = 0
    BIAS = 1
    GELU = 2
    BIAS_GELU_AUX = 3
    DGELU = 4
    BIAS_GRAD = 5


class Extras(NamedTuple):
    """The extra operand and the extra result of an epilogue ("bias", "aux", "dbias" or None)."""

    operand: str | None
    result: str | None


# What each epilogue takes and returns besides A, B and their scale_inv -> D: the one table that
# abstract evaluation, the shardings, the Shardy rule and gemm() read.
EPILOGUES = {
    Epilogue.NONE: Extras(None, None),
    Epilogue.BIAS: Extras("bias", None),
    Epilogue.GELU: Extras(None, None),
    Epilogue.BIAS_GELU_AUX: Extras("bias", "aux"),
    Epilogue.DGELU: Extras("aux", None),
    Epilogue.BIAS_GRAD: Extras(None, "dbias"),
}
# The dimensions of each extra operand and result, as factors of D [M, N].
EXTRA_DIMS = {"bias": "n", "aux": "m n", "dbias": "m"}


def _epilogue(value) -> Epilogue:
    if isinstance(value, str):
        try:
            return Epilogue[value.upper()]
        except KeyError:
            raise ValueError(
                f"gemm: unknown epilogue {value!r}; one of {[e.name for e in Epilogue]}"
            ) from None
    try:
        return Epilogue(int(value))
    except (ValueError, TypeError):
        raise ValueError(
            f"gemm: epilogue must be a qmesh.jax.Epilogue (0..5), not {value!r}"
        ) from None


def _dims(trans_a: bool, trans_b: bool):
    """(m, k) positions in A's stored shape and (k, n) positions in B's."""
    return ((1, 0) if trans_a else (0, 1)), ((1, 0) if trans_b else (0, 1))


def _problem(a, b, trans_a, trans_b):
    """(M, K, N, batch) of the GEMM (batch None for 2-D operands); raises for ranks or inner
    dimensions that do not fit."""
    batched = a.ndim == 3 and b.ndim == 3
    for x, name, flag, stored in (
        (a, "a", "trans_a", ("[M, K]", "[K, M]")),
        (b, "b", "trans_b", ("[K, N]", "[N, K]")),
    ):
        if x.ndim != 2 and not batched:
            trans = trans_a if name == "a" else trans_b
            raise ValueError(
                f"gemm: {name} must be 2-D, {stored[int(trans)]} with {flag}={trans} (or a and "
                f"b both 3-D, a batch of GEMMs), not shape {tuple(x.shape)}"
            )
    batch = None
    if batched:
        if a.shape[0] != b.shape[0]:
            raise ValueError(
                f"gemm: a {tuple(a.shape)} and b {tuple(b.shape)} are batches of different "
                "sizes (dimension 0)"
            )
        batch = a.shape[0]
    sa, sb = a.shape[a.ndim - 2 :], b.shape[b.ndim - 2 :]  # one element's
    (am, ak), (bk, bn) = _dims(trans_a, trans_b)
    m, k, kb, n = sa[am], sa[ak], sb[bk], sb[bn]
    if k != kb:
        raise ValueError(
            f"gemm: inner dimensions differ: op(a) is [{m}, {k}] (a {tuple(a.shape)}, "
            f"trans_a={trans_a}) but op(b) is [{kb}, {n}] (b {tuple(b.shape)}, "
            f"trans_b={trans_b})"
        )
    return m, k, n, batch


# A batch of GEMMs (3-D operands: one strided-batched GEMM call) takes these epilogues, whose
# operand (a bias [N]) every element shares and which give no extra result.
BATCHED_EPILOGUES = (Epilogue.NONE, Epilogue.BIAS, Epilogue.GELU)


def _batch_refusal(epilogue, a_block, b_block):
    """Why a batch of GEMMs (one call) cannot take these parameters; None where it can."""
    if a_block or b_block:
        return "takes per-tensor FP8 or plain operands, not block-scaled ones"
    if Epilogue(epilogue) not in BATCHED_EPILOGUES:
        return f"takes epilogue NONE, BIAS or GELU, not {Epilogue(epilogue).name}"
    return None


def _check_blocks(
    a, b, a_scale_inv, b_scale_inv, *, trans_a, trans_b, a_block, b_block, scale_shape
):
    """The rules of block-scaled operands (module docstring); the scales of `scale_shape`."""
    if not (a_block and b_block):
        raise TypeError(
            "gemm: a block-scaled GEMM needs both operands block-scaled (a_block and b_block "
            f"1 or 2), got a_block={a_block}, b_block={b_block}"
        )
    if a_block == b_block == 2:
        raise ValueError(
            "gemm: no GEMM takes two operands in 128x128 tiles: quantize the activation or "
            "gradient operand in 1x128 blocks"
        )
    if trans_a or not trans_b:
        raise ValueError(
            "gemm: block-scaled operands must be in the TN form (trans_a=False, "
            "trans_b=True), each stored contiguous along K: pass the columnwise copies "
            "(block_quantize(..., columnwise=True)) where the rowwise codes are not"
        )
    for x, s, blk, name in ((a, a_scale_inv, a_block, "a"), (b, b_scale_inv, b_block, "b")):
        if x.dtype not in FP8_DTYPES:
            raise TypeError(f"gemm: the block-scaled operand {name} must be FP8, not {x.dtype}")
        check_scale_inv(s, tuple(x.shape), blk, f"gemm: {name}_scale_inv", scale_shape)


def _check_operands(a, b, a_scale_inv, b_scale_inv, scale_shape, **layout):
    if layout.get("a_block") or layout.get("b_block"):
        return _check_blocks(a, b, a_scale_inv, b_scale_inv, scale_shape=scale_shape, **layout)
    fp8 = (a.dtype in FP8_DTYPES, b.dtype in FP8_DTYPES)
    if any(fp8):
        if not all(fp8):
            raise TypeError(
                f"gemm: a and b must both be FP8 or both one plain dtype, got {a.dtype} "
                f"and {b.dtype}"
            )
        if a.dtype == b.dtype == FP8_DTYPES[1]:
            raise TypeError(
                "gemm: float8_e5m2 x float8_e5m2 is not supported (cuBLASLt lacks it): "
                "use e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3"
            )
        for s, what in ((a_scale_inv, "a_scale_inv"), (b_scale_inv, "b_scale_inv")):
            check_scalar(s, f"gemm: {what}")
    else:
        if a.dtype not in WIDE_DTYPES or a.dtype != b.dtype:
            raise TypeError(
                f"gemm: a and b must have the same dtype, one of float32, bfloat16, "
                f"float16 (or both be FP8), got {a.dtype} and {b.dtype}"
            )


def _avals(
    a,
    b,
    a_scale_inv,
    b_scale_inv,
    extra,
    *,
    trans_a,
    trans_b,
    epilogue,
    out_dtype,
    dbias_dtype,
    split_accumulator,
    alpha,
    a_block,
    b_block,
    scale_shape=block_scale_shape,
):
    epilogue = Epilogue(epilogue)
    m, _, n, batch = _problem(a, b, trans_a, trans_b)
    if batch is not None and (why := _batch_refusal(epilogue, a_block, b_block)):
        raise ValueError(f"gemm: a batch of GEMMs (3-D operands) {why}: call one GEMM per element")
    _check_operands(
        a,
        b,
        a_scale_inv,
        b_scale_inv,
        scale_shape,
        trans_a=trans_a,
        trans_b=trans_b,
        a_block=a_block,
        b_block=b_block,
    )
    out_dtype = check_wide(out_dtype, "gemm: out_dtype")
    wanted, result = EPILOGUES[epilogue]
    if (extra is None) != (wanted is None):
        raise ValueError(
            f"gemm: epilogue {epilogue.name} "
            + (f"needs {wanted}" if wanted else "takes no bias or aux operand")
        )
    sizes = {"m": m, "n": n}
    outs = [jax.core.ShapedArray(((batch,) if batch is not None else ()) + (m, n), out_dtype)]
    if wanted:
        check_wide(extra.dtype, f"gemm: {wanted}")
        dims = EXTRA_DIMS[wanted].split()
        shape = tuple(sizes[d] for d in dims)
        if extra.shape != shape:
            like = " like the output" if wanted == "aux" else ""
            raise ValueError(
                f"gemm: {wanted} of epilogue {epilogue.name} must be "
                f"[{', '.join(d.upper() for d in dims)}] = "
                f"[{', '.join(map(str, shape))}]{like}, not {list(extra.shape)}"
            )
    if result:
        dtype = extra.dtype if result == "aux" else check_wide(dbias_dtype, "gemm: dbias_dtype")
        outs.append(
            jax.core.ShapedArray(tuple(sizes[d] for d in EXTRA_DIMS[result].split()), dtype)
        )
    return tuple(outs)


# ---- the float32 epilogue in JAX (empty inputs, and after the psum of a sharded K) ----------

_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_CUBIC = 0.044715


def gelu(x):
    """The tanh-approximation GELU the GEMM epilogues apply (float32)."""
    return 0.5 * x * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * x * x * x)))


def dgelu(x):
    """gelu'(x) of the tanh approximation (float32)."""
    t = jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * x * x * x))
    du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * x * x)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du


def _finish(r, extra, *, epilogue, out_dtype, aux_dtype=None):
    """The epilogue on the float32 product r (alpha applied); returns D and the aux output."""
    epilogue = Epilogue(epilogue)
    aux = None
    if epilogue == Epilogue.BIAS:
        r = r + extra.astype(F32)
    elif epilogue == Epilogue.GELU:
        r = gelu(r)
    elif epilogue == Epilogue.BIAS_GELU_AUX:
        r = r + extra.astype(F32)
        aux = r.astype(aux_dtype)
        r = gelu(r)
    elif epilogue == Epilogue.DGELU:
        r = r * dgelu(extra.astype(F32))
    return r.astype(out_dtype), aux


def _reference(
    a,
    b,
    a_scale_inv,
    b_scale_inv,
    extra,
    *,
    trans_a,
    trans_b,
    epilogue,
    out_dtype,
    dbias_dtype,
    alpha,
    a_block,
    b_block,
    **_,
):
    """The GEMM in plain JAX on the inner primitive's arguments (used for inputs with no
    elements)."""

    def decoded(x, s, block):
        if block:
            grid = from_layout(s, x.shape, block)  # the handler's arguments
            return x.astype(F32) * expand_scales(grid, *x.shape, block)
        return x.astype(F32) * (s if x.dtype in FP8_DTYPES else 1.0)

    fa, fb = decoded(a, a_scale_inv, a_block), decoded(b, b_scale_inv, b_block)
    opa = jnp.swapaxes(fa, -1, -2) if trans_a else fa
    opb = jnp.swapaxes(fb, -1, -2) if trans_b else fb
    r = alpha * jnp.matmul(opa, opb, precision=lax.Precision.HIGHEST)
    aux_dtype = extra.dtype if extra is not None else None
    d, aux = _finish(r, extra, epilogue=epilogue, out_dtype=out_dtype, aux_dtype=aux_dtype)
    if Epilogue(epilogue) == Epilogue.BIAS_GRAD:
        return d, jnp.sum(opa, axis=1).astype(dbias_dtype)
    return (d,) if aux is None else (d, aux)


# ---- the primitives ---------------------------------------------------------------------------

_STATICS = (
    "trans_a",
    "trans_b",
    "epilogue",
    "out_dtype",
    "dbias_dtype",
    "split_accumulator",
    "alpha",
    "a_block",
    "b_block",
)


def _split(args, epilogue):
    """(a, b, a_scale_inv, b_scale_inv, extra operand or None) of the outer primitive's five
    arguments (the fifth is an empty placeholder where the epilogue takes no operand) or of the
    inner primitive's four or five (only what the handler reads)."""
    operand = EPILOGUES[Epilogue(epilogue)].operand
    return (*args[:4], args[4] if operand and len(args) > 4 else None)


def _handler_args(a, b, a_scale_inv, b_scale_inv, extra):
    """The inner primitive's arguments: the placeholder dropped."""
    return (a, b, a_scale_inv, b_scale_inv) + (() if extra is None else (extra,))


@register
class Gemm(Op):
    """(a, b, a_scale_inv, b_scale_inv, bias | aux | placeholder) -> d [, aux | dbias]: the
    fifth argument is the epilogue's operand (EPILOGUES), else an empty float32 [0]."""

    name, target, num_inputs = "qmesh_gemm", "qmesh_gemm", 5
    static_params = _STATICS

    @classmethod
    def abstract(cls, *avals, **params):
        return _avals(*_split(avals, params["epilogue"]), **params)

    @classmethod
    def inner_abstract(cls, *avals, **params):
        """The handler takes block scales in the C++ layout."""
        return _avals(*_split(avals, params["epilogue"]), scale_shape=layout_shape, **params)

    @classmethod
    def attributes(
        cls, *, trans_a, trans_b, epilogue, split_accumulator, alpha, a_block, b_block, **_
    ):
        return dict(
            trans_a=bool(trans_a),
            trans_b=bool(trans_b),
            epilogue=np.int32(epilogue),
            split_accumulator=bool(split_accumulator),
            alpha=np.float32(alpha),
            a_block=np.int32(a_block),
            b_block=np.int32(b_block),
        )

    @classmethod
    def is_empty(cls, *avals, **params):
        a, b = avals[:2]
        return a.size == 0 or b.size == 0

    @classmethod
    def empty(cls, *args, **params):
        return _reference(*_split(args, params["epilogue"]), **params)

    @classmethod
    def _device_gemm(cls, *args, **params):
        """The inner primitive on the handler's arguments; FP8 operands go to CUDA in the TN
        form."""
        a, b = args[:2]
        if a.dtype not in FP8_DTYPES or (not params["trans_a"] and params["trans_b"]):
            return tuple(cls.inner.bind(*args, **params))
        tn = dict(params, trans_a=False, trans_b=True)

        def as_stored(*xs):
            return tuple(cls.inner.bind(*xs, **params))

        def as_tn(x, y, *rest):
            x = jnp.swapaxes(x, -1, -2) if params["trans_a"] else x
            y = y if params["trans_b"] else jnp.swapaxes(y, -1, -2)
            return tuple(cls.inner.bind(x, y, *rest, **tn))

        return lax.platform_dependent(*args, default=as_stored, **{p: as_tn for p in TN_PLATFORMS})

    @classmethod
    def local(cls, plan, *args, **params):
        a, b, a_si, b_si, extra = _split(args, params["epilogue"])
        if params["a_block"]:  # the shard's scales in the C++ layout
            a_si = to_layout(a_si, params["a_block"])
            b_si = to_layout(b_si, params["b_block"])
        if not plan:  # K not sharded: the whole GEMM with its epilogue on each device
            return cls._device_gemm(*_handler_args(a, b, a_si, b_si, extra), **params)
        k_axes, scatter_axis = plan
        epilogue = Epilogue(params["epilogue"])
        # The float32 partial product of this device's K-slices (and the partial row sums).
        inner = dict(
            params,
            out_dtype=F32,
            dbias_dtype=F32,
            epilogue=Epilogue.BIAS_GRAD if epilogue == Epilogue.BIAS_GRAD else Epilogue.NONE,
        )
        partial = tuple(cls._device_gemm(a, b, a_si, b_si, **inner))
        summed_axes = tuple(x for x in k_axes if x != scatter_axis)
        summed = lax.psum(partial, summed_axes) if summed_axes else partial
        if scatter_axis:  # sequence parallel: each device keeps its M-slice of the sum
            rows = a.ndim - 2  # M's dimension in D (after a batch's); dbias [M]: 0
            summed = tuple(
                lax.psum_scatter(
                    p, scatter_axis, scatter_dimension=rows if p.ndim == a.ndim else 0, tiled=True
                )
                for p in summed
            )
        if epilogue == Epilogue.BIAS_GRAD:
            return summed[0].astype(params["out_dtype"]), summed[1].astype(params["dbias_dtype"])
        d, aux = _finish(
            summed[0],
            extra,
            epilogue=epilogue,
            out_dtype=params["out_dtype"],
            aux_dtype=None if extra is None else extra.dtype,
        )
        return (d,) if aux is None else (d, aux)

    @classmethod
    def batch(cls, args, dims, **params):
        """vmap: one strided-batched GEMM (3-D operands) where a and b are 2-D and both
        batched and nothing else is: one scale_inv per operand for the whole batch (delayed
        scaling, plain dtypes), an epilogue of BATCHED_EPILOGUES with its bias shared.
        Otherwise (a scale per element: current scaling; block scales; one operand batched) a
        loop of GEMMs (primitive.batch_by_map)."""
        a, b = args[:2]  # with their batch dimension
        one_call = (
            dims[0] is not None
            and dims[1] is not None
            and a.ndim == b.ndim == 3
            and all(d is None for d in dims[2:])
            and _batch_refusal(params["epilogue"], params["a_block"], params["b_block"]) is None
        )
        if not one_call:
            return primitive.batch_by_map(cls, args, dims, **params)
        a, b = (jnp.moveaxis(x, d, 0) for x, d in zip(args[:2], dims[:2]))
        outs = cls.outer.bind(a, b, *args[2:], **params)  # params carry the recorded resource
        return outs, (0,) * len(outs)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, trans_a, trans_b, epilogue, a_block, b_block, **_):
        epilogue = Epilogue(epilogue)
        a, b = arg_infos[:2]
        lead = len(a.shape) - 2  # 1 for a batch of GEMMs: its dimension keeps a's sharding
        (am, ak), (bk, bn) = ((d + lead for d in dims) for dims in _dims(trans_a, trans_b))
        sa, sb = spec_of(a), spec_of(b)

        def usable(axes, dim, taken):
            axes = tuple(x for x in axes if x not in taken)
            return axes if axes and divides(mesh, axes, dim) else ()

        batch = usable(axes_of(sa[0]), a.shape[0], ()) if lead else ()
        m = usable(axes_of(sa[am]), a.shape[am], batch)
        n = usable(axes_of(sb[bn]), b.shape[bn], batch + m)
        k = usable(axes_of(sa[ak]) or axes_of(sb[bk]), a.shape[ak], batch + m + n)
        # Sequence parallelism: a K sharded over the tpsp axis is reduce-scattered along M.
        tpsp = sharding.global_mesh_resource().tpsp_resource
        scatter = tpsp if tpsp in k and divides(mesh, m + (tpsp,), a.shape[am]) else None
        m_out = m + ((scatter,) if scatter else ())
        a_spec = [entry(batch)] * lead + [None, None]
        a_spec[am], a_spec[ak] = entry(m), entry(k)
        b_spec = [entry(batch)] * lead + [None, None]
        b_spec[bk], b_spec[bn] = entry(k), entry(n)
        factors = {"m": entry(m_out), "n": entry(n)}

        def extra(name):
            return named(mesh, *(factors[d] for d in EXTRA_DIMS[name].split()))

        operand, result = EPILOGUES[epilogue]
        scales = [named(mesh), named(mesh)]
        if a_block:  # TN: a [M, K], b [N, K]
            scales = [
                named(
                    mesh,
                    *block_scale_spec(mesh, x.shape, blk, rows, k, f"gemm: {w} {list(x.shape)}"),
                )
                for x, blk, rows, w in ((a, a_block, m, "a"), (b, b_block, n, "b"))
            ]
        args = [named(mesh, *a_spec), named(mesh, *b_spec), *scales]
        args.append(extra(operand) if operand else named(mesh))
        d_spec = [entry(batch)] * lead + [factors["m"], factors["n"]]
        outs = [named(mesh, *d_spec)] + ([extra(result)] if result else [])
        return args, outs, (k, scatter) if k else None

    @classmethod
    def mesh_sharding_rule(
        cls, mesh, value_types, result_types, *, trans_a, trans_b, epilogue, a_block, b_block, **_
    ):
        epilogue = Epilogue(epilogue)
        operand, result = EPILOGUES[epilogue]
        if a_block:  # TN; the scales follow their operand's blocks (block_quantize.rule_dim)
            (m, k), (n, _) = (t.shape for t in value_types[:2])
            dims = {d: rule_dim(d, size, mesh) for d, size in (("m", m), ("k", k), ("n", n))}
            scales = [scale_rule(dims["m"], dims["k"], a_block)]
            scales.append(scale_rule(dims["n"], dims["k"], b_block))
            sizes = {f: v for d in dims.values() for f, v in d.sizes.items()}
        else:
            dims = {d: Dim(d, "", {}) for d in "mkn"}
            scales, sizes = ["", ""], {}
        reduce = tuple(dims["k"].dim.strip("()").split())  # k, or its two factors

        def factors(names):
            return " ".join(dims[d].dim for d in names.split())

        lead = "e " if len(value_types[0].shape) == 3 else ""  # a batch of GEMMs: e
        operands = [factors("k m" if trans_a else "m k"), factors("n k" if trans_b else "k n")]
        operands = [lead + o for o in operands]
        operands += [*scales, factors(EXTRA_DIMS[operand]) if operand else "z"]
        results = [lead + factors("m n")] + ([factors(EXTRA_DIMS[result])] if result else [])
        rule, sizes = sized(f"{', '.join(operands)} -> {', '.join(results)}", sizes)
        return rule, {**sizes, "reduction_factors": reduce}


# On CUDA the handler takes cuBLASLt's workspace as one more result, which XLA allocates and
# this lowering drops: the handler then allocates nothing, and XLA may capture it in a command
# buffer (src/ffi/gemm_handlers.cpp).
_ffi.library.qmesh_jax_gemm_workspace_bytes.restype = ctypes.c_size_t
_WORKSPACE = jax.core.ShapedArray((_ffi.library.qmesh_jax_gemm_workspace_bytes(),), jnp.uint8)


def _lower_with_workspace(op, ctx, *args, **params):
    if op.is_empty(*ctx.avals_in, **params):
        return primitive._lower_inner(op, ctx, *args, **params)
    lowering = jax.ffi.ffi_lowering(op.target)
    outs = lowering(
        ctx.replace(avals_out=[*ctx.avals_out, _WORKSPACE]), *args, **op.attributes(**params)
    )
    return outs[:-1]


mlir.register_lowering(Gemm.inner, functools.partial(_lower_with_workspace, Gemm), platform="cuda")


def gemm(
    a,
    b,
    a_scale_inv=None,
    b_scale_inv=None,
    *,
    trans_a: bool = False,
    trans_b: bool = True,
    epilogue=Epilogue.NONE,
    bias=None,
    aux=None,
    out_dtype=jnp.float32,
    split_accumulator: bool = False,
    alpha: float = 1.0,
    dbias_dtype=None,
    a_block: int = 0,
    b_block: int = 0,
):
    """D = epilogue(alpha * op(a) @ op(b)) in `out_dtype` (float32, bfloat16 or float16).

    a, b: 2-D, both FP8 with their float32 scalar scale_inv (x ~= code * scale_inv), or both
    one plain dtype (scale_inv not used); or both 3-D, a batch of GEMMs in one call, D [batch,
    M, N] (module docstring). bias [N] for BIAS and BIAS_GELU_AUX; aux [M, N] (the
    saved pre-activation) for DGELU. a_block / b_block: 1 (1x128) or 2 (128x128) for
    block-scaled operands, whose scale_inv are then their scale tensors (module docstring).
    split_accumulator: the FP8 GEMM on Hopper promotes its
    accumulator to float32 regularly (for the backward GEMMs); ignored elsewhere.

    Returns D, or (D, aux) for BIAS_GELU_AUX (aux: the pre-activation in bias's dtype), or
    (D, dbias) for BIAS_GRAD (dbias [M] in `dbias_dtype`, default out_dtype: the row sums of the
    dequantized op(a), without alpha).
    """
    epilogue = _epilogue(epilogue)
    a, b = jnp.asarray(a), jnp.asarray(b)
    one = jnp.ones((), F32)
    a_scale_inv = one if a_scale_inv is None else jnp.asarray(a_scale_inv)
    b_scale_inv = one if b_scale_inv is None else jnp.asarray(b_scale_inv)
    if (a.dtype in FP8_DTYPES) and (a_scale_inv is one or b_scale_inv is one):
        raise TypeError(
            "gemm: FP8 operands need a_scale_inv and b_scale_inv (float32 scalars, or the "
            "scale tensors of block-scaled operands)"
        )
    blocks = [0 if blk == 0 else check_block(blk) for blk in (a_block, b_block)]
    wanted = EPILOGUES[epilogue].operand
    if wanted != "bias" and bias is not None:
        raise ValueError(f"gemm: bias is given but epilogue {epilogue.name} does not use it")
    if wanted != "aux" and aux is not None:
        raise ValueError(
            f"gemm: aux is given but epilogue {epilogue.name} does not take it as an "
            "operand (BIAS_GELU_AUX returns it)"
        )
    extra = bias if wanted == "bias" else aux if wanted == "aux" else None
    if wanted and extra is None:
        raise ValueError(f"gemm: epilogue {epilogue.name} needs {wanted}")
    out_dtype = check_wide(out_dtype, "gemm: out_dtype")
    params = dict(
        trans_a=bool(trans_a),
        trans_b=bool(trans_b),
        epilogue=epilogue,
        out_dtype=out_dtype,
        dbias_dtype=check_wide(
            out_dtype if dbias_dtype is None else dbias_dtype, "gemm: dbias_dtype"
        ),
        split_accumulator=bool(split_accumulator),
        alpha=float(alpha),
        a_block=blocks[0],
        b_block=blocks[1],
    )
    extra = jnp.zeros((0,), F32) if extra is None else jnp.asarray(extra)
    outs = Gemm.bind(a, b, a_scale_inv, b_scale_inv, extra, **params)
    return outs[0] if len(outs) == 1 else tuple(outs)
