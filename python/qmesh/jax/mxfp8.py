"""MXFP8 quantization primitives (the MXFP8BlockScaling recipe, docs/design/mxfp8.md):
quantize (optionally with the columnwise copy), dbias + quantize and dequantize, each running
qmesh's C++ op on every device's shard.

x is 2-D [R, C] with R and C multiples of 32. Every 32 consecutive elements of a row share one
E8M0 scale (float8_e8m0fnu, the value 2^(byte - 127)): the block amax over fp8_max * 2^-margin
rounded up to a power of two, so no element saturates. Scales are [R, C/32]; the columnwise
copy q_t [C, R] (x transposed, quantized along its own rows: 32x1 blocks of x) has scales
[C, R/32]. x ~= code * scale.

Sharding: codes and scales follow x's sharding (the copy the transposed one); a sharded
dimension must split into shards that are multiples of 32 (ValueError naming it otherwise).
No collective, except the bias gradient's sum over the axes of g's rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qmesh.jax.common import F32, axes_of, check_fp8, check_wide, even_spec, named
from qmesh.jax.operand_checks import check_matrix, check_whole_blocks
from qmesh.jax.primitive import Op, register

MX_BLOCK = 32  # elements per E8M0 scale
E8M0 = jnp.dtype(jnp.float8_e8m0fnu)


def _check_x(x, what):
    check_wide(x.dtype, what)
    check_matrix(x.shape, what, "MXFP8 quantize", multiple=MX_BLOCK)


def _avals(x, *, out_dtype, columnwise):
    _check_x(x, "x")
    out_dtype = check_fp8(out_dtype)
    rows, cols = x.shape
    outs = [
        jax.core.ShapedArray((rows, cols), out_dtype),
        jax.core.ShapedArray((rows, cols // MX_BLOCK), E8M0),
    ]
    if columnwise:
        outs += [
            jax.core.ShapedArray((cols, rows), out_dtype),
            jax.core.ShapedArray((cols, rows // MX_BLOCK), E8M0),
        ]
    else:
        outs += [jax.core.ShapedArray((0,), out_dtype), jax.core.ShapedArray((0,), E8M0)]
    return outs


def _whole_blocks(mesh, axes, size, what):
    """Raises ValueError unless the shards of `size` over `axes` are multiples of 32."""
    check_whole_blocks(mesh, axes, size, MX_BLOCK, what, "an MXFP8 block")


def _shardings(mesh, x_info, columnwise, what):
    """Shardings of (x, [q, scale, q_t, scale_t]) and the mesh axes of x's rows."""
    spec = even_spec(mesh, x_info)
    rows, cols = x_info.shape
    _whole_blocks(mesh, axes_of(spec[1]), cols, f"{what}: the columns")
    if columnwise:
        _whole_blocks(mesh, axes_of(spec[0]), rows, f"{what}: the rows (the copy's blocks)")
    data = named(mesh, *spec)
    outs = [data, data, named(mesh), named(mesh)]
    if columnwise:
        outs[2] = outs[3] = named(mesh, spec[1], spec[0])
    return data, outs, axes_of(spec[0])


def _rule(columnwise):
    return "i j, i k, j i, j l" if columnwise else "i j, i k, z, t"


class _Mxfp8Cast(Op):
    num_inputs = 1
    static_params = ("out_dtype", "columnwise", "margin")

    @classmethod
    def abstract(cls, x, *, out_dtype, columnwise, margin):
        return tuple(_avals(x, out_dtype=out_dtype, columnwise=columnwise))

    @classmethod
    def attributes(cls, *, margin, **_):
        return dict(margin=np.float32(margin))

    @classmethod
    def empty(cls, x, *, out_dtype, columnwise, **_):
        avals = _avals(x, out_dtype=out_dtype, columnwise=columnwise)
        return tuple(jnp.zeros(a.shape, a.dtype) for a in avals)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, columnwise, **_):
        x, outs, _ = _shardings(mesh, arg_infos[0], columnwise, "MXFP8 quantize: x")
        return (x,), outs, None

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, columnwise, **_):
        return f"i j -> {_rule(columnwise)}"


@register
class Mxfp8Quantize(_Mxfp8Cast):
    """x -> (q, scale, q_t, scale_t)."""

    name, target = "qmesh_mxfp8_quantize", "qmesh_mxfp8_quantize"


@register
class Mxfp8DbiasQuantize(_Mxfp8Cast):
    """g -> (q, scale, q_t, scale_t, dbias): MXFP8 quantize of an output gradient and its bias
    gradient dbias[c] = sum over rows of g[r, c] (float32 [cols]) in the same pass."""

    name, target = "qmesh_mxfp8_dbias_quantize", "qmesh_mxfp8_dbias_quantize"

    @classmethod
    def abstract(cls, g, **params):
        return (*super().abstract(g, **params), jax.core.ShapedArray((g.shape[1],), F32))

    @classmethod
    def empty(cls, g, **params):
        return (*super().empty(g, **params), jnp.zeros((g.shape[1],), F32))

    @classmethod
    def local(cls, plan, g, **params):
        """plan: the mesh axes of g's rows (the bias gradient is summed over them), or None."""
        *outs, dbias = cls.inner.bind(g, **params)
        return (*outs, lax.psum(dbias, plan) if plan else dbias)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, columnwise, **_):
        g, outs, rows = _shardings(mesh, arg_infos[0], columnwise, "MXFP8 dbias quantize: g")
        dbias = named(mesh, g.spec[1] if len(g.spec) > 1 else None)
        return (g,), (*outs, dbias), rows

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, columnwise, **_):
        return f"i j -> {_rule(columnwise)}, j"


@register
class Mxfp8Dequantize(Op):
    """(q, scale) -> code * 2^(scale - 127), in `out_dtype`."""

    name, target, num_inputs = "qmesh_mxfp8_dequantize", "qmesh_mxfp8_dequantize", 2
    static_params = ("out_dtype",)

    @classmethod
    def abstract(cls, q, scale, *, out_dtype):
        check_fp8(q.dtype)
        if q.ndim != 2 or q.shape[1] % MX_BLOCK:
            raise ValueError(f"MXFP8 dequantize takes q as [rows, cols / 32 * 32], not {q.shape}")
        want = (q.shape[0], q.shape[1] // MX_BLOCK)
        if scale.dtype != E8M0 or tuple(scale.shape) != want:
            raise ValueError(
                f"the scales of an MXFP8 {list(q.shape)} tensor must be float8_e8m0fnu"
                f"{list(want)}, not {scale.dtype}{list(scale.shape)}"
            )
        return (jax.core.ShapedArray(q.shape, check_wide(out_dtype, "out_dtype")),)

    @classmethod
    def empty(cls, q, scale, *, out_dtype):
        return (jnp.zeros(q.shape, out_dtype),)

    @classmethod
    def shardings(cls, mesh, arg_infos, **_):
        spec = even_spec(mesh, arg_infos[0])
        _whole_blocks(mesh, axes_of(spec[1]), arg_infos[0].shape[1], "MXFP8 dequantize: q")
        q = named(mesh, *spec)
        return (q, q), (q,), None

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return "i j, i k -> i j"


# ---- the functions users call -----------------------------------------------------------------


def quantize_params(out_dtype, columnwise, margin):
    """The static parameters of an MXFP8 quantize, checked."""
    if not (margin >= 0 and margin != float("inf")):
        raise ValueError(f"margin must be finite and >= 0, not {margin}")
    return dict(out_dtype=check_fp8(out_dtype), columnwise=bool(columnwise), margin=float(margin))


def mxfp8_quantize(x, out_dtype=jnp.float8_e4m3fn, *, columnwise=False, margin=0.0):
    """MXFP8-quantizes x [R, C] -> (q, scale, q_t, scale_t): codes [R, C], float8_e8m0fnu
    scales [R, C/32], and if `columnwise` the copy q_t [C, R] with scales [C, R/32] (else two
    empty arrays)."""
    return Mxfp8Quantize.bind(jnp.asarray(x), **quantize_params(out_dtype, columnwise, margin))


def mxfp8_dbias_quantize(g, out_dtype=jnp.float8_e5m2, *, columnwise=False, margin=0.0):
    """mxfp8_quantize of g [R, C] plus dbias = g.sum(0) in float32 [C]."""
    return Mxfp8DbiasQuantize.bind(jnp.asarray(g), **quantize_params(out_dtype, columnwise, margin))


def mxfp8_dequantize(q, scale, *, out_dtype=jnp.float32):
    """code * 2^(scale - 127) for q [R, C] with scales [R, C/32], in out_dtype."""
    return Mxfp8Dequantize.bind(
        jnp.asarray(q), jnp.asarray(scale), out_dtype=check_wide(out_dtype, "out_dtype")
    )[0]
