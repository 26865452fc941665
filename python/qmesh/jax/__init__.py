"""qmesh for JAX: FP8 primitives backed by qmesh's C++ ops through XLA FFI handlers, with
sharding rules (Shardy) for meshes described by a MeshResource. See docs/jax.md.

The modules autocast, dense, gemm, layer_norm and stats can be called as their main function:
qmesh.jax.dense(...) is qmesh.jax.dense.dense(...), qmesh.jax.stats() is
qmesh.jax.stats.stats(), `with qmesh.jax.autocast(...)` is qmesh.jax.autocast.autocast."""

import sys
import types

from qmesh.jax import autocast, dense, gemm, layer_norm, recipe, stats
from qmesh.jax._ffi import built_with_jaxlib
from qmesh.jax.block_quantize import (
    block_dbias_quantize,
    block_dequantize,
    block_quantize,
    block_scale_shape,
    grouped_block_quantize,
)
from qmesh.jax.collective_gemm import CollectiveGemm, all_gather_gemm, gemm_reduce_scatter
from qmesh.jax.delayed_state import combine_state_grads, keep_unused_state, share_state, split_state
from qmesh.jax.dense import init_state
from qmesh.jax.gemm import Epilogue
from qmesh.jax.grouped_scaled_quantize import grouped_mxfp8_quantize, grouped_nvfp4_quantize
from qmesh.jax.mxfp8 import mxfp8_dbias_quantize, mxfp8_dequantize, mxfp8_quantize
from qmesh.jax.nvfp4 import nvfp4_dequantize, nvfp4_quantize
from qmesh.jax.quantize import (
    Quantized,
    amax,
    current_scale,
    dbias_quantize,
    dequantize,
    grouped_quantize,
    quantize,
    quantize_current,
)
from qmesh.jax.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
)
from qmesh.jax.sharding import MeshResource, global_mesh_resource, global_shard_guard


class _CallableModule(types.ModuleType):
    """A module that calls its function of the same name (qmesh.jax.gemm(...) is
    qmesh.jax.gemm.gemm(...)); its other names stay attributes."""

    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rsplit(".", 1)[1])(*args, **kwargs)


for _module in (autocast, dense, gemm, layer_norm, stats):
    sys.modules[_module.__name__].__class__ = _CallableModule

__all__ = [
    "CollectiveGemm",
    "DelayedScaling",
    "Epilogue",
    "Float8BlockScaling",
    "Float8CurrentScaling",
    "Format",
    "MXFP8BlockScaling",
    "MeshResource",
    "Quantized",
    "all_gather_gemm",
    "amax",
    "autocast",
    "block_dbias_quantize",
    "block_dequantize",
    "block_quantize",
    "block_scale_shape",
    "grouped_block_quantize",
    "built_with_jaxlib",
    "combine_state_grads",
    "current_scale",
    "dbias_quantize",
    "dense",
    "dequantize",
    "gemm",
    "gemm_reduce_scatter",
    "global_mesh_resource",
    "global_shard_guard",
    "grouped_mxfp8_quantize",
    "grouped_nvfp4_quantize",
    "grouped_quantize",
    "init_state",
    "nvfp4_dequantize",
    "nvfp4_quantize",
    "keep_unused_state",
    "layer_norm",
    "mxfp8_dbias_quantize",
    "mxfp8_dequantize",
    "mxfp8_quantize",
    "quantize",
    "quantize_current",
    "recipe",
    "share_state",
    "split_state",
    "stats",
]
