"""qmesh for JAX: FP8 primitives backed by qmesh's C++ ops through XLA FFI handlers, with
sharding rules (Shardy) for meshes described by a MeshResource. See docs/jax.md."""

from qmesh.jax import recipe
from qmesh.jax._ffi import built_with_jaxlib
from qmesh.jax.quantize import (Quantized, amax, current_scale, dbias_quantize, dequantize,
                                grouped_quantize, quantize, quantize_current)
from qmesh.jax.sharding import MeshResource, global_mesh_resource, global_shard_guard

__all__ = [
    "MeshResource", "Quantized", "amax", "built_with_jaxlib", "current_scale", "dbias_quantize",
    "dequantize", "global_mesh_resource", "global_shard_guard", "grouped_quantize", "quantize",
    "quantize_current", "recipe",
]
