"""What every qmesh JAX op shares: the dtype sets, the checks of dtypes and scalar operands,
and the partition-spec helpers of the sharding rules.

A PartitionSpec entry names the mesh axes of one dimension: None, 'dp' or ('dp', 'tp').
`axes_of` turns an entry into a tuple of axes, `entry` a tuple of axes back into an entry.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

F32 = jnp.dtype(jnp.float32)
FP8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))
WIDE_DTYPES = (F32, jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


# ---- dtypes and scalars -----------------------------------------------------------------------


def check_fp8(dtype):
    """The FP8 dtype `dtype` names; raises TypeError for any other dtype."""
    dtype = jnp.dtype(dtype)
    if dtype not in FP8_DTYPES:
        raise TypeError(f"the FP8 dtype must be float8_e4m3fn or float8_e5m2, not {dtype}")
    return dtype


def fp8_max(dtype) -> float:
    """The largest finite value of an FP8 dtype (448 for E4M3, 57344 for E5M2)."""
    return float(jnp.finfo(check_fp8(dtype)).max)


def check_wide(dtype, what: str):
    """The dtype `dtype` names; raises TypeError unless it is float32, bfloat16 or float16.
    `what` names the argument in the message (with the op's prefix, e.g. "gemm: bias")."""
    dtype = jnp.dtype(dtype)
    if dtype not in WIDE_DTYPES:
        raise TypeError(f"{what} must be float32, bfloat16 or float16, not {dtype}")
    return dtype


def check_scalar(aval, what: str) -> None:
    """Raises TypeError unless `aval` is a float32 scalar of shape () (a scale, scale_inv)."""
    if aval.dtype != F32 or aval.shape != ():
        raise TypeError(
            f"{what} must be a float32 scalar (shape ()), not {aval.dtype}{list(aval.shape)}"
        )


# ---- partition specs --------------------------------------------------------------------------


def axes_of(entry) -> tuple[str, ...]:
    """The mesh axes one PartitionSpec entry names (None, 'dp' or ('dp', 'tp'))."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def entry(axes):
    """The PartitionSpec entry for a sequence of mesh axes: None, one name, or a tuple."""
    axes = tuple(axes)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def named(mesh, *spec) -> NamedSharding:
    """NamedSharding(mesh, PartitionSpec(*spec))."""
    return NamedSharding(mesh, PartitionSpec(*spec))


def spec_of(info, ndim: int | None = None) -> tuple:
    """The PartitionSpec of an argument as a tuple with one entry per dimension."""
    ndim = len(info.shape) if ndim is None else ndim
    spec = tuple(getattr(info.sharding, "spec", ()) or ())
    return spec + (None,) * (ndim - len(spec))


def divides(mesh, axes, size: int) -> bool:
    """Whether the device count of the mesh axes `axes` divides `size` (no padded shards)."""
    counts = dict(zip(mesh.axis_names, mesh.devices.shape))
    return size % math.prod(counts[a] for a in axes) == 0


def even_spec(mesh, info, ndim: int | None = None) -> tuple:
    """spec_of(info) with every dimension whose mesh axes do not divide its size replicated:
    XLA pads such shards, and an op must not read the padding as data."""
    return tuple(
        e if e is None or divides(mesh, axes_of(e), info.shape[d]) else None
        for d, e in enumerate(spec_of(info, ndim))
    )
