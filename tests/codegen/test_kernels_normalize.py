"""ss_layernorm, ss_group_norm and ss_batchnorm (shapeshift/codegen/kernels/normalize.py)
against NumPy in float64."""

from __future__ import annotations

import ctypes
import zlib

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import normalize, vmath
from shapeshift.codegen.kernels.prelude import PRELUDE

I64 = ctypes.c_int64
P = ctypes.c_void_p
F = ctypes.c_float
RTOL = 1e-5


@pytest.fixture(scope="module")
def lib(build_cache):
    source = PRELUDE + vmath.source() + normalize.source()
    cdll = compile_library(source, name_hint="test normalize", cache_dir=build_cache).cdll
    cdll.ss_layernorm.argtypes = [P, P, P, P, I64, I64, F, P, P]
    cdll.ss_group_norm.argtypes = [P, P, P, P, I64, I64, I64, I64, F]
    cdll.ss_batchnorm.argtypes = [P, P, P, P, P, P, I64, I64, I64, F]
    for name in ("ss_layernorm", "ss_group_norm", "ss_batchnorm"):
        getattr(cdll, name).restype = None
    return cdll


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def ptr(a) -> int | None:
    return None if a is None else a.ctypes.data


def f32(a):
    return None if a is None else np.ascontiguousarray(a, dtype=np.float32)


def check(got, want, atol=1e-5):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=atol)


@pytest.mark.parametrize("affine", ["none", "scale", "bias", "both"])
@pytest.mark.parametrize("rows,n", [(0, 5), (3, 0), (1, 1), (4, 7), (5, 768), (3, 1000), (2, 4099), (33, 17)])
def test_layernorm(lib, rows, n, affine):
    rng = rng_for(rows, n, affine)
    # An offset mean: the two-pass statistics must not cancel the variance away.
    x = (rng.normal(size=(rows, n)) * 3 + 50).astype(np.float32)
    scale = f32(rng.normal(size=n)) if affine in ("scale", "both") else None
    bias = f32(rng.normal(size=n)) if affine in ("bias", "both") else None
    eps = 1e-5
    y = np.full_like(x, 777.0)
    mean = np.full(rows, 777.0, dtype=np.float32)
    inv_std = np.full(rows, 777.0, dtype=np.float32)
    lib.ss_layernorm(x.ctypes.data, ptr(scale), ptr(bias), y.ctypes.data, rows, n, eps,
                     mean.ctypes.data, inv_std.ctypes.data)
    d = x.astype(np.float64)
    if n == 0:
        np.testing.assert_array_equal(mean, 0.0)
        check(inv_std, np.full(rows, 1 / np.sqrt(eps)))
        return
    m = d.mean(axis=1, keepdims=True)
    istd = 1 / np.sqrt(d.var(axis=1, keepdims=True) + eps)
    want = (d - m) * istd * (1.0 if scale is None else scale) + (0.0 if bias is None else bias)
    check(y, want)
    check(mean, m[:, 0])
    check(inv_std, istd[:, 0])


def test_layernorm_without_statistics_outputs(lib):
    rng = rng_for("nostats")
    x = rng.normal(size=(6, 37)).astype(np.float32)
    y = np.empty_like(x)
    lib.ss_layernorm(x.ctypes.data, None, None, y.ctypes.data, 6, 37, 1e-3, None, None)
    d = x.astype(np.float64)
    check(y, (d - d.mean(1, keepdims=True)) / np.sqrt(d.var(1, keepdims=True) + 1e-3))


def numpy_group_norm(x, scale, bias, groups, eps):
    n, c, inner = x.shape
    d = x.astype(np.float64).reshape(n, groups, -1)
    norm = ((d - d.mean(2, keepdims=True)) / np.sqrt(d.var(2, keepdims=True) + eps)).reshape(n, c, inner)
    s = np.ones(c) if scale is None else scale.astype(np.float64)
    b = np.zeros(c) if bias is None else bias.astype(np.float64)
    return norm * s[None, :, None] + b[None, :, None]


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("N,C,G,inner", [
    (2, 6, 6, 5),  # instance norm
    (2, 6, 1, 5),  # one group
    (2, 6, 3, 5),  # in between
    (1, 8, 4, 1),  # inner == 1
    (3, 4, 2, 0),  # empty spatial extent
    (0, 4, 2, 3),  # empty batch
    (1, 32, 8, 1029),  # long groups, odd inner
    (2, 3, 3, 64),
])
def test_group_norm(lib, N, C, G, inner, affine):
    rng = rng_for(N, C, G, inner, affine)
    x = (rng.normal(size=(N, C, inner)) * 2 - 7).astype(np.float32)
    scale = f32(rng.normal(size=C)) if affine else None
    bias = f32(rng.normal(size=C)) if affine else None
    y = np.full_like(x, 777.0)
    lib.ss_group_norm(x.ctypes.data, ptr(scale), ptr(bias), y.ctypes.data, N, C, G, inner, 1e-5)
    if x.size:
        check(y, numpy_group_norm(x, scale, bias, G, 1e-5))


def test_group_norm_rejects_groups_that_do_not_divide_channels(lib):
    x = np.ones((1, 6, 2), dtype=np.float32)
    y = np.zeros_like(x)
    lib.ss_group_norm(x.ctypes.data, None, None, y.ctypes.data, 1, 6, 4, 2, 1e-5)
    assert np.isnan(y).all()


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("N,C,inner", [(2, 3, 7), (1, 16, 1), (4, 5, 64), (0, 3, 4), (2, 3, 0), (3, 2, 1001)])
def test_batchnorm(lib, N, C, inner, affine):
    rng = rng_for(N, C, inner, affine)
    x = rng.normal(size=(N, C, inner)).astype(np.float32) * 4 + 1
    mean = f32(rng.normal(size=C))
    var = f32(rng.uniform(0.1, 3.0, size=C))
    scale = f32(rng.normal(size=C)) if affine else None
    bias = f32(rng.normal(size=C)) if affine else None
    y = np.full_like(x, 777.0)
    lib.ss_batchnorm(x.ctypes.data, ptr(scale), ptr(bias), mean.ctypes.data, var.ctypes.data, y.ctypes.data,
                     N, C, inner, 1e-5)
    s = np.ones(C) if scale is None else scale.astype(np.float64)
    b = np.zeros(C) if bias is None else bias.astype(np.float64)
    want = ((x.astype(np.float64) - mean[None, :, None]) / np.sqrt(var[None, :, None].astype(np.float64) + 1e-5)
            * s[None, :, None] + b[None, :, None])
    check(y, want)
