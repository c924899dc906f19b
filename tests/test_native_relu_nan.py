"""Relu fused into a kernel's epilogue keeps NaN as NaN (ONNX's Relu, onnxruntime): x86's
max_ps returns its second operand where either is NaN, so max(acc, 0) turned NaN into 0."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift

F = TensorProto.FLOAT


def _ort(model, feed):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _matmul_relu(k: int, n: int, bias: bool):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "W")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["mm"])]
    last = "mm"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "B"))
        nodes.append(helper.make_node("Add", ["mm", "B"], ["biased"]))
        last = "biased"
    nodes.append(helper.make_node("Relu", [last], ["Y"]))
    graph = helper.make_graph(nodes, "mm_relu", [helper.make_tensor_value_info("X", F, ["m", k])],
                              [helper.make_tensor_value_info("Y", F, ["m", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _conv_relu():
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "B")
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["Y"])]
    graph = helper.make_graph(nodes, "conv_relu", [helper.make_tensor_value_info("X", F, [1, 8, "h", "w"])],
                              [helper.make_tensor_value_info("Y", F, [1, 16, "h", "w"])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [1, 7, 33])
def test_matmul_relu_keeps_nan(m, bias):
    model = _matmul_relu(64, 48, bias)
    session = shapeshift.InferenceSession(model, {"m": (1, 64)}, backend="native")
    x = np.random.default_rng(m).standard_normal((m, 64)).astype(np.float32)
    x[m // 2, 3] = np.nan  # a whole row of the product is NaN
    got, want = session.run(None, {"X": x})[0], _ort(model, {"X": x})
    assert np.isnan(want[m // 2]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hw", [(5, 7), (16, 16)])
def test_conv_relu_keeps_nan(hw):
    model = _conv_relu()
    session = shapeshift.InferenceSession(model, {"h": (1, 32), "w": (1, 32)}, backend="native")
    x = np.random.default_rng(2).standard_normal((1, 8, *hw)).astype(np.float32)
    x[0, 2, hw[0] // 2, hw[1] // 2] = np.nan
    got, want = session.run(None, {"X": x})[0], _ort(model, {"X": x})
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-4, atol=1e-4)
