"""Scalar helpers that generated elementwise loops call (integer modulo with Python's sign rule)."""


def source() -> str:
    # ONNX Mod with fmod=0 follows the divisor's sign, as Python's % does; C's % follows
    # the dividend's.
    return """
static inline int64_t ss_pymod_int64(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int32_t ss_pymod_int32(int32_t a, int32_t b) { int32_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
"""
