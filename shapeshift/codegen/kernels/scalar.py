"""Scalar helpers that generated elementwise loops call: integer modulo with Python's sign
rule, and Max / Min of two values per C type (NaN wins for floats, as in onnxruntime and
NumPy). A variadic Max folds its inputs through these calls: written inline as a
conditional, each fold repeated the expression so far, and 16 inputs made a 1 MB line."""

SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
MINMAX_TYPES = ("float", "double", *(f"{t}_t" for t in SIGNED + UNSIGNED))


def source() -> str:
    # ONNX Mod with fmod=0 follows the divisor's sign, as Python's % does; C's % follows
    # the dividend's. C traps on x % 0 and on MIN % -1: give 0 there, as NumPy does.
    signed = "".join(
        f"static inline {t}_t ss_pymod_{t}({t}_t a, {t}_t b) {{ if (b == 0 || b == -1) return 0; "
        f"{t}_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}\n" for t in SIGNED)
    unsigned = "".join(
        f"static inline {t}_t ss_pymod_{t}({t}_t a, {t}_t b) {{ return b == 0 ? 0 : a % b; }}\n" for t in UNSIGNED)
    minmax = "".join(
        f"static inline {c} ss_{op}_{c.replace('_t', '')}({c} a, {c} b) {{ return ({nan}a {sign} b) ? a : b; }}\n"
        for c in MINMAX_TYPES for op, sign in (("max", ">"), ("min", "<"))
        for nan in ["a != a || " if c in ("float", "double") else ""])
    return "\n" + signed + unsigned + minmax
