"""Element types against the ops' ONNX type constraints (frontend/element_types.py): models
onnxruntime refuses for their types are refused at load naming the node and input; valid
mixes (a Where's bool condition, a Scan's states of different types) are not."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift.errors import InvalidModelError


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _t(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _ort_refuses(model) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal at load
        return True
    return False


BAD = {
    "topk_over_bool": (
        _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")],
               [_t("x", TensorProto.BOOL, [4])], [_t("v", TensorProto.BOOL, [2]), _t("i", TensorProto.INT64, [2])],
               [helper.make_tensor("k", TensorProto.INT64, [1], [2])]),
        r"node 'topk' \(TopK\): input 0 \('x'\) is tensor\(bool\).*allowed: .*float"),
    "gemm_int32_bias": (
        _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="gemm")],
               [_t("a", TensorProto.FLOAT, [2, 3]), _t("b", TensorProto.FLOAT, [3, 4]), _t("c", TensorProto.INT32, [4])],
               [_t("y", TensorProto.FLOAT, [2, 4])]),
        r"node 'gemm' \(Gemm\): inputs 0 and 2 must have the same element type \(T\), but are tensor\(float\) and "
        r"tensor\(int32\)"),
    "add_float_int64": (
        _model([helper.make_node("Add", ["a", "b"], ["y"], name="add")],
               [_t("a", TensorProto.FLOAT, [3]), _t("b", TensorProto.INT64, [3])], [_t("y", TensorProto.FLOAT, [3])]),
        r"node 'add' \(Add\): inputs 0 and 1"),
    "computed_value_of_a_refused_type": (  # the bad type is known only after inference
        _model([helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BOOL),
                helper.make_node("Relu", ["xb"], ["y"], name="relu")],
               [_t("x", TensorProto.FLOAT, [3])], [_t("y", TensorProto.BOOL, [3])]),
        r"node 'relu' \(Relu\): input 0 \('xb'\) is tensor\(bool\)"),
    # An input of one fixed type rather than a constraint (the fuzz campaign, seed 1330 run
    # 1331: an Expand given a float scalar as its shape ran, natively to another output shape).
    "expand_float_shape": (
        _model([helper.make_node("Expand", ["x", "s"], ["y"], name="expand")],
               [_t("x", TensorProto.FLOAT, [3])], [_t("y", TensorProto.FLOAT, None)],
               [helper.make_tensor("s", TensorProto.FLOAT, [], [1.0])]),
        r"node 'expand' \(Expand\): input 1 \('s'\) is tensor\(float\), where Expand \(opset 17\) takes "
        r"tensor\(int64\) only"),
    "tile_int32_repeats": (  # a one-type constraint (T1), refused before too
        _model([helper.make_node("Tile", ["x", "r"], ["y"], name="tile")],
               [_t("x", TensorProto.FLOAT, [3])], [_t("y", TensorProto.FLOAT, None)],
               [helper.make_tensor("r", TensorProto.INT32, [1], [2])]),
        r"node 'tile' \(Tile\): input 1 \('r'\) is tensor\(int32\), which Tile .*allowed: int64$"),
    "reshape_float_shape_computed": (  # the shape's type known only after inference
        _model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
                helper.make_node("Reshape", ["x", "sf"], ["y"], name="reshape")],
               [_t("x", TensorProto.FLOAT, [2, 3])], [_t("y", TensorProto.FLOAT, None)]),
        r"node 'reshape' \(Reshape\): input 1 \('sf'\) is tensor\(float\), where Reshape"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_type_onnxruntime_refuses_is_refused_at_load_naming_node_and_input(case):
    model, message = BAD[case]
    assert _ort_refuses(model), "the case must be one onnxruntime refuses"
    for backend in ("reference", "native"):
        with pytest.raises(InvalidModelError, match=message):
            shapeshift.InferenceSession(model, backend=backend)


def test_valid_mixed_types_are_accepted():
    model = _model([helper.make_node("Where", ["c", "a", "b"], ["y"])],
                   [_t("c", TensorProto.BOOL, [3]), _t("a", TensorProto.INT64, [3]), _t("b", TensorProto.INT64, [3])],
                   [_t("y", TensorProto.INT64, [3])])
    assert not _ort_refuses(model)
    shapeshift.InferenceSession(model, backend="reference")
