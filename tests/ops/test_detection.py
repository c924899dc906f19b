"""Tests of NonMaxSuppression and RoiAlign: type rules, numerics against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from shapeshift.errors import ShapeInferenceError
from shapeshift.ir.types import DOUBLE, FLOAT, INT64, TensorType
from shapeshift.symbolic import Expr, bounds, symbol
from shapeshift.testing import apply_op, assert_types_match, infer_op, ort_op

B = symbol("batch", 1, 4)
K = symbol("boxes", 1, 1000)
R = symbol("rois", 1, 300)


def f32(*shape) -> TensorType:
    return TensorType(FLOAT, shape)


def i64(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# -- NonMaxSuppression type rule -----------------------------------------------------


@pytest.mark.parametrize("boxes, scores, max_out, expected_hi", [
    (f32(2, 10, 4), f32(2, 3, 10), i64(5), 2 * 3 * 5),
    (f32(2, 10, 4), f32(2, 3, 10), i64(50), 2 * 3 * 10),  # at most every box
    (f32(B, K, 4), f32(B, 80, K), i64(100), 4 * 80 * 100),
    (f32(B, K, 4), f32(B, 80, K), TensorType(INT64, (1,)), 4 * 80 * 1000),  # unknown max: all boxes
])
def test_nms_type_is_a_bounded_fresh_dim(boxes, scores, max_out, expected_hi):
    consts = [2] if isinstance(max_out, np.ndarray) else []
    (t,) = infer_op("NonMaxSuppression", [boxes, scores, max_out], {}, 11, const_inputs=consts)
    assert t.dtype == INT64 and t.shape[1] == 3
    assert isinstance(t.shape[0], Expr) and bounds(t.shape[0]) == (0, expected_hi)


@pytest.mark.parametrize("inputs, consts", [
    ([f32(B, K, 4), f32(B, 80, K)], []),  # max_output_boxes_per_class absent: 0
    ([f32(B, K, 4), f32(B, 80, K), i64(0)], [2]),
    ([f32(B, K, 4), f32(B, 80, K), i64(-3)], [2]),
])
def test_nms_without_output_boxes_is_statically_empty(inputs, consts):
    assert infer_op("NonMaxSuppression", inputs, {}, 11, const_inputs=consts) == [TensorType(INT64, (0, 3))]


def test_nms_unknown_ranks_give_a_fresh_dim():
    (t,) = infer_op("NonMaxSuppression", [TensorType(FLOAT, None), f32(B, 3, K), i64(4)], {}, 10,
                    const_inputs=[2])
    assert isinstance(t.shape[0], Expr) and t.shape[1] == 3


def test_nms_wrong_rank_fails():
    with pytest.raises(ShapeInferenceError):
        infer_op("NonMaxSuppression", [f32(10, 4), f32(1, 1, 10), i64(4)], {}, 11, const_inputs=[2])


# -- NonMaxSuppression numerics ------------------------------------------------------


def random_boxes(rng, batches: int, count: int, center_point_box: int) -> np.ndarray:
    centers = rng.uniform(0, 10, (batches, count, 2))
    extents = rng.uniform(0.5, 4, (batches, count, 2))
    if center_point_box:
        return np.concatenate([centers, extents], -1).astype(np.float32)
    boxes = np.concatenate([centers - extents / 2, centers + extents / 2], -1)
    flipped = rng.random((batches, count)) < 0.3  # corners given in either order
    boxes[flipped] = boxes[flipped][:, [2, 3, 0, 1]]
    return boxes.astype(np.float32)


def distinct_scores(rng, batches: int, classes: int, count: int) -> np.ndarray:
    # A permutation per (batch, class): no ties, so the selection order is unambiguous.
    ranks = [[rng.permutation(count) for _ in range(classes)] for _ in range(batches)]
    return (np.array(ranks, dtype=np.float32) + 1) / count


@pytest.mark.parametrize("batches, classes, count", [(1, 1, 6), (2, 3, 20), (3, 2, 60)])
@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize("max_out, iou, score", [(3, 0.5, None), (100, 0.3, 0.4), (1000, 0.0, None), (2, 0.7, 0.5)])
def test_nms_matches_onnxruntime(batches, classes, count, center_point_box, max_out, iou, score):
    rng = np.random.default_rng(batches * 100 + count)
    inputs = [random_boxes(rng, batches, count, center_point_box), distinct_scores(rng, batches, classes, count),
              i64(max_out), np.array([iou], np.float32)]
    if score is not None:
        inputs.append(np.array([score], np.float32))
    attrs = {"center_point_box": center_point_box}
    (want,) = ort_op("NonMaxSuppression", inputs, attrs, opset=11)
    (got,) = apply_op("NonMaxSuppression", inputs, attrs, opset=11)
    assert got.dtype == np.int64 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    (t,) = infer_op("NonMaxSuppression", inputs, attrs, 11, const_inputs=[2, 3, 4][: len(inputs) - 2])
    assert bounds(t.shape[0])[1] >= got.shape[0]


def test_nms_iou_equal_to_threshold_is_kept():
    # Two unit boxes overlapping by half: IoU = 1/3, exactly at the threshold.
    boxes = np.array([[[0, 0, 1, 1], [0, 0.5, 1, 1.5]]], dtype=np.float32)
    scores = np.array([[[0.9, 0.8]]], dtype=np.float32)
    iou = np.array([1 / 3], dtype=np.float32)
    (kept,) = apply_op("NonMaxSuppression", [boxes, scores, i64(10), iou], {}, opset=11)
    (want,) = ort_op("NonMaxSuppression", [boxes, scores, i64(10), iou], {}, opset=11)
    np.testing.assert_array_equal(kept, [[0, 0, 0], [0, 0, 1]])
    np.testing.assert_array_equal(kept, want)


def test_nms_absent_max_output_selects_nothing():
    rng = np.random.default_rng(0)
    (got,) = apply_op("NonMaxSuppression", [random_boxes(rng, 1, 5, 0), distinct_scores(rng, 1, 2, 5)], {}, opset=11)
    assert got.shape == (0, 3) and got.dtype == np.int64


# -- RoiAlign ------------------------------------------------------------------------


@pytest.mark.parametrize("inputs, attrs, expected", [
    ([f32(B, 256, 64, 64), f32(R, 4), TensorType(INT64, (R,))], {"output_height": 7, "output_width": 7},
     [f32(R, 256, 7, 7)]),
    ([f32(1, 8, 32, 32), f32(R, 4), TensorType(INT64, (R,))], {}, [f32(R, 8, 1, 1)]),
    ([TensorType(DOUBLE, (B, 3, 5, 5)), TensorType(DOUBLE, None), TensorType(INT64, (R,))],
     {"output_height": 2}, [TensorType(DOUBLE, (R, 3, 2, 1))]),
])
def test_roi_align_type_rule(inputs, attrs, expected):
    assert infer_op("RoiAlign", inputs, attrs, 16) == expected


def test_roi_align_wrong_rank_fails():
    with pytest.raises(ShapeInferenceError):
        infer_op("RoiAlign", [f32(8, 32, 32), f32(R, 4), TensorType(INT64, (R,))], {}, 16)


def random_rois(rng, count: int, height: int, width: int) -> np.ndarray:
    x0, y0 = rng.uniform(-2, width, count), rng.uniform(-2, height, count)
    x1 = x0 + rng.uniform(0.2, width / 1.5, count)
    y1 = y0 + rng.uniform(0.2, height / 1.5, count)
    return np.stack([x0, y0, x1, y1], 1).astype(np.float32)


@pytest.mark.parametrize("opset", [10, 16])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("shape, attrs", [
    ((1, 2, 8, 9), {}),
    ((2, 3, 16, 12), {"output_height": 3, "output_width": 4, "sampling_ratio": 2}),
    ((2, 3, 16, 12), {"output_height": 5, "output_width": 2, "spatial_scale": 0.5}),
])
def test_roi_align_matches_onnxruntime(opset, mode, shape, attrs):
    rng = np.random.default_rng(sum(shape) + opset)
    x = rng.standard_normal(shape).astype(np.float32)
    rois = random_rois(rng, 5, shape[2], shape[3])
    indices = rng.integers(0, shape[0], 5).astype(np.int64)
    attrs = {"mode": mode, **attrs}
    if opset >= 16 and "spatial_scale" in attrs:
        attrs["coordinate_transformation_mode"] = "output_half_pixel"
    want = ort_op("RoiAlign", [x, rois, indices], attrs, opset=opset)
    got = apply_op("RoiAlign", [x, rois, indices], attrs, opset=opset)
    assert_types_match(infer_op("RoiAlign", [x, rois, indices], attrs, opset), want)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
