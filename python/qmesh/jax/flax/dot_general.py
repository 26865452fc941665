"""The drop-in: FP8 for an existing Flax model by changing one argument of nn.Dense.

    cls = make_dot_general_cls(DelayedScaling())
    nn.Dense(features, dot_general_cls=cls)        # or nn.Dense(features, dot_general=cls())

The module creates no parameters (the model's kernel, initialisation, sharding annotations and
optimizer stay as they are). With DelayedScaling it keeps, in the collection
`_overwrite_with_gradient` (flax.linen.fp8_ops.OVERWRITE_WITH_GRADIENT), the amax history and
scale of its input, kernel and output gradient (Flax's variable names); the backward pass
returns their updated values as their gradient, which TrainState.apply_gradients writes back.
Float8CurrentScaling keeps no state. Built on wrap_function_in_state_module (state_module.py).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from qmesh.jax.dense import FALLBACKS, dense
from qmesh.jax.flax.batch import map_batch
from qmesh.jax.flax.state_module import States, wrap_function_in_state_module
from qmesh.jax.recipe import check_recipe


def _dims(dims, ndim: int, what: str) -> list:
    """dims as non-negative dimensions of an ndim-D operand (raises for one out of range)."""
    dims = list(dims)
    if any(not -ndim <= d < ndim for d in dims):
        raise ValueError(f"{what} {tuple(dims)} out of range for a {ndim}-D operand")
    return [d % ndim for d in dims]


def quantized_dot_general(
    states: States,
    lhs,
    rhs,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    fallback=None,
):
    """lax.dot_general(lhs, rhs, dimension_numbers) as qmesh's FP8 dense op: lhs's free
    dimensions become the GEMM's rows, the contracting dimensions its K (rhs is the kernel
    [K, N], its free dimensions flattened to N). Batch dimensions (flattened) map over one GEMM
    each (batch.map_batch: a loop, split over MeshResource.ep_resource; the state is shared:
    under delayed scaling the batch's amaxes combine by maximum, current and block scaling
    scale each batch element on its own). The result has
    dot_general's layout: batch, lhs free, rhs free. Under autocast(enabled=False) (states.recipe
    None): lax.dot_general itself, with `precision` (which the FP8 GEMM ignores)."""
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    out_dtype = preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype)
    if states.recipe is None:
        return lax.dot_general(
            lhs, rhs, dimension_numbers, precision, preferred_element_type=preferred_element_type
        ).astype(out_dtype)
    (lc, rc), (lb, rb) = dimension_numbers
    lc, lb = _dims(lc, lhs.ndim, "lhs dimensions"), _dims(lb, lhs.ndim, "lhs dimensions")
    rc, rb = _dims(rc, rhs.ndim, "rhs dimensions"), _dims(rb, rhs.ndim, "rhs dimensions")
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise ValueError(f"dot_general: unpaired dimensions in {dimension_numbers}")
    if not lc:
        raise ValueError(
            f"qmesh's dot_general: {dimension_numbers} contracts no dimension (an outer "
            "product, no GEMM): compute it as a broadcast multiplication"
        )
    for a, b in zip(lc + lb, rc + rb):
        if lhs.shape[a] != rhs.shape[b]:
            raise ValueError(
                f"dot_general: lhs dimension {a} ({lhs.shape[a]}) and rhs dimension {b} "
                f"({rhs.shape[b]}) are paired but differ in size"
            )
    lfree = [d for d in range(lhs.ndim) if d not in lc + lb]
    rfree = [d for d in range(rhs.ndim) if d not in rc + rb]
    batch = tuple(lhs.shape[d] for d in lb)
    k = math.prod(lhs.shape[d] for d in lc)
    x = jnp.transpose(lhs, lb + lfree + lc)
    x = x.reshape(math.prod(batch), *x.shape[len(lb) : len(lb) + len(lfree)], k)
    w = jnp.transpose(rhs, rb + rc + rfree).reshape(math.prod(batch), k, -1)
    state = states()

    def gemm(x, w, state):
        return dense(
            x,
            w.astype(x.dtype) if w.dtype != x.dtype else w,
            None,
            state,
            recipe=states.recipe,
            out_dtype=out_dtype,
            fallback=fallback,
        )

    y = map_batch(gemm, x, w, state) if lb else gemm(x[0], w[0], state)
    return y.reshape(*batch, *(lhs.shape[d] for d in lfree), *(rhs.shape[d] for d in rfree))


_MIXUP = (
    "qmesh's dot_general module: give nn.Dense the class as "
    "dot_general_cls=make_dot_general_cls(recipe), or an instance as "
    "dot_general=make_dot_general_cls(recipe)()"
)


def make_dot_general_cls(recipe=None, fallback: str | None = None):
    """A Flax module class computing lax.dot_general's result with qmesh's FP8 dense op.

    recipe: qmesh.jax.recipe.DelayedScaling(), Float8CurrentScaling(), Float8BlockScaling(),
    MXFP8BlockScaling() (GEMMs emulated, qmesh/jax/mxfp8_dense.py; fallback not used) or
    None: the autocast's when called (qmesh.jax.autocast; DelayedScaling() outside autocast);
    fallback: None (raise when FP8 cannot be used) or "bf16" (run such calls in
    bfloat16, counted in stats)."""
    if recipe is not None:
        check_recipe(recipe)
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'bf16', not {fallback!r}")

    def dot_general(
        states,
        lhs=None,
        rhs=None,
        dimension_numbers=None,
        precision=None,
        preferred_element_type=None,
    ):
        """lhs . rhs as an FP8 GEMM; see make_dot_general_cls."""
        if lhs is None or rhs is None or dimension_numbers is None:
            raise TypeError(_MIXUP + " (an instance was passed as dot_general_cls=)")
        return quantized_dot_general(
            states, lhs, rhs, dimension_numbers, precision, preferred_element_type, fallback
        )

    class QmeshDotGeneral(wrap_function_in_state_module(dot_general, recipe)):
        def __new__(cls, *args, **kwargs):
            if args:  # Flax called the class as the dot_general function
                raise TypeError(_MIXUP + " (the class was passed as dot_general=)")
            return super().__new__(cls, **kwargs)

    return QmeshDotGeneral
