"""FP8 scaling recipes, with TransformerEngine's class and field names and defaults.

    DelayedScaling(margin=0, fp8_format=Format.HYBRID, amax_history_len=1024,
                   amax_compute_algo="max")
    Float8CurrentScaling(fp8_format=Format.HYBRID)
    Float8BlockScaling(fp8_format=Format.E4M3, fp8_quant_fwd_inp=QParams(),
                       fp8_quant_fwd_weight=QParams(), fp8_quant_bwd_grad=QParams(),
                       x_block_scaling_dim=1, w_block_scaling_dim=2,
                       grad_block_scaling_dim=1, fp8_gemm_fprop=MMParams(),
                       fp8_gemm_dgrad=MMParams(), fp8_gemm_wgrad=MMParams(),
                       fp8_dpa=False, fp8_mha=False)
    MXFP8BlockScaling(fp8_format=Format.E4M3, margin=0.0, fp8_dpa=False, fp8_mha=False,
                      emulate=False)
    NVFP4BlockScaling(disable_rht=False, disable_stochastic_rounding=False,
                      disable_2d_quantization=False, fp8_dpa=False, fp8_mha=False,
                      emulate=False)

HYBRID quantizes forward operands (inputs, weights) to E4M3 and gradients to E5M2; E4M3 uses
E4M3 everywhere. The rules are qmesh's (docs/design/fp8_scaling.md): delayed scaling takes the
scale of step t from the amaxes of steps < t; current scaling from the tensor's own amax; block
scaling (docs/design/block_scaling.md) gives every 1x128 slice (block dim 1) or 128x128 tile
(block dim 2) of an operand its own current scale; MXFP8 (docs/design/mxfp8.md) an E8M0
power-of-two scale to every 32 elements along K; NVFP4 (docs/design/nvfp4.md) E2M1 codes with
an E4M3 scale per 16 elements and an fp32 scale per tensor.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers

import jax.numpy as jnp
import numpy as np


class Format(enum.Enum):
    """Which FP8 dtypes a recipe uses: (forward dtype, backward dtype)."""

    E4M3 = (jnp.float8_e4m3fn, jnp.float8_e4m3fn)
    HYBRID = (jnp.float8_e4m3fn, jnp.float8_e5m2)

    @property
    def fwd_dtype(self):
        return self.value[0]

    @property
    def bwd_dtype(self):
        return self.value[1]


def _number(value, what: str) -> float:
    """A real number field (Python or numpy; not a boolean or a string) as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, not {value!r}")
    return float(value)


def _integer(value, what: str) -> int:
    """An integer field: Python or numpy integers, not booleans."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, not {value!r}")
    return int(value)


def _flag(value, what: str) -> bool:
    """A boolean field: True/False (Python or numpy), not a string or a number."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be True or False, not {value!r}")
    return bool(value)


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """Delayed scaling: scale = (fp8_max / amax) / 2**margin with amax from the history."""

    margin: float = 0.0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"  # "max" or "most_recent"

    def __post_init__(self):
        if not isinstance(self.fp8_format, Format):
            raise TypeError(
                f"fp8_format must be a qmesh.jax.recipe.Format, not {self.fp8_format!r}"
            )
        object.__setattr__(self, "margin", _number(self.margin, "margin"))
        object.__setattr__(
            self, "amax_history_len", _integer(self.amax_history_len, "amax_history_len")
        )
        if not (self.margin >= 0 and self.margin != float("inf")):
            raise ValueError(f"margin must be finite and >= 0, not {self.margin}")
        if not 1 <= self.amax_history_len <= 65536:
            raise ValueError(
                f"amax_history_len must be an int in [1, 65536], not {self.amax_history_len!r}"
            )
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(
                f"amax_compute_algo must be 'max' or 'most_recent', not {self.amax_compute_algo!r}"
            )


@dataclasses.dataclass(frozen=True)
class Float8CurrentScaling:
    """Current scaling: each tensor scaled by its own amax (all-reduced over the mesh)."""

    fp8_format: Format = Format.HYBRID
    power_of_two_scales: bool = False
    amax_epsilon: float = 0.0

    def __post_init__(self):
        if not isinstance(self.fp8_format, Format):
            raise TypeError(
                f"fp8_format must be a qmesh.jax.recipe.Format, not {self.fp8_format!r}"
            )
        object.__setattr__(
            self, "power_of_two_scales", _flag(self.power_of_two_scales, "power_of_two_scales")
        )
        object.__setattr__(self, "amax_epsilon", _number(self.amax_epsilon, "amax_epsilon"))
        if not self.amax_epsilon >= 0:
            raise ValueError(f"amax_epsilon must be >= 0, not {self.amax_epsilon}")


@dataclasses.dataclass(frozen=True)
class QParams:
    """How one operand's block scales are chosen: current_scale() of each block's amax."""

    power_2_scale: bool = True  # round every block scale down to a power of two
    amax_epsilon: float = 0.0  # block amaxes below this are raised to it (0: none)

    def __post_init__(self):
        object.__setattr__(self, "power_2_scale", _flag(self.power_2_scale, "power_2_scale"))
        object.__setattr__(self, "amax_epsilon", _number(self.amax_epsilon, "amax_epsilon"))
        if not (self.amax_epsilon >= 0 and self.amax_epsilon != float("inf")):
            raise ValueError(f"amax_epsilon must be finite and >= 0, not {self.amax_epsilon}")


@dataclasses.dataclass(frozen=True)
class MMParams:
    """Settings of one block-scaled GEMM: its partial products are accumulated in float32
    outside the tensor cores' accumulator, which the block-scaled GEMM requires."""

    use_split_accumulator: bool = True

    def __post_init__(self):
        object.__setattr__(
            self,
            "use_split_accumulator",
            _flag(self.use_split_accumulator, "use_split_accumulator"),
        )


@dataclasses.dataclass(frozen=True)
class Float8BlockScaling:
    """Block scaling: 1x128 blocks (dim 1) or 128x128 tiles (dim 2), each with its own current
    scale; no amax is shared between devices. TransformerEngine's fields and defaults (also
    qmesh::Float8BlockScaling): inputs and gradients in 1x128 blocks, weights in 128x128
    tiles, E4M3 everywhere, power-of-two scales."""

    fp8_format: Format = Format.E4M3
    fp8_quant_fwd_inp: QParams = QParams()
    fp8_quant_fwd_weight: QParams = QParams()
    fp8_quant_bwd_grad: QParams = QParams()
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = MMParams()
    fp8_gemm_dgrad: MMParams = MMParams()
    fp8_gemm_wgrad: MMParams = MMParams()
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        if not isinstance(self.fp8_format, Format):
            raise TypeError(
                f"fp8_format must be a qmesh.jax.recipe.Format, not {self.fp8_format!r}"
            )
        for name in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
            if not isinstance(getattr(self, name), QParams):
                raise TypeError(
                    f"{name} must be a qmesh.jax.recipe.QParams, not {getattr(self, name)!r}"
                )
        for name in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
            value = getattr(self, name)
            if not isinstance(value, MMParams):
                raise TypeError(f"{name} must be a qmesh.jax.recipe.MMParams, not {value!r}")
            if not value.use_split_accumulator:
                raise ValueError(
                    f"{name}.use_split_accumulator must be True: the block-scaled GEMM "
                    "accumulates its partial products in float32"
                )
        dims = ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim")
        for name in dims:
            object.__setattr__(self, name, _integer(getattr(self, name), name))
            if getattr(self, name) not in (1, 2):
                raise ValueError(
                    f"{name} must be 1 (1x128 blocks) or 2 (128x128 tiles), "
                    f"not {getattr(self, name)}"
                )
        if sum(getattr(self, name) == 2 for name in dims) > 1:
            raise ValueError(
                "at most one of x_block_scaling_dim, w_block_scaling_dim and "
                "grad_block_scaling_dim may be 2: no GEMM takes two operands in 128x128 tiles"
            )
        for name in ("fp8_dpa", "fp8_mha"):
            if _flag(getattr(self, name), name):
                raise ValueError(
                    f"{name} must be False: FP8 attention is not supported with block scaling"
                )


@dataclasses.dataclass(frozen=True)
class MXFP8BlockScaling:
    """MXFP8: every 32 consecutive elements along a GEMM's K share one E8M0 (power-of-two)
    scale, rounded up from the block's amax so that no element saturates. TransformerEngine's
    fields and defaults (also qmesh::MXFP8BlockScaling), plus `emulate`: run the MXFP8 GEMMs
    emulated (dequantized, then a GEMM with float32 accumulation) where the device has no
    native MXFP8 GEMM, which is every device qmesh drives today; without it (or
    QMESH_BLOCK_EMULATION=1) such a GEMM raises. Used by qmesh.jax.dense.dense."""

    fp8_format: Format = Format.E4M3
    margin: float = 0.0
    fp8_dpa: bool = False
    fp8_mha: bool = False
    emulate: bool = False

    def __post_init__(self):
        if not isinstance(self.fp8_format, Format):
            raise TypeError(
                f"fp8_format must be a qmesh.jax.recipe.Format, not {self.fp8_format!r}"
            )
        margin = _number(self.margin, "margin")
        if not (0 <= margin < float("inf")):
            raise ValueError(f"margin must be finite and >= 0, not {margin}")
        object.__setattr__(self, "margin", margin)
        for name in ("fp8_dpa", "fp8_mha"):
            if _flag(getattr(self, name), name):
                raise ValueError(f"{name} must be False: FP8 attention is not supported with MXFP8")
        object.__setattr__(self, "emulate", _flag(self.emulate, "emulate"))


@dataclasses.dataclass(frozen=True)
class NVFP4BlockScaling:
    """NVFP4 (docs/design/nvfp4.md): float4_e2m1fn codes, an E4M3 scale per 16 elements along
    a GEMM's K and an fp32 scale per tensor. TransformerEngine's switches and defaults (also
    qmesh::NvFp4Config), plus `emulate` as MXFP8BlockScaling's: weights in 16x16 tiles
    (1x16 blocks with disable_2d_quantization), inputs and gradients in 1x16 blocks; the
    gradients rounded stochastically (off with disable_stochastic_rounding), seeded from a
    jax.random key (the Flax rng stream "sr_rng" in the modules and drop-ins, `sr_key` in
    dense/mlp); the random Hadamard transform on the columnwise copies of the inputs and the
    gradients, the two operands of the weight-gradient GEMM (off with disable_rht). Used by
    qmesh.jax.dense.dense (nvfp4_dense.py)."""

    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    fp8_dpa: bool = False
    fp8_mha: bool = False
    emulate: bool = False

    def __post_init__(self):
        for name in (
            "disable_rht",
            "disable_stochastic_rounding",
            "disable_2d_quantization",
            "emulate",
        ):
            object.__setattr__(self, name, _flag(getattr(self, name), name))
        for name in ("fp8_dpa", "fp8_mha"):
            if _flag(getattr(self, name), name):
                raise ValueError(f"{name} must be False: FP8 attention is not supported with NVFP4")


Recipe = (
    DelayedScaling
    | Float8CurrentScaling
    | Float8BlockScaling
    | MXFP8BlockScaling
    | NVFP4BlockScaling
)


def uses_sr(recipe) -> bool:
    """Whether `recipe` rounds stochastically and so takes a key (NVFP4 by default)."""
    return isinstance(recipe, NVFP4BlockScaling) and not recipe.disable_stochastic_rounding


def check_recipe(recipe) -> None:
    """Raises TypeError unless `recipe` is one of the recipe classes above."""
    if not isinstance(
        recipe,
        (
            DelayedScaling,
            Float8CurrentScaling,
            Float8BlockScaling,
            MXFP8BlockScaling,
            NVFP4BlockScaling,
        ),
    ):
        raise TypeError(
            "recipe must be qmesh.jax.recipe.DelayedScaling(), Float8CurrentScaling(), "
            "Float8BlockScaling(), MXFP8BlockScaling() or NVFP4BlockScaling(), not "
            f"{type(recipe).__name__}"
        )
