"""ss_lp_normalize (shapeshift/codegen/kernels/lpnorm.py) against float64 NumPy.

p = 1 and 2 along the first, a middle and the last axis (inner extents below, at and above
the kernel's column block), zero norms (0, not NaN), and empty extents.
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import lpnorm
from shapeshift.codegen.kernels.prelude import PRELUDE

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
BLOCK = 8


@pytest.fixture(scope="module")
def lib(build_cache):
    source = PRELUDE + lpnorm.source(block=BLOCK, par_min=256)  # small: the OpenMP loop runs too
    cdll = compile_library(source, name_hint="test_lpnorm", cache_dir=build_cache).cdll
    cdll.ss_lp_normalize.restype = None
    cdll.ss_lp_normalize.argtypes = [F32P] * 2 + [I64] * 3 + [ctypes.c_int]
    return cdll


def run_kernel(lib, x, axis, p):
    y = np.full_like(x, np.nan)
    outer, n, inner = int(np.prod(x.shape[:axis])), x.shape[axis], int(np.prod(x.shape[axis + 1:]))
    lib.ss_lp_normalize(x.ctypes.data_as(F32P), y.ctypes.data_as(F32P), outer, n, inner, p)
    return y


def expected(x, axis, p):
    xs = x.astype(np.float64)
    norm = np.abs(xs).sum(axis=axis, keepdims=True) if p == 1 else np.sqrt((xs * xs).sum(axis=axis, keepdims=True))
    return np.where(norm == 0, 0.0, xs / np.where(norm == 0, 1.0, norm))


SHAPES = [((5, 7), 1), ((5, 7), 0), ((3, 4, 5), 1), ((2, 6, BLOCK), 1), ((2, 6, BLOCK + 3), 1),
          ((2, 3, 2 * BLOCK + 1), 0), ((1, 1), 0), ((64, 300), 1), ((300, 64), 0)]


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape,axis", SHAPES)
def test_against_numpy(lib, shape, axis, p):
    x = np.random.default_rng(len(shape) + axis).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(run_kernel(lib, x, axis, p), expected(x, axis, p), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("p", [1, 2])
def test_zero_norm_gives_zero(lib, p):
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    x[1, :, 2] = 0.0
    x[2, :, :] = 0.0
    got = run_kernel(lib, x, 1, p)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, expected(x, 1, p), rtol=1e-6, atol=1e-7)


def test_empty_extents(lib):
    for shape, axis in [((0, 4), 1), ((3, 0), 1), ((3, 0, 2), 1)]:
        assert run_kernel(lib, np.zeros(shape, np.float32), axis, 2).size == 0
