"""NumPy helpers shared by the elementwise evaluators.

NumPy computes float16 in float16 and cannot compute bfloat16 or the float8s at
all, so evaluators widen such inputs to float32 and round the result back once.
NumPy also lacks erf (scipy is not a dependency) and C-style integer division.
"""

from __future__ import annotations

import math

import numpy as np


def is_narrow_float(dtype: np.dtype) -> bool:
    """float16, bfloat16 and the float8s (ml_dtypes types have kind 'V', except float8_e5m2)."""
    return dtype.kind == "V" or (dtype.kind == "f" and dtype.itemsize < 4)


def widen(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 if it is a narrow float type, else unchanged."""
    return x.astype(np.float32) if is_narrow_float(x.dtype) else x


def unary(fn, widened: bool = True):
    """An evaluator applying ``fn`` elementwise and keeping the input's dtype.

    Narrow floats are computed in float32 (``widened``) and rounded back once.
    NumPy's warnings (log of 0, sqrt of -1) are silenced: ONNX defines those
    results as inf/nan, which is what NumPy returns.
    """

    def evaluate(ctx, x: np.ndarray) -> list:
        with np.errstate(all="ignore"):
            y = fn(widen(x) if widened else x)
        return [np.asarray(y, dtype=x.dtype)]

    return evaluate


# math.erf is exact to double precision; applied through a ufunc wrapper.
_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, computed in float64."""
    return np.asarray(_ERF(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def truncating_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division rounding toward zero (C semantics, as ONNX Div on integers)."""
    with np.errstate(all="ignore"):
        quotient = np.floor_divide(a, b)
        inexact = (a - quotient * b) != 0
    differ = (a < 0) != (b < 0)
    return quotient + (inexact & differ).astype(quotient.dtype)
