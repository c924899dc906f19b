"""ss_dropout_f32/f64 (shapeshift/codegen/kernels/dropout.py) against NumPy's legacy RandomState.

The kernel must draw exactly ``RandomState(seed).uniform(0, 1, n)``: seeds at the ends of
the 32-bit range, lengths across MT19937's 624-word refills, and every ratio edge (0, 1,
above 1, below 0).
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import dropout
from shapeshift.codegen.kernels.prelude import PRELUDE

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

U8P = ctypes.POINTER(ctypes.c_uint8)
POINTERS = {np.float32: ctypes.POINTER(ctypes.c_float), np.float64: ctypes.POINTER(ctypes.c_double)}


@pytest.fixture(scope="module")
def lib(build_cache):
    cdll = compile_library(PRELUDE + dropout.source(), name_hint="test_dropout",
                           cache_dir=build_cache).cdll
    for name, dtype in (("ss_dropout_f32", np.float32), ("ss_dropout_f64", np.float64)):
        fn = getattr(cdll, name)
        fn.restype = None
        fn.argtypes = [POINTERS[dtype], POINTERS[dtype], U8P, ctypes.c_int64, ctypes.c_double, ctypes.c_uint32]
    return cdll


def run_kernel(lib, x, ratio, seed, with_mask=True):
    y = np.full_like(x, np.nan)
    mask = np.full(x.shape, 7, np.uint8)
    fn = lib.ss_dropout_f32 if x.dtype == np.float32 else lib.ss_dropout_f64
    pointer = POINTERS[x.dtype.type]
    fn(x.ctypes.data_as(pointer), y.ctypes.data_as(pointer), mask.ctypes.data_as(U8P) if with_mask else None,
       x.size, ratio, seed)
    return y, mask


def expected(x, ratio, seed):
    keep = np.random.RandomState(seed).uniform(0.0, 1.0, x.shape) >= ratio
    scale = 1.0 / (1.0 - ratio) if ratio < 1 else 0.0
    with np.errstate(invalid="ignore"):  # inf * 0
        return np.asarray(x * keep * scale, dtype=x.dtype), keep


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 - 1])
@pytest.mark.parametrize("n", [0, 1, 311, 312, 313, 2000])
def test_draws_match_numpy(lib, dtype, seed, n):
    # 312 doubles use exactly one 624-word state; 313 and 2000 refill it.
    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    y, mask = run_kernel(lib, x, 0.4, seed)
    want_y, want_mask = expected(x, 0.4, seed)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(mask.astype(bool), want_mask)
    assert set(np.unique(mask)) <= {0, 1}


@pytest.mark.parametrize("ratio", [0.0, 1.0, 1.5, -0.5, float(np.float32(0.1))])
def test_ratio_edges(lib, ratio):
    x = np.array([1.0, -2.0, np.inf, -np.inf, 0.0, 3.5] * 50, np.float32)
    y, mask = run_kernel(lib, x, ratio, 9)
    want_y, want_mask = expected(x, ratio, 9)
    np.testing.assert_array_equal(y, want_y)  # NaN where inf * 0, as NumPy
    np.testing.assert_array_equal(np.signbit(y), np.signbit(want_y))
    np.testing.assert_array_equal(mask.astype(bool), want_mask)


def test_without_mask(lib):
    x = np.arange(100, dtype=np.float32)
    y, mask = run_kernel(lib, x, 0.5, 3, with_mask=False)
    np.testing.assert_array_equal(y, expected(x, 0.5, 3)[0])
    assert (mask == 7).all()
