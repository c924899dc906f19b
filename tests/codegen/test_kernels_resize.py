"""ss_resize2d (shapeshift/codegen/kernels/resize.py) against onnxruntime.

Every mode x coordinate transformation mode (x nearest mode for nearest; x cubic
coefficient and exclude_outside for cubic), upscales and downscales, given by scales or by
sizes, on odd extents; a one-node Resize model (opset 19) on the same random input.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import resize
from shapeshift.codegen.kernels.prelude import PRELUDE

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P, F32, INT = ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.c_float, ctypes.c_int
MODES = {"nearest": 0, "linear": 1, "cubic": 2}
COORDS = {"half_pixel": 0, "asymmetric": 1, "align_corners": 2, "pytorch_half_pixel": 3, "tf_half_pixel_for_nn": 4}
NEAREST = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}

# (x shape, scales for H and W or None, sizes OH, OW or None). Given scales are chosen so
# that no source coordinate is an exact integer or half-integer in real arithmetic, except
# where onnxruntime's float evaluation is reproduced (2.0, 1.5 and the TIES below): see
# the caveat in shapeshift/codegen/kernels/resize.py.
TARGETS = [
    ((2, 3, 5, 7), (2.0, 1.5), None),  # upscale by scales
    ((1, 2, 9, 11), (0.57, 0.43), None),  # downscale by scales
    ((1, 2, 6, 5), (1.93, 0.77), None),  # one axis each way
    ((2, 1, 5, 7), None, (9, 4)),  # sizes
    ((1, 3, 7, 4), None, (3, 11)),
    ((1, 1, 5, 6), None, (1, 1)),  # one output pixel: align_corners / pytorch_half_pixel edge
    ((1, 64, 33, 31), (2.0, 2.0), None),  # large enough for OpenMP
]


@pytest.fixture(scope="module")
def lib(build_cache):
    cdll = compile_library(PRELUDE + resize.source(), name_hint="test_resize",
                           cache_dir=build_cache).cdll
    cdll.ss_resize2d.restype = None
    cdll.ss_resize2d.argtypes = [F32P, F32P] + [I64] * 5 + [F32, F32, INT, INT, INT, F32, INT]
    return cdll


def ptr(a):
    return a.ctypes.data_as(F32P)


def run_ort(x, scales, sizes, **attrs):
    inits = [numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array([1, 1, *scales], np.float32), "scales"))
        inputs = ["x", "roi", "scales"]
    else:
        inits.append(numpy_helper.from_array(np.array([*x.shape[:2], *sizes], np.int64), "sizes"))
        inputs = ["x", "roi", "", "sizes"]
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def check(lib, target, mode, coord, nearest="round_prefer_floor", cubic_a=-0.75, exclude_outside=0):
    xshape, scales, sizes = target
    rng = np.random.default_rng(abs(hash((target, mode, coord, nearest, cubic_a, exclude_outside))) % 2**32)
    x = rng.standard_normal(xshape, dtype=np.float32)
    expected = run_ort(x, scales, sizes, mode=mode, coordinate_transformation_mode=coord, nearest_mode=nearest,
                       cubic_coeff_a=cubic_a, exclude_outside=exclude_outside)
    N, C, H, W = xshape
    OH, OW = expected.shape[2:]
    # What the lowering passes: the given scales, or output / input when sizes were given.
    sh, sw = scales if scales is not None else (np.float32(OH) / np.float32(H), np.float32(OW) / np.float32(W))
    y = np.full(expected.shape, np.nan, np.float32)
    lib.ss_resize2d(ptr(x), ptr(y), N * C, H, W, OH, OW, sh, sw, MODES[mode], COORDS[coord], NEAREST[nearest],
                    cubic_a, exclude_outside)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def tid(t):
    return f"{t[0]}-scales{t[1]}-sizes{t[2]}"


@pytest.mark.parametrize("target", TARGETS, ids=tid)
@pytest.mark.parametrize("coord,nearest", list(itertools.product(COORDS, NEAREST)))
def test_nearest(lib, target, coord, nearest):
    check(lib, target, "nearest", coord, nearest=nearest)


@pytest.mark.parametrize("target", TARGETS, ids=tid)
@pytest.mark.parametrize("coord", COORDS)
def test_linear(lib, target, coord):
    check(lib, target, "linear", coord)


@pytest.mark.parametrize("target", TARGETS, ids=tid)
@pytest.mark.parametrize("coord,cubic_a,exclude_outside",
                         [(c, a, e) for c in COORDS for a, e in [(-0.75, 0), (-0.5, 0), (-0.75, 1)]])
def test_cubic(lib, target, coord, cubic_a, exclude_outside):
    check(lib, target, "cubic", coord, cubic_a=cubic_a, exclude_outside=exclude_outside)


# Output pixels whose source coordinate is exactly half-way in real arithmetic, where
# float rounding decides which way nearest goes (onnxruntime 1.32 breaks them as ties).
TIES = [
    (((1, 1, 1, 7), None, (1, 2)), "asymmetric"),  # 1 * 7 / 2 = 3.5
    (((1, 1, 1, 7), None, (1, 4)), "asymmetric"),  # 2 * 7 / 4 = 3.5
    (((1, 1, 1, 9), None, (1, 15)), "tf_half_pixel_for_nn"),  # 12.5 * 9 / 15 = 7.5
    (((1, 1, 1, 9), (1.0, 0.6), None), "tf_half_pixel_for_nn"),  # 4.5 / 0.6 = 7.5
    (((1, 1, 1, 25), (1.0, 0.36), None), "tf_half_pixel_for_nn"),  # 4.5 / 0.36 = 12.5
    (((1, 1, 1, 12), (1.0, 2.0 / 3.0), None), "asymmetric"),
    (((1, 1, 3, 10), None, (5, 6)), "half_pixel"),
]


@pytest.mark.parametrize("nearest", ["round_prefer_floor", "round_prefer_ceil"])
@pytest.mark.parametrize("target,coord", TIES, ids=lambda v: str(v))
def test_nearest_half_way_ties(lib, target, coord, nearest):
    check(lib, target, "nearest", coord, nearest=nearest)


def test_empty_writes_nothing(lib):
    x = np.zeros(4, np.float32)
    y = np.full(4, 7.0, np.float32)
    lib.ss_resize2d(ptr(x), ptr(y), 0, 2, 2, 2, 2, 1.0, 1.0, 1, 0, 0, -0.75, 0)
    lib.ss_resize2d(ptr(x), ptr(y), 1, 2, 2, 0, 2, 1.0, 1.0, 1, 0, 0, -0.75, 0)
    assert (y == 7.0).all()
