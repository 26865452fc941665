"""qmesh: FP8 training across many GPUs. `qmesh.jax` holds the JAX primitives."""

__version__ = "0.1.0"
