"""Scalar helpers that generated elementwise loops call (integer modulo with Python's sign rule)."""

SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")


def source() -> str:
    # ONNX Mod with fmod=0 follows the divisor's sign, as Python's % does; C's % follows
    # the dividend's. C traps on x % 0 and on MIN % -1: give 0 there, as NumPy does.
    signed = "".join(
        f"static inline {t}_t ss_pymod_{t}({t}_t a, {t}_t b) {{ if (b == 0 || b == -1) return 0; "
        f"{t}_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}\n" for t in SIGNED)
    unsigned = "".join(
        f"static inline {t}_t ss_pymod_{t}({t}_t a, {t}_t b) {{ return b == 0 ? 0 : a % b; }}\n" for t in UNSIGNED)
    return "\n" + signed + unsigned
