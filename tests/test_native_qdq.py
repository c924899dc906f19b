"""A weight quantized in the model (QDQ: int8 + scale -> DequantizeLinear -> MatMul) runs on
the native backend as a float weight: its DequantizeLinear is folded before lowering,
whatever its size, so the GEMM prepacks it once instead of the reference fallback
dequantizing it at every run. `shapeshift simplify` keeps it quantized."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import shapeshift

K, N = 300, 310  # 93,000 elements: over simplify's default fold limit (65,536)


def _qdq_matmul_model():
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.integers(-127, 127, (K, N)).astype(np.int8), "wq"),
               numpy_helper.from_array((rng.random(N) / 50 + 1e-3).astype(np.float32), "scale"),
               numpy_helper.from_array(rng.integers(-3, 3, N).astype(np.int8), "zero")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "scale", "zero"], ["w"], axis=1),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", N])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_quantized_weight_runs_natively_as_a_float_weight():
    model = _qdq_matmul_model()
    session = shapeshift.InferenceSession(model, backend="native", num_threads=1)
    assert session._executor.program.fallback_ops() == {}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # else it quantizes x too
    reference = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for n in (1, 5, 33):
        x = np.random.default_rng(n).standard_normal((n, K)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)


def test_simplify_keeps_the_weight_quantized():
    simplified = shapeshift.simplify(_qdq_matmul_model())
    assert [n.op_type for n in simplified.graph.node] == ["DequantizeLinear", "MatMul"]
    assert {t.name: t.data_type for t in simplified.graph.initializer}["wq"] == TensorProto.INT8
