"""qmesh for Flax (Linen): the FP8 drop-ins `make_dot_general_cls(recipe)` for nn.Dense and
`make_einsum_cls(recipe)` for jnp.einsum, both on `wrap_function_in_state_module`, and
TransformerEngine-style modules. See docs/flax.md."""

from qmesh.jax.flax.dot_general import make_dot_general_cls
from qmesh.jax.flax.einsum import make_einsum_cls
from qmesh.jax.flax.fp8_info import fp8_meta, saturation
from qmesh.jax.flax.layer_norm import LayerNorm
from qmesh.jax.flax.module import DenseGeneral, LayerNormDenseGeneral, LayerNormMLP, Softmax
from qmesh.jax.flax.sharding import logical_axis_rules
from qmesh.jax.flax.state_module import wrap_function_in_state_module
from qmesh.jax.flax.train_state import TrainState

__all__ = [
    "DenseGeneral",
    "LayerNorm",
    "LayerNormDenseGeneral",
    "LayerNormMLP",
    "Softmax",
    "TrainState",
    "fp8_meta",
    "logical_axis_rules",
    "make_dot_general_cls",
    "make_einsum_cls",
    "saturation",
    "wrap_function_in_state_module",
]
