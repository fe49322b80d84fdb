"""Image sizes and offsets in a DALI graph as scalars: Python ints where the plan fixes them, DALI
integer nodes where they depend on the image. Each helper computes with whichever it is given, so
the graph's arithmetic is torchvision's whether a size is known at plan time or not."""
from __future__ import annotations

from typing import Any

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types

Scalar = Any  # int, or a DALI DataNode holding one int32 per sample


def is_node(x) -> bool:
    return not isinstance(x, (int, float))


def smin(a: Scalar, b: Scalar) -> Scalar:
    return min(a, b) if not (is_node(a) or is_node(b)) else dmath.min(a, b)


def smax(a: Scalar, b: Scalar) -> Scalar:
    return max(a, b) if not (is_node(a) or is_node(b)) else dmath.max(a, b)


def select(cond: Scalar, a: Scalar, b: Scalar) -> Scalar:
    """``a if cond else b`` for int scalars; cond is a bool or a boolean node."""
    if not is_node(cond):
        return a if cond else b
    c = fn.cast(cond, dtype=types.INT32)
    return c * a + (1 - c) * b


def as_float(x: Scalar):
    return float(x) if not is_node(x) else fn.cast(x, dtype=types.FLOAT)


def as_int(x: Scalar):
    return int(x) if not is_node(x) else fn.cast(x, dtype=types.INT32)


def int_vector(*xs: Scalar):
    if not any(is_node(x) for x in xs):
        return [int(x) for x in xs]
    return fn.stack(*[as_int(x) if is_node(x) else types.Constant(int(x), dtype=types.INT32) for x in xs])
