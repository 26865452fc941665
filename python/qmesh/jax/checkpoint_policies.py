"""Remat policies that know qmesh's primitives (for jax.checkpoint / flax.linen.remat).

    jax.checkpoint(f, policy=qmesh.jax.checkpoint_policies.checkpoint_dots_and_qmesh_gemms)

The policy saves what `jax.checkpoint_policies.checkpoint_dots` saves (dot_general outputs),
the outputs of qmesh's GEMM primitives (found by primitive name) and the FP8 operands that
qmesh.jax.dense keeps for its backward (its checkpoint name, with the codes as uint8: see
dense.SAVED_NAME): the backward reuses the forward's FP8 codes instead of quantizing again.
"""

from __future__ import annotations

from jax import lax

from qmesh.jax.dense import SAVED_NAME

GEMM_PRIMITIVES = frozenset({"qmesh_gemm"})


def checkpoint_dots_and_qmesh_gemms(prim, *_, **params) -> bool:
    """Whether to save the outputs of `prim`: dot_general, qmesh's GEMMs, dense's FP8 operands."""
    if prim.name == "name":  # jax.ad_checkpoint.checkpoint_name
        return params.get("name") == SAVED_NAME
    return prim is lax.dot_general_p or prim.name in GEMM_PRIMITIVES
