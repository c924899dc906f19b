"""Elementwise arithmetic on tracked contents, for the type rules of shape computations.

A small integer tensor's contents are tracked as a tuple of dims (``int`` or
symbolic ``Expr``); bool tensors as 0/1 ints.  Each element function here
computes one output element from input elements with ONNX semantics, or
returns None when the result cannot be decided at compile time.  Facts about
symbolic operands (sign, order) come from their interval bounds.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

from ..ir.types import BOOL, INT_TYPES, to_numpy_dtype
from ..symbolic import Dim, Expr, bounds, floordiv, mod, mul, sub
from .context import InferContext

Element = Callable[..., Optional[Dim]]


def track_elementwise(ctx: InferContext, positions: Sequence[int], element: Element,
                      dtypes) -> None:
    """Record output 0's contents as ``element`` applied with broadcasting.

    Nothing is recorded unless every input at ``positions`` has a dtype in
    ``dtypes``, known contents, broadcast-compatible lengths, and every output
    element is decidable.
    """
    if any(ctx.input_dtype(i) not in dtypes for i in positions):
        return
    contents = [ctx.input_dims(i) for i in positions]
    if any(c is None for c in contents):
        return
    lengths = {len(c) for c in contents} - {1}
    if len(lengths) > 1:
        return
    length = lengths.pop() if lengths else 1
    result = []
    for k in range(length):
        value = element(*(c[0] if len(c) == 1 else c[k] for c in contents))
        if value is None:
            return
        result.append(value)
    ctx.set_contents(0, result)


def _sign(x: Dim, nonzero: bool = False) -> Optional[int]:
    """+1 or -1 when x's sign is provable (0 counts as positive unless ``nonzero``)."""
    lo, hi = bounds(x)
    if lo >= (1 if nonzero else 0):
        return 1
    if hi <= (-1 if nonzero else 0):
        return -1
    return None


# -- arithmetic ------------------------------------------------------------------------

def truncating_div(a: Dim, b: Dim) -> Optional[Dim]:
    """ONNX integer Div (rounds toward zero), when both signs are provable.

    With the signs known, trunc(a / b) = sign * (|a| // |b|), which floordiv
    computes exactly for non-negative operands.
    """
    sign_a, sign_b = _sign(a), _sign(b, nonzero=True)
    if sign_a is None or sign_b is None:
        return None
    return mul(floordiv(mul(a, sign_a), mul(b, sign_b)), sign_a * sign_b)


def floor_mod(a: Dim, b: Dim) -> Optional[Dim]:
    """ONNX Mod with fmod=0 (the sign of the divisor): Python's %, for a nonzero divisor."""
    if _sign(b, nonzero=True) is None:
        return None
    return mod(a, b)


def fmod(a: Dim, b: Dim) -> Optional[Dim]:
    """ONNX Mod with fmod=1 (C fmod: the sign of the dividend), when both signs are provable."""
    sign_a, sign_b = _sign(a), _sign(b, nonzero=True)
    if sign_a is None or sign_b is None:
        return None
    return mul(mod(mul(a, sign_a), mul(b, sign_b)), sign_a)


def fold(fn: Callable[[Dim, Dim], Dim]) -> Element:
    """An element function applying a binary ``fn`` across any number of operands."""

    def element(*values: Dim) -> Dim:
        return functools.reduce(fn, values)

    return element


# -- comparisons (results are 0/1) --------------------------------------------------------

def equal(a: Dim, b: Dim) -> Optional[int]:
    if a is b:
        return 1
    lo, hi = bounds(sub(a, b))
    if lo == hi == 0:
        return 1
    if lo > 0 or hi < 0:
        return 0
    return None


def less(a: Dim, b: Dim) -> Optional[int]:
    lo, hi = bounds(sub(b, a))
    if lo >= 1:
        return 1
    if hi <= 0:
        return 0
    return None


def less_equal(a: Dim, b: Dim) -> Optional[int]:
    lo, hi = bounds(sub(b, a))
    if lo >= 0:
        return 1
    if hi <= -1:
        return 0
    return None


def greater(a: Dim, b: Dim) -> Optional[int]:
    return less(b, a)


def greater_equal(a: Dim, b: Dim) -> Optional[int]:
    return less_equal(b, a)


# -- logic (operands are 0/1 ints; symbolic bools are undecidable) -------------------------

def _both_ints(a: Dim, b: Dim) -> bool:
    return not isinstance(a, Expr) and not isinstance(b, Expr)


def logical_not(a: Dim) -> Optional[int]:
    return None if isinstance(a, Expr) else int(not a)


def logical_and(a: Dim, b: Dim) -> Optional[int]:
    return int(bool(a) and bool(b)) if _both_ints(a, b) else None


def logical_or(a: Dim, b: Dim) -> Optional[int]:
    return int(bool(a) or bool(b)) if _both_ints(a, b) else None


def logical_xor(a: Dim, b: Dim) -> Optional[int]:
    return int(bool(a) != bool(b)) if _both_ints(a, b) else None


def select(condition: Dim, x: Dim, y: Dim) -> Optional[Dim]:
    """Where: x if condition else y, when the condition is known."""
    if isinstance(condition, Expr):
        return None
    return x if condition else y


# -- casts ---------------------------------------------------------------------------------

def _wrap(value: int, to: int) -> int:
    """An integer reinterpreted in a narrower type (two's complement), as Cast does."""
    dtype = to_numpy_dtype(to)
    bits = dtype.itemsize * 8
    value %= 1 << bits
    if dtype.kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _to_int(to: int) -> Element:
    def element(value: Dim) -> Dim:
        # A symbolic dim is assumed to fit the target type (dims are < 2**31).
        return value if isinstance(value, Expr) else _wrap(int(value), to)

    return element


def _to_bool(value: Dim) -> Optional[int]:
    lo, hi = bounds(value)
    if lo == hi == 0:
        return 0
    if lo > 0 or hi < 0:
        return 1
    return None


def cast_element(source: int, to: int) -> Optional[Element]:
    """The element function of Cast from ``source`` to ``to``, if contents can follow."""
    if source not in INT_TYPES and source != BOOL:
        return None
    if to in INT_TYPES:
        return _to_int(to)
    if to == BOOL:
        return _to_bool
    return None

