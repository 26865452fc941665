"""The GEMMs of the MXFP8 and NVFP4 dense layers (mxfp8_dense.py, nvfp4_dense.py): where each
runs, one path per device.

  CUDA GPU   qmesh's C++ GEMM through the FFI handler qmesh_microscaled_gemm
             (src/ffi/microscaled_gemm_handler.cpp): the native cuBLASLt GEMM on compute
             capability 10.0+, the C++ emulation elsewhere (only when asked).
  CPU        the Python emulation (emulation.py): operands dequantized, then jnp.dot with
             float32 accumulation; it is the reference of the handler's numerics.

Every GEMM that runs emulated (the C++ emulation or the Python one) is counted in
qmesh.jax.stats()["emulated_gemms"] at trace time; a native GEMM is not.

Private switch: `_HANDLER_ON_CPU = True` routes the CPU through the handler too (the C++
emulation on the host), which the tests use to compare the handler with the Python emulation.

Sharding (the handler's Shardy rule and partitioning callbacks, primitive.py): the rows of A
(M) and of B (N) keep their shardings, each operand's scales sharded with its rows, and the
product comes back sharded [M, N]; every device multiplies its rows. Rows are gathered
instead where their shards would not be whole blocks (multiples of 32 rows for MXFP8, 16 for
NVFP4, as the handler takes them), and N where it would reuse a mesh axis of M. K, the
contracting dimension, is gathered (the codes and scales of a K-sharded operand are
replicated first): each product is one whole-K GEMM, no partial sums. A shard's product has
the bits of its slice of the unsharded one where the GEMM's summation order does not depend
on the shard's extent; the host BLAS's depends on N, so there a split N agrees within float32
rounding (tests/jax/test_microscaled_gemm.py). The per-tensor scale_inv are replicated
scalars.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from qmesh.jax import emulation
from qmesh.jax.common import F32, axes_of, divides, entry, named, spec_of
from qmesh.jax.mxfp8 import MX_BLOCK
from qmesh.jax.nvfp4 import BLOCK as NVFP4_BLOCK
from qmesh.jax.primitive import Op, register

_HANDLER_ON_CPU = False


def uses_handler(device=None) -> bool:
    """Whether the GEMMs on `device` (default jax.devices()[0]) go through the handler."""
    device = jax.devices()[0] if device is None else device
    return device.platform == "gpu" or (_HANDLER_ON_CPU and device.platform == "cpu")


@register
class MicroscaledGemm(Op):
    """(a, a_scale, a_scale_inv, b, b_scale, b_scale_inv) -> A @ B^T float32 [M, N]; the
    handler checks the operands (handler_gemm)."""

    name, target, num_inputs = "qmesh_microscaled_gemm", "qmesh_microscaled_gemm", 6
    static_params = ("emulate",)

    @classmethod
    def abstract(cls, a, a_scale, a_scale_inv, b, *_, **params):
        return (jax.core.ShapedArray((a.shape[0], b.shape[0]), F32),)

    @classmethod
    def attributes(cls, *, emulate):
        return dict(emulate=bool(emulate))

    @classmethod
    def empty(cls, a, a_scale, a_scale_inv, b, *_, **params):
        return (jnp.zeros((a.shape[0], b.shape[0]), F32),)

    @classmethod
    def shardings(cls, mesh, arg_infos, **params):
        a, b = arg_infos[0], arg_infos[3]

        def rows(x, taken):
            """The row axes of x kept: none where its shards would not be whole blocks."""
            block = NVFP4_BLOCK if x.dtype == jnp.uint8 else MX_BLOCK
            axes = tuple(ax for ax in axes_of(spec_of(x)[0]) if ax not in taken)
            return axes if axes and divides(mesh, axes, x.shape[0] // block) else ()

        m = rows(a, ())
        n = rows(b, m)
        by_rows = [named(mesh, entry(m), None)] * 2 + [named(mesh)]
        by_rows += [named(mesh, entry(n), None)] * 2 + [named(mesh)]
        return by_rows, [named(mesh, entry(m), entry(n))], None

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return (
            "m k, m s, i, n l, n t, j -> m n",
            {"need_replication_factors": ("k", "s", "l", "t")},
        )


def handler_gemm(a, a_scale, a_scale_inv, b, b_scale, b_scale_inv, *, emulate: bool):
    """A [M, K] @ B [N, K]^T in float32 through qmesh_microscaled_gemm, each operand its copy
    along K: MXFP8 codes [rows, K] with float8_e8m0fnu scales [rows, K / 32] (scale_inv None),
    or NVFP4 packed codes uint8 [rows, K / 2] with float8_e4m3fn scales [rows, K / 16] and the
    float32 [1] per-tensor scale_inv. emulate: run the C++ emulation where the device has no
    native GEMM (without it, such a device raises qmesh's error). Sharded operands: the module
    docstring. Under jax.vmap the GEMMs of the batch run one after another (the drop-ins'
    batch dimensions, flax/batch.py)."""
    one = jnp.ones((1,), F32)
    a_scale_inv = one if a_scale_inv is None else a_scale_inv
    b_scale_inv = one if b_scale_inv is None else b_scale_inv
    args = (a, a_scale, a_scale_inv, b, b_scale, b_scale_inv)
    return MicroscaledGemm.bind(*args, emulate=bool(emulate))[0]


def gemm(fmt: str, recipe, a, b, python_emulation):
    """A @ B^T in float32 for the copies a, b (data, scale[, scale_inv]) along K of `fmt`
    ("MXFP8" or "NVFP4") operands: the handler where uses_handler(), else
    python_emulation(a, b). Counts the GEMM when it runs emulated."""
    device = jax.devices()[0]
    if not emulation.runs_natively(device):
        emulation.count(fmt)
    if not uses_handler(device):
        return python_emulation(a, b)
    a_si = a[2] if len(a) > 2 else None
    b_si = b[2] if len(b) > 2 else None
    return handler_gemm(
        a[0], a[1], a_si, b[0], b[1], b_si, emulate=emulation.emulation_requested(recipe)
    )
