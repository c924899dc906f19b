"""ss_maxpool2d and ss_avgpool2d (shapeshift/codegen/kernels/pool.py) against onnxruntime.

One-node MaxPool / AveragePool models at the same attributes on random inputs: pads,
strides, dilations (max), ceil_mode windows that run past the end padding, count_include_pad
both ways, 1-D and 2-D; the output extents come from onnxruntime's result.
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import pool
from shapeshift.codegen.kernels.prelude import PRELUDE

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)


@pytest.fixture(scope="module")
def lib(build_cache):
    cdll = compile_library(PRELUDE + pool.source(), name_hint="test_pool", cache_dir=build_cache).cdll
    cdll.ss_maxpool2d.restype = None
    cdll.ss_maxpool2d.argtypes = [F32P] * 2 + [I64] * 13
    cdll.ss_avgpool2d.restype = None
    cdll.ss_avgpool2d.argtypes = [F32P] * 2 + [I64] * 13 + [ctypes.c_int]
    return cdll


def ptr(a):
    return a.ctypes.data_as(F32P)


def run_ort(op, x, **attrs):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def as_2d(values, fill):
    """1-D attributes become (fill, value): a 1-D pool is a 2-D pool with H = 1."""
    return tuple(values) if len(values) == 2 else (fill, *values)


def extents(x, y):
    NC = x.shape[0] * x.shape[1]
    return (NC, *as_2d(x.shape[2:], 1), *as_2d(y.shape[2:], 1))


CASES = [
    # x shape, kernel, strides, pads (begin..., end...), ceil_mode
    ((2, 3, 9, 11), (3, 3), (2, 2), (1, 1, 1, 1), 0),
    ((2, 3, 9, 11), (3, 3), (2, 2), (1, 1, 1, 1), 1),
    ((1, 5, 10, 7), (2, 2), (2, 2), (0, 0, 0, 0), 1),  # ceil: last windows past the input
    ((1, 4, 13, 12), (3, 2), (3, 2), (0, 1, 2, 0), 1),  # asymmetric pads with ceil
    ((1, 2, 8, 9), (4, 3), (1, 2), (2, 1, 1, 2), 0),
    ((3, 2, 7, 7), (7, 7), (1, 1), (0, 0, 0, 0), 0),  # global
    ((1, 3, 5, 6), (2, 3), (3, 3), (1, 1, 1, 2), 1),
    ((1, 1, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 0),
    ((1, 64, 31, 33), (3, 3), (2, 2), (1, 1, 1, 1), 1),  # large enough for OpenMP
    ((2, 3, 17), (3,), (2,), (1, 1), 1),  # 1-D
    ((2, 3, 6), (3,), (2,), (2, 2), 1),  # 1-D, a window starting in the end padding is dropped
    ((1, 4, 10), (4,), (3,), (0, 2), 0),
    # Strided 2-D max pools run by rows, up to padded rows of SS_POOL_ROW_CAP:
    ((1, 16, 56, 56), (3, 3), (2, 2), (1, 1, 1, 1), 0),  # ResNet's stem pool, halved
    ((1, 2, 5, 4500), (3, 3), (2, 2), (1, 1, 1, 1), 0),  # a row past the cap: tap by tap
    ((1, 2, 7, 9), (2, 3), (2, 1), (0, 1, 0, 1), 1),  # strided rows only
    # Stride-2 windows of 2 or 3 taps straight from the row, read in place where no tap pads:
    ((1, 128, 64), (2,), (2,), (0, 0), 0),  # 1-D, as after a text classifier's Conv1d
    ((2, 5, 33), (2,), (2,), (0, 0), 0),  # odd length: the last column is no window's
    ((2, 5, 33), (2,), (2,), (0, 0), 1),  # ceil: the last window runs past x (padded copy)
    ((1, 7, 41), (3,), (2,), (0, 0), 0),
    ((1, 7, 40), (3,), (2,), (1, 0), 0),  # a begin pad: the padded copy
    ((2, 3, 7, 12), (1, 2), (2, 2), (0, 0, 0, 0), 0),  # one window row, every other input row
    ((1, 3, 8, 13), (1, 3), (3, 2), (0, 0, 0, 0), 1),  # ceil on the rows only
    ((1, 4, 10, 14), (2, 2), (2, 2), (0, 0, 0, 0), 0),  # two window rows: the padded copy
    # Stride 1 (max pools run separably over padded planes):
    ((2, 40, 20, 20), (5, 5), (1, 1), (2, 2, 2, 2), 0),  # YOLO's SPPF: many chunks, OpenMP
    ((1, 3, 4, 4), (5, 5), (1, 1), (2, 2, 2, 2), 0),  # windows wider than the plane
    ((1, 2, 9, 7), (3, 2), (1, 1), (0, 1, 2, 0), 1),  # asymmetric pads
    ((1, 2, 50, 49), (3, 3), (1, 1), (1, 1, 1, 1), 0),  # a plane larger than the stack scratch
    ((2, 3, 17), (4,), (1,), (1, 2), 0),  # 1-D
]


def case_id(c):
    return f"{c[0]}-k{c[1]}-s{c[2]}-p{c[3]}-ceil{c[4]}"


@pytest.mark.parametrize("dilated", [False, True])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_maxpool(lib, case, dilated):
    xshape, kernel, strides, pads, ceil = case
    dilations = tuple(2 if k > 1 and dilated else 1 for k in kernel)
    if dilated and any((k - 1) * d + 1 > s + sum(pads[i::len(kernel)])
                       for i, (k, d, s) in enumerate(zip(kernel, dilations, xshape[2:]))):
        pytest.skip("dilated window larger than the padded input")
    rng = np.random.default_rng(hash((case, dilated)) % 2**32)
    x = rng.standard_normal(xshape, dtype=np.float32)
    expected = run_ort("MaxPool", x, kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                       ceil_mode=ceil, dilations=list(dilations))
    y = np.full(expected.shape, np.nan, np.float32)
    NC, H, W, OH, OW = extents(x, y)
    KH, KW = as_2d(kernel, 1)
    sh, sw = as_2d(strides, 1)
    ph, pw = as_2d(pads[:len(kernel)], 0)
    dh, dw = as_2d(dilations, 1)
    lib.ss_maxpool2d(ptr(x), ptr(y), NC, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw)
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_avgpool(lib, case, count_include_pad):
    xshape, kernel, strides, pads, ceil = case
    rng = np.random.default_rng(hash((case, count_include_pad)) % 2**32)
    x = rng.standard_normal(xshape, dtype=np.float32)
    expected = run_ort("AveragePool", x, kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                       ceil_mode=ceil, count_include_pad=count_include_pad)
    y = np.full(expected.shape, np.nan, np.float32)
    NC, H, W, OH, OW = extents(x, y)
    KH, KW = as_2d(kernel, 1)
    sh, sw = as_2d(strides, 1)
    n = len(kernel)
    ph, pw = as_2d(pads[:n], 0)
    ph_end, pw_end = as_2d(pads[n:], 0)
    lib.ss_avgpool2d(ptr(x), ptr(y), NC, H, W, OH, OW, KH, KW, sh, sw, ph, pw, ph_end, pw_end, count_include_pad)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_empty_input_writes_nothing(lib):
    x = np.zeros(1, np.float32)
    y = np.full(4, 7.0, np.float32)
    lib.ss_maxpool2d(ptr(x), ptr(y), 0, 3, 3, 2, 2, 2, 2, 1, 1, 0, 0, 1, 1)
    lib.ss_avgpool2d(ptr(x), ptr(y), 2, 3, 3, 0, 2, 2, 2, 1, 1, 0, 0, 0, 0, 1)
    assert (y == 7.0).all()
