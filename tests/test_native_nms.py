"""NonMaxSuppression and TopK on the native backend (kernels/nms.py, ss_topk), compared
with onnxruntime: random boxes with many overlaps and tied scores, both box formats,
constant and run-time thresholds; TopK with a constant k and with k given at run time. Each
session runs several sizes (the output length is a late symbol computed by a size step)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import shapeshift

from . import test_native_ops_extra
from .test_native_ops_extra import _const, _input, _model

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _boxes(rng, batch, n, center):
    xy = rng.uniform(0, 10, (batch, n, 2)).astype(np.float32)
    wh = rng.uniform(0.5, 4, (batch, n, 2)).astype(np.float32)
    if center:
        return np.concatenate([xy, wh], axis=2)
    corners = np.concatenate([xy, xy + wh], axis=2)
    corners[:, ::3] = corners[:, ::3][..., [2, 3, 0, 1]]  # some boxes with swapped corners
    return corners


def _session_pair(model):
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops(), [(s.node.op_type, s.reason)
                                                        for s in session._executor.program.steps if s.reason]
    return session, ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("max_out,iou,score", [(3, 0.5, None), (100, 0.3, 0.2), (1, 0.0, None), (0, 0.5, None),
                                               (50, 1.0, 0.9)])
def test_nms_with_constant_parameters(center, max_out, iou, score):
    inputs = ["boxes", "scores", "max_out", "iou"] + (["score"] if score is not None else [])
    node = helper.make_node("NonMaxSuppression", inputs, ["selected"], center_point_box=center)
    consts = [_const("max_out", np.array([max_out], dtype=np.int64)), _const("iou", np.array([iou], dtype=np.float32))]
    if score is not None:
        consts.append(_const("score", np.array([score], dtype=np.float32)))
    model = _model([node], [_input("boxes", ["b", "n", 4]), _input("scores", ["b", 3, "n"])],
                   [helper.make_tensor_value_info("selected", I64, None)], consts, opset=11)
    native, reference = _session_pair(model)
    rng = np.random.default_rng(max_out * 10 + center)
    for batch, n in ((1, 1), (2, 40), (1, 300), (3, 7)):
        scores = np.round(rng.random((batch, 3, n)), 1).astype(np.float32)  # many ties
        feeds = {"boxes": _boxes(rng, batch, n, center), "scores": scores}
        np.testing.assert_array_equal(native.run(None, feeds)[0], reference.run(None, feeds)[0])


def test_nms_with_run_time_parameters():
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score"], ["selected"])
    model = _model([node], [_input("boxes", [1, "n", 4]), _input("scores", [1, 2, "n"]),
                            _input("max_out", [1], I64), _input("iou", [1]), _input("score", [1])],
                   [helper.make_tensor_value_info("selected", I64, None)], opset=11)
    native, reference = _session_pair(model)
    rng = np.random.default_rng(7)
    for n, max_out, iou, score in ((50, 5, 0.4, 0.1), (200, 1000, 0.6, 0.0), (9, 2, 0.0, 0.5)):
        feeds = {"boxes": _boxes(rng, 1, n, 0), "scores": rng.random((1, 2, n)).astype(np.float32),
                 "max_out": np.array([max_out], dtype=np.int64), "iou": np.array([iou], dtype=np.float32),
                 "score": np.array([score], dtype=np.float32)}
        np.testing.assert_array_equal(native.run(None, feeds)[0], reference.run(None, feeds)[0])


@pytest.mark.parametrize("center", [0, 1])
def test_nms_over_class_offset_boxes_and_odd_ones(center):
    # torchvision's batched NMS (SSDlite's export): each class's boxes shifted along x by its
    # own offset, one NMS over all of them, so the kernel's x buckets hold few boxes each.
    # Mixed in: boxes as wide as everything, NaN and infinite corners, zero-area boxes.
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou"], ["selected"],
                            center_point_box=center)
    model = _model([node], [_input("boxes", [1, "n", 4]), _input("scores", [1, 1, "n"])],
                   [helper.make_tensor_value_info("selected", I64, None)],
                   [_const("max_out", np.array([100000], dtype=np.int64)), _const("iou", np.array([0.45], np.float32))],
                   opset=11)
    native, reference = _session_pair(model)
    rng = np.random.default_rng(11 + center)
    for n, classes in ((3000, 30), (400, 1), (64, 8)):
        boxes = _boxes(rng, 1, n, center)
        offset = 20.0 * rng.integers(0, classes, n)
        for x in ((0,) if center else (1, 3)):  # x of the center, or both x corners
            boxes[0, :, x] += offset
        odd = rng.choice(n, 12, replace=False)
        span = 20.0 * classes + 10  # boxes over every class's band
        boxes[0, odd[:3]] = [span / 2, 5, span, 10] if center else [0, -1, 10, span]
        boxes[0, odd[3], 0] = np.nan
        boxes[0, odd[4], 2] = np.inf
        boxes[0, odd[5], 1] = -np.inf
        boxes[0, odd[6:8]] = boxes[0, odd[6:8]] * np.array([1, 1, 0, 1], np.float32)
        scores = np.round(rng.random((1, 1, n)), 2).astype(np.float32)
        feeds = {"boxes": boxes, "scores": scores}
        np.testing.assert_array_equal(native.run(None, feeds)[0], reference.run(None, feeds)[0])


@pytest.mark.parametrize("axis,largest", [(-1, 1), (0, 0), (1, 1)])
def test_topk_with_k_given_at_run_time(axis, largest):
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=largest)
    model = _model([node], [_input("x", ["n", 5, 6]), _input("k", [1], I64)],
                   [helper.make_tensor_value_info("values", F, None),
                    helper.make_tensor_value_info("indices", I64, None)], opset=11)
    native, reference = _session_pair(model)
    rng = np.random.default_rng(axis + 5)
    for n, k in ((4, 2), (7, 4), (3, 0), (9, 3)):
        x = np.round(rng.standard_normal((n, 5, 6)), 1).astype(np.float32)  # ties broken by index
        feeds = {"x": x, "k": np.array([k], dtype=np.int64)}
        for got, want in zip(native.run(None, feeds), reference.run(None, feeds)):
            np.testing.assert_array_equal(got, want)


def test_topk_with_constant_k():
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"])
    model = _model([node], [_input("x", ["n", 10])], [helper.make_tensor_value_info("values", F, None),
                                                      helper.make_tensor_value_info("indices", I64, None)],
                   [_const("k", np.array([3], dtype=np.int64))], opset=11)
    native, reference = _session_pair(model)
    x = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32)
    for got, want in zip(native.run(None, {"x": x}), reference.run(None, {"x": x})):
        np.testing.assert_array_equal(got, want)
