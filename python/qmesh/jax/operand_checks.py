"""The operand checks the quantize primitives share (quantize.py, block_quantize.py, mxfp8.py,
nvfp4.py): a 2-D input of whole blocks, the group sizes of a grouped quantize, and a sharding
that cuts no scaling block. Each raises with what to do."""

from __future__ import annotations

import math

import jax.numpy as jnp


def check_matrix(shape, what: str, op: str, *, multiple: int = 1, positive: bool = False):
    """Raises ValueError unless `shape` is 2-D [rows, cols] with rows and cols multiples of
    `multiple` (and, if `positive`, not 0); `op` names the op and `what` the argument in the
    message. Returns (rows, cols)."""
    shape = tuple(shape)
    whole = len(shape) == 2 and not (shape[0] % multiple or shape[1] % multiple)
    if whole and not (positive and 0 in shape):
        return shape
    if multiple == 1:
        raise ValueError(
            f"{op} takes {what} as [rows, cols], not shape {shape}: reshape it to 2-D first"
        )
    sizes = "positive multiples" if positive else "multiples"
    raise ValueError(
        f"{op} takes {what} as [rows, cols] with rows and cols {sizes} of {multiple}, not shape "
        f"{shape}: reshape it, or pad it to multiples of {multiple}"
    )


def check_group_sizes(group_sizes, rows: int, op: str) -> int:
    """Raises unless group_sizes is int32 [G] with G > 0 when there are rows. Returns G. (That
    the sizes add up to the rows, none negative, is a runtime check of the handler.)"""
    if group_sizes.dtype != jnp.int32 or len(group_sizes.shape) != 1:
        raise TypeError(
            f"group_sizes must be int32 [G], not {group_sizes.dtype}{list(group_sizes.shape)}"
        )
    groups = group_sizes.shape[0]
    if groups == 0 and rows > 0:
        raise ValueError(f"{op}: no groups for {rows} rows; group_sizes must cover every row of x")
    return groups


def check_whole_blocks(mesh, axes, size: int, block: int, what: str, kind: str) -> None:
    """Raises ValueError unless the shards of a dimension of `size` over the mesh `axes` are
    multiples of `block` (a shard boundary would otherwise cut a `kind`, e.g. "scaling
    block")."""
    count = math.prod(dict(zip(mesh.axis_names, mesh.devices.shape))[a] for a in axes)
    if axes and (size // count) % block:
        raise ValueError(
            f"{what} ({size}) is sharded over mesh axes {axes} into shards of {size // count}, "
            f"which is not a multiple of {block}: a shard boundary would cut {kind}. Shard it "
            f"into multiples of {block} (fewer devices on those axes, or a size that is a "
            f"multiple of {block} times their device count), or replicate it"
        )
