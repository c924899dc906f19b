"""Scalar helpers that generated elementwise loops call: integer modulo with Python's sign
rule, and Max / Min of two values per C type (NaN wins for floats, as in onnxruntime and
NumPy). A variadic Max folds its inputs through these calls: written inline as a
conditional, each fold repeated the expression so far, and 16 inputs made a 1 MB line.

A header-only fragment: every helper is ``static inline`` and shared with the units that
call it (``ss_pymod_int32``, ``ss_max_float``, ``ss_min_uint8``, ...)."""

from __future__ import annotations

from ..cwriter import Fragment, Function

SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
MINMAX_TYPES = ("float", "double", *(f"{t}_t" for t in SIGNED + UNSIGNED))


def _helper(ret: str, name: str, ctype: str, body: str) -> Function:
    return Function(ret, name, (f"{ctype} a", f"{ctype} b"), "    " + body, linkage="inline", shared=True)


def fragment() -> Fragment:
    # ONNX Mod with fmod=0 follows the divisor's sign, as Python's % does; C's % follows
    # the dividend's. C traps on x % 0 and on MIN % -1: give 0 there, as NumPy does.
    signed = [_helper(f"{t}_t", f"ss_pymod_{t}", f"{t}_t", f"if (b == 0 || b == -1) return 0; {t}_t r = a % b; "
                      "return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;") for t in SIGNED]
    unsigned = [_helper(f"{t}_t", f"ss_pymod_{t}", f"{t}_t", "return b == 0 ? 0 : a % b;") for t in UNSIGNED]
    minmax = [_helper(c, f"ss_{op}_{c.replace('_t', '')}", c, f"return ({nan}a {sign} b) ? a : b;")
              for c in MINMAX_TYPES for op, sign in (("max", ">"), ("min", "<"))
              for nan in ["a != a || " if c in ("float", "double") else ""]]
    return Fragment([*signed, *unsigned, *minmax])


def source() -> str:
    return fragment().text()
