"""ss_grid_sample (shapeshift/codegen/kernels/sample.py) against onnx's reference GridSample.

Every mode x padding x align_corners combination on random grids that reach past the image
(so each padding rule matters), at 1, 2 and 3 spatial axes; grids on the half-pixel points
where nearest rounds half to even; one-pixel axes; empty inputs and outputs; inf next to the
image with zeros padding. The 4-D cases are also checked against onnxruntime.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import sample
from shapeshift.codegen.kernels.prelude import PRELUDE

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P, I64P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int64)
MODES = ("nearest", "linear", "cubic")
PADDINGS = ("zeros", "border", "reflection")


@pytest.fixture(scope="module")
def lib(build_cache):
    # A small par_min so that the test sizes run the OpenMP loop too.
    source = PRELUDE + sample.source(block=8, par_min=256)
    cdll = compile_library(source, name_hint="test_sample", cache_dir=build_cache).cdll
    cdll.ss_grid_sample.restype = None
    cdll.ss_grid_sample.argtypes = [F32P] * 3 + [I64] * 3 + [I64P] * 2 + [ctypes.c_int] * 3
    return cdll


def grid_sample(lib, x, grid, mode, padding, align):
    rank = x.ndim - 2
    x, grid = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(grid, np.float32)
    y = np.full((x.shape[0], x.shape[1], *grid.shape[1:-1]), np.nan, np.float32)
    in_dims = np.array(x.shape[2:] or (0,), np.int64)
    out_dims = np.array(grid.shape[1:-1] or (0,), np.int64)
    lib.ss_grid_sample(x.ctypes.data_as(F32P), grid.ctypes.data_as(F32P), y.ctypes.data_as(F32P),
                       x.shape[0], x.shape[1], rank, in_dims.ctypes.data_as(I64P), out_dims.ctypes.data_as(I64P),
                       sample.MODES[mode], sample.PADDINGS[padding], align)
    return y


def _model(x, grid, mode, padding, align, opset=22):
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                                            helper.make_tensor_value_info("g", TensorProto.FLOAT, grid.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def reference(x, grid, mode, padding, align):
    from onnx.reference import ReferenceEvaluator

    with np.errstate(all="ignore"):
        return ReferenceEvaluator(_model(x, grid, mode, padding, align)).run(None, {"x": x, "g": grid})[0]


def onnxruntime(x, grid, mode, padding, align):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(_model(x, grid, mode, padding, align).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "g": grid})[0]


def _inputs(rng, n, c, in_dims, out_dims, reach=1.4):
    x = rng.standard_normal((n, c, *in_dims)).astype(np.float32)
    grid = rng.uniform(-reach, reach, (n, *out_dims, len(in_dims))).astype(np.float32)
    return x, grid


SHAPES = [  # (N, C, input spatial dims, output spatial dims)
    (2, 3, (5, 7), (4, 6)),
    (1, 2, (1, 4), (3, 3)),  # a one-pixel axis
    (1, 1, (6,), (9,)),  # 1-D
    (1, 2, (3, 4, 5), (2, 3, 2)),  # volumetric
]
COMBOS = list(itertools.product(MODES, PADDINGS, (0, 1)))


@pytest.mark.parametrize("n,c,in_dims,out_dims", SHAPES, ids=["2d", "2d-one-pixel", "1d", "3d"])
@pytest.mark.parametrize("mode,padding,align", COMBOS, ids=[f"{m}-{p}-{a}" for m, p, a in COMBOS])
def test_against_reference(lib, n, c, in_dims, out_dims, mode, padding, align):
    rng = np.random.default_rng(hash((mode, padding, align, in_dims)) % 2**32)
    x, grid = _inputs(rng, n, c, in_dims, out_dims)
    got = grid_sample(lib, x, grid, mode, padding, align)
    if padding == "reflection" and align and mode != "nearest" and 1 in in_dims:
        want = _one_pixel_reference(x, grid, mode, padding, align)
    else:
        want = reference(x, grid, mode, padding, align)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


def _one_pixel_reference(x, grid, mode, padding, align):
    """The reference's result for a one-pixel first spatial axis and align_corners, where the
    reference itself fails (its reflection divides by the axis's zero-width range). Every
    coordinate on that axis is then the pixel itself, with weight exactly 1 (linear 1, 0;
    cubic 0, 1, 0, 0): the result is the sampling of the other axes alone."""
    assert x.shape[2] == 1 and align
    rest = reference(x[:, :, 0], grid[..., :-1].reshape(grid.shape[0], -1, grid.shape[-1] - 1), mode, padding, align)
    return rest.reshape(x.shape[0], x.shape[1], *grid.shape[1:-1])


@pytest.mark.parametrize("mode,padding,align", COMBOS, ids=[f"{m}-{p}-{a}" for m, p, a in COMBOS])
def test_against_onnxruntime(lib, mode, padding, align):
    rng = np.random.default_rng(7)
    # onnxruntime (like PyTorch) does not clamp a cubic coordinate outside the image with
    # border padding, only its taps; the ONNX reference, which the kernel follows, clamps
    # both. They agree on points inside the image only.
    reach = 1.0 if (mode, padding) == ("cubic", "border") else 1.6
    x, grid = _inputs(rng, 2, 3, (6, 5), (7, 4), reach=reach)
    got = grid_sample(lib, x, grid, mode, padding, align)
    np.testing.assert_allclose(got, onnxruntime(x, grid, mode, padding, align), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [0, 1])
def test_nearest_rounds_half_to_even(lib, padding, align):
    # Grid points whose pixel coordinate is exactly k + 0.5 (and the integers between).
    h, w = 4, 6
    coords = []
    for size in (w, h):
        k = np.arange(-3, 2 * size + 3) / 2.0  # pixel coordinates, half-integers included
        coords.append((2 * k + 1) / size - 1 if not align else 2 * k / (size - 1) - 1)
    gx, gy = np.meshgrid(*coords)
    grid = np.stack([gx, gy], axis=-1)[None].astype(np.float32)
    x = np.arange(h * w, dtype=np.float32).reshape(1, 1, h, w)
    got = grid_sample(lib, x, grid, "nearest", padding, align)
    np.testing.assert_array_equal(got, reference(x, grid, "nearest", padding, align))


def test_volumetric_against_onnxruntime(lib):
    rng = np.random.default_rng(3)
    x, grid = _inputs(rng, 2, 2, (3, 4, 5), (2, 3, 4))
    for mode, padding, align in itertools.product(("nearest", "linear"), PADDINGS, (0, 1)):
        got = grid_sample(lib, x, grid, mode, padding, align)
        np.testing.assert_allclose(got, onnxruntime(x, grid, mode, padding, align), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("mode", MODES)
def test_large_enough_for_threads(lib, mode):
    rng = np.random.default_rng(5)
    x, grid = _inputs(rng, 2, 8, (16, 20), (17, 13))
    got = grid_sample(lib, x, grid, mode, "zeros", 0)
    np.testing.assert_allclose(got, onnxruntime(x, grid, mode, "zeros", 0), rtol=1e-5, atol=2e-5)


def test_empty_extents(lib):
    rng = np.random.default_rng(2)
    for n, c, out_dims in [(0, 2, (3, 3)), (1, 0, (3, 3)), (1, 2, (0, 3))]:
        x, grid = _inputs(rng, n, c, (4, 4), out_dims)
        assert grid_sample(lib, x, grid, "linear", "zeros", 0).size == 0
    # Nothing to sample from: the output is zeros (never read out of bounds).
    x = np.zeros((1, 2, 0, 4), np.float32)
    grid = rng.uniform(-1, 1, (1, 3, 2, 2)).astype(np.float32)
    np.testing.assert_array_equal(grid_sample(lib, x, grid, "cubic", "border", 1), np.zeros((1, 2, 3, 2)))


@pytest.mark.parametrize("mode", MODES)
def test_zero_padding_is_not_a_weighted_read(lib, mode):
    # inf just outside the sampled taps would turn 0 * inf into NaN if padding were a
    # weighted read of some pixel; far-away and NaN coordinates read zeros.
    x = np.ones((1, 1, 4, 4), np.float32)
    x[0, 0, 0, 0] = np.inf
    grid = np.array([[[[50.0, 50.0], [-1e30, 0.0], [np.nan, 0.5], [1e30, -1e30]]]], np.float32)
    got = grid_sample(lib, x, grid, mode, "zeros", 0)
    np.testing.assert_array_equal(got, np.zeros((1, 1, 1, 4)))


def test_huge_coordinates_with_reflection_stay_in_the_image(lib):
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    grid = np.array([[[[3e9, -7e8], [1e30, 2.5], [-np.inf, 0.0]]]], np.float32)
    got = grid_sample(lib, x, grid, "linear", "reflection", 0)
    assert np.all(np.isfinite(got)) and got.min() >= 0 and got.max() <= 11
