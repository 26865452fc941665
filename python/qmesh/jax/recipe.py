"""FP8 scaling recipes, with TransformerEngine's class and field names and defaults.

    DelayedScaling(margin=0, fp8_format=Format.HYBRID, amax_history_len=1024,
                   amax_compute_algo="max")
    Float8CurrentScaling(fp8_format=Format.HYBRID)

HYBRID quantizes forward operands (inputs, weights) to E4M3 and gradients to E5M2; E4M3 uses
E4M3 everywhere. The rules are qmesh's (docs/design/fp8_scaling.md): delayed scaling takes the
scale of step t from the amaxes of steps < t; current scaling from the tensor's own amax.
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


Recipe = DelayedScaling | Float8CurrentScaling


def check_recipe(recipe) -> None:
    """Raises TypeError unless `recipe` is one of the recipe classes above."""
    if not isinstance(recipe, (DelayedScaling, Float8CurrentScaling)):
        raise TypeError(
            "recipe must be qmesh.jax.recipe.DelayedScaling() or Float8CurrentScaling(), "
            f"not {type(recipe).__name__}"
        )
