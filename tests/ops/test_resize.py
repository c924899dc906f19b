"""Tests of Resize and Upsample: symbolic type rules, numerics against onnxruntime.

Where onnxruntime departs from the ONNX spec (integer output length in
align_corners/tf_crop_and_resize for fractional scales, roi ignored on axes of
scale 1, negative axes ignored by keep_aspect_ratio_policy, truncation of
integer results) the evaluator follows the spec and the ONNX reference; those
behaviours are tested on their own below, and the onnxruntime table avoids them.
"""

from __future__ import annotations

import numpy as np
import pytest

from shapeshift.errors import ShapeInferenceError
from shapeshift.ir.graph import Graph
from shapeshift.ir.types import FLOAT, INT64, UINT8, TensorType
from shapeshift.ops import lookup
from shapeshift.ops.context import InferContext
from shapeshift.symbolic import Expr, bounds, floordiv, symbol
from shapeshift.testing import apply_op, assert_types_match, infer_op, ort_op

N = symbol("n", 1, 8)
H = symbol("h", 1, 512)
W = symbol("w", 1, 512)


def f32(*shape) -> TensorType:
    return TensorType(FLOAT, shape)


def scales(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def sizes(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


EMPTY = np.array([], dtype=np.float32)
IMAGE = f32(N, 3, H, W)

# -- type rules ----------------------------------------------------------------------

# (op, inputs, attrs, opset, positions given as constants, expected)
TYPE_CASES = [
    ("Resize", [IMAGE, None, scales(1, 1, 2, 2)], {}, 19, [2], [f32(N, 3, 2 * H, 2 * W)]),
    ("Resize", [IMAGE, None, scales(1, 1, 0.5, 1.5)], {"mode": "linear"}, 13, [2],
     [f32(N, 3, floordiv(H, 2), floordiv(3 * W, 2))]),
    ("Resize", [f32(2, 3, 5, 7), None, scales(1, 1, 1.4, 0.6)], {}, 19, [2], [f32(2, 3, 7, 4)]),
    ("Resize", [IMAGE, None, None, sizes(1, 3, 64, 32)], {}, 19, [3], [f32(1, 3, 64, 32)]),
    ("Resize", [IMAGE, None, None, sizes(64, 32)], {"axes": [3, 2]}, 19, [3], [f32(N, 3, 32, 64)]),
    ("Resize", [IMAGE, None, scales(3, 2)], {"axes": [-2, -1]}, 18, [2], [f32(N, 3, 3 * H, 2 * W)]),
    ("Resize", [f32(1, 3, 20, 10), None, None, sizes(10, 10)],
     {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}, 19, [3], [f32(1, 3, 10, 5)]),
    ("Resize", [f32(1, 3, 20, 10), None, None, sizes(10, 10)],
     {"axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"}, 19, [3], [f32(1, 3, 20, 10)]),
    # opset 11/12: roi and scales are required, given as empty placeholders.
    ("Resize", [IMAGE, EMPTY, EMPTY, sizes(1, 3, 8, 8)], {}, 11, [1, 2, 3], [f32(1, 3, 8, 8)]),
    ("Resize", [IMAGE, EMPTY, scales(1, 1, 4, 4)], {}, 11, [1, 2], [f32(N, 3, 4 * H, 4 * W)]),
    ("Resize", [IMAGE, scales(1, 1, 2, 3)], {}, 10, [1], [f32(N, 3, 2 * H, 3 * W)]),
    ("Upsample", [IMAGE, scales(1, 1, 2, 2)], {"mode": "linear"}, 9, [1], [f32(N, 3, 2 * H, 2 * W)]),
    ("Upsample", [IMAGE], {"scales": [1.0, 1.0, 2.0, 3.0]}, 7, [], [f32(N, 3, 2 * H, 3 * W)]),
    ("Resize", [TensorType(FLOAT, None), None, scales(1, 2)], {}, 19, [2], [TensorType(FLOAT, None)]),
    ("Resize", [TensorType(UINT8, (N, 4)), None, scales(1, 2)], {}, 19, [2], [TensorType(UINT8, (N, 8))]),
    ("Resize", [None, None, scales(1, 2)], {}, 19, [2], [None]),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, consts, expected", TYPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TYPE_CASES)])
def test_type_rule(op, inputs, attrs, opset, consts, expected):
    assert infer_op(op, inputs, attrs, opset, const_inputs=consts) == expected


def test_non_dyadic_scale_gives_a_bounded_fresh_dim():
    (t,) = infer_op("Resize", [IMAGE, None, scales(1, 1, 0.6, 1)], {}, 19, const_inputs=[2])
    assert t.shape[:2] == (N, 3) and t.shape[3] is W
    assert isinstance(t.shape[2], Expr) and t.shape[2] is not H
    assert bounds(t.shape[2]) == (0, 308)


@pytest.mark.parametrize("inputs", [
    [IMAGE, None, None, TensorType(INT64, (4,))],  # sizes unknown
    [IMAGE, None, f32(4)],  # scales unknown
])
def test_unknown_parameters_give_fresh_dims(inputs):
    (t,) = infer_op("Resize", inputs, {}, 19)
    assert t.dtype == FLOAT and len(t.shape) == 4
    assert all(isinstance(d, Expr) for d in t.shape) and len({id(d) for d in t.shape}) == 4


def test_unknown_sizes_only_touch_the_given_axes():
    (t,) = infer_op("Resize", [IMAGE, None, None, TensorType(INT64, (2,))], {"axes": [2, 3]}, 19)
    assert t.shape[:2] == (N, 3) and all(isinstance(d, Expr) and d is not H and d is not W for d in t.shape[2:])


def test_symbolic_sizes_contents_are_used():
    graph = Graph("g", opset={"": 19})
    x = graph.add_input("x", IMAGE)
    size = graph.add_input("size", TensorType(INT64, (4,)))
    size.shape_contents = (N, 3, 2 * H, W + 1)
    node = graph.add_node("Resize", [x, None, None, size], 1, {"mode": "linear"}, name="resize")
    (t,) = lookup("", "Resize", 19).infer(InferContext(node, 19, graph.symbols))
    assert t == f32(N, 3, 2 * H, W + 1)


@pytest.mark.parametrize("inputs, consts", [
    ([IMAGE, None, scales(1, 2, 2)], [2]),  # scales of the wrong length
    ([IMAGE, None, None, sizes(4, 4)], [3]),  # sizes of the wrong length
    ([IMAGE], []),  # neither scales nor sizes
])
def test_invalid_parameters_fail(inputs, consts):
    with pytest.raises(ShapeInferenceError):
        infer_op("Resize", inputs, {}, 19, const_inputs=consts)


# -- numerics against onnxruntime ----------------------------------------------------

COORDS = ["half_pixel", "asymmetric", "pytorch_half_pixel", "half_pixel_symmetric", "align_corners"]


def _cases():
    cases = []
    for coord in COORDS:
        for mode in ["linear", "cubic"]:
            cases.append((19, (2, 3, 5, 7), {"mode": mode, "coordinate_transformation_mode": coord},
                          None, sizes(2, 3, 9, 12)))
            cases.append((13, (1, 2, 6, 4), {"mode": mode, "coordinate_transformation_mode": coord},
                          scales(1, 1, 0.5, 2.0), None))
        for nearest in ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]:
            cases.append((19, (2, 3, 5, 7), {"mode": "nearest", "coordinate_transformation_mode": coord,
                                             "nearest_mode": nearest}, None, sizes(2, 3, 10, 3)))
    cases += [
        (19, (2, 3, 5, 7), {"mode": "nearest"}, scales(1, 1, 0.6, 1.75), None),
        (11, (1, 3, 4, 4), {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"},
         scales(1, 1, 2.5, 1.5), None),
        (19, (2, 3, 5, 7), {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, None, sizes(2, 3, 3, 11)),
        (19, (1, 1, 6, 6), {"mode": "cubic", "cubic_coeff_a": -0.6}, scales(1, 1, 1.5, 2.5), None),
        (19, (2, 3, 9, 12), {"mode": "linear", "antialias": 1}, None, sizes(2, 3, 4, 5)),
        (19, (2, 3, 9, 12), {"mode": "linear", "antialias": 1, "exclude_outside": 1}, None, sizes(2, 3, 2, 7)),
        (19, (2, 3, 9, 12), {"mode": "cubic", "antialias": 1}, scales(1, 1, 0.5, 0.3), None),
        (19, (2, 3, 9, 12), {"mode": "cubic", "antialias": 1}, None, sizes(2, 3, 1, 14)),
        (19, (2, 3, 5, 7), {"mode": "linear", "axes": [3, 2]}, None, sizes(9, 8)),
        (19, (2, 3, 5, 7), {"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
         None, sizes(8, 9)),
        (19, (2, 3, 5, 7), {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"},
         None, sizes(8, 9)),
        (19, (2, 3, 5, 7), {"mode": "linear", "axes": [2, 3]}, scales(2.0, 3.0), None),
        (19, (6, 4), {"mode": "linear"}, None, sizes(13, 2)),
        (19, (6,), {"mode": "nearest"}, None, sizes(4)),
        (19, (4, 5), {"mode": "cubic"}, None, sizes(7, 3)),
        (19, (2, 4, 5), {"mode": "linear"}, None, sizes(2, 7, 3)),
        (19, (1, 2, 3, 4, 5), {"mode": "linear"}, None, sizes(1, 2, 5, 7, 9)),
        (19, (1, 2, 3, 4, 5), {"mode": "nearest"}, None, sizes(2, 3, 5, 7, 2)),
        (11, (1, 2, 5, 7), {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
         scales(1, 1, 0.6, 1 / 7 * 3), None),
    ]
    roi = np.array([0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2], dtype=np.float32)
    for mode in ["nearest", "linear", "cubic"]:
        cases.append((19, (2, 3, 5, 7), {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
                                         "extrapolation_value": 2.5}, None, sizes(2, 3, 9, 12), roi))
    return cases


RESIZE_CASES = _cases()


@pytest.mark.parametrize("case", RESIZE_CASES, ids=[f"{c[0]}-{c[2]['mode']}-{i}" for i, c in enumerate(RESIZE_CASES)])
def test_resize_matches_onnxruntime(case):
    opset, shape, attrs, scale_values, size_values, *roi = case
    rng = np.random.default_rng(len(shape) * 10 + opset)
    x = rng.standard_normal(shape).astype(np.float32)
    roi = roi[0] if roi else (EMPTY if opset < 13 else None)
    if size_values is not None:
        inputs = [x, roi, EMPTY if opset < 13 else None, size_values]
    else:
        inputs = [x, roi, scale_values]
    want = ort_op("Resize", inputs, attrs, opset=opset)
    got = apply_op("Resize", inputs, attrs, opset=opset)
    consts = [i for i in (1, 2, 3) if i < len(inputs) and inputs[i] is not None]
    assert_types_match(infer_op("Resize", inputs, attrs, opset, const_inputs=consts), want)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32])
def test_integer_nearest_matches_onnxruntime(dtype):
    x = (np.random.default_rng(1).standard_normal((1, 2, 4, 5)) * 50).astype(dtype)
    inputs = [x, None, None, sizes(1, 2, 7, 9)]
    (want,) = ort_op("Resize", inputs, {"mode": "nearest"}, opset=19)
    (got,) = apply_op("Resize", inputs, {"mode": "nearest"}, opset=19)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("opset, op, mode, scale_values", [
    (10, "Resize", "nearest", [1, 1, 0.5, 0.6]),
    (10, "Resize", "nearest", [1, 1, 2, 3]),
    (10, "Resize", "linear", [1, 1, 1.5, 2.5]),
    (10, "Resize", "linear", [1, 1, 0.5, 0.6]),
    (9, "Upsample", "nearest", [1, 1, 2, 3]),
    (9, "Upsample", "linear", [1, 1, 1.5, 2.5]),
    (7, "Upsample", "nearest", [1, 1, 1.5, 2.5]),
    (7, "Upsample", "linear", [1, 1, 2, 3]),
])
def test_legacy_versions_match_onnxruntime(opset, op, mode, scale_values):
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 7)).astype(np.float32)
    if opset < 9:
        inputs, attrs = [x], {"mode": mode, "scales": [float(s) for s in scale_values]}
    else:
        inputs, attrs = [x, scales(*scale_values)], {"mode": mode}
    want = ort_op(op, inputs, attrs, opset=opset)
    got = apply_op(op, inputs, attrs, opset=opset)
    assert_types_match(infer_op(op, inputs, attrs, opset, const_inputs=[1] if opset >= 9 else []), want)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


# -- where the spec, not onnxruntime, is the reference -------------------------------


def test_align_corners_uses_the_fractional_resized_length():
    # test_resize_downsample_scales_linear_align_corners: 4 * 0.6 = 2.4 is the length.
    x = np.arange(1, 9, dtype=np.float32).reshape(1, 1, 2, 4)
    attrs = {"mode": "linear", "coordinate_transformation_mode": "align_corners"}
    (y,) = apply_op("Resize", [x, None, scales(1, 1, 0.6, 0.6)], attrs, opset=19)
    np.testing.assert_allclose(y, [[[[1.0, 3.142857]]]], rtol=1e-6)


def test_tf_crop_and_resize_crops_an_axis_of_unchanged_size():
    x = np.arange(5, dtype=np.float32)
    attrs = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}
    (y,) = apply_op("Resize", [x, np.array([0.25, 0.75], np.float32), None, sizes(5)], attrs, opset=19)
    np.testing.assert_allclose(y, [1.0, 1.5, 2.0, 2.5, 3.0])


def test_negative_axes_with_aspect_policy():
    x = np.zeros((1, 1, 4, 6), dtype=np.float32)
    attrs = {"axes": [-2, -1], "keep_aspect_ratio_policy": "not_larger"}
    (y,) = apply_op("Resize", [x, None, None, sizes(2, 6)], attrs, opset=19)
    assert y.shape == (1, 1, 2, 3)
    assert infer_op("Resize", [x, None, None, sizes(2, 6)], attrs, 19, const_inputs=[3]) == [f32(1, 1, 2, 3)]


def test_integer_linear_rounds_like_the_reference():
    # Samples at -0.25, 0.25, 0.75, 1.25 give 0, 0.75, 2.25, 3; round half to even.
    (y,) = apply_op("Resize", [np.array([0, 3], np.uint8), None, None, sizes(4)], {"mode": "linear"}, opset=19)
    assert y.dtype == np.uint8
    np.testing.assert_array_equal(y, [0, 1, 2, 3])


@pytest.mark.parametrize("attrs", [{"mode": "area"}, {"coordinate_transformation_mode": "center"},
                                   {"nearest_mode": "round"}, {"keep_aspect_ratio_policy": "fit"}])
def test_unknown_attribute_values_fail(attrs):
    with pytest.raises(ShapeInferenceError):
        infer_op("Resize", [IMAGE, None, scales(1, 1, 2, 2)], attrs, 19, const_inputs=[2])


def test_an_output_larger_than_memory_is_refused_before_any_is_made():
    """A scale of 1e9 built index arrays of 15 GiB per axis before the output, and a
    process without a memory limit was killed for memory instead of told."""
    x = np.ones((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match=r"the output \[1, 1, 4000000000, 4000000000\] would take .* more than "
                                         r"this machine's memory"):
        apply_op("Resize", [x, EMPTY, scales(1, 1, 1e9, 1e9)], {"mode": "nearest"}, opset=19)
