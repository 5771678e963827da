"""How much two values of one variable differ: max |Δ|, relative norm, distance in ULPs.

NumPy only, so the API can measure differences from stored checkpoints without TensorFlow.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Floating dtypes by byte width, and the signed integer type their bits are read as.
_BITS = {2: np.int16, 4: np.int32, 8: np.int64}


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise number of representable floats between a and b (as uint64).

    The bit patterns are mapped to integers that are ordered like the floats they encode
    (sign-magnitude to two's complement), so neighbouring floats are 1 apart across zero
    too, and +0 and -0 are 0 apart. Works for float16, float32, float64 and bfloat16-like
    two-byte types. NaNs get the distance of their bit patterns.
    """
    if a.dtype != b.dtype or a.dtype.kind != "f" or a.dtype.itemsize not in _BITS:
        raise TypeError(f"ULP distance needs one float dtype, got {a.dtype} and {b.dtype}")
    signed = _BITS[a.dtype.itemsize]
    bits = 8 * a.dtype.itemsize
    magnitude_mask = (1 << (bits - 1)) - 1
    # Ordered key: non-negative floats map to their bits, negative ones to -(magnitude).
    keys = []
    for x in (a, b):
        raw = np.ascontiguousarray(x).view(signed).astype(np.int64)
        magnitude = raw & magnitude_mask
        keys.append(np.where(raw < 0, -magnitude, magnitude))
    ka, kb = keys
    same_sign = (ka >= 0) == (kb >= 0)
    # Same sign: the difference fits in int64. Opposite signs: |ka| + |kb| fits in uint64.
    within = np.abs(np.where(same_sign, ka - kb, 0)).astype(np.uint64)
    across = np.abs(ka).astype(np.uint64) + np.abs(kb).astype(np.uint64)
    return np.where(same_sign, within, across)


def array_difference(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """The size of the difference between two values of one variable.

    Returns `elements`, `elements_differing` (bitwise), and for numeric arrays
    `max_abs_diff`, `relative_norm` (‖a-b‖₂ / ‖a‖₂, None when a is all zeros) and, for
    floats, `max_ulp`. `note` explains anything that could not be measured.
    """
    out: dict[str, Any] = {
        "dtype": str(a.dtype),
        "shape": list(a.shape),
        "elements": int(a.size),
        "elements_differing": None,
        "max_abs_diff": None,
        "relative_norm": None,
        "max_ulp": None,
        "note": None,
    }
    if a.dtype != b.dtype or a.shape != b.shape:
        out["note"] = f"different dtype/shape: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        return out
    if a.dtype.kind not in "fiub":
        out["note"] = f"dtype {a.dtype} has no numeric distance"
        return out
    raw_a = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, -1) if a.size else a
    raw_b = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, -1) if b.size else b
    differing = np.any(raw_a != raw_b, axis=-1) if a.size else np.zeros(0, dtype=bool)
    out["elements_differing"] = int(np.count_nonzero(differing))
    if not out["elements_differing"]:
        out["max_abs_diff"], out["relative_norm"] = 0.0, 0.0
        out["max_ulp"] = 0 if a.dtype.kind == "f" else None
        return out
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.abs(wide_a - wide_b)
        out["max_abs_diff"] = _finite_or_none(float(np.max(delta)))
        norm_a = float(np.linalg.norm(wide_a.ravel()))
        norm_delta = float(np.linalg.norm(delta.ravel()))
    out["relative_norm"] = _finite_or_none(norm_delta / norm_a) if norm_a > 0 else None
    if a.dtype.kind == "f" and a.dtype.itemsize in _BITS:
        out["max_ulp"] = int(np.max(ulp_distance(a, b)))
    if np.isnan(wide_a).any() or np.isnan(wide_b).any():
        out["note"] = "contains NaN"
    return out
