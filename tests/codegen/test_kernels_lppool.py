"""ss_lppool3d (shapeshift/codegen/kernels/lppool.py) against float64 NumPy.

1-D, 2-D and 3-D windows with pads, strides, dilations and ceil-mode overhang (an output
extent one longer than the windows that fit), p = 1, 2 and 3, and the global pool (one
window over the whole input).
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import lppool
from shapeshift.codegen.kernels.prelude import PRELUDE

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)


@pytest.fixture(scope="module")
def lib(build_cache):
    source = PRELUDE + lppool.source(par_min=256)  # small: the test sizes run the OpenMP loop too
    cdll = compile_library(source, name_hint="test_lppool", cache_dir=build_cache).cdll
    cdll.ss_lppool3d.restype = None
    cdll.ss_lppool3d.argtypes = [F32P] * 2 + [I64] * 19 + [ctypes.c_float]
    return cdll


def _3d(values, fill):
    return [fill] * (3 - len(values)) + list(values)


def run_kernel(lib, x, out_dims, kernel, strides, pads, dilations, p):
    spatial = x.ndim - 2
    y = np.full((*x.shape[:2], *out_dims), np.nan, np.float32)
    args = [int(np.prod(x.shape[:2])), *_3d(x.shape[2:], 1), *_3d(out_dims, 1), *_3d(kernel, 1),
            *_3d(strides, 1), *_3d(pads, 0), *_3d(dilations, 1)]
    assert len(args) == 19 and spatial == len(kernel)
    lib.ss_lppool3d(x.ctypes.data_as(F32P), y.ctypes.data_as(F32P), *args, p)
    return y


def expected(x, out_dims, kernel, strides, pads, dilations, p):
    """Float64 windows over the zero-padded input (zeros add nothing to a sum of |x|^p)."""
    spatial = x.ndim - 2
    reach = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out_dims, strides, kernel, dilations)]
    ends = [max(0, r - pb - n) for r, pb, n in zip(reach, pads, x.shape[2:])]
    padded = np.pad(np.abs(x.astype(np.float64)) ** p, [(0, 0), (0, 0)] + list(zip(pads, ends)))
    y = np.zeros((*x.shape[:2], *out_dims))
    spatial_axes = tuple(range(2, 2 + spatial))
    for out in np.ndindex(*out_dims):
        window = tuple(slice(o * s, o * s + (k - 1) * d + 1, d) for o, s, k, d in zip(out, strides, kernel, dilations))
        y[(slice(None), slice(None), *out)] = padded[(slice(None), slice(None), *window)].sum(axis=spatial_axes)
    return y ** (1.0 / p)


CASES = [
    # input shape, output spatial dims, kernel, strides, begin pads, dilations
    ((2, 3, 9, 11), (4, 6), (3, 3), (2, 2), (1, 1), (1, 1)),
    ((1, 2, 8, 9), (7, 3), (4, 3), (1, 3), (2, 0), (1, 1)),
    ((1, 4, 10, 10), (3, 4), (2, 2), (3, 3), (0, 0), (2, 1)),  # dilations
    ((1, 2, 10, 7), (5, 4), (2, 2), (2, 2), (0, 0), (1, 1)),  # ceil mode: the last column overhangs
    ((2, 3, 17), (9,), (3,), (2,), (1,), (1,)),  # 1-D
    ((1, 2, 5, 6, 7), (4, 5, 6), (2, 2, 2), (1, 1, 1), (0, 0, 0), (1, 1, 1)),  # 3-D
    ((1, 2, 6, 5, 7), (3, 3, 3), (3, 2, 3), (2, 2, 3), (1, 0, 1), (1, 2, 1)),
    ((1, 1, 1, 1), (1, 1), (1, 1), (1, 1), (0, 0), (1, 1)),
    ((2, 16, 20, 18), (10, 9), (3, 3), (2, 2), (1, 1), (1, 1)),  # large enough for OpenMP
]


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
@pytest.mark.parametrize("shape,out_dims,kernel,strides,pads,dilations", CASES)
def test_windows(lib, shape, out_dims, kernel, strides, pads, dilations, p):
    rng = np.random.default_rng(len(shape) * 31 + int(p))
    x = rng.standard_normal(shape).astype(np.float32)
    got = run_kernel(lib, x, out_dims, kernel, strides, pads, dilations, p)
    np.testing.assert_allclose(got, expected(x, out_dims, kernel, strides, pads, dilations, p), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
def test_global(lib, p):
    x = np.random.default_rng(9).standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    got = run_kernel(lib, x, (1, 1, 1), x.shape[2:], (1, 1, 1), (0, 0, 0), (1, 1, 1), p)
    want = (np.abs(x.astype(np.float64)) ** p).sum(axis=(2, 3, 4), keepdims=True) ** (1.0 / p)
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_empty_extents(lib):
    x = np.zeros((0, 3, 4, 4), np.float32)
    assert run_kernel(lib, x, (2, 2), (2, 2), (2, 2), (0, 0), (1, 1), 2.0).size == 0
    x = np.ones((1, 2, 4, 4), np.float32)
    assert run_kernel(lib, x, (0, 2), (2, 2), (2, 2), (0, 0), (1, 1), 2.0).size == 0
