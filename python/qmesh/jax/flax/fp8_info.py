"""What FP8 does, readable by users: the delayed-scaling state of each GEMM, and how many
values of a tensor saturate or flush to zero at a given scale."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

from qmesh.jax.common import check_fp8, fp8_max
from qmesh.jax.dense import OPERANDS


def fp8_meta(variables) -> dict:
    """{layer path: {operand: {"amax": max of its history, "last_amax": the newest entry (row
    0), "scale": the scale the last step used}}} from a model's variables (the
    _overwrite_with_gradient collection);
    operand is input, kernel or output_grad (with a prefix such as wi_ in LayerNormMLP)."""
    col = variables.get(OVERWRITE_WITH_GRADIENT, {}) if hasattr(variables, "get") else {}
    out: dict = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(col):
        keys = [getattr(k, "key", str(k)) for k in path]
        name = keys[-1]
        layer = "/".join(keys[:-1])
        for op in OPERANDS:
            for kind in ("amax_history", "scale"):
                if name.endswith(f"{op}_{kind}"):
                    entry = out.setdefault(layer, {}).setdefault(name[: -len(kind) - 1], {})
                    if kind == "scale":
                        entry["scale"] = float(jnp.reshape(leaf, ()))
                    else:
                        entry["amax"] = float(jnp.max(leaf))
                        entry["last_amax"] = float(leaf[0])  # row 0: the newest
    return out


def saturation(x, scale, dtype=jnp.float8_e4m3fn) -> dict:
    """{"saturated": share of values with |x * scale| > fp8_max, "flushed": share of nonzero
    values that quantize to 0 (below half the smallest subnormal)}."""
    dtype = check_fp8(dtype)
    y = jnp.abs(jnp.asarray(x, jnp.float32)) * jnp.asarray(scale, jnp.float32)
    tiny = float(jnp.finfo(dtype).smallest_subnormal)
    n = max(y.size, 1)
    return {
        "saturated": float(jnp.sum(y > fp8_max(dtype)) / n),
        "flushed": float(jnp.sum((y > 0) & (y <= tiny / 2)) / n),
    }
