"""The N-d pooling kernels of shapeshift/codegen/kernels/pool.py against a float64 NumPy reference.

ss_maxpool3d_*, ss_maxpool3d_argmax_* (Indices, both storage orders), ss_avgpool3d_*,
ss_pool_same_pads and ss_maxunpool on random inputs: 3-D, and 1-D / 2-D seen as 3-D with
leading extents of 1; strides, pads, dilations, ceil_mode windows past the end padding,
count_include_pad both ways, SAME_UPPER / SAME_LOWER; float, double, int8 and uint8.
The reference below walks every window tap by tap, written from the ONNX spec.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import shutil
import zlib

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import pool
from shapeshift.codegen.kernels.prelude import PRELUDE

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, VP = ctypes.c_int64, ctypes.c_void_p
MAX_DTYPES = {"f32": np.float32, "f64": np.float64, "i8": np.int8, "u8": np.uint8}
AVERAGE_DTYPES = {"f32": np.float32, "f64": np.float64}
ARRAY3 = I64 * 3


@pytest.fixture(scope="module")
def lib(build_cache):
    cdll = compile_library(PRELUDE + pool.source(), name_hint="test_pool3d",
                           cache_dir=build_cache).cdll
    geometry = [ctypes.POINTER(I64)] * 6  # in, out, k, s, p, dil
    for sfx in MAX_DTYPES:
        fn = getattr(cdll, f"ss_maxpool3d_{sfx}")
        fn.restype, fn.argtypes = None, [VP, VP, I64] + geometry
        fn = getattr(cdll, f"ss_maxpool3d_argmax_{sfx}")
        fn.restype, fn.argtypes = None, [VP, VP, VP, I64] + geometry + [ctypes.c_int]
    for sfx in AVERAGE_DTYPES:
        fn = getattr(cdll, f"ss_avgpool3d_{sfx}")
        fn.restype, fn.argtypes = None, [VP, VP, I64] + geometry[:5] + [ctypes.POINTER(I64)] * 2 + [ctypes.c_int]
    cdll.ss_pool_same_pads.restype = None
    cdll.ss_pool_same_pads.argtypes = [ctypes.POINTER(I64)] * 5 + [ctypes.c_int] + [ctypes.POINTER(I64)] * 2
    cdll.ss_maxunpool.restype = ctypes.c_int
    cdll.ss_maxunpool.argtypes = [I64, VP, VP, I64, VP, I64]
    return cdll


def ptr(a: np.ndarray):
    return a.ctypes.data_as(VP)


def arr3(values, fill):
    """Per-axis values as the kernels' three-axis array, leading axes filled with ``fill``."""
    values = [int(v) for v in values]
    return ARRAY3(*([fill] * (3 - len(values)) + values))


# -- the reference ---------------------------------------------------------------------------


class Pool:
    """One pooling geometry, resolved the way ONNX specifies it."""

    def __init__(self, sizes, kernel, strides, pads=None, dilations=None, ceil=False, auto_pad="NOTSET"):
        rank = len(sizes)
        self.sizes, self.kernel, self.strides = list(sizes), list(kernel), list(strides)
        self.dilations = list(dilations or [1] * rank)
        pads = list(pads or [0] * (2 * rank))
        self.begins, self.ends, self.outs = [], [], []
        for i in range(rank):
            extent = (self.kernel[i] - 1) * self.dilations[i] + 1
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out = -(-self.sizes[i] // self.strides[i])
                total = max(0, (out - 1) * self.strides[i] + extent - self.sizes[i])
                begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
                end = total - begin
            else:
                begin, end = pads[i], pads[i + rank]
                span = self.sizes[i] + begin + end - extent
                out = (-(-span // self.strides[i]) if ceil else span // self.strides[i]) + 1
                if ceil and (out - 1) * self.strides[i] >= self.sizes[i] + begin:
                    out -= 1  # a last window starting in the end padding is dropped
            self.begins.append(begin)
            self.ends.append(end)
            self.outs.append(max(out, 0))

    def taps(self, out_index):
        """Each tap's input coordinates, in window order, for one output position."""
        per_axis = [[o * s - b + t * d for t in range(k)]
                    for o, s, b, k, d in zip(out_index, self.strides, self.begins, self.kernel, self.dilations)]
        return itertools.product(*per_axis)

    def inside(self, coords, lows, highs) -> bool:
        return all(lo <= c < hi for c, lo, hi in zip(coords, lows, highs))


def ref_max(x: np.ndarray, geo: Pool, storage_order: int = 0):
    """Values and flat Indices of the first maximum; a window of padding only keeps its
    first tap, clipped into x (the reference evaluator's choice)."""
    nc = x.shape[0] * x.shape[1]
    planes = x.reshape(nc, -1).astype(np.float64)
    lowest = float(np.iinfo(x.dtype).min) if np.issubdtype(x.dtype, np.integer) else -np.inf
    order = "F" if storage_order else "C"
    values = np.empty((nc, *geo.outs))
    indices = np.empty((nc, *geo.outs), np.int64)
    for out_index in np.ndindex(*geo.outs):
        taps = list(geo.taps(out_index))
        first = tuple(min(max(c, 0), size - 1) for c, size in zip(taps[0], geo.sizes))
        best = np.full(nc, lowest)
        where = np.full(nc, np.ravel_multi_index(first, geo.sizes, order=order))
        for coords in taps:
            if not geo.inside(coords, [0] * len(coords), geo.sizes):
                continue
            flat = np.ravel_multi_index(coords, geo.sizes, order=order)
            v = planes[:, np.ravel_multi_index(coords, geo.sizes)]
            better = v > best
            best[better], where[better] = v[better], flat
        values[(slice(None), *out_index)] = best
        indices[(slice(None), *out_index)] = where
    indices += np.arange(nc).reshape((nc,) + (1,) * len(geo.outs)) * int(np.prod(geo.sizes))
    shape = x.shape[:2] + tuple(geo.outs)
    return values.reshape(shape), indices.reshape(shape)


def ref_average(x: np.ndarray, geo: Pool, count_include_pad: int) -> np.ndarray:
    nc = x.shape[0] * x.shape[1]
    planes = x.reshape(nc, -1).astype(np.float64)
    zeros = [0] * len(geo.sizes)
    lows = [-b for b in geo.begins] if count_include_pad else zeros
    highs = [s + e for s, e in zip(geo.sizes, geo.ends)] if count_include_pad else geo.sizes
    y = np.zeros((nc, *geo.outs))
    for out_index in np.ndindex(*geo.outs):
        total, count = np.zeros(nc), 0
        for coords in geo.taps(out_index):
            if geo.inside(coords, zeros, geo.sizes):
                total += planes[:, np.ravel_multi_index(coords, geo.sizes)]
            count += geo.inside(coords, lows, highs)
        y[(slice(None), *out_index)] = total / count if count else 0.0
    return y.reshape(x.shape[:2] + tuple(geo.outs))


# -- cases -----------------------------------------------------------------------------------

# x shape, kernel, strides, pads (begins, ends), dilations, ceil_mode
CASES = [
    ((2, 3, 5, 6, 7), (2, 2, 2), (1, 1, 1), (0, 0, 0, 0, 0, 0), (1, 1, 1), 0),
    ((1, 2, 7, 8, 9), (3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), (1, 1, 1), 0),
    ((1, 2, 7, 8, 9), (3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), (1, 1, 1), 1),
    ((1, 2, 9, 8, 10), (3, 2, 3), (2, 3, 2), (0, 1, 2, 1, 0, 1), (2, 1, 2), 1),  # asymmetric, dilated, ceil
    ((2, 1, 6, 6, 6), (2, 2, 2), (1, 1, 1), (0, 0, 0, 0, 0, 0), (2, 2, 2), 0),
    ((1, 1, 10, 9, 11), (3, 3, 3), (3, 2, 3), (1, 0, 2, 2, 1, 1), (3, 2, 2), 1),
    ((1, 3, 4, 4, 4), (4, 4, 4), (1, 1, 1), (0, 0, 0, 0, 0, 0), (1, 1, 1), 0),  # global window
    ((1, 1, 1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0, 0, 0, 0), (1, 1, 1), 0),
    ((1, 16, 12, 14, 15), (3, 3, 3), (1, 2, 2), (1, 1, 1, 1, 1, 1), (1, 1, 1), 0),  # large enough for OpenMP
    ((2, 3, 9, 11), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),  # 2-D
    ((1, 2, 9, 10), (3, 2), (2, 2), (1, 0, 1, 1), (2, 3), 0),  # 2-D dilated
    ((2, 3, 17), (3,), (2,), (1, 1), (2,), 1),  # 1-D
    ((1, 1, 1), (2,), (1,), (1, 1), (2,), 0),  # dilated taps straddling a one-element input
    # 2-D and 1-D max pools of stride 1 run separably over padded planes (max only):
    ((2, 40, 20, 20), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 0),  # YOLO's SPPF: many chunks, OpenMP
    ((1, 3, 4, 4), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 0),  # windows wider than the plane
    ((1, 2, 9, 7), (3, 2), (1, 1), (0, 1, 2, 0), (2, 3), 1),  # asymmetric pads, dilated
    ((1, 2, 50, 49), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 0),  # a plane larger than the stack scratch
    ((2, 3, 17), (4,), (1,), (1, 2), (1,), 0),  # 1-D
]


def case_id(c):
    return f"{c[0]}-k{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}-ceil{c[5]}"


def seeded(*key) -> np.random.Generator:
    """A generator seeded by the case (str hashes vary between processes, crc32 does not)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def random_input(rng, shape, dtype):
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        # a narrow range, so that windows hold ties and the first maximum matters
        return rng.integers(max(info.min, -4), min(info.max, 4) + 1, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def geometry_args(geo: Pool):
    return (arr3(geo.sizes, 1), arr3(geo.outs, 1), arr3(geo.kernel, 1), arr3(geo.strides, 1),
            arr3(geo.begins, 0), arr3(geo.dilations, 1))


def nc_of(x):
    return x.shape[0] * x.shape[1]


@pytest.mark.parametrize("sfx", list(MAX_DTYPES))
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_maxpool(lib, case, sfx):
    xshape, kernel, strides, pads, dilations, ceil = case
    dtype = MAX_DTYPES[sfx]
    x = random_input(seeded(case, sfx), xshape, dtype)
    geo = Pool(xshape[2:], kernel, strides, pads, dilations, ceil)
    want, _ = ref_max(x, geo)
    y = np.zeros(want.shape, dtype)
    in_, out, k, s, p, dil = geometry_args(geo)
    getattr(lib, f"ss_maxpool3d_{sfx}")(ptr(x), ptr(y), nc_of(x), in_, out, k, s, p, dil)
    np.testing.assert_array_equal(y, want.astype(dtype))


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("sfx", list(MAX_DTYPES))
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_maxpool_indices(lib, case, sfx, storage_order):
    xshape, kernel, strides, pads, dilations, ceil = case
    dtype = MAX_DTYPES[sfx]
    x = random_input(seeded(case, sfx, storage_order), xshape, dtype)
    geo = Pool(xshape[2:], kernel, strides, pads, dilations, ceil)
    want, want_indices = ref_max(x, geo, storage_order)
    y = np.zeros(want.shape, dtype)
    indices = np.full(want.shape, -7, np.int64)
    in_, out, k, s, p, dil = geometry_args(geo)
    getattr(lib, f"ss_maxpool3d_argmax_{sfx}")(ptr(x), ptr(y), ptr(indices), nc_of(x), in_, out, k, s, p, dil,
                                               storage_order)
    np.testing.assert_array_equal(y, want.astype(dtype))
    np.testing.assert_array_equal(indices, want_indices)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("sfx", list(AVERAGE_DTYPES))
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_avgpool(lib, case, sfx, count_include_pad):
    xshape, kernel, strides, pads, dilations, ceil = case
    dtype = AVERAGE_DTYPES[sfx]
    x = random_input(seeded(case, sfx, count_include_pad), xshape, dtype)
    geo = Pool(xshape[2:], kernel, strides, pads, dilations, ceil)
    want = ref_average(x, geo, count_include_pad)
    y = np.full(want.shape, np.nan, dtype)
    in_, out, k, s, p, dil = geometry_args(geo)
    getattr(lib, f"ss_avgpool3d_{sfx}")(ptr(x), ptr(y), nc_of(x), in_, out, k, s, p, arr3(geo.ends, 0), dil,
                                        count_include_pad)
    np.testing.assert_allclose(y, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


SAME_CASES = [  # x shape, kernel, strides, dilations
    ((1, 2, 5, 6, 7), (3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ((2, 1, 6, 7, 5), (2, 3, 4), (1, 2, 3), (1, 1, 1)),
    ((1, 2, 8, 9), (3, 2), (2, 1), (2, 3)),
    ((1, 3, 32, 32), (2, 2), (1, 1), (1, 1)),  # the conformance cases' geometry
    ((1, 1, 7), (4,), (3,), (1,)),
]


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("case", SAME_CASES, ids=str)
def test_same_padding(lib, case, auto_pad, count_include_pad):
    """ss_pool_same_pads gives the pads the spec does; both pools then agree with the reference."""
    xshape, kernel, strides, dilations = case
    geo = Pool(xshape[2:], kernel, strides, None, dilations, auto_pad=auto_pad)
    begins, ends = ARRAY3(), ARRAY3()
    lib.ss_pool_same_pads(arr3(geo.sizes, 1), arr3(geo.outs, 1), arr3(geo.kernel, 1), arr3(geo.strides, 1),
                          arr3(geo.dilations, 1), auto_pad == "SAME_UPPER", begins, ends)
    lead = 3 - len(kernel)
    assert list(begins) == [0] * lead + geo.begins and list(ends) == [0] * lead + geo.ends
    x = random_input(np.random.default_rng(len(xshape) + count_include_pad), xshape, np.float32)
    in_, out, k, s, _, dil = geometry_args(geo)
    y = np.full([*xshape[:2], *geo.outs], np.nan, np.float32)
    lib.ss_avgpool3d_f32(ptr(x), ptr(y), nc_of(x), in_, out, k, s, begins, ends, dil, count_include_pad)
    np.testing.assert_allclose(y, ref_average(x, geo, count_include_pad), rtol=1e-5, atol=1e-6)
    lib.ss_maxpool3d_f32(ptr(x), ptr(y), nc_of(x), in_, out, k, s, begins, dil)
    np.testing.assert_array_equal(y, ref_max(x, geo)[0].astype(np.float32))


def test_wide_kernel_takes_the_heap_path(lib):
    """Kernels wider than the on-stack column table (64) take a malloc'd one."""
    x = np.random.default_rng(3).standard_normal((1, 2, 3, 150)).astype(np.float32)
    geo = Pool(x.shape[2:], (2, 70), (1, 3), (1, 5, 0, 6), (1, 1), True)
    in_, out, k, s, p, dil = geometry_args(geo)
    y = np.zeros([1, 2, *geo.outs], np.float32)
    lib.ss_maxpool3d_f32(ptr(x), ptr(y), 2, in_, out, k, s, p, dil)
    np.testing.assert_array_equal(y, ref_max(x, geo)[0].astype(np.float32))
    lib.ss_avgpool3d_f32(ptr(x), ptr(y), 2, in_, out, k, s, p, arr3(geo.ends, 0), dil, 1)
    np.testing.assert_allclose(y, ref_average(x, geo, 1), rtol=1e-5, atol=1e-6)


def test_max_of_infinities_is_infinite(lib):
    """-inf inputs are a float max's answer, not -FLT_MAX."""
    x = np.full((1, 1, 2, 2, 2), -np.inf, np.float32)
    geo = Pool((2, 2, 2), (2, 2, 2), (1, 1, 1))
    y = np.zeros((1, 1, 1, 1, 1), np.float32)
    lib.ss_maxpool3d_f32(ptr(x), ptr(y), 1, *geometry_args(geo))
    assert y[0, 0, 0, 0, 0] == -np.inf


def test_empty_extents_write_nothing(lib):
    x = np.zeros(1, np.float32)
    y = np.full(8, 7.0, np.float32)
    indices = np.full(8, 7, np.int64)
    geo = Pool((3, 3, 3), (2, 2, 2), (1, 1, 1))
    lib.ss_maxpool3d_f32(ptr(x), ptr(y), 0, *geometry_args(geo))
    lib.ss_maxpool3d_argmax_f32(ptr(x), ptr(y), ptr(indices), 0, *geometry_args(geo), 0)
    in_, _, k, s, p, dil = geometry_args(geo)
    lib.ss_avgpool3d_f32(ptr(x), ptr(y), 2, in_, ARRAY3(2, 0, 2), k, s, p, ARRAY3(), dil, 1)
    assert (y == 7.0).all() and (indices == 7).all()


# -- MaxUnpool -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8, np.int16])
def test_maxunpool_scatters_into_zeros(lib, dtype):
    rng = np.random.default_rng(5)
    total = 60
    x = rng.integers(1, 100, 12).astype(dtype)
    indices = rng.choice(total, 12, replace=False).astype(np.int64)
    y = np.full(total, 9, dtype)
    assert lib.ss_maxunpool(x.itemsize, ptr(x), ptr(indices), x.size, ptr(y), total) == 0
    want = np.zeros(total, dtype)
    want[indices] = x
    np.testing.assert_array_equal(y, want)


def test_maxunpool_repeated_index_keeps_the_last(lib):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    indices = np.array([4, 1, 4], np.int64)
    y = np.empty(6, np.float32)
    assert lib.ss_maxunpool(4, ptr(x), ptr(indices), 3, ptr(y), 6) == 0
    np.testing.assert_array_equal(y, [0, 2, 0, 0, 3, 0])


@pytest.mark.parametrize("bad", [-1, 6])
def test_maxunpool_rejects_an_index_out_of_range(lib, bad):
    x = np.ones(2, np.float32)
    indices = np.array([0, bad], np.int64)
    y = np.empty(6, np.float32)
    assert lib.ss_maxunpool(4, ptr(x), ptr(indices), 2, ptr(y), 6) == 1


def test_reference_output_sizes_match_the_spec():
    """The test's own geometry, against the ONNX formulas for one known case each."""
    assert Pool([5], [2], [2], [0, 0], ceil=True).outs == [3]  # ceil((5 - 2) / 2) + 1
    assert Pool([6], [3], [2], [2, 2], ceil=True).outs == [4]  # a window starting in the end pad is dropped
    assert Pool([7], [3], [2], auto_pad="SAME_LOWER").outs == [math.ceil(7 / 2)]


def test_max_over_an_empty_spatial_axis_is_zero(lib):
    """Padding alone gives outputs: zeros, as the reference evaluator (onnxruntime rejects it)."""
    x = np.zeros(1, np.float32)
    geo = Pool((0, 2, 2), (2, 1, 1), (1, 1, 1), (1, 0, 0, 1, 0, 0))
    assert geo.outs == [1, 2, 2]
    y = np.full(2 * 4, 7.0, np.float32)
    indices = np.full(2 * 4, 7, np.int64)
    lib.ss_maxpool3d_f32(ptr(x), ptr(y), 2, *geometry_args(geo))
    assert (y == 0).all()
    y[:] = 7
    lib.ss_maxpool3d_argmax_f32(ptr(x), ptr(y), ptr(indices), 2, *geometry_args(geo), 1)
    assert (y == 0).all() and (indices == 0).all()
