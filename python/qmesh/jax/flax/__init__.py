"""qmesh for Flax (Linen): the FP8 drop-in `make_dot_general_cls(recipe)` for nn.Dense, and
TransformerEngine-style modules. See docs/flax.md."""

from qmesh.jax.flax.dot_general import make_dot_general_cls

__all__ = ["make_dot_general_cls"]
