"""Argument conversion shared by the public classes: eagle3 errors, never bare ones."""

from __future__ import annotations

import operator
from typing import Any

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
