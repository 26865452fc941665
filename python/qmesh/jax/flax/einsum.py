"""The einsum drop-in: FP8 for a model written with jnp.einsum (attention projections, MoE
experts), as Flax's flax.linen.fp8_ops.Fp8Einsum:

    einsum = make_einsum_cls(DelayedScaling())()       # in setup, or inline in a compact call
    q = einsum("btd,dnh->btnh", x, q_kernel)           # instead of jnp.einsum(...)

The second operand is the kernel (the weight), the first the input; the module creates no
parameters and keeps its delayed-scaling state as the dot_general drop-in does
(wrap_function_in_state_module: `_overwrite_with_gradient`, the updated state as its
gradient). Every recipe; recipe None: the autocast's (qmesh.jax.autocast).

An equation maps onto one FP8 dense GEMM (quantized_dot_general): the indices of both operands
that the output drops are the contraction K (any number, flattened), the indices of one
operand only are its free dimensions (the input's become the GEMM's rows, the kernel's its
columns N), indices of both operands and the output are batch dimensions (one GEMM per batch
element, see quantized_dot_general); operands are transposed as needed and the result is
transposed to the output's order. Shardings of the operands' dimensions carry through the
transposes and reshapes to qmesh's GEMM primitives, whose rules keep the rows' and columns'
shardings and sum the partial products of a sharded K; a batch index runs as a loop of GEMMs
(flax/batch.py), split over MeshResource.ep_resource (expert parallelism: nothing gathered),
else not keeping its sharding. Refused, with the reason:
anything but two operands, an implicit output (no "->"), an index repeated within a term
(diagonals, traces), an index summed within one operand only, an output index of neither
operand, no contracted index (an outer product).

Ellipsis: each '...' stands for the dimensions of its operand that the term does not name,
right-aligned between the operands as in numpy (the last dimensions of two ellipses are the
same indices, so they must have the same size: no broadcasting of size 1); the output's '...'
stands for the longer one. "...d,df->...f" (a Dense on any leading dimensions),
"...hd,hdf->...f" (an attention output projection) and "e...d,edf->e...f" (experts with any
token dimensions) thus map as their spelled-out forms do; refusals quote the equation with
the letters given to the ellipsis.
"""

from __future__ import annotations

import string

from jax import numpy as jnp

from qmesh.jax.dense import FALLBACKS
from qmesh.jax.flax.dot_general import quantized_dot_general
from qmesh.jax.flax.state_module import wrap_function_in_state_module
from qmesh.jax.recipe import check_recipe


def _refuse(eqn: str, why: str):
    raise ValueError(f"qmesh's einsum cannot map {eqn!r} onto one GEMM: {why}")


def expand_ellipsis(eqn: str, lhs: str, rhs: str, out: str, lhs_ndim: int, rhs_ndim: int):
    """(lhs, rhs, out) with each '...' replaced by letters of the equation's own, one per
    dimension it stands for (the operand's rank less its named indices): right-aligned, so the
    last dimensions of both operands' ellipses share letters (sized alike, or refused as
    differing in size), and the output's '...' stands for the longer one."""
    if "." not in lhs + rhs + out:
        return lhs, rhs, out
    for term in (lhs, rhs, out):
        if "." in term.replace("...", "", 1):
            _refuse(eqn, f"a term has one '...' at most and no other '.': {term!r}")
    lengths = []
    for term, ndim, what in ((lhs, lhs_ndim, "input"), (rhs, rhs_ndim, "kernel")):
        named = len(term.replace("...", ""))
        if "..." in term and named > ndim:
            _refuse(eqn, f"the {what} term {term!r} names {named} dimensions of a {ndim}-D {what}")
        lengths.append(ndim - named if "..." in term else 0)
    free = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in lhs + rhs + out]
    fresh = "".join(free[: max(lengths)])
    lhs, rhs = (t.replace("...", fresh[len(fresh) - n :]) for t, n in zip((lhs, rhs), lengths))
    return lhs, rhs, out.replace("...", fresh)


def parse_equation(eqn: str, lhs_ndim: int, rhs_ndim: int):
    """(dimension_numbers, perm): the lax.dot_general dimension numbers of a two-operand
    einsum equation and the permutation taking dot_general's result (batch, lhs free, rhs
    free) to the equation's output. Raises ValueError for an equation that does not map onto
    one GEMM (see the module docstring)."""
    if not isinstance(eqn, str):
        raise TypeError(f"einsum: the equation must be a str, not {type(eqn).__name__}")
    spec = eqn.replace(" ", "")
    if spec.count("->") != 1:
        _refuse(eqn, "write the output explicitly, as in 'btd,dh->bth'")
    inputs, out = spec.split("->")
    terms = inputs.split(",")
    if len(terms) != 2:
        _refuse(eqn, f"it has {len(terms)} operands; the drop-in takes two (input, kernel)")
    lhs, rhs, out = expand_ellipsis(eqn, *terms, out, lhs_ndim, rhs_ndim)
    if "..." in spec:  # name the letters the refusals below may speak of
        eqn = f"{eqn} (read as {lhs},{rhs}->{out})"
    for term, ndim, what in ((lhs, lhs_ndim, "input"), (rhs, rhs_ndim, "kernel"), (out, None, "")):
        if not all(c.isalpha() for c in term):
            _refuse(eqn, f"indices are letters, not {term!r}")
        if len(set(term)) != len(term):
            _refuse(eqn, f"an index repeats within {term!r} (a diagonal or trace)")
        if ndim is not None and len(term) != ndim:
            _refuse(
                eqn, f"the {what} term {term!r} names {len(term)} dimensions of a {ndim}-D {what}"
            )
    for c in out:
        if c not in lhs and c not in rhs:
            _refuse(eqn, f"the output index {c!r} is in neither operand")
    for term, other in ((lhs, rhs), (rhs, lhs)):
        for c in term:
            if c not in other and c not in out:
                _refuse(eqn, f"index {c!r} is summed within one operand; sum it out first")
    lb = [i for i, c in enumerate(lhs) if c in rhs and c in out]
    lc = [i for i, c in enumerate(lhs) if c in rhs and c not in out]
    if not lc:
        _refuse(eqn, "no index is contracted (an outer product); multiply with broadcasting")
    dims = ((lc, [rhs.index(lhs[i]) for i in lc]), (lb, [rhs.index(lhs[i]) for i in lb]))
    result = [lhs[i] for i in lb]
    result += [c for c in lhs if c not in rhs] + [c for c in rhs if c not in lhs]
    return dims, tuple(result.index(c) for c in out)


def make_einsum_cls(recipe=None, fallback: str | None = None):
    """A Flax module class whose instances compute jnp.einsum(eqn, x, kernel) with qmesh's
    FP8 dense op: called as einsum(eqn, x, kernel, precision=None,
    preferred_element_type=None), the kernel cast to x's dtype, the result in
    preferred_element_type (default: the operands' result type); precision applies in high
    precision only. recipe: as
    make_dot_general_cls (None: the autocast's); fallback: None or "bf16" (as dense())."""
    if recipe is not None:
        check_recipe(recipe)
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'bf16', not {fallback!r}")

    def einsum(states, eqn, x, kernel, precision=None, preferred_element_type=None):
        """jnp.einsum(eqn, x, kernel) as one FP8 GEMM; see make_einsum_cls."""
        x, kernel = jnp.asarray(x), jnp.asarray(kernel)
        dims, perm = parse_equation(eqn, x.ndim, kernel.ndim)
        y = quantized_dot_general(
            states, x, kernel, dims, precision, preferred_element_type, fallback
        )
        return jnp.transpose(y, perm)

    return wrap_function_in_state_module(einsum, recipe, "QmeshEinsum")
