"""The integer-base Pow helpers (shapeshift/codegen/kernels/intpow.py) against NumPy.

Non-negative integer exponents: NumPy's exact power, wrapping like it on overflow.
Negative ones and float exponents: std::pow in double then truncated, out-of-range and
NaN results giving the type's minimum (what NumPy's and x86's conversions give).
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import intpow
from shapeshift.codegen.kernels.prelude import PRELUDE

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

# Exported loops over the static inline helpers, so ctypes can call them.
_WRAPPERS = r"""
void t_ipow_i32(const int32_t* b, const int64_t* e, int32_t* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ss_ipow_i32(b[i], e[i] < 0, (uint64_t)e[i]);
}
void t_ipow_i64(const int64_t* b, const int64_t* e, int64_t* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ss_ipow_i64(b[i], e[i] < 0, (uint64_t)e[i]);
}
void t_ipow_real_i32(const int32_t* b, const double* e, int32_t* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ss_ipow_real_i32((double)b[i], e[i]);
}
void t_ipow_real_i64(const int64_t* b, const double* e, int64_t* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ss_ipow_real_i64((double)b[i], e[i]);
}
"""


@pytest.fixture(scope="module")
def lib(build_cache):
    return compile_library(PRELUDE + intpow.source() + _WRAPPERS, name_hint="test_intpow",
                           cache_dir=build_cache).cdll


def _suffix(dtype) -> str:
    return np.dtype(dtype).name.replace("int", "i")


def _call(fn, base, exponent, dtype):
    base, exponent = np.ascontiguousarray(base), np.ascontiguousarray(exponent)
    y = np.zeros(base.shape, dtype)
    fn(ctypes.c_void_p(base.ctypes.data), ctypes.c_void_p(exponent.ctypes.data), ctypes.c_void_p(y.ctypes.data),
       ctypes.c_int64(base.size))
    return y


def _through_double(base, exponent, dtype):
    """std::pow in double, truncated; the type's minimum where that is out of range or NaN."""
    with np.errstate(all="ignore"):
        r = np.power(base.astype(np.float64), exponent.astype(np.float64))
    info = np.iinfo(dtype)
    ok = (r >= info.min) & (r < -float(info.min))
    return np.where(ok, np.trunc(np.where(ok, r, 0)), info.min).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_non_negative_exponents_are_exact_and_wrap(lib, dtype):
    rng = np.random.default_rng(1)
    base = np.concatenate([np.arange(-5, 6), rng.integers(-1000, 1000, 200)]).astype(dtype)
    exponent = np.concatenate([np.arange(11), rng.integers(0, 70, 200)]).astype(np.int64)
    fn = getattr(lib, f"t_ipow_{_suffix(dtype)}")
    with np.errstate(all="ignore"):
        want = np.power(base, exponent.astype(dtype))
    np.testing.assert_array_equal(_call(fn, base, exponent, dtype), want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_negative_exponents(lib, dtype):
    base = np.repeat(np.array([0, 1, -1, 2, -2, 7, -9], dtype), 4)
    exponent = np.tile(np.array([-1, -2, -3, -64], np.int64), 7)
    fn = getattr(lib, f"t_ipow_{_suffix(dtype)}")
    np.testing.assert_array_equal(_call(fn, base, exponent, dtype), _through_double(base, exponent, dtype))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_float_exponents(lib, dtype):
    base = np.repeat(np.array([0, 1, -1, 2, -3, 10, 1000], dtype), 6)
    exponent = np.tile(np.array([0.0, 0.5, -0.5, 2.5, 40.0, np.nan]), 7)
    fn = getattr(lib, f"t_ipow_real_{_suffix(dtype)}")
    np.testing.assert_array_equal(_call(fn, base, exponent, dtype), _through_double(base, exponent, dtype))
