"""Pow with an integer base (int32, int64), as generated elementwise loops call it.

Exported C helpers (``static inline``: they sit in the innermost loop)::

    /* base ** exponent for an integer exponent, given as its sign (negative != 0) and its
       bits (the exponent converted to uint64_t, which keeps its parity). */
    int32_t ss_ipow_i32(int32_t base, int negative, uint64_t exponent);
    int64_t ss_ipow_i64(int64_t base, int negative, uint64_t exponent);

    /* base ** exponent for a floating-point exponent: pow in double, truncated. */
    int32_t ss_ipow_real_i32(double base, double exponent);
    int64_t ss_ipow_real_i64(double base, double exponent);

A non-negative integer exponent gives the exact power, wrapping on overflow as NumPy's
integer power (and the reference evaluator) do; squaring runs in uint64_t, where
overflow is defined, and the low bits are the result in any narrower width.

A negative exponent gives what onnxruntime's ``static_cast<T>(std::pow(base, e))``
gives (the reference agrees): 1 for base 1, +-1 for base -1 by the exponent's parity,
0 for |base| >= 2 (the fraction truncates), and for base 0 (1 / 0 = inf) the type's
minimum, the value x86 conversions (and NumPy) give for a double out of range or NaN.
The float-exponent helpers give that same minimum for any such double.
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, fill

DEPENDS: tuple[str, ...] = ()

_TYPES = (("i32", "int32_t", "INT32_MIN", "2147483648.0"), ("i64", "int64_t", "INT64_MIN", "9223372036854775808.0"))

# The bodies of ss_ipow_<suffix> and ss_ipow_real_<suffix>: @T@ is the C type, @MIN@ its minimum,
# @LIMIT@ -(the minimum) as a double literal.
_IPOW = r"""
    if (negative) {
        if (base == 1) return 1;
        if (base == -1) return (exponent & 1) ? -1 : 1;
        return base == 0 ? @MIN@ : 0;
    }
    uint64_t result = 1, square = (uint64_t)base;
    while (exponent) {
        if (exponent & 1) result *= square;
        square *= square;
        exponent >>= 1;
    }
    return (@T@)result;"""

_IPOW_REAL = r"""
    double r = pow(base, exponent);
    /* The comparisons are false for NaN too. */
    return (r >= -@LIMIT@ && r < @LIMIT@) ? (@T@)r : @MIN@;"""


def fragment() -> Fragment:
    """Header-only: both helpers of each type, shared with the units that call them."""
    parts = []
    for suffix, ctype, lowest, limit in _TYPES:
        parts.append(Function(ctype, f"ss_ipow_{suffix}", (f"{ctype} base", "int negative", "uint64_t exponent"),
                              fill(_IPOW, T=ctype, MIN=lowest), linkage="inline", shared=True))
        parts.append(Function(ctype, f"ss_ipow_real_{suffix}", ("double base", "double exponent"),
                              fill(_IPOW_REAL, T=ctype, MIN=lowest, LIMIT=limit), linkage="inline", shared=True))
    return Fragment(parts)


def source() -> str:
    return fragment().text()
