"""Argument conversion shared by the public classes: eagle3 errors, never bare ones."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from eagle3.errors import ArgumentTypeError, InvalidArgumentError

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def as_int(value: Any, name: str, lo: int = INT32_MIN, hi: int = INT32_MAX) -> int:
    """``value`` as a Python int in ``[lo, hi]`` (bools and floats are refused)."""
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an integer, got a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if not lo <= number <= hi:
        raise InvalidArgumentError(f"{name} = {number} is outside [{lo}, {hi}]")
    return number


def int32_array(values: Any, name: str) -> np.ndarray:
    """Integer input as a C-contiguous int32 array: one dimension (a scalar is one value),
    an integer dtype (no silent casts from floats), values that fit in int32."""
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int32)
    if arr.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.dtype != np.int32 and (arr.min() < INT32_MIN or arr.max() > INT32_MAX):
        raise InvalidArgumentError(f"{name} do not fit in int32")
    return np.ascontiguousarray(arr, dtype=np.int32)
