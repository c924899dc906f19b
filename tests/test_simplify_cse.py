"""Simplify's common-subexpression step: duplicates go, near-duplicates stay, and the
simplified model computes what onnxruntime computes on the original."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import shapeshift

F32 = TensorProto.FLOAT


def _model(nodes, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["n", 4])],
                              [helper.make_tensor_value_info(name, F32, None) for name in outputs],
                              list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(node.op_type for node in model.graph.node)


def _same_outputs(original: onnx.ModelProto, simplified: onnx.ModelProto) -> None:
    rng = np.random.default_rng(0)
    for n in (1, 3, 8):
        feed = {"x": rng.standard_normal((n, 4)).astype(np.float32)}
        want = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        got = ort.InferenceSession(simplified.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_a_duplicate_whose_inputs_become_shared_later_goes():
    """a = Sigmoid(Relu(x)) and b = Sigmoid(Relu(x)): when a's Sigmoid is visited its input
    has one reader, so it cannot have a duplicate yet; the Relus merge, and then b's
    Sigmoid must find a's."""
    nodes = [helper.make_node("Relu", ["x"], ["r1"]), helper.make_node("Sigmoid", ["r1"], ["a"]),
             helper.make_node("Relu", ["x"], ["r2"]), helper.make_node("Sigmoid", ["r2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    model = _model(nodes, ["y"])
    simplified = shapeshift.simplify(model)
    assert _ops(simplified) == {"Relu": 1, "Sigmoid": 1, "Add": 1}
    _same_outputs(model, simplified)


def test_duplicates_with_an_omitted_input_go_and_different_attributes_stay():
    """Two Clip(x, '', hi) are one; Softmax over axis 0 and over axis 1 are two."""
    hi = numpy_helper.from_array(np.array(0.5, np.float32), "hi")
    nodes = [helper.make_node("Clip", ["x", "", "hi"], ["c1"]), helper.make_node("Clip", ["x", "", "hi"], ["c2"]),
             helper.make_node("Softmax", ["x"], ["s0"], axis=0), helper.make_node("Softmax", ["x"], ["s1"], axis=1),
             helper.make_node("Sum", ["c1", "c2", "s0", "s1"], ["y"])]
    model = _model(nodes, ["y"], [hi])
    simplified = shapeshift.simplify(model)
    assert _ops(simplified) == {"Clip": 1, "Softmax": 2, "Sum": 1}
    _same_outputs(model, simplified)


def test_duplicate_shape_chains_become_one():
    """Reshape(x, [Shape(x)[0], 4]) written twice, each with its own Shape chain."""
    nodes, inits = [], [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                        numpy_helper.from_array(np.array([4], np.int64), "four")]
    for k in (1, 2):
        nodes += [helper.make_node("Shape", ["x"], [f"s{k}"]),
                  helper.make_node("Gather", [f"s{k}", "zero"], [f"n{k}"], axis=0),
                  helper.make_node("Concat", [f"n{k}", "four"], [f"shape{k}"], axis=0),
                  helper.make_node("Reshape", ["x", f"shape{k}"], [f"r{k}"]),
                  helper.make_node("Relu", [f"r{k}"], [f"y{k}"])]
    model = _model(nodes, ["y1", "y2"], inits)
    simplified = shapeshift.simplify(model)
    assert _ops(simplified)["Relu"] == 1 and _ops(simplified)["Shape"] <= 1
    _same_outputs(model, simplified)
