"""Gather, Where, Cast and TopK kernels (shapeshift/codegen/kernels/indexing.py) against NumPy."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import indexing
from shapeshift.codegen.kernels.prelude import PRELUDE

ELEM_DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
i64, vp = ctypes.c_int64, ctypes.c_void_p
p64 = ctypes.POINTER(ctypes.c_int64)


# The default build, and one whose tiny thresholds put small cases on the threaded paths.
@pytest.fixture(scope="module", params=[{}, {"parallel_bytes": 64, "parallel_cast_elems": 16, "topk_parallel_elems": 16}],
                ids=["default", "small"])
def lib(request, build_cache):
    cdll = compile_library(PRELUDE + indexing.source(**request.param), name_hint="indexing",
                           cache_dir=build_cache).cdll
    for name in ("ss_gather", "ss_gather_i32"):
        getattr(cdll, name).argtypes = [i64, vp, i64, i64, i64, vp, i64, vp]
        getattr(cdll, name).restype = ctypes.c_int
    cdll.ss_where.argtypes = [i64, i64, p64, vp, p64, vp, p64, vp, p64, vp]
    cdll.ss_where.restype = None
    for src, dst in indexing.CAST_PAIRS:
        fn = getattr(cdll, f"ss_cast_{src}_{dst}")
        fn.argtypes = [vp, vp, i64]
        fn.restype = None
    cdll.ss_topk.argtypes = [vp, vp, vp, i64, i64, i64, i64, ctypes.c_int]
    cdll.ss_topk.restype = None
    return cdll


def _i64s(values):
    values = list(values)
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def random_elems(rng, elem_size, shape):
    return rng.integers(0, np.iinfo(ELEM_DTYPES[elem_size]).max, size=shape, dtype=ELEM_DTYPES[elem_size],
                        endpoint=True)


# ---------------------------------------------------------------------------- gather

def gather(lib, data, axis, indices, index_dtype=np.int64):
    """(return code, out) of ss_gather[_i32] for np.take(data, indices, axis)."""
    shape = data.shape
    outer, axis_dim = int(np.prod(shape[:axis])), shape[axis]
    inner = int(np.prod(shape[axis + 1:]))
    idx = np.array(indices, dtype=index_dtype)  # a C-contiguous copy that keeps 0-d indices 0-d
    out = np.empty(shape[:axis] + idx.shape + shape[axis + 1:], data.dtype)
    out.reshape(-1).view(np.uint8)[:] = 0x5A  # a byte pattern, to see whether anything was written
    fn = lib.ss_gather if index_dtype == np.int64 else lib.ss_gather_i32
    rc = fn(data.itemsize, data.ctypes.data, outer, axis_dim, inner, idx.ctypes.data, idx.size, out.ctypes.data)
    return rc, out


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
def test_gather(lib, elem_size, index_dtype):
    rng = np.random.default_rng(elem_size)
    shapes = [(7,), (5, 1), (1, 9), (3, 4, 5), (2, 6, 1, 3), (4, 3, 2, 5, 2), (2, 0, 3), (0, 4), (3, 5, 0),
              (64, 200), (3, 300, 70)]
    for shape in shapes:
        for axis in range(len(shape)):
            dim = shape[axis]
            data = random_elems(rng, elem_size, shape)
            for idx_shape in [(), (0,), (1,), (6,), (2, 3), (300,)]:
                if dim == 0 and idx_shape not in [(0,)]:
                    continue
                idx = rng.integers(-dim, dim, size=idx_shape) if dim else np.zeros(idx_shape, np.int64)
                rc, out = gather(lib, data, axis, idx, index_dtype)
                assert rc == 0
                np.testing.assert_array_equal(out, np.take(data, idx, axis=axis))


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather_bounds(lib, index_dtype):
    rng = np.random.default_rng(7)
    data = rng.standard_normal((3, 5, 4)).astype(np.float32)
    # The extreme valid indices work ...
    rc, out = gather(lib, data, 1, [-5, 4, 0, -1], index_dtype)
    assert rc == 0
    np.testing.assert_array_equal(out, np.take(data, [-5, 4, 0, -1], axis=1))
    # ... one past either end fails, and leaves out untouched.
    for bad in ([5], [-6], [0, 1, 2, 3, 100], [-1000, 0], [np.iinfo(index_dtype).min]):
        rc, out = gather(lib, data, 1, bad, index_dtype)
        assert rc == 1
        assert (out.view(np.uint8) == 0x5A).all()
    # Any index into an empty axis fails; no index into it is fine.
    empty = np.zeros((2, 0, 3), np.float32)
    assert gather(lib, empty, 1, [0], index_dtype)[0] == 1
    assert gather(lib, empty, 1, np.zeros(0, np.int64), index_dtype)[0] == 0
    # Odd element sizes go through memcpy.
    raw = rng.integers(0, 255, size=(4, 6, 3), dtype=np.uint8)
    idx = np.array([3, -1, 0], index_dtype)
    out = np.zeros((4, 3, 3), np.uint8)
    fn = lib.ss_gather if index_dtype == np.int64 else lib.ss_gather_i32
    assert fn(3, raw.ctypes.data, 4, 6, 1, idx.ctypes.data, 3, out.ctypes.data) == 0
    np.testing.assert_array_equal(out, np.take(raw, idx, axis=1))


# ----------------------------------------------------------------------------- where

def where(lib, cond, a, b):
    """ss_where on views (any strides, broadcasting like np.where)."""
    shape = np.broadcast_shapes(cond.shape, a.shape, b.shape)
    c, x, y = np.broadcast_arrays(cond, a, b)
    out = np.empty(shape, a.dtype)

    def strides(v):
        return _i64s(s // v.itemsize for s in v.strides)

    lib.ss_where(a.itemsize, len(shape), _i64s(shape), c.ctypes.data, strides(c), x.ctypes.data, strides(x),
                 y.ctypes.data, strides(y), out.ctypes.data)
    return out


def random_broadcast_shapes(rng, rank):
    full = [int(rng.integers(0, 5)) if rng.random() < 0.05 else int(rng.integers(1, 6)) for _ in range(rank)]

    def operand():
        lead = int(rng.integers(0, rank + 1))  # missing leading dims
        return tuple(1 if rng.random() < 0.3 else n for n in full[lead:])
    return operand(), operand(), operand()


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
def test_where_broadcast(lib, elem_size):
    rng = np.random.default_rng(elem_size + 10)
    for _ in range(200):
        rank = int(rng.integers(0, 6))
        cs, as_, bs = random_broadcast_shapes(rng, rank)
        cond = (rng.random(cs) < 0.5).astype(np.uint8)
        a, b = random_elems(rng, elem_size, as_), random_elems(rng, elem_size, bs)
        if a.ndim >= 2 and rng.random() < 0.5:
            a = np.ascontiguousarray(a.swapaxes(0, 1)).swapaxes(0, 1)  # a non-contiguous operand
        if b.ndim >= 1 and rng.random() < 0.3:
            b = b[..., ::-1]  # a reversed operand (negative stride)
        np.testing.assert_array_equal(where(lib, cond, a, b), np.where(cond.astype(bool), a, b))


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
def test_where_large(lib, elem_size):
    rng = np.random.default_rng(elem_size + 20)
    cond = (rng.random((300, 1, 700)) < 0.5).astype(np.uint8)
    cond[0, 0, :5] = 7  # nonzero other than 1 counts as true
    a = random_elems(rng, elem_size, (300, 2, 700))
    b = random_elems(rng, elem_size, (1, 700))
    np.testing.assert_array_equal(where(lib, cond, a, b), np.where(cond != 0, a, b))
    np.testing.assert_array_equal(where(lib, cond, b, a), np.where(cond != 0, b, a))
    np.testing.assert_array_equal(where(lib, cond[..., ::-1], a, a[:, ::-1]), np.where(cond[..., ::-1] != 0, a, a[:, ::-1]))


# ------------------------------------------------------------------------------ cast

CAST_DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32, "i8": np.int8,
               "u8": np.uint8, "bool": np.bool_}


def cast_inputs(rng, src, dst, n):
    """Values of dtype src whose numpy cast to dst is well defined on every platform."""
    if src == "bool":
        return rng.random(n) < 0.5
    if src in ("f32", "f64"):
        # Negative, fractional, near-integer and zero values; big ones only where they fit.
        limit = {"i8": 127, "u8": 255, "i32": 2**31 - 1, "i64": 2**62}.get(dst, 1e30)
        values = rng.standard_normal(n) * rng.choice([0.5, 3, 100, 1e6, 1e9], size=n)
        values = np.clip(values, -limit if dst != "u8" else -128, limit)
        values[:8] = [0.0, -0.0, 0.5, -0.5, 1.9999, -1.9999, 127.6, -128.7][:min(8, n)]
        if dst in ("i8", "u8"):
            values[:8] = np.clip(values[:8], -128, 127)
        return values.astype(CAST_DTYPES[src])
    info = np.iinfo(CAST_DTYPES[src])
    values = rng.integers(info.min, info.max, size=n, dtype=CAST_DTYPES[src], endpoint=True)
    values[: min(n, 4)] = np.array([0, 1, -1, info.max], dtype=np.int64)[: min(n, 4)].astype(CAST_DTYPES[src])
    return values


@pytest.mark.parametrize("pair", indexing.CAST_PAIRS, ids=lambda p: f"{p[0]}_{p[1]}")
def test_cast(lib, pair):
    src, dst = pair
    assert len(indexing.CAST_PAIRS) == 49
    rng = np.random.default_rng(abs(hash(pair)) % 2**32)
    for n in (0, 1, 7, 33, 1000, 100_003):
        x = cast_inputs(rng, src, dst, n)
        y = np.full(n + 2, 3, CAST_DTYPES[dst])
        getattr(lib, indexing.cast_function_name(x.dtype, y.dtype))(x.ctypes.data, y.ctypes.data, n)
        with np.errstate(invalid="ignore"):
            expected = x.astype(CAST_DTYPES[dst])
        np.testing.assert_array_equal(y[:n], expected)
        np.testing.assert_array_equal(y[n:], np.full(2, 3, CAST_DTYPES[dst]))


def test_bool_input_nonzero_is_true(lib):
    x = np.array([0, 1, 2, 255], np.uint8)
    y = np.zeros(4, np.float32)
    lib.ss_cast_bool_f32(x.ctypes.data, y.ctypes.data, 4)
    np.testing.assert_array_equal(y, [0, 1, 1, 1])


def test_cast_function_name():
    assert indexing.cast_function_name(np.float32, np.int64) == "ss_cast_f32_i64"
    assert indexing.cast_function_name(np.dtype(bool), "float32") == "ss_cast_bool_f32"
    assert indexing.cast_function_name(np.uint8, np.int8) == "ss_cast_u8_i8"
    with pytest.raises(ValueError):
        indexing.cast_function_name(np.float16, np.float32)


# ------------------------------------------------------------------------------ topk

def topk(lib, x, k, largest):
    outer, n = x.shape[0], x.shape[1]
    inner = int(np.prod(x.shape[2:]))
    values = np.full((outer, k) + x.shape[2:], np.nan, np.float32)
    indices = np.full((outer, k) + x.shape[2:], -7, np.int64)
    lib.ss_topk(x.ctypes.data, values.ctypes.data, indices.ctypes.data, outer, n, inner, k, int(largest))
    return values, indices


def topk_reference(x, k, largest):
    order = np.argsort(-x if largest else x, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(x, order, axis=1), order


@pytest.mark.parametrize("largest", [True, False])
def test_topk(lib, largest):
    rng = np.random.default_rng(int(largest))
    shapes = [(1, 1), (1, 10), (3, 17), (2, 5, 3), (4, 64, 1), (1, 1000), (2, 300, 7), (0, 5), (3, 4, 0),
              (5, 8, 2, 3)]
    for shape in shapes:
        x = np.ascontiguousarray(rng.standard_normal(shape).astype(np.float32))
        ties = np.ascontiguousarray(rng.integers(-3, 4, size=shape).astype(np.float32))  # many equal values
        n = shape[1]
        for data in (x, ties):
            for k in sorted({0, 1, 2, n // 10, n // 2, n - 1, n} & set(range(n + 1))):
                values, indices = topk(lib, data.reshape(shape[0], n, -1) if data.ndim > 3 else data, k, largest)
                ref_v, ref_i = topk_reference(data.reshape(values.shape[0], n, -1) if data.ndim > 3 else data,
                                              k, largest)
                np.testing.assert_array_equal(values, ref_v)
                np.testing.assert_array_equal(indices, ref_i)


def test_topk_large_parallel(lib):
    rng = np.random.default_rng(5)
    x = rng.integers(-50, 50, size=(6, 5000, 4)).astype(np.float32)
    for k in (3, 700, 5000):
        for largest in (True, False):
            values, indices = topk(lib, x, k, largest)
            ref_v, ref_i = topk_reference(x, k, largest)
            np.testing.assert_array_equal(values, ref_v)
            np.testing.assert_array_equal(indices, ref_i)
