"""ss_channel_moments and ss_mvn (shapeshift/codegen/kernels/moments.py) against float64 NumPy.

x viewed as [outer, channels, inner]: statistics per channel over outer and inner, with
1 and 0 extents, a large mean (the two passes keep the variance), and the parallel path.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import warnings

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import moments
from shapeshift.codegen.kernels.prelude import PRELUDE

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
SHAPES = [(1, 1, 1), (2, 3, 5), (1, 4, 1), (5, 1, 7), (3, 2, 0), (0, 3, 2), (4, 16, 33), (64, 8, 100)]


@pytest.fixture(scope="module")
def lib(build_cache):
    source = PRELUDE + moments.source(par_work=256)  # small: the OpenMP loops run too
    cdll = compile_library(source, name_hint="test_moments", cache_dir=build_cache).cdll
    cdll.ss_channel_moments.restype = None
    cdll.ss_channel_moments.argtypes = [F32P, I64, I64, I64, F32P, F32P]
    cdll.ss_mvn.restype = None
    cdll.ss_mvn.argtypes = [F32P, F32P, I64, I64, I64, F32P]
    return cdll


def _p(a):
    return a.ctypes.data_as(F32P)


def _numpy_moments(x):
    xs = x.astype(np.float64)
    with warnings.catch_warnings():  # an empty channel: NaN, with a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return xs.mean(axis=(0, 2)), xs.var(axis=(0, 2))


@pytest.mark.parametrize("shape", SHAPES)
def test_channel_moments(lib, shape):
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 3 + 1000).astype(np.float32)
    mean, var = np.full(shape[1], -1.0, np.float32), np.full(shape[1], -1.0, np.float32)
    lib.ss_channel_moments(_p(x), *shape, _p(mean), _p(var))
    want_mean, want_var = _numpy_moments(x)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-6)  # NaN for an empty channel, both
    np.testing.assert_allclose(var, want_var, rtol=1e-4)


@pytest.mark.parametrize("shape", SHAPES)
def test_mvn(lib, shape):
    x = np.random.default_rng(len(shape)).normal(2.0, 3.0, shape).astype(np.float32)
    y = np.full_like(x, np.nan)
    stats = np.zeros(2 * shape[1], np.float32)
    lib.ss_mvn(_p(x), _p(y), *shape, _p(stats))
    mean, var = _numpy_moments(x)
    with np.errstate(all="ignore"):  # an empty channel's NaN statistics
        want = (x - mean[None, :, None]) / (np.sqrt(var)[None, :, None] + 1e-9)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
