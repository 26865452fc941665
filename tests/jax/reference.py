"""Independent references for the JAX tests: numpy/ml_dtypes, float32/float64 math."""

import jax
import ml_dtypes
import numpy as np

FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {ml_dtypes.float8_e4m3fn: 448.0, ml_dtypes.float8_e5m2: 57344.0}


def quantize(x, scale, dtype):
    """sat_rne(x * scale) as FP8 codes (uint8): ml_dtypes rounds to nearest even but does not
    saturate, so clip first (NaN passes through clip)."""
    y = np.asarray(x, np.float32) * np.float32(scale)
    m = FP8_MAX[dtype]
    return np.clip(y, -m, m).astype(dtype).view(np.uint8)


def codes_equal(a, b, dtype):
    """FP8 codes equal, with any NaN code matching any NaN code."""
    a = np.asarray(a).view(np.uint8)
    b = np.asarray(b).view(np.uint8)
    nan_a = np.isnan(a.view(dtype).astype(np.float32))
    nan_b = np.isnan(b.view(dtype).astype(np.float32))
    return bool(np.array_equal(nan_a, nan_b) and np.array_equal(a[~nan_a], b[~nan_b]))


def amax(x):
    x = np.abs(np.asarray(x, np.float32))
    return np.float32(np.nan) if np.isnan(x).any() else (x.max() if x.size else np.float32(0))


def current_scale(a, dtype, power_of_two=False, epsilon=0.0):
    """TransformerEngine's compute_scale_from_amax in float32."""
    a = np.float32(max(np.float32(a), np.float32(epsilon))) if not np.isnan(a) else np.float32(a)
    if a == 0 or np.isinf(a) or np.isnan(a):
        return np.float32(1)
    with np.errstate(over="ignore"):
        s = np.float32(FP8_MAX[dtype]) / a
    s = np.float32(np.finfo(np.float32).max) if np.isinf(s) else s
    if power_of_two:
        s = np.array(s, np.float32).view(np.uint32) & np.uint32(0xFF800000)
        s = np.array(s, np.uint32).view(np.float32)[()]
    return np.float32(s)


def delayed_update(history, scale, maxima, margin, algo):
    """The delayed-scaling rules, tensor by tensor, in float64 where it is exact."""
    history = np.array(history, np.float32)
    scale = np.array(scale, np.float32)
    for i in range(history.shape[1]):
        col = history[:, i].copy()
        if col[0] == 0:
            continue  # the tensor did not run: no roll, scale kept
        # The window's max skips NaN (an all-NaN window gives 0: scale kept).
        finite = col[~np.isnan(col)]
        window_max = max(np.float32(0), finite.max()) if finite.size else np.float32(0)
        a = col[0] if algo == "most_recent" else window_max
        if a > 0 and np.isfinite(a):
            scaled_max = np.float32(maxima[i] * 2.0**-margin)  # margin before the division
            with np.errstate(over="ignore"):  # a tiny amax overflows: FLT_MAX below
                q = scaled_max / np.float32(a)
            scale[i] = np.float32(np.finfo(np.float32).max) if np.isinf(q) else np.float32(q)
        col = np.roll(col, -1)
        col[0] = 0
        history[:, i] = col
    return history, scale


def rel_err(got, want):
    """||got - want|| / ||want|| in float64."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def assert_trees_close(got, want, tol=1e-5):
    """Every leaf of `got` has its `want` leaf's shape and lies within relative error `tol` of
    it; an all-zero `want` leaf must be matched exactly."""
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape
        if np.any(np.asarray(w)):
            assert rel_err(g, w) < tol
        else:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
